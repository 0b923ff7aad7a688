"""Jacobi decoding's guess (the lookahead paper's baseline): W tokens verified as one chain.

The guess starts as random prompt tokens; after each step it becomes the target's argmax
predictions past the accepted run, padded with the last one. Argmax even when sampling:
drafts stay deterministic, as the multi-draft verifier requires (`emitted` holds sampled
tokens only up to the first rejection).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jaxtyping import Array, Int

from jaxspec.decoding.sources.base import Branch, Outcome, Start, Step
from jaxspec.decoding.sources.window import random_prompt_tokens
from jaxspec.decoding.tree import BranchLayout, chain


@dataclasses.dataclass(frozen=True)
class JacobiGuess:
    window: int  # W guessed tokens

    random_init = True
    stochastic = False
    hidden_layers = ()
    needs_runs = False

    @property
    def block_tokens(self) -> int:
        return self.window

    def layout(self) -> BranchLayout:
        return chain(self.window)

    def init(self, start: Start, weights) -> Int[Array, "b w"]:
        return random_prompt_tokens(start.key, start.prompts, start.prompt_lengths, (1, self.window))[:, 0]

    def propose(self, guess, step: Step, weights):
        return Branch(tokens=guess, path_valid=jnp.ones((guess.shape[0], 1), bool)), guess

    def update(self, guess, outcome: Outcome):
        idx = jnp.minimum(outcome.n_acc[:, None] + 1 + jnp.arange(self.window)[None], self.window)
        return jnp.take_along_axis(outcome.path_preds, idx, axis=1), ()
