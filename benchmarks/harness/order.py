"""The order settings run in: every setting alike.

A program that ran just before finds the caches warm, so who runs after whom matters on a CPU:
with a plain rotation (or one reversed every other case with a new rotation) one setting ran
right after another more often than the other way round, which cost `auto` ~15% against greedy
on stories260K (benchmarks/auto_bench.py). Here case 2j runs rotation j forwards and case 2j+1
the same rotation backwards: over each pair, every setting follows each other one as often as it
precedes it, and each starts and ends a case equally often over the rounds.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def interleaved(names: Sequence[T], k: int) -> list[T]:
    """The order of the k-th case run (counted over rounds and cases)."""
    names = list(names)
    if not names:
        return []
    j = (k // 2) % len(names)
    rotation = names[j:] + names[:j]
    return rotation if k % 2 == 0 else rotation[::-1]
