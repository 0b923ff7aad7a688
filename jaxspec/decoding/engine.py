"""The decoding engine: every method is a list of draft sources and a verifier.

One start-up and one loop serve every method (`decode`):

* start-up: ONE prefill of the target (returning the hidden states the sources ask for),
  the first token, then each source's `init`;
* each step (one iteration of a `lax.while_loop`): every source proposes a branch; the
  branches hang off the last token as one token tree (`jaxspec.decoding.tree`); ONE target
  forward over the tree under its `TreeMask`; ONE verifier picks the accepted path; ONE
  `commit` of its K/V and one `append` of the emitted tokens; every source's `update`.

autoregressive = no source; lookahead = [window, pool]; prompt lookup = [pool]; Jacobi =
[guess]; speculative = [drafter]; hybrid = [window, pool, drafter] (`jaxspec.decoding.methods`).
How the block is built, run and verified is the `Block`'s business: `LocalBlock` here (one
device), `ShardedBlock` in `jaxspec.decoding.lookahead_parallel` (lookahead parallelism). Everything is
fixed-shape and rows finish on their own: a finished row's updates are masked, not skipped.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.decoding.prefill import concat_features, prefill
from jaxspec.decoding.sources.base import Outcome, Start, Step
from jaxspec.decoding.state import DecodeState, TokenLogprobs, append
from jaxspec.decoding.tree import TokenTree
from jaxspec.decoding.verify import Greedy
from jaxspec.models.kv_cache import KVCache, commit, init_cache
from jaxspec.models.model import Transformer
from jaxspec.decoding.sampling import SamplingParams, next_token, penalize


@dataclasses.dataclass(frozen=True)
class Engine:
    """A decoding method: its draft sources (in block order) and its verifier. Hashable: the
    compiled program's static key."""

    sources: tuple = ()
    verifier: Any = Greedy()
    # Logits processing (`jaxspec.decoding.sampling`) beyond warping: the penalties applied before every
    # choice, and per generated token its log-probability and the `logprobs` most likely (-1: none).
    penalties: bool = False
    logprobs: int = -1
    # Target hidden-state layers a step returns besides its sources' (a plain step over a drafted
    # engine's state: the drafter's features, which it reads when it drafts again).
    feature_layers: tuple[int, ...] = ()

    @property
    def reads_logits(self) -> bool:
        """Whether a step needs the block's logits (else the forward returns only their argmax)."""
        return self.verifier.sampled or self.penalties or self.logprobs >= 0

    @functools.cached_property
    def tree(self) -> TokenTree:
        return TokenTree(tuple(s.layout() for s in self.sources))

    @property
    def block_tokens(self) -> int:
        """`tree.size` without building the tree (its tables grow with the block's square); a
        source without `block_tokens` is measured by its layout."""
        return 1 + sum(s.block_tokens if hasattr(s, "block_tokens") else s.layout().size for s in self.sources)

    @property
    def max_commit(self) -> int:
        """The most tokens one step commits or emits: the longest path + the bonus token."""
        return self.tree.max_path + 1

    def cache_length(self, positions: int, *, tree_free: bool = False) -> int:
        """The KV cache of rows that reach `positions` (prompt and reply): one step's commit more (the
        last step may overshoot a row's budget before it stops), a multiple of 64. The one rule.
        `tree_free`: without building the token tree (its tables grow with the block's square; the
        memory guard's first check): the block's tokens bound a step's commit."""
        overshoot = self.block_tokens if tree_free else self.max_commit
        return -(-(positions + overshoot) // 64) * 64

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        layers: list[int] = list(self.feature_layers)
        for source in self.sources:
            layers += [i for i in source.hidden_layers if i not in layers]
        return tuple(layers)

    @property
    def steps_plain(self) -> bool:
        """Whether `plain_step` can run over this engine's state: greedy (penalties aside: their
        rows are stepped one by one), drafted, every source able to `observe` a step it did not draft."""
        return (not self.verifier.sampled and not self.penalties and bool(self.sources)
                and all(hasattr(s, "observe") for s in self.sources))

    @property
    def plain(self) -> "Engine":
        """The engine of a plain step: no draft, greedy, this engine's logprobs, its sources' features."""
        return Engine(logprobs=self.logprobs, feature_layers=self.hidden_layers)

    @property
    def needs_runs(self) -> bool:
        return not self.verifier.sampled and any(s.needs_runs for s in self.sources)

    def load(self, graphdef, params) -> tuple[Transformer, tuple]:
        """The target and each source's weights. Sources with a model of their own get
        `graphdef = (target graphdef, per-source graphdefs)` and `params = (target params,
        per-source params)`, aligned with `sources` (None for a source without weights)."""
        if not isinstance(graphdef, tuple):
            return nnx.merge(graphdef, params), (None,) * len(self.sources)
        (target_def, source_defs), (target_params, source_params) = graphdef, params
        weights = tuple(None if d is None else s.load(d, p)
                        for s, d, p in zip(self.sources, source_defs, source_params))
        return nnx.merge(target_def, target_params), weights


@struct.dataclass
class Chosen:
    """A verified step, as every device sees it."""

    best: Int[Array, " b"]  # path row (verification order)
    n_acc: Int[Array, " b"]
    emitted: Int[Array, "b e"]
    path_preds: Int[Array, "b e"]
    path_hidden: Float[Array, "b e f"]
    observed: tuple  # per source: argmax at its observed tokens
    runs: Int[Array, "b s"] | None  # per source: its paths' longest accepted run (greedy)
    logprobs: TokenLogprobs | None = None  # of the emitted tokens (an engine with logprobs)


@struct.dataclass
class EngineState:
    decode: DecodeState
    sources: tuple
    block: Any  # the Block's own carry (lookahead parallelism: tokens awaiting their K/V)
    accept_histogram: Int[Array, "b e1"]  # steps that emitted k tokens


def penalized_block(engine: Engine, logits: Float[Array, "b t v"], tokens: Int[Array, "b t"], decode: DecodeState,
                    sampling: SamplingParams) -> Float[Array, "b t v"]:
    """The penalties at every block position: the output so far (`decode`'s, the block's root
    included) plus the position's own ancestors in the tree, itself included, as that position's
    output; a chain verified this way equals the same tokens decoded one by one."""
    batch, size = tokens.shape
    vocab = logits.shape[-1]
    counts = jnp.broadcast_to(decode.output_counts(vocab)[:, None], (batch, size, vocab))
    position, ancestor = np.nonzero(engine.tree.relation()[:, 1:])
    if len(position):
        ids = jnp.clip(tokens[:, ancestor + 1], 0, vocab - 1)  # (padding drafts: any id, never accepted)
        counts = counts.at[jnp.arange(batch)[:, None], position[None], ids].add(1)
    return penalize(logits, counts, decode.seen[:, None], sampling)


def source_runs(engine: Engine, accepted: Int[Array, "b k"], path_ids: np.ndarray) -> Int[Array, "b s"]:
    """Per source, the longest accepted run among the paths `accepted` holds (`path_ids`: their
    rows in the tree's verification order)."""
    cols = []
    for lo, hi in engine.tree.path_rows():
        mine = (path_ids >= lo) & (path_ids < hi)
        cols.append(jnp.max(jnp.where(mine[None], accepted, 0), axis=-1, initial=0))
    return jnp.stack(cols, axis=1)


@dataclasses.dataclass(frozen=True)
class LocalBlock:
    """The step's block on one device: the whole tree, one forward, the engine's verifier.

    A block is a static argument of the programs (`jaxspec.decoding.methods`): it says where a
    step runs (`on_devices`), what it cannot do (`check`), how a step's block is run (`step`)."""

    def check(self, engine: Engine, *, rows_apart: bool = False) -> None:
        """Every engine, and rows stepped apart (the server's slots, plain steps), run on one device."""

    def on_devices(self, fn, *args):
        """`fn(*args)` where this block's steps run: here, as it is."""
        return fn(*args)

    def init(self, batch: int):
        return ()

    def step(self, engine: Engine, model: Transformer, tokens, decode: DecodeState, valid, q, key,
             sampling: SamplingParams, carry) -> tuple[Chosen, KVCache, Any]:
        tree, cache = engine.tree, decode.cache
        batch = tokens.shape[0]
        # Greedy verification reads only the argmax: the block's logits are never materialised.
        out = model(tokens, cache.lengths[:, None] + jnp.asarray(tree.depths), tree.mask(batch), cache,
                    hidden_layers=engine.hidden_layers, head="logits" if engine.reads_logits else "argmax")
        logits = out.logits
        if engine.penalties:
            logits = penalized_block(engine, logits, tokens, decode, sampling)
        preds = jnp.argmax(logits, axis=-1).astype(jnp.int32) if engine.reads_logits else out.preds  # [b, T]
        paths, pred_idx = tree.paths, tree.pred_idx
        path_tokens = jnp.where(paths >= 0, tokens[:, np.maximum(paths, 0)], -1)  # [b, K, P]
        verdict = engine.verifier(key, path_tokens, valid, logits, preds, pred_idx, q, sampling)
        hidden = concat_features(out.hidden_states, batch, tokens.shape[1])  # f = 0 unless a source asks
        if len(paths) == 1:  # one path (greedy, speculative, Jacobi): its block indices are constants
            lo, n = int(pred_idx[0, 0]), pred_idx.shape[1]
            take = jnp.broadcast_to(jnp.asarray(pred_idx[0]), (batch, n))
            contiguous = (pred_idx[0] == lo + np.arange(n)).all()
            path_preds = preds[:, lo:lo + n] if contiguous else preds[:, pred_idx[0]]
            path_hidden = hidden[:, lo:lo + n] if contiguous else hidden[:, pred_idx[0]]
        else:
            take = jnp.asarray(pred_idx)[verdict.best]  # the last token + the path's tokens
            path_preds = jnp.take_along_axis(preds, take, axis=1)
            path_hidden = jnp.take_along_axis(hidden, take[..., None], axis=1)
        cache = commit(cache, out.block_kv, take, jnp.where(decode.done, 0, verdict.n_acc + 1))
        runs = None
        if engine.needs_runs:
            runs = source_runs(engine, verdict.accepted, np.arange(len(paths)))
        logprobs = None
        if engine.logprobs >= 0:  # the target's own distribution where each emitted token was chosen
            logprobs = TokenLogprobs.of(jnp.take_along_axis(out.logits, take[..., None], axis=1), verdict.emitted,
                                        engine.logprobs)
        chosen = Chosen(best=verdict.best, n_acc=verdict.n_acc, emitted=verdict.emitted,
                        path_preds=path_preds, path_hidden=path_hidden,
                        observed=tuple(preds[:, tree.observed(i)] for i in range(len(engine.sources))),
                        runs=runs, logprobs=logprobs)
        return chosen, cache, carry


def start(engine: Engine, model: Transformer, weights: tuple, block, prompts: Int[Array, "b p"],
          prompt_lengths: Int[Array, " b"], rng, sampling: SamplingParams, *, max_new_tokens: int, cache_len: int,
          eos_ids: tuple[int, ...], greedy: bool) -> EngineState:
    """The one prefill, the first token, every source's initial state."""
    batch = prompts.shape[0]
    logits, cache, hidden = prefill(model, prompts, prompt_lengths, init_cache(model, batch, cache_len),
                                    hidden_layers=engine.hidden_layers)
    init_key = None
    if any(s.random_init for s in engine.sources):
        rng, init_key, first_key = jax.random.split(rng, 3)
    else:
        rng, first_key = jax.random.split(rng)
    seen = None
    raw = logits
    if engine.penalties:  # (no output yet: only the repetition penalty on the prompt's tokens)
        real = jnp.arange(prompts.shape[1])[None, :] < prompt_lengths[:, None]
        seen = jnp.zeros(logits.shape, jnp.int32).at[jnp.arange(batch)[:, None], prompts].add(real) > 0
        logits = penalize(logits, jnp.zeros(logits.shape, jnp.int32), seen, sampling)
    first = next_token(logits, first_key, sampling, greedy)
    decode = DecodeState.start(batch, max_new_tokens, cache, rng, seen=seen, top_logprobs=engine.logprobs)
    first_logprobs = None if engine.logprobs < 0 else TokenLogprobs.of(raw[:, None], first[:, None], engine.logprobs)
    decode, _ = append(decode, first[:, None], jnp.ones((batch,), jnp.int32), eos_ids, first_logprobs)
    decode = decode.replace(steps=jnp.ones((batch,), jnp.int32))
    begin = Start(prompts=prompts, prompt_lengths=prompt_lengths, first=first, hidden=hidden, key=init_key,
                  vocab_size=model.config.vocab_size, max_new_tokens=max_new_tokens, cache_len=cache_len,
                  emit_len=engine.max_commit)
    states = tuple(s.init(begin, w) for s, w in zip(engine.sources, weights))
    return EngineState(decode=decode, sources=states, block=block.init(batch),
                       accept_histogram=jnp.zeros((batch, engine.max_commit + 1), jnp.int32))


def step(engine: Engine, model: Transformer, weights: tuple, block, state: EngineState, sampling: SamplingParams,
         eos_ids: tuple[int, ...]) -> EngineState:
    """Propose, one forward, verify, commit, append, update (see the module docstring)."""
    decode = state.decode
    active = ~decode.done
    last = decode.last_token
    batch = last.shape[0]
    draft_key = None
    if any(s.stochastic for s in engine.sources):
        rng, draft_key, verify_key = jax.random.split(decode.rng, 3)
    else:
        rng, verify_key = jax.random.split(decode.rng)
    proposal = Step(last=last, active=active, key=draft_key, sampling=sampling)
    branches, states = [], []
    for source, source_state, w in zip(engine.sources, state.sources, weights):
        branch, source_state = source.propose(source_state, proposal, w)
        branches.append(branch)
        states.append(source_state)

    tokens = jnp.concatenate([last[:, None]] + [b.tokens for b in branches], axis=1)
    valid = [b.path_valid for b in reversed(branches) if b.path_valid.shape[1]]
    valid = jnp.concatenate(valid, axis=1) if valid else jnp.ones((batch, 1), bool)  # no draft: one empty path
    q = next((b.q for b in branches if b.q is not None), None) if engine.verifier.needs_q else None
    chosen, cache, carry = block.step(engine, model, tokens, decode, valid, q, verify_key, sampling, state.block)

    count = jnp.where(active, chosen.n_acc + 1, 0)
    decode, kept = append(decode.replace(cache=cache, rng=rng), chosen.emitted, count, eos_ids, chosen.logprobs)
    decode = decode.replace(steps=decode.steps + active)

    outcome = Outcome(last=last, emitted=chosen.emitted, n_acc=chosen.n_acc, kept=kept, active=active,
                      path_preds=chosen.path_preds, path_hidden=chosen.path_hidden, ngrams=())
    rows = engine.tree.path_rows()
    for i, source in enumerate(engine.sources):
        run = rival = None
        if chosen.runs is not None:
            run = chosen.runs[:, i]
            others = [j for j in range(len(rows)) if j != i]
            rival = jnp.max(chosen.runs[:, others], axis=1) if others else None
        lo, hi = rows[i]
        own = dataclasses.replace(outcome, observed=chosen.observed[i], won=(chosen.best >= lo) & (chosen.best < hi),
                                  run=run, rival_run=rival)
        states[i], seen = source.update(states[i], own)
        outcome = dataclasses.replace(outcome, ngrams=outcome.ngrams + seen)
    histogram = state.accept_histogram
    if engine.max_commit > 1:  # (a one-token tree emits one token per step: `run` fills it in at the end)
        histogram = histogram.at[jnp.arange(batch), kept].add(active.astype(jnp.int32))
    return EngineState(decode=decode, sources=tuple(states), block=carry, accept_histogram=histogram)


def plain_step(engine: Engine, model: Transformer, weights: tuple, block, state: EngineState,
               sampling: SamplingParams, eos_ids: tuple[int, ...]) -> EngineState:
    """One step of `engine`'s state with no draft: the target's next token alone (a forward of
    the last token), as greedy decoding takes it; every source then `observe`s that token, so
    its state stays what it would be had it drafted (a drafter's cache keeps exactly the target's
    committed tokens). `engine.steps_plain` says whether it can. Where a step costs more than
    its drafts are worth (a full batch on a compute-bound device) a caller runs this instead of
    `step`, chunk by chunk, over the same state: switching never compiles and never loses state."""
    decode = state.decode
    active = ~decode.done
    last = decode.last_token
    batch = last.shape[0]
    rng, verify_key = jax.random.split(decode.rng)
    chosen, cache, carry = block.step(engine.plain, model, last[:, None], decode, jnp.ones((batch, 1), bool), None,
                                      verify_key, sampling, state.block)
    decode, kept = append(decode.replace(cache=cache, rng=rng), chosen.emitted, active.astype(jnp.int32), eos_ids,
                          chosen.logprobs)
    decode = decode.replace(steps=decode.steps + active)
    outcome = Outcome(last=last, emitted=chosen.emitted, n_acc=chosen.n_acc, kept=kept, active=active,
                      path_preds=chosen.path_preds, path_hidden=chosen.path_hidden, ngrams=())
    states = tuple(source.observe(s, outcome, w) for source, s, w in zip(engine.sources, state.sources, weights))
    histogram = state.accept_histogram.at[jnp.arange(batch), kept].add(active.astype(jnp.int32))
    return EngineState(decode=decode, sources=states, block=carry, accept_histogram=histogram)


def begin(engine: Engine, block, graphdef, params, prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"], rng,
          sampling: SamplingParams, *, max_new_tokens: int, cache_len: int, eos_ids: tuple[int, ...]) -> EngineState:
    """The state before the first step (prefill, first token, sources' states): `advance` runs from it."""
    model, weights = engine.load(graphdef, params)
    return start(engine, model, weights, block, prompts, prompt_lengths, rng, sampling,
                 max_new_tokens=max_new_tokens, cache_len=cache_len, eos_ids=eos_ids,
                 greedy=not engine.verifier.sampled)


# `begin` as its own jitted function: `generate` first traces it alone (`jax.eval_shape`, for the
# memory estimate of the loop state), then inside the whole decode program; JAX keeps the trace of
# a jitted function per argument shapes, so the second time reuses the first instead of tracing the
# prefill again (~0.15 s per program for the default model). XLA inlines the call: same program.
begin_jit = jax.jit(begin, static_argnums=(0, 1), static_argnames=("max_new_tokens", "cache_len", "eos_ids"))


def advance(engine: Engine, block, graphdef, params, state: EngineState, sampling: SamplingParams,
            steps: Int[Array, ""], *, eos_ids: tuple[int, ...], row_limit: Int[Array, " b"] | None = None,
            per_row: bool = False, plain: bool = False) -> EngineState:
    """At most `steps` more steps of every row not yet done, in one `lax.while_loop`: the whole
    generation (`run`), a stream's chunk and a server's chunk are all this.

    `steps` is traced: one compiled program runs chunk after chunk on the state it returns.
    `row_limit` (optional, [b]): a row is done once it has generated that many tokens (a server
    slot's own max_tokens); 0 marks a free row, done before the first step, so its updates are
    masked. `per_row`: `state` and `sampling` are single-row states stacked on a leading axis
    (each row with its own random key and knobs), stepped under `jax.vmap`. `plain`: every step
    a `plain_step` (no draft) over the engine's state."""
    if plain and not engine.steps_plain:
        raise ValueError("this engine cannot step without its drafts (plain_step): greedy and drafted, "
                         "every source with `observe`")
    model, weights = engine.load(graphdef, params)
    step_fn = plain_step if plain else step

    def one_step(s: EngineState, knobs: SamplingParams, limit) -> EngineState:
        s = step_fn(engine, model, weights, block, s, knobs, eos_ids)
        if limit is None:
            return s
        return s.replace(decode=s.decode.replace(done=s.decode.done | (s.decode.num_generated >= limit)))

    stepper = jax.vmap(one_step) if per_row else one_step
    if row_limit is not None:
        free = (row_limit <= 0).reshape(state.decode.done.shape)
        state = state.replace(decode=state.decode.replace(done=state.decode.done | free))

    def more(carry) -> Bool[Array, ""]:
        taken, s = carry
        return (taken < steps) & jnp.any(~s.decode.done)

    return jax.lax.while_loop(more, lambda c: (c[0] + 1, stepper(c[1], sampling, row_limit)),
                              (jnp.int32(0), state))[1]


def accept_histogram(engine: Engine, state: EngineState) -> Int[Array, "... e1"]:
    """Each row's steps that emitted k tokens (the prefill's first token not counted). A one-token
    engine's loop leaves its histogram to this: every step emitted 1."""
    histogram = state.accept_histogram
    if engine.max_commit == 1:
        histogram = histogram.at[..., 1].set(jnp.maximum(state.decode.steps - 1, 0))
    return histogram


def finish(engine: Engine, state: EngineState) -> tuple[DecodeState, dict]:
    """The decode state and the statistics (accept histogram, sources' own) of a finished state."""
    stats = {"accept_histogram": accept_histogram(engine, state)}
    for source, source_state in zip(engine.sources, state.sources):
        if hasattr(source, "finish"):
            stats.update(source.finish(source_state))
    return state.decode, stats


def run(engine: Engine, block, graphdef, params, prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"], rng,
        sampling: SamplingParams, *, max_new_tokens: int, cache_len: int, eos_ids: tuple[int, ...]
        ) -> tuple[DecodeState, dict]:
    """The whole generation as one `lax.while_loop` with `block` running each step's block."""
    state = begin_jit(engine, block, graphdef, params, prompts, prompt_lengths, rng, sampling,
                      max_new_tokens=max_new_tokens, cache_len=cache_len, eos_ids=eos_ids)
    # (a row takes fewer than max_new_tokens more steps: the bound never stops the loop early)
    state = advance(engine, block, graphdef, params, state, sampling, jnp.int32(max_new_tokens), eos_ids=eos_ids)
    return finish(engine, state)


def decode(engine: Engine, graphdef, params, prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"], rng,
           sampling: SamplingParams, *, max_new_tokens: int, cache_len: int, eos_ids: tuple[int, ...]
           ) -> tuple[DecodeState, dict]:
    """Decode on one device. Pure and jit-able: `jax.jit(decode, static_argnames=("engine",
    "max_new_tokens", "cache_len", "eos_ids"))`."""
    return run(engine, LocalBlock(), graphdef, params, prompts, prompt_lengths, rng, sampling,
               max_new_tokens=max_new_tokens, cache_len=cache_len, eos_ids=eos_ids)
