"""The static shape of a decoding step: draft branches joined into one token tree.

Every draft source proposes a *branch*: tokens that hang off the root (the last committed
token, block index 0) as chains, each token with a parent that is the root or an earlier
token of the same branch. `TokenTree` lays the branches out one after another behind the
root, so a step's block is a tree and everything the step needs follows from it:

* positions: a token sits at the root's position + its depth;
* attention: query i sees block token j iff j is i or an ancestor of i (`TreeMask`: each
  token's DFS interval, two comparisons per pair, evaluated by the XLA reference and in
  the Pallas kernel alike);
* verification: each branch names the chains (root-to-token paths) to verify; a path
  token's prediction is the output at its parent, so accepting a path's matching prefix is
  exact greedy decoding whichever branch it is in. Paths are verified in reverse branch
  order (the last branch's first): the greedy verifier keeps the first longest, the
  sampled one walks them in that order.

For lookahead parallelism a branch also says which tokens every device computes (shared,
group -1) and which group each other token and each path belongs to; `jaxspec.decoding.
parallel` deals the groups out to devices.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from jaxspec.models.masks import TreeMask, tree_relation

ROOT = -1  # a branch token whose parent is the root


@dataclasses.dataclass(frozen=True)
class BranchLayout:
    """One branch: `parents[i]` (an earlier branch index, or ROOT), the verified `paths`
    (branch indices, root-most first), and the lookahead-parallel split: `groups[i]` (-1 =
    computed on every device) and `path_groups[k]`. A path's shared tokens come first.
    `observed`: the tokens whose predictions the source's `update` reads (`Outcome.observed`)."""

    parents: tuple[int, ...]
    paths: tuple[tuple[int, ...], ...]
    groups: tuple[int, ...] | None = None  # None: every token shared (computed on every device)
    path_groups: tuple[int, ...] | None = None  # None: every path in group 0
    observed: tuple[int, ...] = ()  # tokens (or ROOT) whose argmax the source's update reads

    def __post_init__(self):
        for i, parent in enumerate(self.parents):
            if not (parent == ROOT or 0 <= parent < i):
                raise ValueError(f"token {i}: parent {parent} is neither the root nor an earlier token")
        for path in self.paths:
            for k, token in enumerate(path):
                if self.parents[token] != (path[k - 1] if k else ROOT):
                    raise ValueError(f"path {path} is not a chain from the root")
        groups, path_groups = self.token_groups, self.path_group_ids
        for path, group in zip(self.paths, path_groups):
            tail = [groups[i] for i in path if groups[i] >= 0]
            shared = sum(groups[i] < 0 for i in path)
            if any(g != group for g in tail) or any(groups[i] >= 0 for i in path[:shared]):
                raise ValueError(f"path {path}: shared tokens first, then tokens of its own group {group}")
        for i, parent in enumerate(self.parents):
            if parent != ROOT and groups[parent] >= 0 and groups[parent] != groups[i]:
                raise ValueError(f"token {i} of group {groups[i]} hangs off a token of group {groups[parent]}")

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def token_groups(self) -> tuple[int, ...]:
        return self.groups if self.groups is not None else (-1,) * self.size

    @property
    def path_group_ids(self) -> tuple[int, ...]:
        return self.path_groups if self.path_groups is not None else (0,) * len(self.paths)

    @property
    def num_groups(self) -> int:
        return max([*self.token_groups, *self.path_group_ids, -1]) + 1


def chain(length: int) -> BranchLayout:
    """`length` tokens in one chain after the root, verified as one path (a draft sequence);
    under lookahead parallelism every device computes them (no re-feed), device 0 verifies."""
    return BranchLayout(parents=tuple(range(-1, length - 1)), paths=(tuple(range(length)),) if length else ())


def dfs_intervals(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(preorder number, last preorder number in the subtree) of each node of a forest given
    by `parents` (-1 = no parent, parents before children); children in index order."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i, p in enumerate(parents):
        (roots if p < 0 else children[p]).append(i)
    pre, end = np.zeros(n, np.int32), np.zeros(n, np.int32)
    counter = 0
    stack = [(r, False) for r in reversed(roots)]
    while stack:
        node, done = stack.pop()
        if done:
            end[node] = max([pre[node]] + [end[c] for c in children[node]])
            continue
        pre[node] = counter
        counter += 1
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children[node]))
    return pre, end


@dataclasses.dataclass(frozen=True, eq=False)
class TokenTree:
    """The block of one step: the root (index 0), then each branch's tokens in order. Static:
    its tables are numpy arrays, computed once per tree (cached), read while tracing."""

    branches: tuple[BranchLayout, ...]

    @functools.cached_property
    def starts(self) -> tuple[int, ...]:
        """Block index of each branch's first token."""
        out, at = [], 1
        for b in self.branches:
            out.append(at)
            at += b.size
        return tuple(out)

    @property
    def size(self) -> int:
        return 1 + sum(b.size for b in self.branches)

    @functools.cached_property
    def parents(self) -> np.ndarray:
        out = [-1]
        for start, b in zip(self.starts, self.branches):
            out += [0 if p == ROOT else start + p for p in b.parents]
        return np.asarray(out, np.int32)

    @functools.cached_property
    def depths(self) -> np.ndarray:
        """Each token's position relative to the root's."""
        parents = self.parents
        depth = np.zeros(len(parents), np.int32)
        for i in range(1, len(parents)):
            depth[i] = depth[parents[i]] + 1
        return depth

    def path_rows(self) -> list[tuple[int, int]]:
        """[first, last) path row of each branch in `paths` (verification order)."""
        rows, at = [None] * len(self.branches), 0
        for i in reversed(range(len(self.branches))):
            rows[i] = (at, at + len(self.branches[i].paths))
            at = rows[i][1]
        return rows

    @functools.cached_property
    def paths(self) -> np.ndarray:
        """Block indices `[K, P]` of every verified path (-1 = padding), last branch's first.

        No path at all: one empty path, i.e. a plain one-token step."""
        paths = [[start + i for i in path]
                 for start, b in reversed(list(zip(self.starts, self.branches))) for path in b.paths]
        paths = paths or [[]]
        longest = max(len(p) for p in paths)
        return np.array([p + [-1] * (longest - len(p)) for p in paths], np.int32).reshape(len(paths), longest)

    @property
    def max_path(self) -> int:
        return self.paths.shape[1]

    @property
    def pred_idx(self) -> np.ndarray:
        """`[K, P+1]`: the block index whose output predicts each path position (0 = the root,
        then the path's own tokens; padding points at the root)."""
        paths = self.paths
        return np.concatenate([np.zeros((len(paths), 1), np.int32), np.maximum(paths, 0)], axis=1)

    def observed(self, branch: int) -> np.ndarray:
        """Block indices of branch `branch`'s observed tokens."""
        start = self.starts[branch]
        return np.asarray([0 if i == ROOT else start + i for i in self.branches[branch].observed], np.int32)

    def relation(self) -> np.ndarray:
        """The dense `[T, T]` relation (tests and references): j is i or an ancestor of i."""
        pre, end = dfs_intervals(self.parents)
        return tree_relation(pre[:, None], pre[None, :], end[None, :])

    def mask(self, batch: int) -> TreeMask:
        """The step's `TreeMask`, as numpy constants: the XLA reference's dense relation is then
        a compile-time constant, and the kernel reads the two vectors."""
        pre, end = dfs_intervals(self.parents)
        return TreeMask(pre=np.broadcast_to(pre, (batch, self.size)), end=np.broadcast_to(end, (batch, self.size)))
