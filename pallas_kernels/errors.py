"""The error the kernels raise for bad input.

`pallas_kernels` imports nothing from `jaxspec` (`tools/import_graph.py` checks it), so it
cannot raise jaxspec's `ConfigError`; it raises this `ValueError` instead, with the same
kind of one-line message (what is wrong, how to fix it). jaxspec's entry points into the
package (`jaxspec.models.attention`, `jaxspec.models.masks`) re-raise it as a `ConfigError`,
so a caller of jaxspec (and its CLI: one line, exit code 2) sees jaxspec's error.
"""


class KernelConfigError(ValueError):
    """A kernel option, shape, mask or platform the kernels cannot run: the message says which and how to fix it."""
