"""Tensor parallelism (TP), lookahead parallelism (LP) and both, measured from the compiled
programs on 8 forced CPU devices: per-device weight bytes and what one decode step
communicates.

For each setting the benchmark lays a random-weight Llama (8 heads and 8 KV heads, so every
weight splits up to TP 8; untied embedding and LM head) out on its mesh, decodes with greedy
and with lookahead (15, 5, 15), and reads:

* weights per device: the bytes of each parameter's shard on device 0 (`addressable_shards`);
* per step: every collective inside the decode loop's body in the compiled HLO
  (`jaxspec.parallel.hlo_collectives`): its op, its device-group size g, and its result bytes;
  the bytes a device puts on the wire, for ring algorithms: all-reduce 2 (g-1)/g x the result,
  all-gather (g-1)/g x the result;
* the tokens: every setting must give single-device greedy's.

`--vocab replicated` rows repeat TP 4 with the embedding and the LM head replicated instead of
split by vocabulary: what the split saves and what it costs.

    python benchmarks/tp_bench.py              # sets XLA_FLAGS for 8 CPU devices itself
    python benchmarks/tp_bench.py --smoke      # a 1-layer model, seconds
"""

from __future__ import annotations

import os
import sys

if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import jaxspec  # noqa: E402
import report  # noqa: E402
from jaxspec import Model, ModelConfig, Transformer  # noqa: E402
from jaxspec.parallel import hlo_collectives  # noqa: E402
from jaxspec.tensor_parallel import param_shardings, path_names, shard, tp_mesh  # noqa: E402
from machine import machine_info  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = dict(hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8, num_kv_heads=8, head_dim=64,
             vocab_size=32000)
SMOKE_SHAPE = dict(SHAPE, num_layers=1, vocab_size=4096)
LOOKAHEAD = dict(window=15, ngram=5, guesses=15)
SETTINGS = [  # (name, LP groups, TP degree, vocabulary layout)
    ("1 device", 1, 1, "split"), ("TP 2", 1, 2, "split"), ("TP 4", 1, 4, "split"), ("TP 8", 1, 8, "split"),
    ("TP 4, vocab replicated", 1, 4, "replicated"), ("LP 4", 4, 1, "split"), ("LP 2 x TP 4", 2, 4, "split"),
]


def synthetic(shape: dict) -> Model:
    cfg = ModelConfig(model_type="llama", max_position_embeddings=2048, bos_token_id=1, eos_token_ids=(2,),
                      tie_word_embeddings=False, **shape)
    return Model.from_module(nnx.jit(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))(), source="synthetic")


def lay_out(single: Model, tp: int, vocab: str) -> Model:
    """The model on a TP mesh; `vocab="replicated"` keeps the embedding and LM head whole."""
    if tp == 1:
        return single
    model = shard(single, tp_mesh(tp))
    if vocab == "replicated":
        shardings = param_shardings(model.params, model.config, model.mesh)
        whole = NamedSharding(model.mesh, PartitionSpec())
        shardings = jax.tree_util.tree_map_with_path(
            lambda path, s: whole if {"embed_tokens", "lm_head"} & set(path_names(path)) else s, shardings)
        model = dataclasses.replace(model, params=jax.device_put(model.params, shardings), compiled={})
    return model


def weight_bytes_per_device(params) -> int:
    """Bytes of device 0's shards of every parameter (LP x TP: the re-laid-out parameters)."""
    total = 0
    for leaf in jax.tree.leaves(params):
        shard0 = next(s for s in leaf.addressable_shards if s.device == jax.devices()[0])
        total += shard0.data.nbytes
    return total


def wire_bytes(c: dict) -> float:
    """Bytes one device sends for a collective with ring algorithms (see the module docstring)."""
    g = len(c["groups"][0]) if c["groups"] else jax.device_count()
    if c["op"] == "all-reduce":
        return 2 * (g - 1) / g * c["bytes"]
    if c["op"] in ("all-gather", "reduce-scatter"):
        return (g - 1) / g * c["bytes"]
    return float(c["bytes"])


