"""Errors raised for bad input.

Every error a user can cause is a `JaxspecError` (a `ValueError`) whose message says what
is wrong and how to fix it, in one line. The CLI prints that line and exits with code 2.
"""


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
