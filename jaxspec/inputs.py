"""One normalisation of what a caller passes to `generate` / `stream`: prompts (text, id lists,
numpy or jax arrays) and option values (Python, numpy or jax scalars).

Everything accepted becomes plain Python ints / floats / bools and lists of ids; everything
else is a PromptError / GenerationError that names the type given and what is expected."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from jaxspec.errors import GenerationError, PromptError

if TYPE_CHECKING:
    from jaxspec.checkpoint.loading import Model


def describe(value) -> str:
    """`value`'s type for an error message (an array's dtype and shape too)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{type(value).__name__} of {value.dtype}, shape {tuple(value.shape)}"
    return type(value).__name__


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_array(value) -> bool:
    return isinstance(value, np.ndarray) or (hasattr(value, "shape") and hasattr(value, "dtype")
                                             and hasattr(value, "__array__"))


def as_int(value) -> int | None:
    """`value` as a Python int if it is an integer scalar (int, a numpy or jax integer, a 0-d
    integer array; never a bool), else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if is_array(value) and tuple(value.shape) == () and np.issubdtype(np.dtype(value.dtype), np.integer):
        return int(value)
    return None


def as_float(value) -> float | None:
    """`value` as a Python float if it is a real number (int, float, numpy or jax scalar, 0-d
    array; never a bool), else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        try:
            return float(value)
        except OverflowError:  # (an integer past float's range: no real number a knob takes)
            return None
    if is_array(value) and tuple(value.shape) == () and (np.issubdtype(np.dtype(value.dtype), np.integer)
                                                          or np.issubdtype(np.dtype(value.dtype), np.floating)):
        return float(value)
    return None


def as_bool(value) -> bool | None:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if is_array(value) and tuple(value.shape) == () and np.dtype(value.dtype) == np.bool_:
        return bool(value)
    return None


def given(value) -> str:
    return f"{_short(value)} ({describe(value)})"


def int_arg(name: str, value, expected: str, ok) -> int:
    """`value` as a Python int (see `as_int`) for which `ok` holds, else GenerationError."""
    number = as_int(value)
    if number is None or not ok(number):
        raise GenerationError(f"{name} must be {expected}, got {given(value)}")
    return number


def number_arg(name: str, value, expected: str) -> float:
    """`value` as a finite Python float (see `as_float`), else GenerationError."""
    number = as_float(value)
    if number is None or not math.isfinite(number):
        raise GenerationError(f"{name} must be {expected}, got {given(value)}")
    return number


def plain_option(value):
    """A method option with numpy / jax scalars turned into Python ints and bools (the option
    classes validate Python values); anything else unchanged."""
    flag = as_bool(value)
    if flag is not None:
        return flag
    number = as_int(value)
    return value if number is None else number


PROMPT_FORMS = ("a str, a list of token ids, a list of str, a list of token-id lists, "
                "or a 1-D / 2-D integer array")


def _is_row(value) -> bool:
    """A candidate prompt row: a list / tuple / range of ids or an array (checked by `_ids`)."""
    return (isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))) or (
        is_array(value) and tuple(value.shape) != ())


def _ids(row, where: str, vocab: int) -> list[int]:
    """One prompt's ids as Python ints, each checked against the vocabulary."""
    if is_array(row):
        array = np.asarray(row)
        if array.ndim != 1:
            raise PromptError(f"{where} must be a 1-D list of token ids, got an array of shape {array.shape}")
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise PromptError(f"{where} token ids must be integers, got an array of {array.dtype}")
        row = array.tolist()
    ids = []
    for i, t in enumerate(row):
        number = as_int(t)
        if number is None:
            raise PromptError(f"{where} has {given(t)} at index {i}, not a token id; "
                              f"token ids are integers in [0, {vocab})")
        if not 0 <= number < vocab:
            raise PromptError(f"{where} has token id {number!r} outside the vocabulary [0, {vocab})")
        ids.append(number)
    if not ids:
        raise PromptError(f"{where} is empty; pass at least one token id (e.g. the BOS id)")
    return ids


def normalize_prompts(model: Model, prompt) -> tuple[list[list[int]], bool]:
    """Prompts as a list of id lists, and whether the caller passed a batch.

    Accepted: a str (encoded by the model's tokenizer), a list / tuple of token ids, a list of
    str, a list of id lists (or 1-D arrays), or a 1-D / 2-D integer numpy or jax array; ids
    may be Python, numpy or jax integers. Anything else is a PromptError naming the type given."""
    if isinstance(prompt, str):
        if not prompt:  # (one rule with the server's: an empty text is no prompt, whatever BOS the tokenizer adds)
            raise PromptError("prompt is empty; pass at least one character or token id")
        if model.tokenizer is None:
            raise PromptError(f"{model.source} has no tokenizer; pass prompt token ids instead of text")
        return [model.tokenizer.encode(prompt)], False
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        raise PromptError(f"prompt must be text (str) or token ids, got {type(prompt).__name__}; decode bytes "
                          "first, e.g. data.decode('utf-8', errors='replace'), or pass list(data) for byte ids")
    vocab = model.config.vocab_size
    if is_array(prompt):
        array = np.asarray(prompt)
        if array.ndim not in (1, 2):
            raise PromptError(f"a prompt array must be 1-D (one prompt) or 2-D (a batch), got shape {array.shape}")
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise PromptError(f"prompt token ids must be integers, got an array of {array.dtype}")
        if array.ndim == 2:
            if not len(array):
                raise PromptError("prompt is empty (a batch of 0 rows); pass at least one prompt")
            return [_ids(r, f"prompt row {i}", vocab) for i, r in enumerate(array.tolist())], True
        prompt = array.tolist()
    if not isinstance(prompt, Sequence):
        raise PromptError(f"prompt must be {PROMPT_FORMS}; got {describe(prompt)}")
    if len(prompt) == 0:
        raise PromptError("prompt is empty; pass at least one token id (e.g. the BOS id)")
    texts = [isinstance(p, str) for p in prompt]
    if all(texts):
        return [normalize_prompts(model, p)[0][0] for p in prompt], True
    rows = [_is_row(p) for p in prompt]
    if any(texts) or (any(rows) and not all(rows)):
        other = next(i for i in range(1, len(prompt)) if (texts[i], rows[i]) != (texts[0], rows[0]))
        raise PromptError(f"prompt mixes kinds of item: item 0 is {given(prompt[0])}, item {other} is "
                          f"{given(prompt[other])}; pass one list of token ids, a list of token-id lists, "
                          "or a list of str")
    if all(rows):
        return [_ids(r, f"prompt row {i}", vocab) for i, r in enumerate(prompt)], True
    return [_ids(prompt, "prompt", vocab)], False
