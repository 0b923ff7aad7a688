"""Registry of decoding methods: name -> jit-able loop, accepted options, defaults.

Every loop has the signature
`decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, max_new_tokens, cache_len,
eos_ids, greedy, **options) -> (DecodeState, stats)` and is compiled whole by `generate`.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any, Callable

from jaxspec.config import ModelConfig
from jaxspec.decoding.autoregressive import autoregressive_decode
from jaxspec.decoding.hybrid import hybrid_decode
from jaxspec.decoding.lookahead import LookaheadConfig, jacobi_decode, lookahead_decode, prompt_lookup_decode
from jaxspec.decoding.lookahead_parallel import lookahead_parallel_decode
from jaxspec.decoding.speculative import DraftSpec, speculative_decode
from jaxspec.errors import CheckpointError, ConfigError, GenerationError
from jaxspec.parallel import check_lp_devices

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


@dataclasses.dataclass(frozen=True)
class Method:
    decode: Callable
    # option name -> default (None = derived from the model by `resolve_options`)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The longest run of block tokens one step may commit (cache headroom past the budget).
    max_commit: Callable[[dict], int] = lambda options: 1
    # Fills in model-dependent defaults and validates: (model config, options) -> options.
    resolve: Callable[[ModelConfig, dict], dict] = lambda cfg, options: options
    # (model, resolved options) -> (graphdef, params, static options, options as reported).
    # Methods that run a second model (a drafter) pass its weights as arguments here, never
    # as compile-time constants. None: the model's own graph and parameters, options as given.
    bind: Callable[[Any, dict], tuple[Any, Any, dict, dict]] | None = None


def lookahead_defaults(cfg: ModelConfig, path: Path | None = None) -> LookaheadConfig:
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
            return LookaheadConfig(window=entry["window"], ngram=entry["ngram"], guesses=entry["guesses"])
    raise ConfigError(f"{path}: no [[default]] entry covers a model of {cfg.num_params} parameters")


def _lookahead_options(cfg: ModelConfig, options: dict) -> dict:
    defaults = lookahead_defaults(cfg)
    resolved = {k: (getattr(defaults, k) if v is None else v) for k, v in options.items()}
    LookaheadConfig(**{k: resolved.get(k, getattr(defaults, k)) for k in ("window", "ngram", "guesses")},
                    pool_from_prompt=resolved.get("pool_from_prompt", True),
                    verify_window=resolved.get("verify_window", True))  # validates
    if "lp_devices" in resolved:
        resolved["lp_devices"] = check_lp_devices(resolved["lp_devices"])
    return resolved


def _lookahead(graphdef, params, prompts, prompt_lengths, rng, sampling, *, lp_devices: int = 1, **options):
    """Single-device lookahead, or the same steps split over `lp_devices` devices (LP)."""
    if lp_devices > 1:
        return lookahead_parallel_decode(graphdef, params, prompts, prompt_lengths, rng, sampling,
                                         lp_devices=lp_devices, **options)
    return lookahead_decode(graphdef, params, prompts, prompt_lengths, rng, sampling, **options)


# ----------------------------------------------------------------------------- drafters

# Drafter names a user can pass instead of a path (shipped inside the package), and the
# drafter used for a target when none is given: the default model's PARD-2 drafter.
DEFAULT_DRAFTER = "pycode-5M-pard2"
_drafter_cache: dict = {}


def _drafter_path(name_or_path) -> Path:
    from jaxspec.loading import ASSETS

    path = Path(name_or_path)
    if path.exists():
        return path
    if str(name_or_path) == DEFAULT_DRAFTER:
        return ASSETS / DEFAULT_DRAFTER
    raise GenerationError(f"drafter {str(name_or_path)!r} does not exist; pass a drafter folder "
                          f"(trained with `jaxspec train-drafter`) or {DEFAULT_DRAFTER!r}")


def _load_drafter(path: Path, target_independent: bool):
    from jaxspec.drafter import load_drafter

    key = (str(path.resolve()), target_independent)
    if key not in _drafter_cache:
        _drafter_cache[key] = load_drafter(path, target_independent=target_independent)
    return _drafter_cache[key]


def resolve_drafter(cfg: ModelConfig, drafter, target_features: bool | None):
    """A `Drafter` for this target: given (a Drafter, a drafter folder or name, or a loaded
    drafter `Model`), or the shipped default drafter when the target is the default model."""
    from jaxspec.drafter import Drafter
    from jaxspec.loading import ASSETS, Model

    independent = target_features is False
    if drafter is None:
        folder = ASSETS / DEFAULT_DRAFTER
        default = None
        if folder.exists():
            default = _load_drafter(folder, independent)
        if default is None or default.target_vocab_size != cfg.vocab_size:
            raise GenerationError("speculative decoding needs a drafter for this model: pass drafter=PATH "
                                  "(CLI: --drafter PATH); only the default model has a shipped drafter"
                                  + ("" if folder.exists() else f" ({folder} is not installed)"))
        drafter = default
    elif isinstance(drafter, (str, os.PathLike)):
        drafter = _load_drafter(_drafter_path(drafter), independent)
    elif isinstance(drafter, Model):
        try:
            drafter = _load_drafter(Path(drafter.source), independent)
        except (CheckpointError, OSError):  # a bare model: a PARD drafter without features
            drafter = Drafter(model=drafter, mask_token_id=drafter.config.vocab_size - 1,
                              target_vocab_size=drafter.config.vocab_size - 1, target_layers=(),
                              target_hidden_size=0)
    elif not isinstance(drafter, Drafter):
        raise GenerationError(f"drafter must be a Drafter (jaxspec.drafter.load_drafter), a drafter folder or "
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


def _speculative_options(cfg: ModelConfig, options: dict) -> dict:
    drafter, target_features = resolve_drafter(cfg, options.get("drafter"), options.get("target_features"))
    draft_len = options.get("draft_len")
    draft_len = drafter.draft_len if draft_len is None else draft_len
    if isinstance(draft_len, bool) or not isinstance(draft_len, int) or draft_len < 1:
        raise GenerationError(f"draft_len must be an integer >= 1, got {draft_len!r}")
    if not isinstance(options.get("bonus_in_context", True), bool):
        raise GenerationError(f"bonus_in_context must be true or false, got {options['bonus_in_context']!r}")
    return {**options, "drafter": drafter, "draft_len": draft_len, "target_features": target_features}


def _hybrid_options(cfg: ModelConfig, options: dict) -> dict:
    options = _speculative_options(cfg, options)
    lookahead = _lookahead_options(cfg, {k: options[k] for k in ("window", "ngram", "guesses", "pool_from_prompt",
                                                                   "verify_window")})
    return {**options, **lookahead}


def _bind_drafter(model, options: dict):
    """Target + drafter graphs and weights; the drafter's statics as a hashable `DraftSpec`."""
    drafter = options["drafter"]
    target_features = options["target_features"]
    spec = DraftSpec(draft_len=options["draft_len"], mask_token_id=drafter.mask_token_id,
                     target_vocab_size=drafter.target_vocab_size,
                     target_layers=tuple(drafter.target_layers) if target_features else (),
                     feature_scale=float(drafter.feature_scale), bonus_in_context=options["bonus_in_context"])
    graphdef = (model.graphdef, drafter.model.graphdef)
    params = {"target": model.params, "drafter": drafter.model.params,
              "projection": drafter.projection if target_features else None}
    statics = {k: v for k, v in options.items() if k not in _DRAFTER_OPTIONS}
    reported = {**options, "drafter": drafter.model.source}
    return graphdef, params, {**statics, "draft_spec": spec}, reported


