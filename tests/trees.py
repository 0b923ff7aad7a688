"""The lookahead family's token trees as the tests describe them: (W, levels, G, candidate length).

`StepLayout` builds the library's `TokenTree` from the sources the methods use (the window,
then the n-gram candidates; Jacobi's W-token guess is the same tree as one candidate of W
tokens) and reads it back in the terms of the paper's layout: where the candidates start,
the position offsets, the relation, the verified paths.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxspec.decoding.sources.pool import NGramCandidates
from jaxspec.decoding.sources.window import LookaheadWindow
from jaxspec.decoding.tree import TokenTree


@dataclasses.dataclass(frozen=True)
class StepLayout:
    window: int
    levels: int
    guesses: int
    cand_len: int
    verify_window: bool = False

    @property
    def tree(self) -> TokenTree:
        branches = []
        if self.levels:
            branches.append(LookaheadWindow(self.window, self.levels, self.verify_window).layout())
        if self.guesses and self.cand_len:
            branches.append(NGramCandidates(ngram=self.cand_len + 1, guesses=self.guesses).layout())
        return TokenTree(tuple(branches))

    @property
    def cand_start(self) -> int:
        return max(self.levels * self.window, 1)

    @property
    def size(self) -> int:
        return self.tree.size

    def position_offsets(self) -> np.ndarray:
        return self.tree.depths

    def attention_relation(self) -> np.ndarray:
        return self.tree.relation()

    def paths(self) -> np.ndarray:
        return self.tree.paths

    def definition(self) -> np.ndarray:
        """The lookahead relation written out from the paper's description, independently of
        the tree: a level-l token at column i sees level 0 up to column i and column i of
        levels 1..l; a candidate token sees the last token and its own earlier tokens."""
        t, w = self.size, self.window
        mask = np.eye(t, dtype=bool)
        mask[:, 0] = True
        for level in range(self.levels):
            for col in range(w):
                q = level * w + col
                mask[q, :col + 1] = True
                mask[q, [lv * w + col for lv in range(1, level + 1)]] = True
        for c in range(self.guesses):
            start = self.cand_start + c * self.cand_len
            for j in range(self.cand_len):
                mask[start + j, start:start + j + 1] = True
        return mask