def step_collectives(program) -> dict:
    found = [c for c in hlo_collectives(program.as_text()) if c["in_loop"]]
    ops: dict = {}
    for c in found:
        g = len(c["groups"][0]) if c["groups"] else jax.device_count()
        key = f"{c['op']} (g={g})"
        ops[key] = ops.get(key, 0) + 1
    return dict(count=len(found), result_bytes=sum(c["bytes"] for c in found),
                wire_bytes=round(sum(wire_bytes(c) for c in found)), ops=ops)


def run(model: Model, prompts, method: str, budget: int, lp: int, repeats: int) -> dict:
    options = dict(LOOKAHEAD) if method == "lookahead" else {}
    if lp > 1:
        options["lp_devices"] = lp
    call = lambda: jaxspec.generate(model, prompts, max_new_tokens=budget, method=method,  # noqa: E731
                                    stop_at_eos=False, **options)
    model.compiled.clear()  # so the one program left is this method's
    out = call()
    (program,) = model.compiled.values()
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        again = call()
        seconds.append((time.perf_counter() - t0) / max(again.steps))
        assert again.tokens == out.tokens
    return dict(tokens=out.tokens, steps=out.steps, seconds_per_step=min(seconds),
                collectives=step_collectives(program))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--smoke", action="store_true", help="a 1-layer model with a 4096 vocabulary, 8 tokens")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if jax.device_count() < 8:
        print(f"tp_bench needs 8 devices, {jax.device_count()} visible (set XLA_FLAGS="
              "--xla_force_host_platform_device_count=8 before jax is imported)", file=sys.stderr)
        return 2
    shape = SMOKE_SHAPE if args.smoke else SHAPE
    if args.smoke:
        args.new_tokens, args.repeats = 8, 1
    single = synthetic(shape)
    vocab = shape["vocab_size"]
    rng = np.random.default_rng(0)
    motif = rng.integers(3, vocab, 12).tolist()  # a repeated motif: lookahead has n-grams to find
    prompts = [[1] + motif * 4 + rng.integers(3, vocab, 4).tolist() for _ in range(args.batch)]
    greedy = jaxspec.generate(single, prompts, max_new_tokens=args.new_tokens, stop_at_eos=False).tokens
    rows = []
    for name, lp, tp, vocab_layout in SETTINGS:
        model = lay_out(single, tp, vocab_layout)
        methods = ["lookahead"] if lp > 1 else ["greedy", "lookahead"]
        for method in methods:
            result = run(model, prompts, "autoregressive" if method == "greedy" else method, args.new_tokens, lp,
                         args.repeats)
            params = model.lp_layouts[lp][1] if lp > 1 and tp > 1 else model.params
            rows.append(dict(setting=name, lp=lp, tp=tp, vocab=vocab_layout, devices=lp * tp, method=method,
                             weight_bytes=weight_bytes_per_device(params), steps=result["steps"],
                             seconds_per_step=result["seconds_per_step"], collectives=result["collectives"],
                             identical_to_greedy=result["tokens"] == greedy))
            print(json.dumps({k: v for k, v in rows[-1].items()}), flush=True)
        model.compiled.clear()
        jax.clear_caches()
    full = rows[0]["weight_bytes"]
    out = dict(shape=shape, lookahead=list(LOOKAHEAD.values()), batch=args.batch, new_tokens=args.new_tokens,
               full_weight_bytes=full, rows=rows, machine=machine_info(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               command="python " + " ".join(["benchmarks/tp_bench.py", *(argv if argv is not None else sys.argv[1:])]))
    stem = "tp_bench_smoke" if args.smoke else "tp_bench"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["# Tensor and lookahead parallelism: per-device weights and per-step communication", "",
             f"{out['date']}, `{out['command']}`, jax {jax.__version__}, {jax.device_count()} CPU devices.", "",
             *report.tp_bench(out)]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(r["identical_to_greedy"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