_DRAFTER_OPTIONS = {"drafter": None, "draft_len": None, "target_features": None, "bonus_in_context": True}

METHODS: dict[str, Method] = {
    "autoregressive": Method(autoregressive_decode),
    "lookahead": Method(_lookahead,
                        options={"window": None, "ngram": None, "guesses": None, "pool_from_prompt": True,
                                 "verify_window": True, "lp_devices": 1},
                        max_commit=lambda o: o["window"] + o["ngram"], resolve=_lookahead_options),
    "prompt-lookup": Method(prompt_lookup_decode, options={"ngram": None, "guesses": None},
                            max_commit=lambda o: o["ngram"], resolve=_lookahead_options),
    "jacobi": Method(jacobi_decode, options={"window": None}, max_commit=lambda o: o["window"] + 1,
                     resolve=_lookahead_options),
    "speculative": Method(speculative_decode, options=dict(_DRAFTER_OPTIONS),
                          max_commit=lambda o: o["draft_len"] + 1, resolve=_speculative_options,
                          bind=_bind_drafter),
    "hybrid": Method(hybrid_decode,
                     options={**_DRAFTER_OPTIONS, "window": None, "ngram": None, "guesses": None,
                              "pool_from_prompt": True, "verify_window": True},
                     max_commit=lambda o: max(o["window"] + o["ngram"], o["draft_len"] + 1),
                     resolve=_hybrid_options, bind=_bind_drafter),
}
ALIASES = {"greedy": "autoregressive"}


def register_method(name: str, method: Method) -> None:
    METHODS[name] = method


def resolve_method(name: str, cfg: ModelConfig, options: dict) -> tuple[str, Method, dict]:
    """Canonical name, method, and validated options with defaults filled in."""
    canonical = ALIASES.get(name, name)
    if canonical not in METHODS:
        raise GenerationError(f"unknown method {name!r}; available: {', '.join(sorted([*METHODS, *ALIASES]))}")
    method = METHODS[canonical]
    unknown = sorted(set(options) - set(method.options))
    if unknown:
        raise GenerationError(
            f"method {canonical!r} has no option {unknown[0]!r}; its options: {', '.join(method.options) or 'none'}"
        )
    merged = {**method.options, **{k: v for k, v in options.items() if v is not None}}
    return canonical, method, method.resolve(cfg, merged)
