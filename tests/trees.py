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
