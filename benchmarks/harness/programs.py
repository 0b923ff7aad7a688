"""Timing compiled programs (a forward, an attention kernel, a decode step) rather than decodes.

`time_programs` compiles every program and runs it once before timing anything, then runs them
round after round in the interleaved order of `harness.order` (so each is as often right after a
given other as before it), garbage collection outside timed calls, and returns every program's
seconds per round. Reporting the minimum (the least disturbed run) or the median is the caller's
choice; both are in `stats`.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable, Mapping

from benchmarks.harness.order import interleaved


def stats(seconds: list[float]) -> dict:
    return {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds), "rounds": len(seconds)}


def time_programs(programs: Mapping[str, tuple[Callable, tuple[Any, ...]]], rounds: int,
                  deadline: float | None = None) -> dict[str, list[float]]:
    """{name: (fn, args)} -> {name: [seconds of each round]}. `fn(*args)` is blocked on (JAX's
    asynchronous dispatch returns before the work is done). With `deadline` (a `time.perf_counter()`
    value) rounds stop early once it has passed, after at least one."""
    import jax

    names = list(programs)
    for name in names:  # compile and warm up, untimed
        fn, args = programs[name]
        jax.block_until_ready(fn(*args))
    times = {name: [] for name in names}
    gc.disable()
    try:
        for k in range(rounds):
            gc.collect()
            for name in interleaved(names, k):
                fn, args = programs[name]
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times[name].append(time.perf_counter() - t0)
            if deadline is not None and time.perf_counter() > deadline:
                break
    finally:
        gc.enable()
    return times
