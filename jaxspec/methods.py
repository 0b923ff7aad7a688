"""Registry of decoding methods: name -> jit-able loop, accepted options, defaults.

Every loop has the signature
`decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, max_new_tokens, cache_len,
eos_ids, greedy, **options) -> (DecodeState, stats)` and is compiled whole by `generate`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any, Callable

from jaxspec.config import ModelConfig
from jaxspec.decoding.autoregressive import autoregressive_decode
from jaxspec.decoding.lookahead import LookaheadConfig, jacobi_decode, lookahead_decode, prompt_lookup_decode
from jaxspec.decoding.lookahead_parallel import lookahead_parallel_decode
from jaxspec.errors import ConfigError, GenerationError
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
