"""Continuous batching in fixed shapes: B decode slots of one engine in one compiled program.

Each slot holds the whole loop state of ONE request, exactly as `jaxspec.generate` builds it
for that request alone (batch 1): the slots' state is those single-request states stacked on
a leading axis, and a step is the engine's step under `jax.vmap`. So every row computes what
the request computes alone (its own random key, its own sampling knobs, its own tree), which
is what makes serving lossless per request whatever else is in flight.

Three programs, none recompiled while serving:

* `start` (one per prompt bucket): prefill + first token + sources' state of one request
  (`jaxspec.methods.begin`, batch 1), with buffers sized by the prompt (the n-gram pool's copy
  of the text) padded to the slots' shapes;
* `insert`: writes that state into one slot row (the stacked state is donated: in place);
* `advance`: up to `chunk_steps` vmapped engine steps, until every slot is done. A row stops
  at EOS (static, the group's `eos_ids`) or at its own token limit (an argument); a free slot
  has limit 0, so it is done and its row's updates are masked, as a finished row's are.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.decoding import engine as engine_lib
from jaxspec.decoding.engine import Engine, EngineState
from jaxspec.methods import begin
from jaxspec.sampling import SamplingParams


def prompt_bucket(length: int) -> int:
    """Padded prompt length: powers of two from 32, so a server compiles a handful of prefills."""
    return max(32, 1 << (length - 1).bit_length())


def _pad_to(x, like: jax.ShapeDtypeStruct):
    """`x` zero-padded at the end of each axis to `like`'s shape (buffers sized by the prompt:
    nothing reads past their valid length, so the padding is never seen)."""
    if x.shape == like.shape:
        return x
    if len(x.shape) != len(like.shape) or any(a > b for a, b in zip(x.shape, like.shape)):
        raise ValueError(f"slot state leaf {x.shape} does not fit the slot shape {like.shape}")
    return jnp.pad(x, [(0, b - a) for a, b in zip(x.shape, like.shape)])


def _start(graphdef, params, prompts, lengths, rng, sampling, *, engine: Engine, max_new_tokens: int, cache_len: int,
           eos_ids: tuple[int, ...], shapes) -> EngineState:
    state = begin(graphdef, params, prompts, lengths, rng, sampling, engine=engine, max_new_tokens=max_new_tokens,
                  cache_len=cache_len, eos_ids=eos_ids)
    return jax.tree.map(_pad_to, state, shapes)


def _fields(sampling: SamplingParams):
    return [(f.name, getattr(sampling, f.name)) for f in dataclasses.fields(sampling)]


def _insert(slots: EngineState, one: EngineState, slot) -> EngineState:
    return jax.tree.map(lambda rows, row: rows.at[slot].set(row), slots, one)


def _advance(graphdef, params, slots: EngineState, sampling: SamplingParams, limit, *, engine: Engine,
             eos_ids: tuple[int, ...], chunk_steps: int) -> EngineState:
    model, weights = engine.load(graphdef, params)
    block = engine_lib.LocalBlock()

    def one(state: EngineState, knobs: SamplingParams, row_limit) -> EngineState:
        state = engine_lib.step(engine, model, weights, block, state, knobs, eos_ids)
        d = state.decode
        return state.replace(decode=d.replace(done=d.done | (d.num_generated >= row_limit)))

    step = jax.vmap(one)

    def cond(carry):
        i, state = carry
        return (i < chunk_steps) & jnp.any(~state.decode.done)

    # A free slot (limit 0) is done before the first step: its row is masked, never decoded.
    slots = slots.replace(decode=slots.decode.replace(done=slots.decode.done | (limit[:, None] <= 0)))
    return jax.lax.while_loop(cond, lambda c: (c[0] + 1, step(c[1], sampling, limit)), (jnp.int32(0), slots))[1]


@dataclasses.dataclass
class SlotView:
    """One slot's row as the host sees it after a chunk."""

    tokens: np.ndarray  # [num] generated ids so far
    done: bool
    steps: int  # model forwards while the row was active (prefill included)


