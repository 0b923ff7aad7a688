"""One `DecodePlan` per request shape: the method resolved to its engine and the program's
weights, checked by the memory guard before anything is compiled; and its `Program`, the shapes
its compiled programs run at.

`generate` / `stream` (one request) and the server (`jaxspec.serving`: B slots of a context)
both plan with `plan_decode`, take the plan's `program(...)` (cache length, prompt buffer, static
arguments, compile keys, device placement, the exact-size memory check), then run the same engine
API (`jaxspec.decoding.methods`: `begin`, `advance`, `decode`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from jaxspec.checkpoint.method_defaults import FileDefaults
from jaxspec.decoding.engine import Engine
from jaxspec.decoding.lookahead_parallel import block_for
from jaxspec.decoding.methods import begin, bind, resolve_method
from jaxspec.models.meshes import lp_mesh, lp_params, replicate
from jaxspec.models.tensor_parallel import MODEL_AXIS, place_inputs
from jaxspec.runtime import compile_cache, memory


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

    def program(self, model, *, batch: int, prompt_len: int, max_new_tokens: int, context: int | None = None,
                rungs: int | None = None) -> "Program":
        """The programs of `batch` rows whose prompts are at most `prompt_len` tokens and whose
        replies at most `max_new_tokens`: the prompt buffer is `prompt_bucket(prompt_len)`, the cache
        holds it and the reply. `context`: prompt and reply share `context` positions (a server's
        slots). `rungs`: the cache is one of `context_cache_len`'s rungs from `rungs` on, and the
        prompt buffer the rung less the reply (a conversation's turns, `auto`'s settings: requests of
        any prompt length up to the rung run one program). Under LP the block is picked here, once."""
        buffer = prompt_bucket(prompt_len)
        cache_len = self.engine.cache_length(buffer + max_new_tokens if context is None else context)
        if rungs is not None:
            most = self.engine.cache_length(model.config.max_position_embeddings)
            cache_len = context_cache_len(cache_len, most, rungs)
            buffer = cache_len - max_new_tokens
        tensor_parallel = 1
        if self.lp_devices > 1 and model.mesh is not None:  # LP x TP: LP groups of the model's TP degree
            tensor_parallel = lp_params(model, self.lp_devices)[0].shape[MODEL_AXIS]
        return Program(plan=self, batch=batch, prompt_len=buffer, max_new_tokens=max_new_tokens, cache_len=cache_len,
                       block=block_for(self.lp_devices, tensor_parallel))


def compile_key(program: str, shape: tuple, statics: dict, graphdef, bound: bool) -> tuple:
    """The key of a compiled program in `Model.compiled`: its name, the prompt buffer's shape, its
    static arguments and (a drafter bound) the graph definitions, hashed once per object."""
    return (program, shape, tuple(statics.items()), compile_cache.graph_key(graphdef) if bound else None)


@dataclasses.dataclass(frozen=True)
class Program:
    """A plan at fixed shapes: what `generate`, `stream` and a server's slot group compile and run.
    The one place that fixes the cache length, the prompt buffer, the static arguments, the
    compile keys, where the inputs live and the exact-size memory check."""

    plan: DecodePlan
    batch: int
    prompt_len: int  # the prompt buffer every row is padded to
    max_new_tokens: int  # the output buffer (a server's slots: their context)
    cache_len: int
    block: Any  # where each step runs (`jaxspec.decoding.lookahead_parallel.block_for`)

    @property
    def statics(self) -> dict:
        """`decode`'s and `begin`'s static arguments."""
        return dict(engine=self.plan.engine, max_new_tokens=self.max_new_tokens, cache_len=self.cache_len,
                    eos_ids=self.plan.eos_ids, block=self.block)

    @property
    def step_statics(self) -> dict:
        """`advance`'s static arguments (the shapes come with its state)."""
        return dict(engine=self.plan.engine, eos_ids=self.plan.eos_ids, block=self.block)

    def key(self, name: str, *more) -> tuple:
        """The compile key of this program's `name` program (`more`: what else decides it)."""
        return (*compile_key(name, (self.batch, self.prompt_len), self.statics, self.plan.graphdef,
                             self.plan.bound), *more)

    def padded(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """The prompts right-padded to the buffer, and their lengths."""
        prompts = np.zeros((len(rows), self.prompt_len), np.int32)
        for i, r in enumerate(rows):
            prompts[i, : len(r)] = r
        return prompts, np.asarray([len(r) for r in rows], np.int32)

    def arguments(self, model, rows: list[list[int]], seed: int, sampling) -> tuple:
        """`decode`'s / `begin`'s arguments, placed: the weights as they are (tensor parallelism:
        GSPMD partitions the program from their layouts), replicated on the `lp` mesh under LP, split
        within each LP group under LP x TP."""
        # (placed and wrapped, not made by jnp or jax.random.key: each would compile a tiny program per
        # process; threefry's `key(seed)` is the data [0, seed] for a seed below 2**32)
        threefry = jax.config.jax_default_prng_impl == "threefry2x32"
        key = jax.random.wrap_key_data(np.array([0, seed], np.uint32)) if threefry else jax.random.key(seed)
        prompts, lengths = self.padded(rows)
        inputs = (jax.device_put(prompts), jax.device_put(lengths), key, sampling)
        graphdef, params, lp = self.plan.graphdef, self.plan.params, self.plan.lp_devices
        if lp > 1 and model.mesh is not None:
            mesh, target = lp_params(model, lp)
            params = target if params is model.params else (target, replicate(params[1], mesh))
            return (graphdef, params, *replicate(inputs, mesh))
        if lp > 1:
            return (graphdef, *replicate((params, *inputs), lp_mesh(lp)))
        if model.mesh is not None:
            return (graphdef, params, *place_inputs(model.mesh, *inputs))
        return (graphdef, params, *inputs)

    def check_memory(self, model, args: tuple) -> memory.MemoryEstimate:
        """The exact-size check (the loop state traced, never compiled; cached per program shape):
        refused in one line when it cannot fit; the estimate, for `GenerateOutput.memory`."""
        return memory.guard_program(model, self.key("memory"), args, self.statics, self.plan.description, begin)


def resolve(model, method: str, method_options: dict) -> tuple[str, Any, Any]:
    """(canonical name, `Method`, options) of `method` for `model`: unknown names and options
    refused, the options left None filled from the package's files. The first half of a plan,
    apart so that a caller checks the method before the rest of its request."""
    return resolve_method(method, model.config, method_options, FileDefaults(model))


def plan_decode(model, method: str | tuple, method_options: dict | None = None, *, greedy: bool,
                penalties: bool = False, logprobs: int = -1, batch: int, prompt_len: int, max_new_tokens: int,
                eos_ids: tuple[int, ...] = (), where: str = "", cache_copies: float = 0) -> DecodePlan:
    """Resolve `method` with `method_options` (or take what `resolve` gave), build its engine
    (greedy verification iff `greedy`; `penalties`, `logprobs` = the most reported, -1 none)
    and refuse, in one line, a plan whose `batch` rows of `prompt_len` + `max_new_tokens`
    cannot fit (`where` completes the refusal's description; `cache_copies`: copies of the KV
    cache a step makes besides, a fraction where it copies part of it, as a server's slot group
    does of the rows and positions a chunk reads)."""
    name, spec, options = method if isinstance(method, tuple) else resolve(model, method, method_options or {})
    engine = dataclasses.replace(spec.engine(options, greedy), penalties=penalties, logprobs=logprobs)
    what = memory.describe(name, options, batch, max_new_tokens) + where
    memory.guard_options(model, engine, what, batch, prompt_len, max_new_tokens, cache_copies)
    graphdef, params = bind(model, engine, options)
    return DecodePlan(name=name, options=options, engine=engine, graphdef=graphdef, params=params, eos_ids=eos_ids,
                      description=what)
