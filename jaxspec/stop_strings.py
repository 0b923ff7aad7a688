"""OpenAI's `stop`: strings that end a generation, the same rule for `generate`, `stream`, `chat`
and the server. The text ends before the first stop string found (the earliest in the text), and
the tokens end with the one that completed it; a stream holds back a suffix that may still grow
into a stop string, so what it has sent is never taken back (`settled`: the one rule of
`jaxspec.stream` and the server's `Detokenizer` for the text of a generation so far)."""

from __future__ import annotations

from typing import Callable, Sequence

from jaxspec.errors import GenerationError

MAX_STOPS = 4  # as OpenAI (the server answers 400 past it, the library a GenerationError)


def check(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """`stop` as a tuple of non-empty strings (None: none); anything else is a GenerationError."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, (list, tuple)) or len(stops) > MAX_STOPS
            or not all(isinstance(s, str) and s for s in stops)):
        raise GenerationError(f"stop must be a non-empty str or a list of up to {MAX_STOPS} of them, got {stop!r}")
    return tuple(dict.fromkeys(stops))


def cut(decode: Callable[[list[int]], str], ids: list[int], stops: tuple[str, ...]
        ) -> tuple[list[int], str] | None:
    """Where the earliest stop string of `decode(ids)` begins: (the ids through the token that
    completed it, the text before it); None when the text holds none."""
    text = decode(ids)
    hit = min(((text.find(s), s) for s in stops if s in text), default=None)
    if hit is None:
        return None
    n = next(k for k in range(1, len(ids) + 1) if hit[1] in decode(ids[:k]))
    return ids[:n], text[:hit[0]]


def sendable(text: str, stops: tuple[str, ...]) -> str:
    """The part of a generation's text so far that no later token can change: no half character
    (U+FFFD at the end) and no suffix that may grow into a stop string."""
    held = text.rstrip("\ufffd")
    keep = len(held)
    for s in stops:
        for k in range(min(len(s) - 1, len(held)), 0, -1):
            if held.endswith(s[:k]):
                keep = min(keep, len(held) - k)
                break
    return held[:keep]


def settled(decode: Callable[[list[int]], str], ids: list[int], stops: tuple[str, ...], done: bool
            ) -> tuple[list[int], str, bool]:
    """A generation's tokens so far as the text a stream may send: (the ids kept, through the
    token that completed a stop string; their text, cut before the stop string, whole once
    `done`, otherwise without what a later token may still change (`sendable`); whether a stop
    string ended the generation). A stream sends the part of that text it has not sent yet."""
    hit = cut(decode, ids, stops) if stops else None
    if hit is not None:
        return hit[0], hit[1], True
    text = decode(ids)
    return ids, text if done else sendable(text, stops), False
