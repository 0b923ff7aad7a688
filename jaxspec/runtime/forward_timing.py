"""Seconds of one forward of a model over a block of T tokens after a half-full cache: the
step cost c(T) that the one-off studies draft_vocab and cpu_options measured (their scripts:
`git show 1baa28e:benchmarks/NAME.py`). `method="auto"` no longer times forwards before it answers: it learns from the decodes
it runs (`jaxspec.runtime.auto`)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.models.kv_cache import KVCache
from jaxspec.models.masks import TreeMask
from jaxspec.models.quantize import module_dtype
from jaxspec.runtime import compile_cache

REPEATS = 3
# Timed rounds stop early once they have taken this long: the minimum of a few runs guards a
# millisecond forward against a stray pause, which a 50 ms one (SmolLM2-135M's) hardly feels.
ROUNDS_SECONDS = 0.1


def _forward_program(graphdef, params, ids, positions, mask, cache, head):
    module = nnx.merge(graphdef, params)
    if head is None:
        return module(ids, positions, mask, cache, head="argmax").preds
    final = module(ids, positions, mask, cache, head="none").final
    return jnp.argmax(jnp.einsum("btd,vd->btv", final.astype(jnp.float32), head.astype(jnp.float32)), -1)


def _forward(module_graphdef, params, batch: int, cache_len: int, tokens: int, cfg, dtype, head=None):
    """A compiled forward of `tokens` tokens after a half-full cache, and its arguments.
    `head`: a drafter's draft-vocabulary head rows, used instead of the model's full head."""
    # Built on the host and placed once: made with jnp, each array would compile a small program
    # of its own in every process.
    kv = np.zeros((cfg.num_layers, batch, cfg.num_kv_heads, cache_len, cfg.head_dim), dtype)  # KVCache's layout
    lengths = np.full((batch,), cache_len // 2, np.int32)
    steps = np.arange(tokens, dtype=np.int32)
    cache, ids, positions, chain = jax.device_put((
        KVCache(k=kv, v=kv, lengths=lengths), np.zeros((batch, tokens), np.int32), lengths[:, None] + steps[None],
        TreeMask(pre=np.broadcast_to(steps, (batch, tokens)),  # each token sees the ones before
                 end=np.full((batch, tokens), tokens - 1, np.int32))))
    args = (module_graphdef, params, ids, positions, chain, cache, head)
    return compile_cache.compiled(_forward_program, args), args


def _in_threads(fn, items: list, model) -> list:
    """`fn` of each item, in threads, at most one per core (compiling, loading and first runs:
    untimed work that runs outside Python's lock; more threads than cores only add switching:
    auto's first measurement with a race on 2 cores, median of 4 processes: 0.96 s with a thread
    per program, 0.92 s with two); one after another where programs hold collectives: processes
    must meet them in the same order, and a tensor-parallel model's programs share its devices."""
    if jax.process_count() > 1 or model.mesh is not None or len(items) < 2:
        return [fn(x) for x in items]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ThreadPoolExecutor(min(len(items), cores)) as pool:
        return list(pool.map(fn, items))


def forward_seconds(model, batch: int, cache_len: int, sizes: list[int], repeats: int = REPEATS, head=None
                    ) -> dict[int, float]:
    """Seconds of one forward of `model` per block size (`forwards_seconds`)."""
    return dict(zip(sizes, forwards_seconds(batch, cache_len, [(model, t, head) for t in sizes], repeats)))


def forwards_seconds(batch: int, cache_len: int, forwards: list[tuple], repeats: int = REPEATS) -> list[float]:
    """Seconds of each forward (model, block size, head or None): each compiled (or loaded) and
    run once, all at once in threads (a program's first run is several times slower than the
    next on CPU), then timed `repeats` times (fewer once ROUNDS_SECONDS are spent), interleaved,
    the minimum kept."""
    def ready(forward: tuple):
        model, tokens, head = forward
        dtype = module_dtype(model.module)
        program, args = _forward(model.graphdef, model.params, batch, cache_len, tokens, model.config, dtype, head)
        jax.block_until_ready(program(*args))
        return program, args

    programs = _in_threads(ready, forwards, forwards[0][0])
    best = [np.inf] * len(programs)
    timed = 0.0
    for _ in range(repeats):
        for i, (program, args) in enumerate(programs):
            t0 = time.perf_counter()
            jax.block_until_ready(program(*args))
            best[i] = min(best[i], time.perf_counter() - t0)
            timed += time.perf_counter() - t0
        if timed >= ROUNDS_SECONDS:  # programs this long time steadily: one more round would not change c
            break
    return best
