"""Pallas attention kernels vs the XLA reference attention at 7B-like shapes, in one command.

Decode (one layer's attention of a lookahead step): 32 query heads, 8 KV heads, head_dim 128, bfloat16, batch 1,
a full KV cache of 2k / 4k / 8k tokens, the block of the (W, N, G) = (15, 5, 15) step (120 tokens) and, as a
baseline, the one-token greedy step. Variants: `xla` (`jaxspec.models.attention.xla_attention`, the reference and
default backend); `pallas dense` (`decode_attention` reading the step relation as a dense mask); `pallas
in-kernel` (the step's `TreeMask`, the relation computed in the kernel: what `attention="pallas"` runs). Training
(one layer's attention of a PARD drafter-training forward): K = 4 blocks of L = 1024 tokens, `pard_attention` vs
`pard_reference` (XLA under the dense mask). A program runs the attention `--inner` times over different queries;
a group's variants are timed interleaved (`harness.time_programs`, median of `--rounds`); outputs are compared
with xla's (max |difference|). `GB/s` = K/V bytes read (cache + block, or the sequence) / time.

    python -m benchmarks.attention_bench            # on a GPU or TPU, ~1-3 minutes
    python -m benchmarks.attention_bench --smoke    # tiny shapes (no greedy step), interpret mode; CPU, seconds
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.harness import RESULTS, command_line, time_programs, write_result  # noqa: E402
from jaxspec.models.attention import xla_attention  # noqa: E402
from jaxspec.decoding.engine import Engine  # noqa: E402
from jaxspec.decoding.options import LookaheadOptions  # noqa: E402
from jaxspec.models.masks import pard_layout  # noqa: E402
from jaxspec.decoding.methods import lookahead_sources  # noqa: E402
from pallas_kernels import decode_attention, pard_attention, pard_reference  # noqa: E402

FULL = dict(heads=32, kv_heads=8, head_dim=128, cache_lengths=(2048, 4096, 8192), step=(15, 5, 15),
            greedy_step=True, pard=(1024, 4), dtype="bfloat16")
SMOKE = dict(heads=4, kv_heads=2, head_dim=64, cache_lengths=(50,), step=(3, 3, 2),
             greedy_step=False, pard=(24, 2), dtype="float32")


def repeated(attention, inner: int):
    """One program that runs `attention(q_i, *rest)` for `inner` different queries in sequence."""
    return jax.jit(lambda qs, *rest: jax.lax.map(lambda q: attention(q, *rest), qs))


def groups(cfg: dict, batch: int, inner: int, interpret: bool | None):
    """The timed groups, lazily: (row fields, {variant: (program, args)}, K/V bytes read), the
    decode step at each cache length, then PARD training."""
    h, kv, d, dtype = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], jnp.dtype(cfg["dtype"])
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    pallas = functools.partial(decode_attention, interpret=interpret)
    w, n, g = cfg["step"]
    step = Engine(sources=lookahead_sources(LookaheadOptions(window=w, ngram=n, guesses=g))).tree.mask(batch)
    for length in cfg["cache_lengths"]:
        blocks = [("greedy step", 1, None)] if cfg["greedy_step"] else []
        for name, t, relation in blocks + [(f"lookahead {tuple(cfg['step'])}", step.size, step)]:
            rest = (normal(batch, kv, length, d), normal(batch, kv, length, d), jnp.full((batch,), length, jnp.int32),
                    normal(batch, t, kv, d), normal(batch, t, kv, d))
            positions = length + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (batch, t))
            dense = jnp.ones((batch, 1, 1), bool) if relation is None else relation.dense()
            variants = {"xla": lambda q, *r, m=dense, p=positions: xla_attention(q, *r, m, p),
                        "pallas dense": lambda q, *r, m=dense, p=positions: pallas(q, *r, m, p)}
            if relation is not None:
                variants["pallas in-kernel"] = lambda q, *r, m=relation, p=positions: pallas(q, *r, m, p)
            args = (normal(inner, batch, t, h, d), *rest)
            yield (dict(kind="decode", block=name, tokens=t, cache=length),
                   {v: (repeated(a, inner), args) for v, a in variants.items()},
                   2 * batch * (length + t) * kv * d * dtype.itemsize)
    seq_len, count = cfg["pard"]
    n = seq_len * count
    block_ids, positions = (jnp.broadcast_to(x, (batch, n)) for x in pard_layout(seq_len, count))
    args = (normal(inner, batch, n, h, d), normal(batch, n, kv, d), normal(batch, n, kv, d))
    variants = {"xla": lambda q, k, v: pard_reference(q, k, v, block_ids, positions),
                "pallas": lambda q, k, v: pard_attention(q, k, v, block_ids, positions, interpret=interpret)}
    yield (dict(kind="pard", block=f"PARD L={seq_len} K={count}", tokens=n, cache=0),
           {v: (repeated(a, inner), args) for v, a in variants.items()}, 2 * batch * n * kv * d * dtype.itemsize)


def measure(group, rounds: int, inner: int, deadline: float | None = None) -> list[dict]:
    """One group's rows: its variants timed interleaved (median per attention), each output against xla's."""
    fields, programs, kv_bytes = group
    times = time_programs(programs, rounds, deadline)
    reference, rows = None, []
    for variant, (fn, args) in programs.items():
        out = fn(*args).astype(jnp.float32)
        reference = out if reference is None else reference
        seconds = statistics.median(times[variant]) / inner
        rows.append(dict(fields, variant=variant, ms=seconds * 1e3, gb_per_s=kv_bytes / seconds / 1e9,
                         max_abs_diff=float(jnp.max(jnp.abs(out - reference))), rounds=len(times[variant])))
        print(f"{fields['block']:22s} cache {fields['cache']:5d} {variant:17s} {seconds * 1e3:9.3f} ms "
              f"{rows[-1]['gb_per_s']:8.1f} GB/s  max|diff| {rows[-1]['max_abs_diff']:.2e}", flush=True)
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes in Pallas interpret mode (CPU)")
    p.add_argument("--rounds", type=int, help="timed rounds per variant, median reported (default 20; smoke 1)")
    p.add_argument("--inner", type=int, help="attention calls inside one timed program (default 10; smoke 1)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if jax.default_backend() == "cpu" and not args.smoke:
        sys.exit("no accelerator: the 7B-like shapes are for a GPU or TPU; run with --smoke on CPU")
    cfg = SMOKE if args.smoke else FULL
    rounds, inner = args.rounds or (1 if args.smoke else 20), args.inner or (1 if args.smoke else 10)
    rows = [row for g in groups(cfg, args.batch, inner, args.smoke or None) for row in measure(g, rounds, inner)]
    r = dict(benchmark="attention_bench", title="Attention kernels vs XLA" + (" (smoke)" if args.smoke else ""),
             smoke=args.smoke, config=cfg, batch=args.batch, rounds=rounds, inner=inner, rows=rows,
             command=command_line(__file__, argv))
    write_result(r, args.out, "attention_bench_smoke" if args.smoke else "attention_bench")
    return r


if __name__ == "__main__":
    main()
