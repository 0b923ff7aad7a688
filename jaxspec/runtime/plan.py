"""One `DecodePlan` per request shape: the method resolved to its engine and the program's
weights, checked by the memory guard before anything is compiled.

`generate` / `stream` (one request) and the server (`jaxspec.serving`: B slots of a context)
both plan with `plan_decode`, then run the same engine API (`jaxspec.decoding.methods`:
`begin`, `advance`, `decode`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxspec.checkpoint.method_defaults import FileDefaults
from jaxspec.decoding.engine import Engine
from jaxspec.decoding.methods import bind, resolve_method
from jaxspec.runtime import memory


def prompt_bucket(length: int) -> int:
    """A prompt's padded length, the one rule of `generate`, `stream`, the server and `auto`'s
    cache: 16 x 2^k or 24 x 2^k, the smallest that holds it (two programs per doubling of the
    prompt, at most half of it padding)."""
    bucket = 16
    while bucket < length:
        bucket = bucket * 3 // 2 if bucket & (bucket - 1) == 0 else bucket * 4 // 3  # 16, 24, 32, 48, 64, ...
    return bucket


# Cache rungs: a request's cache is the smallest rung (FIRST x 2^k) that holds it and its prompt is
# padded to the rung less the reply's budget and prefilled in chunks (`jaxspec.decoding.prefill`),
# so that requests of any prompt length up to the rung run one program. A conversation (`stream`,
# `chat`) starts at 1024: every turn reuses the programs its first turn compiled until the
# conversation outgrows 1024 tokens (a rung of 512 would compile again on most second turns).
# `method="auto"`'s `generate` starts at 256: the settings it compiles in the background serve the
# next requests whatever their prompt, at most twice the cache they need.
CONVERSATION_RUNGS_FROM = 1024
AUTO_RUNGS_FROM = 256


def context_cache_len(needed: int, most: int, first: int = CONVERSATION_RUNGS_FROM) -> int:
    """The cache length of a request that needs `needed` positions (prompt, reply budget and one
    step's overshoot): the smallest rung (`first` x 2^k) that holds it, at most `most` (the model's
    positions and a step's overshoot, a multiple of 64) and at least `needed`."""
    rung = first
    while rung < needed:
        rung *= 2
    return max(needed, min(rung, most))


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """How a request decodes: the method (canonical name, options with the defaults filled in,
    engine), the program's weights (the target's, and a drafter's next to them) and the ids
    that end a row."""

    name: str
    options: Any
    engine: Engine
    graphdef: Any
    params: Any
    eos_ids: tuple[int, ...] = ()
    description: str = ""  # how a memory refusal names it: method, integer options, batch and budget
    # a server's slots step drafted or plain per chunk (`jaxspec.runtime.step_modes`): the server's `auto`
    step_modes: bool = False

    @property
    def key(self) -> tuple:
        """What decides the compiled programs (weights are arguments, not constants)."""
        return (self.engine, self.eos_ids, self.step_modes)

    @property
    def label(self) -> str:
        """The method and its plain options (numbers, switches; not a drafter's folder)."""
        settings = ", ".join(f"{k}={v}" for k, v in self.options.as_dict().items()
                             if isinstance(v, (int, float, bool)) and v is not None)
        return f"{self.name} ({settings})" if settings else self.name

    @property
    def bound(self) -> bool:
        """Whether a drafter's graph travels with the target's (the compile key must say so)."""
        return isinstance(self.graphdef, tuple)

    @property
    def lp_devices(self) -> int:
        return getattr(self.options, "lp_devices", 1)


def resolve(model, method: str, method_options: dict) -> tuple[str, Any, Any]:
    """(canonical name, `Method`, options) of `method` for `model`: unknown names and options
    refused, the options left None filled from the package's files. The first half of a plan,
    apart so that a caller checks the method before the rest of its request."""
    return resolve_method(method, model.config, method_options, FileDefaults(model))


def plan_decode(model, method: str | tuple, method_options: dict | None = None, *, greedy: bool,
                penalties: bool = False, logprobs: int = -1, batch: int, prompt_len: int, max_new_tokens: int,
                eos_ids: tuple[int, ...] = (), where: str = "", cache_copies: int = 0) -> DecodePlan:
    """Resolve `method` with `method_options` (or take what `resolve` gave), build its engine
    (greedy verification iff `greedy`; `penalties`, `logprobs` = the most reported, -1 none)
    and refuse, in one line, a plan whose `batch` rows of `prompt_len` + `max_new_tokens`
    cannot fit (`where` completes the refusal's description; `cache_copies`: copies of the KV
    cache a step makes besides, as a server's slot group does of the rows and positions a chunk
    reads)."""
    name, spec, options = method if isinstance(method, tuple) else resolve(model, method, method_options or {})
    engine = dataclasses.replace(spec.engine(options, greedy), penalties=penalties, logprobs=logprobs)
    what = memory.describe(name, options, batch, max_new_tokens) + where
    memory.guard_options(model, engine, what, batch, prompt_len, max_new_tokens, cache_copies)
    graphdef, params = bind(model, engine, options)
    return DecodePlan(name=name, options=options, engine=engine, graphdef=graphdef, params=params, eos_ids=eos_ids,
                      description=what)
