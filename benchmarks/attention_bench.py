"""Pallas attention kernels vs the XLA reference attention at 7B-like shapes, in one command.

Decode (one layer's attention of a lookahead step): 32 query heads, 8 KV heads, head_dim 128,
bfloat16, batch 1, a full KV cache of 2k / 4k / 8k tokens, the block of the (W, N, G) =
(15, 5, 15) step (120 tokens) and, as a baseline, the one-token greedy step. Variants:

* `xla`: `jaxspec.attention.xla_attention` (the reference and the default backend);
* `pallas dense`: `decode_attention` reading the step relation as a dense mask;
* `pallas in-kernel`: `decode_attention` with the step's `TreeMask` (each token's DFS interval
  in the token tree): the relation is computed in the kernel (what `attention="pallas"` runs
  for every decoding step).

Training (one layer's attention of a PARD drafter-training forward): the full layout of
K = 4 blocks of L = 1024 tokens (n = 4096), `pard_attention` vs `pard_reference` (XLA under
the dense mask).

Each variant is compiled and run once (warm-up), then timed as the median of `--repeats`
calls, each of which runs the attention `--inner` times over different queries inside one
program (so per-call dispatch does not swamp microsecond kernels). Outputs are compared
with the reference (max |difference|). `GB/s` = K/V bytes the attention must read (cache
+ block, or the sequence) / time.

    python benchmarks/attention_bench.py            # on a GPU or TPU, ~1-3 minutes
    python benchmarks/attention_bench.py --smoke    # tiny shapes (no greedy step), interpret mode; CPU, seconds

Writes benchmarks/results/attention_bench{,_smoke}.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.attention import xla_attention
from jaxspec.decoding.engine import Engine
from jaxspec.decoding.options import LookaheadOptions
from jaxspec.masks import pard_layout
from jaxspec.methods import lookahead_sources
from pallas_kernels import decode_attention, pard_attention, pard_reference

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_info  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

FULL = dict(heads=32, kv_heads=8, head_dim=128, cache_lengths=(2048, 4096, 8192), step=(15, 5, 15),
            greedy_step=True, pard=(1024, 4), dtype="bfloat16", repeats=20, inner=10)
SMOKE = dict(heads=4, kv_heads=2, head_dim=64, cache_lengths=(50,), step=(3, 3, 2),
             greedy_step=False, pard=(24, 2), dtype="float32", repeats=1, inner=1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes in Pallas interpret mode (CPU)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls per variant (median reported)")
    p.add_argument("--inner", type=int, default=None, help="attention calls inside one timed program")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def timed(fn, args, repeats: int) -> tuple[float, jax.Array]:
    out = jax.block_until_ready(fn(*args))  # compile + warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def repeated(attention, inner: int):
    """One program that runs `attention(q_i, *rest)` for `inner` different queries in sequence."""
    return jax.jit(lambda qs, *rest: jax.lax.map(lambda q: attention(q, *rest), qs))


def decode_rows(cfg: dict, batch: int, repeats: int, inner: int, interpret: bool | None) -> list[dict]:
    h, kv, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dtype = jnp.dtype(cfg["dtype"])
    w, n, g = cfg["step"]
    tree = Engine(sources=lookahead_sources(LookaheadOptions(window=w, ngram=n, guesses=g))).tree
    step = tree.mask(batch)
    rng = np.random.default_rng(0)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    pallas = functools.partial(decode_attention, interpret=interpret)
    rows = []
    for length in cfg["cache_lengths"]:
        blocks = [("greedy step", 1, None)] if cfg["greedy_step"] else []
        for name, t, relation in blocks + [(f"lookahead {cfg['step']}", step.size, step)]:
            kc, vc = normal(batch, length, kv, d), normal(batch, length, kv, d)
            kn, vn = normal(batch, t, kv, d), normal(batch, t, kv, d)
            qs = normal(inner, batch, t, h, d)
            lengths = jnp.full((batch,), length, jnp.int32)
            positions = length + jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (batch, t))
            dense = jnp.ones((batch, 1, 1), bool) if relation is None else \
                relation.dense()
            rest = (kc, vc, lengths, kn, vn)
            variants = {
                "xla": lambda q, *r: xla_attention(q, *r, dense, positions),
                "pallas dense": lambda q, *r: pallas(q, *r, dense, positions),
            }
            if relation is not None:
                variants["pallas in-kernel"] = lambda q, *r: pallas(q, *r, relation, positions)
            kv_bytes = 2 * batch * (length + t) * kv * d * dtype.itemsize
            reference = None
            for variant, attention in variants.items():
                seconds, out = timed(repeated(attention, inner), (qs, *rest), repeats)
                seconds /= inner
                if reference is None:
                    reference = out
                diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - reference.astype(jnp.float32))))
                rows.append(dict(kind="decode", block=name, tokens=t, cache=length, variant=variant,
                                 ms=seconds * 1e3, gb_per_s=kv_bytes / seconds / 1e9, max_abs_diff=diff))
                print(f"{name:22s} cache {length:5d} {variant:17s} {seconds * 1e3:9.3f} ms "
                      f"{kv_bytes / seconds / 1e9:8.1f} GB/s  max|diff| {diff:.2e}", flush=True)
    return rows


def pard_rows(cfg: dict, batch: int, repeats: int, inner: int, interpret: bool | None) -> list[dict]:
    h, kv, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dtype = jnp.dtype(cfg["dtype"])
    seq_len, blocks = cfg["pard"]
    block_ids, positions = (jnp.broadcast_to(x, (batch, seq_len * blocks)) for x in pard_layout(seq_len, blocks))
    n = seq_len * blocks
    rng = np.random.default_rng(1)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    qs, k, v = normal(inner, batch, n, h, d), normal(batch, n, kv, d), normal(batch, n, kv, d)
    variants = {
        "xla": lambda q, k, v: pard_reference(q, k, v, block_ids, positions),
        "pallas": lambda q, k, v: pard_attention(q, k, v, block_ids, positions, interpret=interpret),
    }
    rows, reference = [], None
    for variant, attention in variants.items():
        seconds, out = timed(repeated(attention, inner), (qs, k, v), repeats)
        seconds /= inner
        if reference is None:
            reference = out
        diff = float(jnp.max(jnp.abs(out.astype(jnp.float32) - reference.astype(jnp.float32))))
        name = f"PARD L={seq_len} K={blocks}"
        rows.append(dict(kind="pard", block=name, tokens=n, cache=0, variant=variant, ms=seconds * 1e3,
                         gb_per_s=2 * batch * n * kv * d * dtype.itemsize / seconds / 1e9, max_abs_diff=diff))
        print(f"{name:22s} n {n:5d}     {variant:17s} {seconds * 1e3:9.3f} ms  max|diff| {diff:.2e}", flush=True)
    return rows


def markdown(r: dict) -> str:
    cfg, m = r["config"], r["machine"]
    lines = [f"# Attention kernels vs XLA{' (smoke: tiny shapes, interpret mode)' if r['smoke'] else ''}", "",
             f"{cfg['heads']} query heads, {cfg['kv_heads']} KV heads, head_dim {cfg['head_dim']}, {cfg['dtype']}, "
             f"batch {r['batch']}; median of {r['repeats']} timed calls x {r['inner']} attentions per call. "
             "Times are per attention (one layer). `vs xla` = XLA time / this time.", "",
             "| block | tokens | cache | variant | ms | GB/s (K/V) | vs xla | max abs diff |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    xla = {(e["block"], e["cache"]): e["ms"] for e in r["rows"] if e["variant"] == "xla"}
    for e in r["rows"]:
        speedup = xla[(e["block"], e["cache"])] / e["ms"]
        lines.append(f"| {e['block']} | {e['tokens']} | {e['cache']} | {e['variant']} | {e['ms']:.3f} | "
                     f"{e['gb_per_s']:.1f} | {speedup:.2f}x | {e['max_abs_diff']:.2e} |")
    lines += ["", "| machine | |", "|---|---|",
              f"| device | {m['device']} ({m['jax_backend']}) |", f"| host | {m['cpu']} ({m['cpu_count']} cores) |",
              f"| python / jax / jaxspec | {m['python']} / {m['jax']} / {m['jaxspec']} |",
              f"| date | {r['date']} |", f"| command | `{r['command']}` |", ""]
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg = dict(SMOKE if args.smoke else FULL)
    backend = jax.default_backend()
    if backend == "cpu" and not args.smoke:
        sys.exit("no accelerator: the 7B-like shapes are for a GPU or TPU; run with --smoke on CPU")
    interpret = True if args.smoke else None
    repeats = args.repeats or cfg["repeats"]
    inner = args.inner or cfg["inner"]
    start = time.perf_counter()
    rows = decode_rows(cfg, args.batch, repeats, inner, interpret)
    rows += pard_rows(cfg, args.batch, repeats, inner, interpret)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    r = dict(benchmark=__doc__.splitlines()[0], smoke=args.smoke, config=cfg, batch=args.batch, repeats=repeats,
             inner=inner, rows=rows, total_seconds=time.perf_counter() - start, machine=machine_info(),
             load_average=os.getloadavg(), date=date,
             command="python benchmarks/attention_bench.py" + "".join(f" {a}" for a in (argv or sys.argv[1:])))
    suffix = "_smoke" if args.smoke else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"attention_bench{suffix}.json").write_text(json.dumps(r, indent=1) + "\n")
    (args.out / f"attention_bench{suffix}.md").write_text(markdown(r))
    print(f"wrote {args.out / f'attention_bench{suffix}.md'} ({r['total_seconds']:.0f} s)")
    return r


if __name__ == "__main__":
    main()
