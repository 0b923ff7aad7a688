"""Errors raised for bad input.

Every error a user can cause is a `JaxspecError` (a `ValueError`) whose message says what
is wrong and how to fix it, in one line. The CLI prints that line and exits with code 2.
A package jaxspec calls that does not import it (`pallas_kernels`) raises its own error;
`reraised` turns that into jaxspec's where jaxspec calls in.
"""

import functools


class JaxspecError(ValueError):
    """Bad input: the message names the problem and the fix."""


class CheckpointError(JaxspecError):
    """A checkpoint path, file or tensor is missing, malformed or does not match its config."""


class ConfigError(JaxspecError):
    """A model or run configuration has an unknown key, an unsupported value or a bad value."""


class PromptError(JaxspecError):
    """A prompt is empty, has ids outside the vocabulary, or does not fit the model."""


class GenerationError(JaxspecError):
    """Decoding options are invalid (method name, lengths, sampling parameters)."""


class MemoryLimitError(GenerationError):
    """A request needs more device memory than is free (`jaxspec.runtime.memory` estimates it)."""


def reraised(fn, caught: type[Exception], error: type[JaxspecError]):
    """`fn`, raising `error` (same message, the original as its cause) where it raises `caught`.

    For functions of a package that imports nothing from jaxspec (`pallas_kernels` raises its
    `KernelConfigError`): jaxspec's own names for them raise jaxspec's error, so callers that
    catch it (and the CLI) see no difference. The checks run while JAX traces `fn`, so a
    compiled program is the same with or without the wrapper.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except caught as e:
            raise error(str(e)) from e

    return wrapper


def shown(value, limit: int = 60) -> str:
    """`value` as an error message quotes it: its repr, cut to `limit` characters, non-ASCII
    escaped (a lone surrogate cannot be encoded), a huge integer by its digit count."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {len(str(abs(value)))} digits"
    text = ascii(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