class SlotGroup:
    """B slots decoding with one engine (one method, greedy or sampled) and one set of
    end-of-sequence ids. Not thread-safe: one scheduler thread drives it."""

    def __init__(self, model, engine: Engine, graphdef, params, *, slots: int, context: int,
                 eos_ids: tuple[int, ...], chunk_steps: int):
        self.model, self.engine, self.graphdef, self.params = model, engine, graphdef, params
        self.slots, self.context, self.eos_ids, self.chunk_steps = slots, context, eos_ids, chunk_steps
        # A request's prompt + output fit in `context` positions; the output buffer holds up to
        # `context` tokens, the cache one step's commit more.
        self.max_new_tokens = context
        self.cache_len = -(-(context + engine.max_commit) // 64) * 64
        self.compile_seconds = 0.0
        self._programs: dict[Any, Any] = {}
        self._sampling0 = SamplingParams.create()
        widest = self._start_args(np.zeros(prompt_bucket(context), np.int32), 1, 0, self._sampling0)
        shapes = jax.eval_shape(lambda *a: begin(*a, **self._begin_statics()), *widest)
        self.row_shapes = shapes
        empty = self._start_program(prompt_bucket(1))(*self._start_args(np.zeros(prompt_bucket(1), np.int32), 1, 0,
                                                                           self._sampling0))
        stacked = jax.tree.map(lambda x: jnp.broadcast_to(x, (slots, *x.shape)), empty)
        self.state = stacked.replace(decode=stacked.decode.replace(done=jnp.ones((slots, 1), bool)))
        self.limit = np.zeros(slots, np.int32)
        self.sampling = {k: np.zeros(slots, v.dtype) for k, v in _fields(self._sampling0)}

    # ----------------------------------------------------------------------------- programs
    def _begin_statics(self) -> dict:
        return dict(engine=self.engine, max_new_tokens=self.max_new_tokens, cache_len=self.cache_len,
                    eos_ids=self.eos_ids)

    def _start_args(self, padded: np.ndarray, length: int, seed: int, sampling: SamplingParams) -> tuple:
        return (self.graphdef, self.params, jnp.asarray(padded[None]), jnp.asarray([length], jnp.int32),
                jax.random.key(seed), sampling)

    def _compile(self, key, fn, args: tuple, statics: dict, **jit_options):
        if key not in self._programs:
            t0 = time.perf_counter()
            self._programs[key] = jax.jit(fn, static_argnames=tuple(statics), **jit_options).lower(
                *args, **statics).compile()
            self.compile_seconds += time.perf_counter() - t0
        return self._programs[key]

    def _start_program(self, bucket: int):
        args = self._start_args(np.zeros(bucket, np.int32), 1, 0, self._sampling0)
        # (the slot shapes are a pytree, not hashable: bound, not static)
        fn = functools.partial(_start, shapes=self.row_shapes)
        return self._compile(("start", bucket), fn, args, self._begin_statics())

    def warm(self, buckets: tuple[int, ...] = ()) -> None:
        """Compile the slot programs (and the prefills of `buckets`) before the first request."""
        for b in buckets:
            self._start_program(b)
        self._insert_program(self.row_shapes)
        self._advance_program()

    def _insert_program(self, one: EngineState):
        return self._compile(("insert",), _insert, (self.state, one, jnp.int32(0)), {}, donate_argnums=(0,))

    def _advance_program(self):
        statics = dict(engine=self.engine, eos_ids=self.eos_ids, chunk_steps=self.chunk_steps)
        args = (self.graphdef, self.params, self.state, self._sampling_arrays(), jnp.asarray(self.limit))
        return self._compile(("advance",), _advance, args, statics, donate_argnums=(2,))

    def _sampling_arrays(self) -> SamplingParams:
        return SamplingParams(**{k: jnp.asarray(v) for k, v in self.sampling.items()})

    # ----------------------------------------------------------------------------- serving
    def insert(self, slot: int, prompt: list[int], limit: int, seed: int, sampling: SamplingParams) -> None:
        """Prefill `prompt` alone and put its state in `slot`; the row decodes from the next
        `advance` until EOS or `limit` new tokens."""
        if not 0 < limit <= self.max_new_tokens or len(prompt) + limit > self.context:
            raise ValueError(f"prompt ({len(prompt)}) + limit ({limit}) does not fit the slot's {self.context}")
        bucket = prompt_bucket(len(prompt))
        padded = np.zeros(bucket, np.int32)
        padded[:len(prompt)] = prompt
        one = self._start_program(bucket)(*self._start_args(padded, len(prompt), seed, sampling))
        self.state = self._insert_program(one)(self.state, one, jnp.int32(slot))
        self.limit[slot] = limit
        for k, v in _fields(sampling):
            self.sampling[k][slot] = np.asarray(v)

    def release(self, slot: int) -> None:
        """Free `slot`: its row is masked from the next `advance` on."""
        self.limit[slot] = 0

    @property
    def busy(self) -> bool:
        return bool((self.limit > 0).any())

    def advance(self) -> list[SlotView]:
        """Up to `chunk_steps` steps of every busy slot; each slot's row afterwards (one host sync)."""
        self.state = self._advance_program()(self.graphdef, self.params, self.state, self._sampling_arrays(),
                                             jnp.asarray(self.limit))
        return self.read()

    def read(self) -> list[SlotView]:
        d = self.state.decode
        tokens, num, done, steps = jax.device_get((d.tokens, d.num_generated, d.done, d.steps))
        views = []
        for i in range(self.slots):
            n = min(int(num[i, 0]), int(self.limit[i]))
            views.append(SlotView(tokens=np.array(tokens[i, 0, :n]), done=bool(done[i, 0]) or n >= self.limit[i],
                                  steps=int(steps[i, 0])))
        return views
