"""The lookahead window (Fu et al., 2024): a 2D Jacobi iteration that yields n-grams.

The window holds `levels` = N-1 levels of W tokens, level-major; level 0 column 0 IS the
last committed token (the tree's root), so column 0 Jacobi-decodes the real continuation.
Level l column c sits at position p + l + c and sees level 0 up to column c and column c of
levels 1..l: in the token tree, (0, c)'s parent is (0, c-1) and (l, c)'s is (l-1, c).

Each step the top level's outputs become the new top level and the window shifts down one
level; every column gives an n-gram `(level 0, ..., new level)` keyed by its first token,
handed to the n-gram pool. With `verify_paths` the window's own diagonals (level 0 up to
column c, then up column c) are verified too: free extra candidates, still exact.

Lookahead parallelism: level 0 is computed on every device (every column's chain starts
there); column c's upper levels form group c.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from jaxspec.decoding.sources.base import Branch, NGrams, Outcome, Start, Step
from jaxspec.decoding.tree import ROOT, BranchLayout


def random_prompt_tokens(key, prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"], shape: tuple[int, ...]):
    """Tokens drawn uniformly from each row's prompt: a guess that costs nothing."""
    idx = jax.random.randint(key, (prompts.shape[0], *shape), 0, prompt_lengths[:, None, None])
    return jnp.take_along_axis(prompts, idx.reshape(prompts.shape[0], -1), axis=1).reshape(idx.shape)


@dataclasses.dataclass(frozen=True)
class LookaheadWindow:
    window: int
    levels: int
    verify_paths: bool = True

    random_init = True
    stochastic = False
    hidden_layers = ()
    needs_runs = False

    def _branch(self, level: int, col: int) -> int:
        """Branch index of (level, col); the root for (0, 0)."""
        g = level * self.window + col
        return ROOT if g == 0 else g - 1

    @property
    def block_tokens(self) -> int:
        return self.levels * self.window - 1  # every cell but the root's

    def layout(self) -> BranchLayout:
        w, levels = self.window, self.levels
        cells = [(lv, c) for lv in range(levels) for c in range(w)][1:]  # (0, 0) is the root
        parents = tuple(self._branch(lv, c - 1) if lv == 0 else self._branch(lv - 1, c) for lv, c in cells)
        groups = tuple(-1 if lv == 0 else c for lv, c in cells)
        paths = ()
        if self.verify_paths:
            paths = tuple(tuple([self._branch(0, k) for k in range(1, c + 1)]
                                + [self._branch(lv, c) for lv in range(1, levels)]) for c in range(w))
        return BranchLayout(parents=parents, paths=paths, groups=groups,
                            path_groups=tuple(range(w)) if self.verify_paths else (),
                            observed=tuple(self._branch(levels - 1, c) for c in range(w)))

    def init(self, start: Start, weights) -> Int[Array, "b levels w"]:
        return random_prompt_tokens(start.key, start.prompts, start.prompt_lengths, (self.levels, self.window))

    def propose(self, window, step: Step, weights):
        batch = window.shape[0]
        tokens = window.at[:, 0, 0].set(step.last).reshape(batch, -1)[:, 1:]
        return Branch(tokens=tokens, path_valid=jnp.ones((batch, len(self.layout().paths)), bool)), window

    def update(self, window, outcome: Outcome):
        window = window.at[:, 0, 0].set(outcome.last)
        grams = jnp.concatenate([window, outcome.observed[:, None]], axis=1)  # [b, N, W]
        # From the first step on: n-grams of the random initial levels are mostly noise, but
        # they cost nothing and the pool's LRU evicts them (measured: no gating is better
        # than waiting N-2 steps for the levels to fill).
        seen = NGrams(keys=grams[:, 0], values=jnp.swapaxes(grams[:, 1:], 1, 2),
                      valid=jnp.broadcast_to(outcome.active[:, None], grams[:, 0].shape))
        return grams[:, 1:], (seen,)
