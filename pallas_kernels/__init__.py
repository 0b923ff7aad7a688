"""Pallas kernels for jaxspec: the `"pallas"` attention backend (`jaxspec.models.attention.BACKENDS`).

* `decode_attention`: a block of queries over the KV cache plus the block itself; a
  decoding step's token-tree relation (`pallas_kernels.masks.TreeMask`) is computed in the
  kernel, other relations are read as a dense mask;
* `pard_attention`: the PARD drafter-training forward (`pallas_kernels.masks.PardMask`, no cache);
* `pallas_attention`: the registered backend, which picks one of the two by mask.

The package stands alone: it imports nothing from `jaxspec` (`tools/import_graph.py` fails
if it does), and jaxspec imports it. What the kernels need lives here: the mask specs and
relations they take (`masks`), the XLA reference they compute and differentiate through
(`reference.xla_attention`, jaxspec's `xla` backend), and their bad-input error
(`errors.KernelConfigError`, a `ValueError`; jaxspec re-raises it as its `ConfigError`).

Backends (TPU Mosaic, GPU Triton, CPU interpret) are described in `pallas_kernels.backend`;
`python -m pallas_kernels --check-lowering` lowers every kernel for TPU and CUDA.
"""

from pallas_kernels.errors import KernelConfigError
from pallas_kernels.pallas_attention import pallas_attention
from pallas_kernels.decode_attention import decode_attention
from pallas_kernels.pard_attention import pard_attention, pard_reference

__all__ = ["KernelConfigError", "decode_attention", "pallas_attention", "pard_attention", "pard_reference"]
