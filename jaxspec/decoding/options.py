"""Typed options of each decoding method: frozen dataclasses, validated once on construction.

A field left None is filled by `resolve` from a `Defaults` (lookahead's (W, N, G) by model
size, a drafter and its K): decoding itself reads no file, `jaxspec.checkpoint.method_defaults`
reads them from the package's files. `as_dict` is what `generate` reports.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from jaxspec.decoding.sources.drafter import DraftSpec
from jaxspec.errors import GenerationError, shown
from jaxspec.models.config import ModelConfig
from jaxspec.models.meshes import check_lp_devices


class Defaults(Protocol):
    """Where an option left None gets its value (`jaxspec.checkpoint.method_defaults.FileDefaults`)."""

    def lookahead(self, cfg: ModelConfig) -> "LookaheadOptions":
        """(W, N, G) for a model of this size."""

    def drafter(self, cfg: ModelConfig, drafter: Any, target_features: bool | None) -> tuple[Any, bool]:
        """(a loaded, checked `Drafter`, whether it reads the target's features) for what the caller
        gave: a `Drafter`, a folder or shipped name, a drafter `Model`, or None (the target's own)."""


# The largest value any integer option takes (int32's): a larger integer would overflow the float
# arithmetic of the memory estimate; below it the memory guard says what a setting would need.
MAX_OPTION = 2**31 - 1


def _check_int(method: str, name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_OPTION:
        raise GenerationError(f"{method} {name} must be an integer in [{low}, {MAX_OPTION}], got {shown(value)}")


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise GenerationError(f"{name} must be true or false, got {shown(value)}")


class Options:
    """Shared behaviour of the option dataclasses below."""

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def resolve(cls, cfg: ModelConfig, given: dict, defaults: Defaults) -> "Options":
        """Options from the caller's values (a value left out = the model's default), validated."""
        return cls(**given)


@dataclasses.dataclass(frozen=True)
class NoOptions(Options):
    pass


def _fill_lookahead(cfg: ModelConfig, given: dict, names, defaults: Defaults) -> dict:
    if all(given.get(k) is not None for k in names):
        return given
    table = defaults.lookahead(cfg)
    return {**given, **{k: getattr(table, k) for k in names if given.get(k) is None}}


@dataclasses.dataclass(frozen=True)
class LookaheadOptions(Options):
    """Window W (lookahead columns), n-gram size N (N-1 levels), up to G verified candidates;
    `lp_devices` > 1 splits each step over that many devices (lookahead parallelism)."""

    window: int = 15
    ngram: int = 5
    guesses: int = 15
    pool_from_prompt: bool = True
    # Also verify the window's own diagonals (Jacobi paths): free extra candidates, still exact.
    verify_window: bool = True
    lp_devices: int = 1

    def __post_init__(self):
        method = "hybrid" if isinstance(self, HybridOptions) else "lookahead"  # (errors name the method used)
        for name, low in (("window", 1), ("ngram", 2), ("guesses", 0)):
            _check_int(method, name, getattr(self, name), low)
        for name in ("pool_from_prompt", "verify_window"):
            _check_bool(name, getattr(self, name))
        object.__setattr__(self, "lp_devices", check_lp_devices(self.lp_devices))

    @classmethod
    def resolve(cls, cfg, given, defaults):
        return cls(**_fill_lookahead(cfg, given, ("window", "ngram", "guesses"), defaults))


@dataclasses.dataclass(frozen=True)
class PromptLookupOptions(Options):
    ngram: int = 5
    guesses: int = 15

    def __post_init__(self):
        _check_int("prompt-lookup", "ngram", self.ngram, 2)
        _check_int("prompt-lookup", "guesses", self.guesses, 0)

    @classmethod
    def resolve(cls, cfg, given, defaults):
        return cls(**_fill_lookahead(cfg, given, ("ngram", "guesses"), defaults))


@dataclasses.dataclass(frozen=True)
class JacobiOptions(Options):
    window: int = 15

    def __post_init__(self):
        _check_int("jacobi", "window", self.window, 1)

    @classmethod
    def resolve(cls, cfg, given, defaults):
        return cls(**_fill_lookahead(cfg, given, ("window",), defaults))


@dataclasses.dataclass(frozen=True)
class DrafterOptions(Options):
    """A PARD drafter (resolved to a loaded `Drafter`), K drafts per step, target-dependent
    (PARD-2 features) or not, and whether the drafter sees the bonus token."""

    drafter: Any = None
    draft_len: int | None = None
    target_features: bool | None = None
    bonus_in_context: bool = True
    # A > 0: also verify the drafter's next A most likely first drafts, each one token beside the
    # chain (`PardDrafter.alternatives`); the drafts are then the argmax, a deterministic branch
    # when sampling (`MultiDraft`).
    first_alternatives: int = 0

    def __post_init__(self):
        if self.draft_len is not None:
            _check_int("speculative", "draft_len", self.draft_len, 1)
        _check_bool("bonus_in_context", self.bonus_in_context)
        _check_int("speculative", "first_alternatives", self.first_alternatives, 0)

    @classmethod
    def resolve(cls, cfg, given, defaults):
        cls(**{**given, "drafter": None, "target_features": None})  # validates the plain values first
        drafter, target_features = defaults.drafter(cfg, given.get("drafter"), given.get("target_features"))
        draft_len = given.get("draft_len")
        return cls(**{**given, "drafter": drafter, "target_features": target_features,
                      "draft_len": drafter.draft_len if draft_len is None else draft_len})

    def draft_spec(self) -> DraftSpec:
        d = self.drafter
        return DraftSpec(draft_len=self.draft_len, mask_token_id=d.mask_token_id, target_vocab_size=d.target_vocab_size,
                         target_layers=tuple(d.target_layers) if self.target_features else (),
                         feature_scale=float(d.feature_scale), bonus_in_context=self.bonus_in_context,
                         draft_vocab_size=0 if d.draft_vocab is None else d.draft_vocab_size)

    def source_weights(self, source) -> tuple[Any, dict]:
        """(graphdef, params) of the drafter source (`PardDrafter.load` reads them)."""
        d = self.drafter
        return d.model.graphdef, {"model": d.model.params, "projection": d.projection if self.target_features else None,
                                  "draft_head": d.draft_head(), "draft_vocab": d.draft_vocab}

    def as_dict(self) -> dict:
        return {**super().as_dict(), "drafter": self.drafter.model.source}


@dataclasses.dataclass(frozen=True)
class SpeculativeOptions(DrafterOptions):
    """A drafter's K-token chain, and (`lookup_guesses` G > 0) next to it in the same step up
    to G prompt-lookup candidates: (N-1)-grams of the conversation so far that continue the last
    token (`lookup_ngram` N). Copying from the prompt is free and strong on chat replies, which
    quote it; the drafter covers what is new. The target verifies every path at once and keeps
    the longest accepted one, so the output is unchanged."""

    lookup_guesses: int = 0
    lookup_ngram: int = 5
    # True: instead of verifying the drafter's chain and the candidates side by side, verify ONE chain
    # a step, the best candidate's or the drafter's, by the drafter's confidence
    # (`jaxspec.decoding.sources.routed`): max(K, N-1) tokens a step instead of K + G(N-1).
    lookup_route: bool = False

    def __post_init__(self):
        DrafterOptions.__post_init__(self)
        _check_int("speculative", "lookup_guesses", self.lookup_guesses, 0)
        _check_int("speculative", "lookup_ngram", self.lookup_ngram, 2)
        _check_bool("lookup_route", self.lookup_route)
        if self.lookup_route and not self.lookup_guesses:
            raise GenerationError("lookup_route chooses between the drafter and prompt-lookup candidates: "
                                  "set lookup_guesses >= 1")


@dataclasses.dataclass(frozen=True)
class HybridOptions(DrafterOptions, LookaheadOptions):
    """A drafter's branch next to lookahead's window and pool: the fields of both."""

    def __post_init__(self):
        DrafterOptions.__post_init__(self)
        LookaheadOptions.__post_init__(self)

    @classmethod
    def resolve(cls, cfg, given, defaults):
        return super().resolve(cfg, _fill_lookahead(cfg, given, ("window", "ngram", "guesses"), defaults), defaults)
