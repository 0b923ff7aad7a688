"""Per-device memory and per-step communication of Llama-3.1-8B / 70B (bf16) under tensor
parallelism (TP), lookahead parallelism (LP) and both, derived from the configs (nothing is
run: the parameter shapes come from `jax.eval_shape` of the model, their layout from
`jaxspec.tensor_parallel.partition_spec`, the KV cache from `jaxspec.memory`).

Per device: weights (bf16, the Megatron layout; replicated under LP), KV cache at a 4096-token
context per sequence (split over `model` when the 8 KV heads divide), the n-gram pool
(batch x vocab x G x (N-1) int32, replicated). Per decode step at batch 1, lookahead
(15, 5, 15) (T = 120 block tokens): TP sends two all-reduces of [b, T, hidden] bf16 per layer
(a ring all-reduce moves 2 (T-1)/T of the array per device); LP one all_gather of int32 rows
(accepted length, path id, emitted tokens, new window tokens: 704 bytes at 8 devices,
`benchmarks/results/lp_bench.md`). Chips: TPU v5e 16 GB, v5p 95 GB, H100 80 GB per device.

    python benchmarks/tp_plan.py
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from jaxspec import ModelConfig, Transformer
from jaxspec.memory import kv_cache_bytes
from jaxspec.tensor_parallel import path_names, partition_spec, splits

RESULTS = Path(__file__).resolve().parent / "results"
GB = 1e9
MODELS = {  # the published configs
    "Llama-3.1-8B": dict(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8),
    "Llama-3.1-70B": dict(hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64, num_kv_heads=8),
}
CHIPS = {"TPU v5e": 16, "TPU v5p": 95, "H100": 80}
SETTINGS = [  # (hardware, devices, LP groups, TP degree)
    ("TPU v5e-8", 8, 1, 8), ("TPU v5e-8", 8, 2, 4), ("TPU v5e-16", 16, 1, 16), ("TPU v5e-16", 16, 2, 8),
    ("TPU v5p-8", 8, 1, 8), ("TPU v5p-8", 8, 8, 1), ("TPU v5p-8", 8, 2, 4),
    ("8 x H100", 8, 1, 8), ("8 x H100", 8, 8, 1), ("8 x H100", 8, 2, 4),
]
CONTEXT, BLOCK, G, N, BATCH = 4096, 120, 15, 5, 1
LP_GATHER_BYTES = 704  # measured from the compiled LP program at (15, 5, 15) on 8 devices


def config(name: str) -> ModelConfig:
    return ModelConfig(model_type="llama", vocab_size=128256, head_dim=128, max_position_embeddings=131072,
                       bos_token_id=1, **MODELS[name])


def weight_bytes_per_device(cfg: ModelConfig, tp: int) -> int:
    shapes = nnx.state(nnx.eval_shape(lambda: Transformer(cfg, dtype=jax.numpy.bfloat16, rngs=nnx.Rngs(0))))
    total = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
        spec = partition_spec(path_names(path), cfg, tp)
        split = tp if any(axis is not None for axis in spec) else 1
        total += int(np.prod(leaf.shape)) * 2 // split
    return total


def main(argv=None) -> int:
    rows = []
    for name in MODELS:
        cfg = config(name)
        for hardware, devices, lp, tp in SETTINGS:
            chip = next(v for k, v in CHIPS.items() if hardware.startswith(k) or k in hardware)
            weights = weight_bytes_per_device(cfg, tp)
            kv = kv_cache_bytes(cfg, 2, BATCH, CONTEXT) // (tp if splits(cfg, tp)["kv_heads"] else 1)
            pool = BATCH * cfg.vocab_size * G * (N - 1) * 4
            tp_bytes = 0 if tp == 1 else int(2 * cfg.num_layers * BATCH * (BLOCK // lp) * cfg.hidden_size * 2
                                             * 2 * (tp - 1) / tp)
            lp_bytes = 0 if lp == 1 else LP_GATHER_BYTES
            total = weights + kv + pool
            rows.append(dict(model=name, hardware=hardware, devices=devices, lp=lp, tp=tp, weights_bytes=weights,
                             kv_bytes=kv, pool_bytes=pool, total_bytes=total, chip_bytes=chip * 10**9,
                             fits=total < 0.9 * chip * 10**9, tp_bytes_per_step=tp_bytes, lp_bytes_per_step=lp_bytes))
    result = dict(rows=rows, context=CONTEXT, block=BLOCK, batch=BATCH, config=[15, N, G],
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command="python benchmarks/tp_plan.py")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tp_plan.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["| model | hardware | LP x TP | weights GB | KV (4k) GB | pool GB | total GB / chip GB | fits | "
             "TP bytes/step/device | LP bytes/step |", "|---|---|---|---:|---:|---:|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['hardware']} | {r['lp']} x {r['tp']} | {r['weights_bytes'] / GB:.2f} | "
                     f"{r['kv_bytes'] / GB:.3f} | {r['pool_bytes'] / GB:.3f} | {r['total_bytes'] / GB:.1f} / "
                     f"{r['chip_bytes'] / GB:.0f} | {'yes' if r['fits'] else 'no'} | "
                     f"{r['tp_bytes_per_step'] / 1e6:.1f} MB | {r['lp_bytes_per_step']} B |")
    (RESULTS / "tp_plan.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
