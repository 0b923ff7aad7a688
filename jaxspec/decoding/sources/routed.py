"""One chain a step, from prompt lookup or from the drafter: whichever the drafter's confidence favours.

Beside the drafter's K-token chain, a prompt-lookup candidate costs the verification forward N-1
more tokens, and on a CPU every token counts (SmolLM2-135M, blocks weights: a 9-token forward costs
1.76 one-token forwards, a 5-token one 1.29). The two rarely both pay in one step: lookup wins where
the reply copies the conversation, the drafter where it does not. `RoutedChain` verifies ONE chain of
L = max(K, N-1) tokens a step:

* of the pool's G candidates (`NGramCandidates`), the one whose first token the drafter's first
  draft distribution q1 rates highest;
* taken when q1 of that token >= `agree` x p1, the drafter's probability of its own first draft
  (the drafter agrees, or nearly), or when p1 < `unsure` (the drafter does not know: copying is the
  better bet); else the drafter's K drafts. Tokens past a chain's own length are padding (id 0):
  verification accepts a draft only where it is the target's own token, so padding costs nothing
  but its slot.

`agree` = `unsure` = 0.3 were chosen on the drafter recipe's own held-out chats (184 greedy replies of
parts 4-7, teacher-forced, never the benchmark prompts): S 2.053-2.060 for agree 0.1-0.5 and unsure
0.2-0.4 (`benchmarks/results/route_rule_recipe.md`; docs/pard2.md, "Routing"). The drafter sees every step's emitted tokens whichever chain was
verified (its pending run is the emitted path), so its cache and features stay exact.

With the drafter's `alternatives` A > 0 the step also verifies the A first tokens q1 rates highest
after the chosen chain's own first token, each a one-token branch: a chain whose first token is
wrong then still gains a token where q1's runner-up is right.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.decoding.sources.base import Outcome, Start, Step
from jaxspec.decoding.sources.drafter import DraftState, PardDrafter, with_alternatives
from jaxspec.decoding.sources.pool import NGramCandidates, PoolState
from jaxspec.decoding.tree import BranchLayout, chain


@struct.dataclass
class RoutedState:
    pool: PoolState
    draft: DraftState
    from_lookup: Bool[Array, " b"]  # this step's chain is the lookup candidate
    lookup_steps: Int[Array, " b"]  # steps whose chain was a lookup candidate


def choose(score: Float[Array, "b g"], valid: Bool[Array, "b g"], p1: Float[Array, " b"], agree: float,
           unsure: float) -> tuple[Int[Array, " b"], Bool[Array, " b"]]:
    """The candidate to verify (the valid one the drafter rates highest: `score`, its q1 of the
    candidate's first token) and whether to verify it rather than the drafter's chain."""
    score = jnp.where(valid, score, -1.0)
    best = jnp.argmax(score, axis=1)
    top = jnp.take_along_axis(score, best[:, None], axis=1)[:, 0]
    return best, (top >= 0) & ((top >= agree * p1) | (p1 < unsure))


def pad_to(tokens: Int[Array, "b n"], length: int) -> Int[Array, "b l"]:
    return jnp.pad(tokens, ((0, 0), (0, length - tokens.shape[1])))


@dataclasses.dataclass(frozen=True)
class RoutedChain:
    pool: NGramCandidates
    drafter: PardDrafter
    agree: float = 0.3
    unsure: float = 0.3

    random_init = False
    stochastic = False
    needs_runs = True
    load = staticmethod(PardDrafter.load)

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        return self.drafter.hidden_layers

    @property
    def chain_tokens(self) -> int:
        return max(self.drafter.spec.draft_len, self.pool.ngram - 1)

    @property
    def block_tokens(self) -> int:
        return self.chain_tokens + self.drafter.alternatives

    def layout(self) -> BranchLayout:
        return with_alternatives(chain(self.chain_tokens), self.drafter.alternatives)

    def init(self, start: Start, weights) -> RoutedState:
        batch = start.prompts.shape[0]
        return RoutedState(pool=self.pool.init(start, None), draft=self.drafter.init(start, weights),
                           from_lookup=jnp.zeros((batch,), bool), lookup_steps=jnp.zeros((batch,), jnp.int32))

    def propose(self, state: RoutedState, step: Step, weights):
        head = weights[2]
        logits, draft = self.drafter.draft_logits(state.draft, step, weights)
        batch, length = logits.shape[0], self.chain_tokens
        columns = jnp.argmax(logits, axis=-1)
        ids = columns if head is None else head["ids"][columns]
        q1 = jax.nn.softmax(logits[:, 0], axis=-1)  # [b, V] (V': the draft vocabulary's columns)
        p1 = jnp.max(q1, axis=-1)
        looked, _ = self.pool.propose(state.pool, step, None)
        cands = looked.tokens.reshape(batch, self.pool.guesses, self.pool.ngram - 1)
        firsts = cands[:, :, 0]
        if head is None:
            score = jnp.take_along_axis(q1, jnp.clip(firsts, 0, q1.shape[-1] - 1), axis=1)
        else:  # q1 of an id outside V' is 0
            score = jnp.einsum("bv,bgv->bg", q1, (head["ids"][None, None] == firsts[..., None]).astype(q1.dtype))
        best, from_lookup = choose(score, looked.path_valid, p1, self.agree, self.unsure)
        rows = jnp.arange(batch)
        tokens = jnp.where(from_lookup[:, None], pad_to(cands[rows, best], length), pad_to(ids.astype(jnp.int32), length))
        branch, draft = self.drafter.branch_with_alternatives(tokens, logits, head, draft)
        return branch, state.replace(draft=draft, from_lookup=from_lookup)

    def update(self, state: RoutedState, outcome: Outcome):
        pool, _ = self.pool.update(state.pool, outcome)
        draft, _ = self.drafter.update(state.draft, outcome)
        counted = state.from_lookup & outcome.active
        return state.replace(pool=pool, draft=draft, lookup_steps=state.lookup_steps + counted), ()

    def observe(self, state: RoutedState, outcome: Outcome, weights) -> RoutedState:
        """A step it did not draft (`engine.plain_step`): the pool and the drafter take its token."""
        return state.replace(pool=self.pool.observe(state.pool, outcome, None),
                             draft=self.drafter.observe(state.draft, outcome, weights))

    def finish(self, state: RoutedState) -> dict:
        """The drafter's statistics over every verified chain, and how many were lookup's."""
        return {**self.drafter.finish(state.draft), "lookup_steps": state.lookup_steps}
