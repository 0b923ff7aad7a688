"""Typed options of each decoding method: frozen dataclasses, validated once on construction.

A field left None is filled from the model by `resolve` (lookahead's (W, N, G) from
`configs/lookahead.toml` by parameter count; a drafter's K from the drafter). `as_dict` is
what `generate` reports. Options that name a drafter resolve it to a loaded `Drafter`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from jaxspec.models.config import ModelConfig
from jaxspec.decoding.sources.drafter import DraftSpec
from jaxspec.checkpoint.drafter_files import Drafter, load_drafter
from jaxspec.errors import CheckpointError, ConfigError, GenerationError
from jaxspec.checkpoint.loading import ASSETS, Model
from jaxspec.checkpoint.loading import resolve as resolve_model
from jaxspec.models.meshes import check_lp_devices

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # jaxspec/configs (-> configs/), in the wheel
# The drafter used for a target when none is given: the default model's PARD-2 drafter,
# shipped inside the package (its name can be passed instead of a path).
DEFAULT_DRAFTER = "pycode-5M-pard2"
# Shipped drafters by the named model they draft for (`jaxspec.checkpoint.loading.NAMED_MODELS`).
SHIPPED_DRAFTERS = {"pycode-5M": DEFAULT_DRAFTER, "smollm2-135m-instruct": "smollm2-135m-instruct-pard2"}


def shipped_drafter(target: Model | None, cfg: ModelConfig) -> Path | None:
    """The shipped drafter folder for this target: the one trained for the named model the
    target was loaded from, else (a target built in memory) the default model's when the
    vocabularies agree; None when there is none."""
    if target is not None:
        for name, drafter in SHIPPED_DRAFTERS.items():
            try:
                same = resolve_model(name).resolve() == Path(target.source).resolve()
            except (CheckpointError, OSError):
                continue
            if same and (ASSETS / drafter).exists():
                return ASSETS / drafter
    folder = ASSETS / DEFAULT_DRAFTER
    if folder.exists() and json.loads((folder / "config.json").read_text())["pard"]["target_vocab_size"] == cfg.vocab_size:
        return folder
    return None


def _check_int(method: str, name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise GenerationError(f"{method} {name} must be an integer >= {low}, got {value!r}")


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise GenerationError(f"{name} must be true or false, got {value!r}")


class Options:
    """Shared behaviour of the option dataclasses below."""

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def resolve(cls, cfg: ModelConfig, given: dict, drafters: dict | None = None, target: Model | None = None
                ) -> "Options":
        """Options from the caller's values (None = the model's default), validated. `drafters`:
        drafters already loaded for this target (`Model.drafters`), reused and filled in."""
        return cls(**given)


@dataclasses.dataclass(frozen=True)
class NoOptions(Options):
    pass


def lookahead_defaults(cfg: ModelConfig, path: Path | None = None) -> "LookaheadOptions":
    """(W, N, G) for a model of this size, from configs/lookahead.toml."""
    path = path or CONFIG_DIR / "lookahead.toml"
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read lookahead defaults {path}: {e}") from None
    for entry in table.get("default", []):
        unknown = set(entry) - {"name", "max_params", "window", "ngram", "guesses"}
        if unknown:
            raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r} in [[default]] {entry.get('name')!r}")
        if cfg.num_params <= entry["max_params"]:
            return LookaheadOptions(window=entry["window"], ngram=entry["ngram"], guesses=entry["guesses"])
    raise ConfigError(f"{path}: no [[default]] entry covers a model of {cfg.num_params} parameters")


def _fill_lookahead(cfg: ModelConfig, given: dict, names) -> dict:
    if all(given.get(k) is not None for k in names):
        return given
    defaults = lookahead_defaults(cfg)
    return {**given, **{k: getattr(defaults, k) for k in names if given.get(k) is None}}


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
    def resolve(cls, cfg, given, drafters=None, target=None):
        return cls(**_fill_lookahead(cfg, given, ("window", "ngram", "guesses")))


@dataclasses.dataclass(frozen=True)
class PromptLookupOptions(Options):
    ngram: int = 5
    guesses: int = 15

    def __post_init__(self):
        _check_int("prompt-lookup", "ngram", self.ngram, 2)
        _check_int("prompt-lookup", "guesses", self.guesses, 0)

    @classmethod
    def resolve(cls, cfg, given, drafters=None, target=None):
        return cls(**_fill_lookahead(cfg, given, ("ngram", "guesses")))


@dataclasses.dataclass(frozen=True)
class JacobiOptions(Options):
    window: int = 15

    def __post_init__(self):
        _check_int("jacobi", "window", self.window, 1)

    @classmethod
    def resolve(cls, cfg, given, drafters=None, target=None):
        return cls(**_fill_lookahead(cfg, given, ("window",)))


# ----------------------------------------------------------------------------- drafters


def find_drafter(name_or_path) -> Path:
    path = Path(name_or_path)
    if path.exists():
        return path
    if str(name_or_path) in SHIPPED_DRAFTERS.values():
        return ASSETS / str(name_or_path)
    raise GenerationError(f"drafter {str(name_or_path)!r} does not exist; pass a drafter folder "
                          f"(trained with `jaxspec train-drafter`) or one of {', '.join(SHIPPED_DRAFTERS.values())}")


def resolve_drafter(cfg: ModelConfig, drafter, target_features: bool | None, drafters: dict | None = None,
                    target: Model | None = None) -> tuple[Drafter, bool]:
    """A `Drafter` for this target: given (a Drafter, a drafter folder or name, or a loaded
    drafter `Model`), or the shipped drafter of the target (`shipped_drafter`).
    Drafters read from disk are kept in `drafters` (keyed by folder and mode) for the next call;
    `target` gives a drafter that shares the target's embeddings its rows."""
    independent = target_features is False
    drafters = {} if drafters is None else drafters

    def load(folder: Path) -> Drafter:
        key = (str(folder.resolve()), independent)
        if key not in drafters:
            drafters[key] = load_drafter(folder, target_independent=independent, target=target)
        return drafters[key]

    if drafter is None:
        folder = shipped_drafter(target, cfg)
        if folder is None:
            raise GenerationError("speculative decoding needs a drafter for this model: pass drafter=PATH "
                                  "(CLI: --drafter PATH); shipped drafters exist for "
                                  + ", ".join(SHIPPED_DRAFTERS))
        drafter = load(folder)
    elif isinstance(drafter, (str, os.PathLike)):
        drafter = load(find_drafter(drafter))
    elif isinstance(drafter, Model):
        try:
            drafter = load(Path(drafter.source))
        except (CheckpointError, OSError):  # a bare model: a PARD drafter without features
            drafter = Drafter(model=drafter, mask_token_id=drafter.config.vocab_size - 1,
                              target_vocab_size=drafter.config.vocab_size - 1, target_layers=(),
                              target_hidden_size=0)
    elif not isinstance(drafter, Drafter):
        raise GenerationError(f"drafter must be a Drafter (jaxspec.checkpoint.drafter_files.load_drafter), a drafter folder or "
                              f"name, got {type(drafter).__name__}")
    if target_features is None:
        target_features = drafter.projection is not None
    if target_features and drafter.projection is None:
        raise GenerationError("target_features=True needs the drafter's projection, which this drafter lacks "
                              "(loaded target-independent or never trained with features); "
                              "pass target_features=False (CLI: --target-independent)")
    if target_features:
        drafter.check_compatible(cfg)
    else:  # no features: only the vocabulary has to agree
        dataclasses.replace(drafter, projection=None, target_layers=()).check_compatible(cfg)
    if drafter.model.config.vocab_size != drafter.target_vocab_size + 1:
        raise GenerationError(f"drafter vocabulary {drafter.model.config.vocab_size} is not the target's "
                              f"{drafter.target_vocab_size} + 1 mask token; use a PARD drafter")
    return drafter, bool(target_features)


