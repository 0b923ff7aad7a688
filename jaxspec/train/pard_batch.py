"""PARD drafter-training batches: K blocks per sequence, conditional drop (COD), labels and
the target-feature alignment (`../shared/docs/pard2.md`, relation in `jaxspec.models.masks`).

A training sequence is L + 1 corpus tokens x_0..x_L. The drafter's input holds block 0 =
the real tokens x_0..x_{L-1} and mask blocks 1..K-1, every token tagged with (block j,
position t). The row (j, t) stands for the inference input `[x_<n, m_1..m_j]`, n = t-j+1,
and predicts x_{t+1}; rows with t < j have no real context and are never built.

COD keeps block i's rows at floor(L * max(r^i, r_min)) positions chosen at random among
those whose predecessor (i-1, t-1) was kept, so every kept row's whole mask chain exists
and the training relation of each kept row equals its inference relation. The counts are
static, so batches have one shape; a block with fewer candidates than its count is
padded (block id -1: sees nothing, is seen by nobody, weight 0).

Everything here is numpy on the host, seeded by (seed, step): resuming rebuilds the same
batches.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from jaxtyping import Bool, Int

from jaxspec.errors import ConfigError


def cod_counts(seq_len: int, num_blocks: int, ratio: float, min_ratio: float) -> tuple[int, ...]:
    """Rows kept per block: L for block 0, floor(L * max(r^i, r_min)) (at most L - i) after."""
    if num_blocks < 1 or seq_len <= num_blocks - 1:
        raise ConfigError(f"PARD training needs seq_len ({seq_len}) > num_blocks - 1 ({num_blocks - 1}); "
                          "raise [data] seq_len or lower [pard] num_blocks")
    counts = [seq_len]
    for i in range(1, num_blocks):
        counts.append(max(1, min(seq_len - i, math.floor(seq_len * max(ratio ** i, min_ratio)))))
    return tuple(counts)


@dataclasses.dataclass(frozen=True)
class PardBatch:
    """Host arrays of one batch; `n` = sum of the COD counts (padding rows have block -1)."""

    inputs: Int[np.ndarray, "b L"]  # x_0..x_{L-1}: the frozen target's input
    next_tokens: Int[np.ndarray, "b L"]  # x_1..x_L: block 0's labels
    tokens: Int[np.ndarray, "b n"]  # drafter input: x_t in block 0, the mask id elsewhere
    positions: Int[np.ndarray, "b n"]
    block_ids: Int[np.ndarray, "b n"]
    labels: Int[np.ndarray, "b n"]  # x_{t+1}
    valid: Bool[np.ndarray, "b n"]  # a real row whose label is scored (padding and unscored labels: False)

    def arrays(self) -> dict[str, np.ndarray]:
        return dataclasses.asdict(self)


def cod_rows(rng: np.random.Generator, counts: tuple[int, ...], scored: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
    """(block ids, positions) of one sequence's kept rows, block by block, positions sorted.
    `scored` ([L] bool): mask rows are kept only at positions t whose label is scored (the
    others would only be computed to be weighted 0); block 0 is always whole (it is the context)."""
    seq_len = counts[0]
    kept = np.arange(seq_len)
    blocks, positions = [np.zeros(seq_len, np.int32)], [kept.astype(np.int32)]
    for i, count in enumerate(counts[1:], start=1):
        candidates = kept[kept + 1 < seq_len] + 1
        if scored is not None:
            candidates = candidates[scored[candidates]]
        take = min(count, len(candidates))
        if take < len(candidates):
            candidates = np.sort(rng.choice(candidates, size=take, replace=False))
        kept = candidates
        pad = count - take
        blocks.append(np.concatenate([np.full(take, i, np.int32), np.full(pad, -1, np.int32)]))
        positions.append(np.concatenate([kept.astype(np.int32), np.zeros(pad, np.int32)]))
    return np.concatenate(blocks), np.concatenate(positions)


def make_batch(sequences: Int[np.ndarray, "b L1"], counts: tuple[int, ...], mask_token_id: int,
               rng: np.random.Generator, scored_tokens: Bool[np.ndarray, "b L1"] | None = None) -> PardBatch:
    """The PARD batch of `sequences` (L + 1 tokens each) with COD rows drawn from `rng`.

    `counts = (L, L-1, ..., L-K+1)` keeps every row (no COD): the full layout minus the
    rows without context, as used to measure acceptance. `scored_tokens`: which tokens are
    trained on as labels (a chat's reply tokens; None: all): a row is `valid` only where its
    label is one, and COD keeps mask rows only there.
    """
    sequences = np.asarray(sequences, np.int64)
    b, seq_len = sequences.shape[0], sequences.shape[1] - 1
    if counts[0] != seq_len:
        raise ConfigError(f"COD counts are for sequences of {counts[0]} tokens, the batch has {seq_len}")
    scored = None if scored_tokens is None else np.asarray(scored_tokens, bool)[:, 1:]  # row t's label is x_{t+1}
    rows = [cod_rows(rng, counts, None if scored is None else scored[i]) for i in range(b)]
    block_ids = np.stack([r[0] for r in rows])
    positions = np.stack([r[1] for r in rows])
    valid = block_ids >= 0
    if scored is not None:
        valid &= np.take_along_axis(scored, positions, axis=1)
    real = np.take_along_axis(sequences, positions, axis=1)
    labels = np.take_along_axis(sequences, positions + 1, axis=1)
    tokens = np.where(block_ids == 0, real, np.where(block_ids > 0, mask_token_id, 0))
    return PardBatch(inputs=sequences[:, :-1].astype(np.int32), next_tokens=sequences[:, 1:].astype(np.int32),
                     tokens=tokens.astype(np.int32), positions=positions, block_ids=block_ids,
                     labels=np.where(valid, labels, 0).astype(np.int32), valid=valid)


def full_counts(seq_len: int, num_blocks: int) -> tuple[int, ...]:
    """COD counts that keep every row with context (r = 1)."""
    return cod_counts(seq_len, num_blocks, 1.0, 1.0)


def feature_index(block_ids: Int[np.ndarray, "*b n"], positions: Int[np.ndarray, "*b n"]):
    """Which target hidden state row (block j, position t) gets: h_{t-j-1}. In block 0 that is
    the shift (token t pairs with h_{t-1}, nothing at t = 0); mask block j's input is
    `[x_<n, m_1..m_j]` with n = t-j+1, and its masks get the feature of the last real token
    x_{n-1}, i.e. h_{n-2}: at inference x_{n-1} is the bonus token the target has not run on
    yet, so h_{n-1} does not exist. Returns (index, has_feature); numpy and jax arrays alike."""
    index = positions - block_ids - 1
    return index * (index > 0), (index >= 0) & (block_ids >= 0)
