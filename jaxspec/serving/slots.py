"""Continuous batching in fixed shapes: B decode slots of one engine in one compiled program.

Each slot holds the loop state of ONE request, built exactly as `jaxspec.generate` builds it
for that request alone (batch 1), so every row computes what the request computes alone:

* greedy engines (every draft verified by argmax) keep the slots as the engine's own batch:
  rows of a batched state are independent, and a step is the engine's batched step;
* sampled engines need each row's own random key and sampling knobs, which a batched state
  shares: their slots are single-request states stacked on a leading axis, and a step is the
  engine's step under `jax.vmap` (slower per row on a CPU, but the same draws as alone).

Four programs, none recompiled while serving:

* `start` (one for every prompt: the prompt is padded to the context and prefilled in chunks,
  `jaxspec.decoding.prefill`, at a cost that follows its length): prefill + first token +
  sources' state of one request (`jaxspec.decoding.methods.begin`, batch 1);
* `insert`: writes that state into one slot's row (the slots' state is donated: in place);
* `advance`: the engine's `advance` (the loop `generate` and `stream` run): up to `chunk_steps`
  steps, until every busy slot is done. A row stops at
  EOS (static, the group's `eos_ids`) or at its own token limit (an argument); a free slot
  has limit 0, so it is done and its row's updates are masked, as a finished row's are. It
  is compiled per tier of rows (1, 2, 4, ... slots) and steps the first rows only; the
  scheduler keeps the busy slots first (`move`), so one request in flight costs one row;
* `move`: copies a slot's row into a free slot.

The slots' state holds as many cache positions as the busy rows may reach (`lengths`: 256, 512,
... the context), not the context: it grows before a chunk or an insert needs more and shrinks
when the rows that needed it are gone (`resize`, one copy), so a server of short requests holds a
cache of their size. `insert`, `move` and `advance` are compiled per state length (and `advance`
per tier of rows); positions past a length are never read by a row that fits it, so nothing is
lost when the state shrinks.

A group given `StepModes` (`jaxspec.runtime.step_modes`: the server's `auto`, an engine that drafts
and `Engine.steps_plain`) has `advance` twice per tier and length: drafted steps and plain steps
over the same state. Before each chunk it picks the mode predicted faster from what the chunks
measured: a step's cost per mode at the busy rows' tier, and each busy row's recent acceptance.

With a `Background` worker (`jaxspec.runtime.background`; the server's), no program compiles on
the caller's thread once the group is built: `admits` says whether a request's programs are
ready (and queues what is missing), and `advance` runs the smallest compiled `advance` that
covers the busy rows and their cache (a larger tier or length computes the same rows), queuing
the exact one for later chunks. Without one, programs compile where they are first needed.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.runtime import compile_cache
from jaxspec.decoding.engine import Engine, EngineState, accept_histogram
from jaxspec.decoding.methods import advance, begin
from jaxspec.decoding.sampling import SamplingParams
from jaxspec.runtime.plan import DecodePlan
from jaxspec.runtime.step_modes import MODES, Acceptance, StepModes


# The largest slot state a group keeps a copy of, to run its programs once before they serve.
SCRATCH_BYTES = 256 << 20


def corner_share(model) -> float:
    """The largest share of the slots' state one chunk copies, for the memory guard. A corner of fewer
    rows than the slots (`_corner`) is copied; with the layers scanned the largest is half the state
    (half the slots, the state grown to the whole cache) and a chunk of every slot updates the state
    in place; unrolled, counted as a whole copy.
    Measured (SmolLM2, 8 slots x 2112, XLA's memory analysis of each `advance`): scanned, the 4-slot
    chunk over the whole cache 438 MB of temporaries, the 8-slot one 59 MB, the state 817 MB;
    unrolled, the warm-up's programs' largest 797 MB (about the whole state)."""
    return 0.5 if model.layer_scan else 1.0


def _pad_to(x, like: jax.ShapeDtypeStruct):
    """`x` zero-padded at the end of each axis to `like`'s shape (buffers sized by the prompt:
    nothing reads past their valid length, so the padding is never seen)."""
    if x.shape == like.shape:
        return x
    if len(x.shape) != len(like.shape) or any(a > b for a, b in zip(x.shape, like.shape)):
        raise ValueError(f"slot state leaf {x.shape} does not fit the slot shape {like.shape}")
    return jnp.pad(x, [(0, b - a) for a, b in zip(x.shape, like.shape)])


def _start(graphdef, params, prompts, lengths, rng, sampling, *, shapes, **statics) -> EngineState:
    state = begin(graphdef, params, prompts, lengths, rng, sampling, **statics)
    return jax.tree.map(_pad_to, state, shapes)


def _resized(x, axis: int, length: int):
    """`x` cut, or zero-padded at the end, to `length` along `axis` (-1: kept)."""
    if axis < 0 or x.shape[axis] == length:
        return x
    if x.shape[axis] > length:
        return jax.lax.slice_in_dim(x, 0, length, axis=axis)
    return jnp.pad(x, [(0, length - n if i == axis else 0) for i, n in enumerate(x.shape)])


def _resize(slots: EngineState, *, length_axes, length: int) -> EngineState:
    return jax.tree.map(lambda x, la: _resized(x, la, length), slots, length_axes)


def _differing_axis(a, b):
    """Per leaf, the first axis where the shapes of `a` and `b` differ (-1: none)."""
    return jax.tree.map(lambda x, y: next((i for i, (m, n) in enumerate(zip(x.shape, y.shape)) if m != n), -1), a, b)


def _fields(sampling: SamplingParams):
    return [(f.name, getattr(sampling, f.name)) for f in dataclasses.fields(sampling)]


# Slot layouts: each leaf's row axis (-1: a leaf without one, e.g. a batched state's one key).
def _rows(x, axis: int, start, n: int):
    return x if axis < 0 else jax.lax.dynamic_slice_in_dim(x, start, n, axis)


def _set_rows(x, part, axis: int, start):
    return part if axis < 0 else jax.lax.dynamic_update_slice_in_dim(x, part, start, axis)


def _insert(slots: EngineState, one: EngineState, slot, *, axes, row_length_axes, per_row: bool) -> EngineState:
    """`one` (a request's state at the whole cache) written into `slot`, cut to the slots' length."""
    def put(rows, row, axis, length_axis):
        if axis < 0:  # (a batched state's shared key: greedy engines never draw from it)
            return rows
        row = _resized(row, length_axis, rows.shape[length_axis + per_row] if length_axis >= 0 else 0)
        return _set_rows(rows, row[None] if per_row else row, axis, slot)

    return jax.tree.map(put, slots, one, axes, row_length_axes)


def _move(slots: EngineState, src, dst, *, axes) -> EngineState:
    return jax.tree.map(lambda x, a: _set_rows(x, _rows(x, a, src, 1), a, dst), slots, axes)


def _corner(x, row_axis: int, rows: int, length_axis: int, length: int):
    """The leading block of a leaf: its first `rows` rows and `length` cache positions."""
    limit = list(x.shape)
    if row_axis >= 0:
        limit[row_axis] = rows
    if length_axis >= 0:
        limit[length_axis] = length
    return jax.lax.slice(x, (0,) * x.ndim, tuple(limit))


def _advance(graphdef, params, slots: EngineState, sampling: SamplingParams, limit, *, engine: Engine,
             eos_ids: tuple[int, ...], chunk_steps: int, rows: int, length: int, axes, length_axes,
             per_row: bool, plain: bool = False) -> EngineState:
    """The engine's `advance` (the loop `generate` and `stream` run) over the first `rows` slots of
    the state, which holds `length` cache positions (`SlotGroup.length`: the busy rows' caches end
    before it): attention costs the cache it reads, not the context's. A free slot (limit 0) is
    masked, never decoded.
    `plain`: steps without drafts over the same state (`jaxspec.decoding.engine.plain_step`)."""
    part = jax.tree.map(lambda x, a, la: _corner(x, a, rows, la, length), slots, axes, length_axes)
    part = advance(graphdef, params, part, sampling, jnp.int32(chunk_steps), engine=engine, eos_ids=eos_ids,
                   row_limit=limit, per_row=per_row, plain=plain)
    return jax.tree.map(lambda x, y: jax.lax.dynamic_update_slice(x, y, (0,) * x.ndim), slots, part)


@dataclasses.dataclass
class SlotView:
    """One slot's row as the host sees it after a chunk."""

    tokens: np.ndarray  # [num] generated ids so far
    done: bool
    steps: int  # model forwards while the row was active (prefill included)
    # decoding steps (after the prefill) that emitted k tokens, k = 0 .. max_commit: the engine's
    # accept histogram of this row (a one-token engine: every step emitted 1)
    accept_histogram: np.ndarray | None = None
    # an engine with logprobs: per token, its log-probability, the top ids and theirs ([num], [num, k] x 2)
    logprobs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    plain_steps: int = 0  # of `steps`, those stepped without drafts (a group with `StepModes`)


class SlotGroup:
    """B slots decoding with one engine (one method, greedy or sampled) and one set of
    end-of-sequence ids. Not thread-safe: one scheduler thread drives it."""

    def __init__(self, model, plan: DecodePlan, *, slots: int, context: int, chunk_steps: int, compiler=None,
                 modes: StepModes | None = None):
        engine = plan.engine
        self.model, self.engine, self.graphdef, self.params = model, engine, plan.graphdef, plan.params
        self.slots, self.context, self.eos_ids, self.chunk_steps = slots, context, plan.eos_ids, chunk_steps
        # A request's prompt + output fit in `context` positions: the output buffer holds up to
        # `context` tokens, every prompt is padded to one buffer (`start`), the cache is the plan's.
        self.program = plan.program(model, batch=slots, prompt_len=context, max_new_tokens=context, context=context)
        self.max_new_tokens, self.cache_len, self.bucket = context, self.program.cache_len, self.program.prompt_len
        self.compile_seconds = 0.0
        self.compiler = compiler  # a `Background` that compiles off the scheduler's thread, or None
        self.stalls = 0  # chunks that had to compile on the caller's thread (no covering program yet)
        if modes is not None and not engine.steps_plain:
            raise ValueError("step modes need an engine that drafts and can step plain (Engine.steps_plain)")
        self.modes = modes  # drafted or plain, chunk by chunk (None: drafted, as the engine is)
        self.acceptance = Acceptance(slots)  # each slot's tokens per drafted step (what `modes` predicts from)
        # Programs live in the model's one program table (`Model.compiled`, as generate's), keyed
        # by what decides them: a group made again for the same plan finds them there.
        self._key = self.program.key("slots", chunk_steps)
        self._sampling0 = SamplingParams.create()
        # Greedy verification reads no randomness and no knob: the engine's own batch is exact
        # per row. Sampling and penalties read each row's own knobs (and sampling its own key).
        self.per_row = engine.verifier.sampled or engine.penalties
        self.row_shapes = self._shapes(1, self.cache_len)
        # Each leaf's row axis (where its shape at batch 2 differs from batch 1) and cache
        # axis (where it differs at another cache length); -1 where it has none.
        self.row_length_axes = _differing_axis(self.row_shapes, self._shapes(1, self.cache_len + 64))
        if self.per_row:  # (stacked: every leaf gains a leading row axis)
            self.axes = jax.tree.map(lambda _: 0, self.row_shapes)
            self.length_axes = jax.tree.map(lambda a: a + 1 if a >= 0 else a, self.row_length_axes)
        else:
            self.axes = _differing_axis(self.row_shapes, self._shapes(2, self.cache_len))
            self.length_axes = self.row_length_axes
        self.used = np.zeros(slots, np.int32)  # cache positions each slot's request may reach by the next read
        empty = self._start_program()(*self._start_args(np.zeros(self.bucket, np.int32), 1, 0, self._sampling0))
        self.length = self.lengths[0]  # the cache positions the slots' state holds now

        def tile(x, axis, length_axis):
            x = _resized(x, length_axis, self.length)
            if self.per_row:
                return jnp.broadcast_to(x, (slots, *x.shape))
            return x if axis < 0 else jnp.repeat(x, slots, axis)

        state = jax.tree.map(tile, empty, self.axes, self.row_length_axes)
        self.state = state.replace(decode=state.decode.replace(done=jnp.ones_like(state.decode.done)))
        # What the programs are lowered from, per length (the state itself is donated chunk after
        # chunk: another thread must not read it).
        self._shapes_at_first = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                             self.state)
        # A state to run each new program once on, off the scheduler's thread (on a CPU a program's first
        # run costs several of its later ones): every row live, so a chunk steps them all. Only where it is
        # small (a copy of the slots' caches is kept for it, at the first length; resized for a program
        # of another length where that stays small).
        # (its own buffers: the slots' state is donated from the first chunk on, and a first run may
        # come later, in the background)
        self._scratch = None if compiler is None or self._bytes(self.length) > SCRATCH_BYTES else jax.tree.map(
            jnp.copy, (state.replace(decode=state.decode.replace(done=jnp.zeros_like(state.decode.done))), empty))
        self.limit = np.zeros(slots, np.int32)
        self._inserted = False  # a request inserted since the last chunk (its prefill's memory: given back after it)
        self.prompt_len = np.zeros(slots, np.int32)
        self.generated = np.zeros(slots, np.int64)  # each slot's tokens at the last read
        self.steps = np.zeros(slots, np.int64)  # each slot's steps at the last read
        self.plain_steps = np.zeros(slots, np.int64)  # of those, plain ones (`modes`)
        self.sampling = {k: np.full(slots, v) for k, v in _fields(self._sampling0)}  # (free slots: neutral)

    def state_shapes(self, length: int):
        """The slots' state's shapes when it holds `length` cache positions."""
        def at(x, axis):
            shape = list(x.shape)
            if axis >= 0:
                shape[axis] = length
            return jax.ShapeDtypeStruct(tuple(shape), x.dtype, sharding=x.sharding)

        return jax.tree.map(at, self._shapes_at_first, self.length_axes)

    def _bytes(self, length: int) -> int:
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.state_shapes(length)))

    def _shapes(self, batch: int, cache_len: int):
        """The loop state's shapes for `batch` rows at the prompt buffer."""
        args = (self.graphdef, self.params, jax.ShapeDtypeStruct((batch, self.bucket), jnp.int32),
                jax.ShapeDtypeStruct((batch,), jnp.int32), jax.random.key(0), self._sampling0)
        statics = {**self._begin_statics(), "cache_len": cache_len}
        return jax.eval_shape(lambda *a: begin(*a, **statics), *args)

    # ----------------------------------------------------------------------------- programs
    def _begin_statics(self) -> dict:
        return self.program.statics

    def _start_args(self, padded: np.ndarray, length: int, seed: int, sampling: SamplingParams) -> tuple:
        return (self.graphdef, self.params, jnp.asarray(padded[None]), jnp.asarray([length], jnp.int32),
                jax.random.key(seed), sampling)

    def _compile(self, key, fn, args: tuple, statics: dict, **jit_options):
        program, seconds = compile_cache.compiled_into(self.model.compiled, (*self._key, *key), fn, args, statics,
                                                       **jit_options)
        self.compile_seconds += seconds
        return program

    def compiled(self, *key) -> bool:
        return (*self._key, *key) in self.model.compiled

    def _start_program(self):
        args = self._start_args(np.zeros(self.bucket, np.int32), 1, 0, self._sampling0)
        # (the slot shapes are a pytree, not hashable: bound, not static)
        fn = functools.partial(_start, shapes=self.row_shapes)
        return self._compile(("start",), fn, args, self._begin_statics())

    def warm(self, tiers: int | None = None) -> None:
        """Compile before the first request: insert and move at every state length, and `advance`
        of the first `tiers` tiers of rows (None: all) over the smallest cache length and over the
        whole cache (`start` compiled with the group).
        With a `Background` worker, the other tiers over the smallest length, and all slots over
        the whole cache, are queued to compile next: a chunk then always finds a covering program.
        (Not every tier over the whole cache: each program holds ~20-50 MB on this project's CPU
        (SmolLM2, layers scanned), and a tier of long requests is compiled when one comes, `_covering`.)"""
        for length in self.lengths:  # (small programs: a request of any length finds its insert and move)
            self._first_run(self._insert_program(length), "insert", length=length)
            self._first_run(self._move_program(length), "move", length=length)
        for rows in self.tiers[:tiers]:
            for length in (self.lengths[0], self.cache_len):  # a short request's, and one that covers any
                self._first_run(self.advance_program(rows, length), "advance", rows, length)
        if self.compiler is not None:
            for mode in self._modes:  # (plain steps after every drafted program: drafted serves alone)
                for rows in self.tiers:
                    self._queue(rows, self.lengths[0], mode)
                self._queue(self.tiers[-1], self.cache_len, mode)

    @property
    def _modes(self) -> tuple[str, ...]:
        return MODES if self.modes is not None else MODES[:1]

    def _queue(self, rows: int, length: int, mode: str = "drafted") -> None:
        if not self.compiled("advance", rows, length, mode):
            self.compiler.submit((self._key, "advance", rows, length, mode),
                                 lambda: self._first_run(self.advance_program(rows, length, mode), "advance", rows,
                                                         length))

    def _first_run(self, program, kind: str, rows: int = 0, length: int = 0) -> None:
        """Run a new program once on the scratch state (see `__init__`) resized to the program's
        `length`, when the group keeps one and that stays small."""
        if self._scratch is None or self._bytes(length) > SCRATCH_BYTES:
            return
        state, row = self._scratch
        # (copies: the programs donate)
        state = jax.tree.map(jnp.copy, _resize(state, length_axes=self.length_axes, length=length))
        row = jax.tree.map(jnp.copy, row)
        if kind == "insert":
            out = program(state, row, jnp.int32(0))
        elif kind == "move":
            out = program(state, jnp.int32(0), jnp.int32(0))
        else:
            out = program(self.graphdef, self.params, state, self._sampling_arrays(rows), jnp.ones(rows, jnp.int32))
        jax.block_until_ready(out)

    # (the slot axes are a pytree, not hashable: bound with partial, not static)
    def _insert_program(self, length: int):
        fn = functools.partial(_insert, axes=self.axes, row_length_axes=self.row_length_axes, per_row=self.per_row)
        # (shapes stand for the arrays when lowering)
        return self._compile(("insert", length), fn, (self.state_shapes(length), self.row_shapes, jnp.int32(0)), {},
                             donate_argnums=(0,))

    def advance_program(self, rows: int, length: int, mode: str = "drafted"):
        """The `advance` of the first `rows` rows of the state at `length` cache positions."""
        statics = dict(engine=self.engine, eos_ids=self.eos_ids, chunk_steps=self.chunk_steps, rows=rows,
                       length=length, plain=mode == "plain")
        args = (self.graphdef, self.params, self.state_shapes(length), self._sampling_arrays(rows),
                jax.ShapeDtypeStruct((rows,), jnp.int32))
        fn = functools.partial(_advance, axes=self.axes, length_axes=self.length_axes, per_row=self.per_row)
        return self._compile(("advance", rows, length, mode), fn, args, statics, donate_argnums=(2,))

    def _move_program(self, length: int):
        fn = functools.partial(_move, axes=self.axes)
        return self._compile(("move", length), fn, (self.state_shapes(length), jnp.int32(0), jnp.int32(0)), {},
                             donate_argnums=(0,))

    def _resize_to(self, length: int) -> None:
        """The state grown or cut to `length` cache positions (one copy; a small program per pair of
        lengths, compiled where first needed)."""
        if length == self.length:
            return
        fn = functools.partial(_resize, length_axes=self.length_axes, length=length)
        # (not donated: no buffer of the old length can hold the new one)
        program = self._compile(("resize", self.length, length), fn, (self.state_shapes(self.length),), {})
        self.state, self.length = program(self.state), length

    def _exact(self, rows: int, reach: int) -> tuple[int, int]:
        """The (tier, length) of a chunk of the first `rows` rows reaching `reach` cache positions."""
        return (next(t for t in self.tiers if t >= rows),
                next(n for n in self.lengths if n >= min(reach, self.cache_len)))

    def _compiled_covering(self, tier: int, length: int, mode: str) -> list[tuple[int, int]]:
        return sorted(((t, n) for t in self.tiers for n in self.lengths
                       if t >= tier and n >= length and self.compiled("advance", t, n, mode)),
                      key=lambda tn: tn[0] * tn[1])

    def _covering(self, rows: int, reach: int, mode: str = "drafted") -> tuple[int, int]:
        """The (tier, length) a chunk of the first `rows` rows reaching `reach` cache positions
        runs: the exact one when compiled (or with no worker: compiled now), else the smallest
        compiled that covers it, the exact one queued. Nothing compiled covers it: compiled now (a
        stall, counted)."""
        tier, length = self._exact(rows, reach)
        if self.compiler is None or self.compiled("advance", tier, length, mode):
            return tier, length
        self._queue(tier, length, mode)
        covering = self._compiled_covering(tier, length, mode)
        if covering:
            return covering[0]
        self.stalls += 1
        return tier, length

    def admits(self, slot: int, prompt_len: int, limit: int) -> bool:
        """Whether a request of `prompt_len` tokens and at most `limit` new ones put in `slot`
        finds a compiled `advance` for every chunk until it and the busy rows are done (one of
        their tier or more, over the cache they may reach at the end); always, without a worker.
        What is missing is queued."""
        if self.compiler is None:
            return True
        busy = np.flatnonzero(self.limit > 0)
        rows = max(int(busy[-1]) + 1 if busy.size else 0, slot + 1)
        ends = [self._reach(int(self.prompt_len[i]), int(self.limit[i])) for i in busy]
        tier, length = self._exact(rows, max([*ends, self._reach(prompt_len, limit)]))
        ready = bool(self._compiled_covering(tier, length, "drafted"))
        if not ready and (self._key, "advance", tier, length, "drafted") in self.compiler.failed:
            return True  # compiled where it runs, and its error reported there (`Scheduler._guarded`)
        if not ready:
            self._queue(tier, length)
        return ready

    @property
    def tiers(self) -> list[int]:
        """The row counts `advance` is compiled for: powers of two, then all slots."""
        return sorted({min(1 << k, self.slots) for k in range(self.slots.bit_length() + 1)})

    @property
    def lengths(self) -> list[int]:
        """The cache lengths `advance` is compiled for: 256, 512, ... then the whole cache."""
        return sorted({min(256 << k, self.cache_len) for k in range(max(self.cache_len // 256, 1).bit_length() + 1)})

    def _reach(self, prompt_len: int, generated: int) -> int:
        """Cache positions a request may use by the end of the next chunk (each step commits at
        most `max_commit`; one step's more for the sources' look-ahead)."""
        return prompt_len + generated + (self.chunk_steps + 1) * self.engine.max_commit

    def _sampling_arrays(self, rows: int) -> SamplingParams:
        if not self.per_row:  # (greedy: the knobs are not read)
            return self._sampling0
        return SamplingParams(**{k: jnp.asarray(v[:rows]) for k, v in self.sampling.items()})

    # ----------------------------------------------------------------------------- serving
    def insert(self, slot: int, prompt: list[int], limit: int, seed: int, sampling: SamplingParams) -> None:
        """Prefill `prompt` alone and put its state in `slot`; the row decodes from the next
        `advance` until EOS or `limit` new tokens."""
        if not 0 < limit <= self.max_new_tokens or len(prompt) + limit > self.context:
            raise ValueError(f"prompt ({len(prompt)}) + limit ({limit}) does not fit the slot's {self.context}")
        padded = np.zeros(self.bucket, np.int32)
        padded[:len(prompt)] = prompt
        one = self._start_program()(*self._start_args(padded, len(prompt), seed, sampling))
        self._resize_to(max(self.length, self._exact(1, self._reach(len(prompt), 1))[1]))
        self.state = self._insert_program(self.length)(self.state, one, jnp.int32(slot))
        self.limit[slot] = limit
        self.prompt_len[slot] = len(prompt)
        self.generated[slot] = self.steps[slot] = self.plain_steps[slot] = 0
        self.used[slot] = self._reach(len(prompt), 1)
        self.acceptance.start(slot)
        self._inserted = True
        for k, v in _fields(sampling):
            self.sampling[k][slot] = np.asarray(v)

    def release(self, slot: int) -> None:
        """Free `slot`: its row is masked from the next `advance` on."""
        self.limit[slot] = 0

    @property
    def busy(self) -> bool:
        return bool((self.limit > 0).any())

    def move(self, src: int, dst: int) -> None:
        """Move the request in slot `src` to the free slot `dst` (to keep busy slots first)."""
        self.state = self._move_program(self.length)(self.state, jnp.int32(src), jnp.int32(dst))
        self.limit[dst], self.limit[src] = self.limit[src], 0
        self.used[dst], self.prompt_len[dst] = self.used[src], self.prompt_len[src]
        for v in (self.generated, self.steps, self.plain_steps):
            v[dst] = v[src]
        self.acceptance.move(src, dst)
        for v in self.sampling.values():
            v[dst] = v[src]

    def advance(self) -> list[SlotView]:
        """Up to `chunk_steps` steps of the busy slots (the smallest tier holding the last busy
        slot, over the state resized to the length the program reads), drafted or plain (`modes`);
        each slot's row afterwards (one host sync)."""
        busy = self.limit > 0
        last = int(np.flatnonzero(busy)[-1]) + 1 if busy.any() else 1
        reach = int(self.used[busy].max()) if busy.any() else 1
        mode = "drafted"
        exact = self._exact(last, reach)
        if self.modes is not None:
            # A mode whose own program is not compiled yet is not picked (a larger covering program
            # would run it slower, unmeasured): its program is queued meanwhile.
            ready = set()
            for m in MODES:
                if self.compiler is None or self.compiled("advance", *exact, m):
                    ready.add(m)
                else:
                    self._queue(*exact, m)
            rows_busy = np.flatnonzero(busy)
            mode = self.modes.pick(exact[0], ready, self.acceptance.expected(rows_busy), len(rows_busy))
        rows, length = self._covering(last, reach, mode)
        program = self.advance_program(rows, length, mode)
        resized = length != self.length
        self._resize_to(length)  # (the state holds what the program reads: grown, or cut to the busy rows')
        compiled, generated, steps = self.compile_seconds, self.generated.copy(), self.steps.copy()
        quiet = self.compiler is None or not self.compiler.busy()
        start = time.perf_counter()
        self.state = program(self.graphdef, self.params, self.state, self._sampling_arrays(rows),
                             jnp.asarray(self.limit[:rows]))
        views = self.read(plain=mode == "plain")
        seconds = time.perf_counter() - start
        if self._inserted:  # (the prefills' temporaries and rows at the whole cache are freed by now)
            compile_cache.give_back_freed_memory()
            self._inserted = False
        if self.modes is not None:
            for i in np.flatnonzero(busy):
                if mode == "drafted":
                    self.acceptance.add(i, int(self.generated[i] - generated[i]), int(self.steps[i] - steps[i]))
                else:
                    self.acceptance.aged(i)
            tokens = int((self.generated - generated)[busy].sum())
            self.modes.ran(mode, tokens, rows)
            # measured where the chunk ran its own program, nothing compiling (here or in the background)
            if (rows, length) == exact and compiled == self.compile_seconds and quiet and not resized:
                self.modes.record(exact[0], mode, int((self.steps - steps)[busy].max()), tokens, seconds)
        return views

    def read(self, plain: bool = False) -> list[SlotView]:
        """Each slot's row after a chunk (`plain`: a chunk of plain steps, counted per busy row)."""
        d = self.state.decode
        tokens, num, done, steps, histogram = (
            np.asarray(x).reshape(self.slots, -1)
            for x in jax.device_get((d.tokens, d.num_generated, d.done, d.steps,
                                     accept_histogram(self.engine, self.state))))
        logprobs = None
        if d.logprobs is not None:  # (the same host sync)
            lp = d.logprobs
            logprobs = [np.asarray(x).reshape((self.slots, -1) + x.shape[x.ndim - extra:])
                        for x, extra in zip(jax.device_get((lp.chosen, lp.top_ids, lp.top)), (0, 1, 1))]
        views = []
        for i in range(self.slots):
            n = min(int(num[i, 0]), int(self.limit[i]))
            self.used[i] = self._reach(int(self.prompt_len[i]), int(num[i, 0]))
            if self.limit[i] > 0:
                if plain:
                    self.plain_steps[i] += int(steps[i, 0]) - self.steps[i]
                self.generated[i], self.steps[i] = n, int(steps[i, 0])
            views.append(SlotView(tokens=np.array(tokens[i, :n]), done=bool(done[i, 0]) or n >= self.limit[i],
                                  steps=int(steps[i, 0]), accept_histogram=np.array(histogram[i]),
                                  logprobs=None if logprobs is None else tuple(np.array(x[i, :n]) for x in logprobs),
                                  plain_steps=int(self.plain_steps[i])))
        return views
