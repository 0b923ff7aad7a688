"""Candidates from an n-gram pool: Lookahead Decoding's verification branch, and prompt lookup.

Up to G candidate (N-1)-grams continuing the last token (`candidates`), each a chain after
the root verified as one path; empty pool slots are invalid paths. The pool
(`jaxspec.decoding.ngram_pool`) is filled from the prompt (`from_prompt`), from the n-grams ending in
each step's emitted tokens, and from whatever the sources before it saw (the lookahead
window's columns). It keeps its own copy of the text so far (prompt + output), which feeds it.

Lookahead parallelism: candidate c is group c.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Int

from jaxspec.decoding.sources.base import Branch, Outcome, Start, Step
from jaxspec.decoding.tree import ROOT, BranchLayout
from jaxspec.decoding.ngram_pool import NGramPool, insert, sequence_ngrams


def candidates(pool: NGramPool, prev: Int[Array, " b"], last: Int[Array, " b"]):
    """Up to G candidates continuing `last`: the pool's entries keyed by `last`, then, in the
    slots those leave empty, entries keyed by `prev` whose first token is `last` (shifted by
    one, so they are one token shorter; the pad -1 never matches)."""
    primary, primary_ok = pool.lookup(last)
    secondary, secondary_ok = pool.lookup(prev)
    secondary_ok &= secondary[..., 0] == last[:, None]
    secondary = jnp.concatenate([secondary[..., 1:], jnp.full_like(secondary[..., :1], -1)], axis=-1)
    merged = jnp.concatenate([primary, secondary], axis=1)
    ok = jnp.concatenate([primary_ok, secondary_ok], axis=1)
    order = jnp.argsort(~ok, axis=1, stable=True)[:, :pool.capacity]  # valid first, primary before secondary
    return jnp.take_along_axis(merged, order[..., None], axis=1), jnp.take_along_axis(ok, order, axis=1)


@struct.dataclass
class PoolState:
    pool: NGramPool
    history: Int[Array, "b s"]  # prompt + generated tokens
    history_len: Int[Array, " b"]


@dataclasses.dataclass(frozen=True)
class NGramCandidates:
    ngram: int  # N: candidates are the N-1 tokens after a key
    guesses: int  # G >= 1 candidates per step
    from_prompt: bool = True

    random_init = False
    stochastic = False
    hidden_layers = ()
    needs_runs = False

    @property
    def block_tokens(self) -> int:
        return self.guesses * (self.ngram - 1)

    def layout(self) -> BranchLayout:
        length = self.ngram - 1
        parents = tuple(ROOT if j == 0 else c * length + j - 1 for c in range(self.guesses) for j in range(length))
        return BranchLayout(parents=parents,
                            paths=tuple(tuple(range(c * length, (c + 1) * length)) for c in range(self.guesses)),
                            groups=tuple(c for c in range(self.guesses) for _ in range(length)),
                            path_groups=tuple(range(self.guesses)))

    def init(self, start: Start, weights) -> PoolState:
        prompts, lengths = start.prompts, start.prompt_lengths
        batch, p = prompts.shape
        history = jnp.zeros((batch, p + start.max_new_tokens), jnp.int32).at[:, :p].set(prompts)
        history = history.at[jnp.arange(batch), lengths].set(start.first)
        pool = NGramPool.empty(batch, start.vocab_size, self.guesses, self.ngram)
        if self.from_prompt:
            starts = jnp.broadcast_to(jnp.arange(p), (batch, p))
            pool = insert(pool, *sequence_ngrams(history, lengths + 1, self.ngram, starts))
        return PoolState(pool=pool, history=history, history_len=lengths + 1)

    def propose(self, state: PoolState, step: Step, weights):
        batch = state.history.shape[0]
        prev = state.history[jnp.arange(batch), jnp.maximum(state.history_len - 2, 0)]
        cands, valid = candidates(state.pool, prev, step.last)
        return Branch(tokens=cands.reshape(batch, -1), path_valid=valid), state

    def update(self, state: PoolState, outcome: Outcome):
        """Extend the text with the kept tokens; insert what the sources before this one saw,
        then the n-grams ending in the new tokens."""
        emitted, kept = outcome.emitted, outcome.kept
        rows = jnp.arange(emitted.shape[0])
        j = jnp.arange(emitted.shape[1])[None]
        dest = jnp.where(j < kept[:, None], state.history_len[:, None] + j, state.history.shape[1])
        history = state.history.at[rows[:, None], dest].set(emitted, mode="drop")
        history_len = state.history_len + kept
        starts = state.history_len[:, None] + j - (self.ngram - 1)
        keys, values, valid = sequence_ngrams(history, history_len, self.ngram, starts)
        seen = outcome.ngrams
        pool = insert(state.pool, jnp.concatenate([g.keys for g in seen] + [keys], 1),
                      jnp.concatenate([g.values for g in seen] + [values], 1),
                      jnp.concatenate([g.valid for g in seen] + [valid], 1))
        return PoolState(pool=pool, history=history, history_len=history_len), ()

    def observe(self, state: PoolState, outcome: Outcome, weights) -> PoolState:
        """A step it did not draft (`engine.plain_step`): the text and the pool grow as after any step."""
        return self.update(state, outcome)[0]