@dataclasses.dataclass(frozen=True)
class DrafterOptions(Options):
    """A PARD drafter (resolved to a loaded `Drafter`), K drafts per step, target-dependent
    (PARD-2 features) or not, and whether the drafter sees the bonus token."""

    drafter: Any = None
    draft_len: int | None = None
    target_features: bool | None = None
    bonus_in_context: bool = True

    def __post_init__(self):
        if self.draft_len is not None:
            if isinstance(self.draft_len, bool) or not isinstance(self.draft_len, int) or self.draft_len < 1:
                raise GenerationError(f"draft_len must be an integer >= 1, got {self.draft_len!r}")
        _check_bool("bonus_in_context", self.bonus_in_context)

    @classmethod
    def resolve(cls, cfg, given, drafters=None, target=None):
        cls(**{**given, "drafter": None, "target_features": None})  # validates the plain values first
        drafter, target_features = resolve_drafter(cfg, given.get("drafter"), given.get("target_features"),
                                                   drafters, target)
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

    def __post_init__(self):
        DrafterOptions.__post_init__(self)
        _check_int("speculative", "lookup_guesses", self.lookup_guesses, 0)
        _check_int("speculative", "lookup_ngram", self.lookup_ngram, 2)


@dataclasses.dataclass(frozen=True)
class HybridOptions(DrafterOptions, LookaheadOptions):
    """A drafter's branch next to lookahead's window and pool: the fields of both."""

    def __post_init__(self):
        DrafterOptions.__post_init__(self)
        LookaheadOptions.__post_init__(self)

    @classmethod
    def resolve(cls, cfg, given, drafters=None, target=None):
        return super().resolve(cfg, _fill_lookahead(cfg, given, ("window", "ngram", "guesses")), drafters,
                               target)
