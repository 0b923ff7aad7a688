"""Teacher-forced acceptance of a parallel drafter, read off one PARD forward.

The full PARD layout (every row with context, no COD) over a sequence s holds, for every
context length n, the K drafts the drafter would make from `[s_<n, m_1..m_{K-1}]`: draft
k is the row (block k-1, position n+k-2). Greedy verification accepts the longest prefix of
drafts that match the target's own continuation plus one bonus token, so with `correct[j,
t]` = "row (j, t) predicts the reference token s_{t+1}" the accepted length at n is
1 + the number of leading k with correct[k-1, n+k-2]. Against the target's greedy
continuation this is exactly what greedy speculative decoding would accept at each step
started from that prefix.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Bool, Int


def conditional_rates(accepted: np.ndarray) -> np.ndarray:
    """a_k = P(draft k accepted | drafts 1..k-1 accepted), k = 1..K, from histograms of accepted
    counts on the last axis ([..., K + 1] -> [..., K]; NaN where unreached)."""
    reached = np.flip(np.flip(accepted, -1).cumsum(-1), -1)  # reached[..., k] = #(accepted >= k)
    with np.errstate(invalid="ignore", divide="ignore"):
        return reached[..., 1:] / reached[..., :-1]


@dataclasses.dataclass(frozen=True)
class AcceptanceStats:
    contexts: int
    accepted: np.ndarray  # [K + 1]: how many contexts accepted exactly a drafts, a = 0..K
    path_accepted: np.ndarray  # [K + 1]: the same over the steps of each text's decoding path (`decode_path`)

    @property
    def num_blocks(self) -> int:
        return len(self.accepted) - 1

    @property
    def mean_length(self) -> float:
        """Mean tokens per verification step, bonus included (1 .. K + 1)."""
        return float((self.accepted * (np.arange(len(self.accepted)) + 1)).sum() / max(self.contexts, 1))

    def position_rates(self) -> np.ndarray:
        """a_k: P(draft k accepted | drafts 1..k-1 accepted) over every context, k = 1..K."""
        return conditional_rates(self.accepted)

    def path_position_rates(self) -> np.ndarray:
        """a_k over the contexts where a decoding step starts (those just after a rejection and its
        bonus token: harder ones where acceptance comes in runs), what decoding measures."""
        return conditional_rates(self.path_accepted)

    @property
    def path_steps(self) -> int:
        return int(self.path_accepted.sum())

    @property
    def path_tokens(self) -> int:
        return int((self.path_accepted * (np.arange(len(self.path_accepted)) + 1)).sum())

    @property
    def path_s(self) -> float | None:
        """Tokens per step along the texts' decoding paths (`decode_path`); None without steps."""
        return self.path_tokens / self.path_steps if self.path_steps else None

    def __add__(self, other: "AcceptanceStats") -> "AcceptanceStats":
        return AcceptanceStats(self.contexts + other.contexts, self.accepted + other.accepted,
                               self.path_accepted + other.path_accepted)


def accepted_drafts(correct: Bool[np.ndarray, "b n"], block_ids: Int[np.ndarray, "b n"],
                    positions: Int[np.ndarray, "b n"], num_blocks: int, seq_len: int,
                    first_context: int | np.ndarray = 1, last_context: int | np.ndarray | None = None,
                    scored_tokens: Bool[np.ndarray, "b L1"] | None = None) -> list[np.ndarray]:
    """Per sequence, the drafts greedy verification accepts at each counted context n =
    first_context .. last_context (default and at most seq_len-K+1, where the last draft's row
    exists); both may be per-sequence arrays. `scored_tokens`: only contexts whose first draft
    x_n is one of these count (a chat's reply tokens: a drafter is used on replies, never to
    draft the prompt)."""
    return [a for _, a in _accepted_at(correct, block_ids, positions, num_blocks, seq_len, first_context, last_context,
                                       scored_tokens)]


def _accepted_at(correct, block_ids, positions, num_blocks, seq_len, first_context, last_context,
                 scored_tokens) -> list[tuple[np.ndarray, np.ndarray]]:
    """`accepted_drafts` with each sequence's counted contexts n beside its counts."""
    b = correct.shape[0]
    grid = np.zeros((b, num_blocks, seq_len), bool)
    rows, cols = np.nonzero(block_ids >= 0)
    grid[rows, block_ids[rows, cols], positions[rows, cols]] = correct[rows, cols]
    first = np.broadcast_to(np.asarray(first_context), (b,))
    last = np.broadcast_to(np.asarray(seq_len - num_blocks + 1 if last_context is None else last_context), (b,))
    out = []
    for i in range(b):
        n = np.arange(max(int(first[i]), 1), min(int(last[i]), seq_len - num_blocks + 1) + 1)
        if scored_tokens is not None:
            n = n[np.asarray(scored_tokens[i], bool)[n]]
        chain = grid[i, np.arange(num_blocks)[None, :], n[:, None] - 1 + np.arange(num_blocks)[None, :]]
        out.append((n, np.cumprod(chain, axis=1).sum(axis=1)))
    return out


def stats_of(accepted: list[np.ndarray], num_blocks: int) -> AcceptanceStats:
    """AcceptanceStats of per-context accepted-draft counts, each array one text's consecutive
    contexts (its `decode_path` counted)."""
    def histogram(counts: list[np.ndarray]) -> np.ndarray:
        every = np.concatenate([np.asarray(a, np.int64) for a in counts]) if counts else np.zeros(0, np.int64)
        return np.bincount(every, minlength=num_blocks + 1)[:num_blocks + 1]

    return AcceptanceStats(sum(len(a) for a in accepted), histogram(accepted),
                           histogram([decode_path(a) for a in accepted]))


def acceptance(correct: Bool[np.ndarray, "b n"], block_ids: Int[np.ndarray, "b n"],
               positions: Int[np.ndarray, "b n"], num_blocks: int, seq_len: int,
               first_context: int | np.ndarray = 1, last_context: int | np.ndarray | None = None,
               scored_tokens: Bool[np.ndarray, "b L1"] | None = None) -> AcceptanceStats:
    """The statistics of `accepted_drafts` (same arguments) over all counted contexts, with the
    decoding paths along each run of consecutive counted contexts (a packed chat's reply)."""
    found = _accepted_at(correct, block_ids, positions, num_blocks, seq_len, first_context, last_context,
                         scored_tokens)
    return stats_of([run for n, counts in found for run in np.split(counts, np.nonzero(np.diff(n) != 1)[0] + 1)],
                    num_blocks)


def decode_path(accepted: Int[np.ndarray, " n"]) -> Int[np.ndarray, " steps"]:
    """The accepted drafts of each step of greedy speculative decoding along one text whose
    consecutive contexts accept `accepted[i]` drafts each: a step starts where the previous step's
    accepted drafts and bonus token ended, so a context inside an accepted run never starts a step.
    sum(steps + 1) / len(steps) is the S decoding that text would get; the mean over every context
    (`AcceptanceStats.mean_length`) counts a long accepted run at each of its positions, so it is
    higher where acceptance comes in runs (repeated text). The last step may run past the contexts
    into the text they were scored against."""
    steps, at = [], 0
    while at < len(accepted):
        steps.append(int(accepted[at]))
        at += steps[-1] + 1
    return np.asarray(steps, np.int64)
