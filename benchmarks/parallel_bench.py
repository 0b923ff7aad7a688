"""Lookahead parallelism (LP), tensor parallelism (TP) and both: per-device bytes and what one decode step
communicates, read from the compiled programs on 8 forced CPU devices (XLA_FLAGS is set here before JAX is
imported; an accelerator host runs unchanged). The devices share the CPU's cores: seconds show structure only.

* `lp`: lookahead (15, 5, 15), batch 1, over 1/2/4/8 devices, decoding stories260K's references: block tokens
  per device (`shard_tree`'s split), the bytes exchanged per step (formula, and the collectives in the compiled
  decode loop), and, analytically for stories260K and a bf16 Llama-2-7B shape, the alternatives' traffic (the
  accepted tokens' K/V, TP's two all-reduces per layer, the HBM reads of every forward). Tokens and steps must
  equal one device's.
* `tp`: a random-weight Llama (8 heads, 8 KV heads, untied) at TP 1/2/4/8, TP 4 with the embedding and LM head
  replicated, LP 4 and LP 2 x TP 4, greedy and lookahead: device 0's weight bytes, the decode loop's collectives
  (op, group size g, result bytes; wire bytes with ring algorithms: all-reduce 2 (g-1)/g, all-gather (g-1)/g of
  the result), ms per step. Tokens must equal single-device greedy's.
* `plan`: Llama-3.1-8B / 70B (bf16) on TPU v5e / v5p and H100 settings, from the configs alone (shapes from
  `jax.eval_shape`, layout from `partition_spec`): weights, KV cache at 4096 tokens and n-gram pool per device;
  TP and LP bytes per lookahead step.

    python -m benchmarks.parallel_bench lp             # results/lp_bench.{json,md}
    python -m benchmarks.parallel_bench tp [--smoke]   # results/tp_bench[_smoke].{json,md}
    python -m benchmarks.parallel_bench plan           # results/tp_plan.{json,md}
"""

from __future__ import annotations

import os
import sys

if "jax" not in sys.modules and "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, command_line, repo_relative, story_cases, time_programs, write_result  # noqa: E402
from benchmarks.hlo import hlo_collectives  # noqa: E402

WINDOW, NGRAM, GUESSES = 15, 5, 15
LOOKAHEAD = dict(window=WINDOW, ngram=NGRAM, guesses=GUESSES)


def llama(**shape) -> jaxspec.ModelConfig:
    return jaxspec.ModelConfig(**{"model_type": "llama", "bos_token_id": 1, "eos_token_ids": (2,), **shape})


LLAMA2_7B = llama(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32,
                  num_kv_heads=32, head_dim=128, max_position_embeddings=4096)
LLAMA31 = {name: llama(vocab_size=128256, head_dim=128, max_position_embeddings=131072, **shape) for name, shape in {
    "Llama-3.1-8B": dict(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8),
    "Llama-3.1-70B": dict(hidden_size=8192, intermediate_size=28672, num_layers=80, num_heads=64, num_kv_heads=8),
}.items()}


def loop_collectives(program) -> list[dict]:
    """The collectives inside the compiled decode loop: what every step communicates."""
    return [c for c in hlo_collectives(program.as_text()) if c["in_loop"]]


def group_size(c: dict) -> int:
    return len(c["groups"][0]) if c["groups"] else jax.device_count()


def wire_bytes(c: dict) -> float:
    """Bytes one device sends for a collective with ring algorithms."""
    g = group_size(c)
    share = {"all-reduce": 2 * (g - 1) / g, "all-gather": (g - 1) / g, "reduce-scatter": (g - 1) / g}
    return share.get(c["op"], 1) * c["bytes"]


def new_program(model, call):
    """Run `call` and return (its output, the one program it compiles, or recompiles, for itself)."""
    kept = dict(model.compiled)
    model.compiled.clear()
    out = call()
    (program,) = model.compiled.values()
    model.compiled.update(kept)
    return out, program


def step_tokens(devices: int) -> dict:
    """Block tokens in one device's forward, and how they split (1 device: the plain layout)."""
    from jaxspec.decoding.engine import Engine
    from jaxspec.decoding.options import LookaheadOptions
    from jaxspec.decoding.lookahead_parallel import shard_tree
    from jaxspec.decoding.methods import lookahead_sources

    layout = Engine(sources=lookahead_sources(LookaheadOptions(**LOOKAHEAD))).tree
    s = shard_tree(layout, devices) if devices > 1 else None
    return {"tokens": int(s.size) if s else layout.size, "refeed": int(s.refeed) if s else 0, "level0": WINDOW,
            "upper": (NGRAM - 2) * -(-WINDOW // devices), "candidates": -(-GUESSES // devices) * (NGRAM - 1),
            # accepted, path id, emitted, new window tokens
            "row_ints": 2 + s.max_path + 1 + s.observed_per_device if s else 0}


def model_costs(cfg, bytes_per_value: int, tokens: int, context: int) -> dict:
    """Per device and step (`tokens` in its forward): matmul + attention FLOPs, HBM reads, replicated
    memory, and the bytes tensor parallelism over the whole single-device block would all-reduce."""
    dense = cfg.num_params - cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * (context + tokens)
    kv_per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * bytes_per_value
    return {"flops": 2 * (dense + cfg.vocab_size * cfg.hidden_size) * tokens + attention,
            "weights_bytes": cfg.num_params * bytes_per_value, "kv_cache_read_bytes": kv_per_token * context,
            "kv_per_token_bytes": kv_per_token, "pool_bytes": cfg.vocab_size * GUESSES * NGRAM * 4,
            # TP over the whole block instead: two all-reduces of [block, hidden] per layer
            "tp_allreduce_bytes": 2 * cfg.num_layers * step_tokens(1)["tokens"] * cfg.hidden_size * bytes_per_value}


def lp(args) -> dict:
    counts = [d for d in map(int, args.devices.split(",")) if d <= jax.device_count()]
    model = jaxspec.load(args.model)
    cases = story_cases()
    rows, first_tokens = [], None
    for devices in counts:
        options = {**LOOKAHEAD, **({"lp_devices": devices} if devices > 1 else {})}
        run = lambda case: jaxspec.generate(model, list(case.ids), max_new_tokens=len(case.reference),  # noqa: E731
                                            method="lookahead", stop_at_eos=False, **options)
        out, program = new_program(model, lambda: run(cases[0]))  # the same program in every prompt bucket
        outs = [out] + [run(case) for case in cases[1:]]
        found = [{k: c[k] for k in ("op", "dtype", "shape", "bytes", "in_loop")} for c in loop_collectives(program)]
        split = step_tokens(devices)
        tokens, steps = [list(o.tokens) for o in outs], [o.steps for o in outs]
        first_tokens = first_tokens or (tokens, steps)
        rows.append({
            "devices": devices, **split, "collectives": found,
            "exchanged_bytes_measured": sum(c["bytes"] for c in found),
            "exchanged_bytes_formula": devices * split["row_ints"] * 4,
            "steps": steps, "S": sum(map(len, tokens)) / sum(steps),
            "identical_to_one_device": (tokens, steps) == first_tokens,
            "equals_greedy_reference": all(t == list(c.reference) for t, c in zip(tokens, cases)),
            "decode_seconds": sum(o.seconds for o in outs), "compile_seconds": sum(o.compile_seconds for o in outs),
            "stories260K": model_costs(model.config, 4, split["tokens"], 512),
            "llama2_7b_bf16": model_costs(LLAMA2_7B, 2, split["tokens"], args.context)})
        print(f"{devices} device(s): {split['tokens']} tokens/forward, {rows[-1]['exchanged_bytes_measured']} B/step, "
              f"S={rows[-1]['S']:.3f}, identical={rows[-1]['identical_to_one_device']}", file=sys.stderr, flush=True)
    return {"benchmark": "lp_bench", "title": "Lookahead parallelism: work and communication per step",
            "config": [WINDOW, NGRAM, GUESSES], "model": repo_relative(jaxspec.checkpoint.loading.resolve(args.model)),
            "context_7b": args.context, "device_count": jax.device_count(),
            "identical_tokens_and_steps": all(r["identical_to_one_device"] for r in rows), "rows": rows}


TP_SHAPE = dict(hidden_size=512, intermediate_size=1536, num_layers=4, num_heads=8, num_kv_heads=8, head_dim=64,
                vocab_size=32000)
TP_SETTINGS = [  # (name, LP groups, TP degree, vocabulary layout)
    ("1 device", 1, 1, "split"), ("TP 2", 1, 2, "split"), ("TP 4", 1, 4, "split"), ("TP 8", 1, 8, "split"),
    ("TP 4, vocab replicated", 1, 4, "replicated"), ("LP 4", 4, 1, "split"), ("LP 2 x TP 4", 2, 4, "split"),
]


def lay_out(single, tp: int, vocab: str):
    """The model on a TP mesh; `vocab="replicated"` keeps the embedding and LM head whole."""
    from jax.sharding import NamedSharding, PartitionSpec

    from jaxspec.models.tensor_parallel import param_shardings, path_names, shard, tp_mesh

    if tp == 1:
        return single
    model = shard(single, tp_mesh(tp))
    if vocab == "replicated":
        whole = NamedSharding(model.mesh, PartitionSpec())
        shardings = jax.tree_util.tree_map_with_path(
            lambda path, s: whole if {"embed_tokens", "lm_head"} & set(path_names(path)) else s,
            param_shardings(model.params, model.config, model.mesh))
        model = dataclasses.replace(model, params=jax.device_put(model.params, shardings), compiled={})
    return model


def device0_bytes(params) -> int:
    return sum(next(s for s in leaf.addressable_shards if s.device == jax.devices()[0]).data.nbytes
               for leaf in jax.tree.leaves(params))


def tp(args) -> dict:
    if jax.device_count() < 8:
        raise SystemExit(f"tp needs 8 devices, {jax.device_count()} visible (XLA_FLAGS="
                         "--xla_force_host_platform_device_count=8 before jax is imported)")
    shape = dict(TP_SHAPE, num_layers=1, vocab_size=4096) if args.smoke else TP_SHAPE
    new_tokens, rounds = (8, 1) if args.smoke else (args.new_tokens, args.repeats)
    cfg = llama(max_position_embeddings=2048, tie_word_embeddings=False, **shape)
    module = nnx.jit(lambda: jaxspec.Transformer(cfg, rngs=nnx.Rngs(0)))()
    single = jaxspec.Model.from_module(module, source="synthetic")
    rng = np.random.default_rng(0)
    motif = rng.integers(3, shape["vocab_size"], 12).tolist()  # a repeated motif: lookahead has n-grams to find
    prompts = [[1] + motif * 4 + rng.integers(3, shape["vocab_size"], 4).tolist()]
    greedy = jaxspec.generate(single, prompts, max_new_tokens=new_tokens, stop_at_eos=False).tokens
    rows = []
    for name, lp_groups, degree, vocab in TP_SETTINGS:
        model = lay_out(single, degree, vocab)
        methods = {"greedy": {"method": "autoregressive"}} if lp_groups == 1 else {}
        methods["lookahead"] = dict(LOOKAHEAD, method="lookahead", **{"lp_devices": lp_groups} if lp_groups > 1 else {})
        calls = {m: (lambda o=o: jaxspec.generate(model, prompts, max_new_tokens=new_tokens, stop_at_eos=False, **o),
                     ()) for m, o in methods.items()}
        found = {m: new_program(model, call) for m, (call, _) in calls.items()}
        seconds = time_programs(calls, rounds)
        params = model.lp_layouts[lp_groups][1] if lp_groups > 1 and degree > 1 else model.params
        for method, (out, program) in found.items():
            collectives = loop_collectives(program)
            ops = dict(Counter(f"{c['op']} (g={group_size(c)})" for c in collectives))
            rows.append(dict(setting=name, lp=lp_groups, tp=degree, vocab=vocab, devices=lp_groups * degree,
                             method=method, weight_bytes=device0_bytes(params), steps=out.steps,
                             seconds_per_step=min(seconds[method]) / max(out.steps),
                             collectives=dict(count=len(collectives), result_bytes=sum(c["bytes"] for c in collectives),
                                              wire_bytes=round(sum(map(wire_bytes, collectives))), ops=ops),
                             identical_to_greedy=out.tokens == greedy))
            print(rows[-1], file=sys.stderr, flush=True)
        model.compiled.clear()
        jax.clear_caches()
    return {"benchmark": "tp_bench", "title": "Tensor and lookahead parallelism: per-device weights and per-step "
            "communication", "shape": shape, "lookahead": [WINDOW, NGRAM, GUESSES], "batch": 1,
            "new_tokens": new_tokens, "repeats": rounds, "device_count": jax.device_count(),
            "full_weight_bytes": rows[0]["weight_bytes"], "rows": rows}


CHIPS = {"TPU v5e": 16, "TPU v5p": 95, "H100": 80}  # GB per device
PLAN_SETTINGS = [  # (hardware, devices, LP groups, TP degree)
    ("TPU v5e-8", 8, 1, 8), ("TPU v5e-8", 8, 2, 4), ("TPU v5e-16", 16, 1, 16), ("TPU v5e-16", 16, 2, 8),
    ("TPU v5p-8", 8, 1, 8), ("TPU v5p-8", 8, 8, 1), ("TPU v5p-8", 8, 2, 4),
    ("8 x H100", 8, 1, 8), ("8 x H100", 8, 8, 1), ("8 x H100", 8, 2, 4),
]
CONTEXT, BLOCK, BATCH = 4096, 120, 1
LP_GATHER_BYTES = 704  # `lp` measures it: the compiled LP program at (15, 5, 15) on 8 devices


def plan_weight_bytes(cfg, tp_degree: int) -> int:
    from jaxspec.models.tensor_parallel import partition_spec, path_names

    shapes = nnx.state(nnx.eval_shape(lambda: jaxspec.Transformer(cfg, dtype=jax.numpy.bfloat16, rngs=nnx.Rngs(0))))
    return sum(int(np.prod(leaf.shape)) * 2 // (tp_degree if any(partition_spec(path_names(path), cfg, tp_degree))
                                                else 1)
               for path, leaf in jax.tree_util.tree_leaves_with_path(shapes))


def plan(args) -> dict:
    from jaxspec.runtime.memory import kv_cache_bytes
    from jaxspec.models.tensor_parallel import splits

    rows = []
    for name, cfg in LLAMA31.items():
        for hardware, devices, lp_groups, degree in PLAN_SETTINGS:
            chip = next(v for k, v in CHIPS.items() if hardware.startswith(k) or k in hardware) * 10**9
            weights = plan_weight_bytes(cfg, degree)
            kv = kv_cache_bytes(cfg, 2, BATCH, CONTEXT) // (degree if splits(cfg, degree)["kv_heads"] else 1)
            pool = BATCH * cfg.vocab_size * GUESSES * (NGRAM - 1) * 4
            tp_bytes = 0 if degree == 1 else int(2 * cfg.num_layers * BATCH * (BLOCK // lp_groups) * cfg.hidden_size
                                                 * 2 * 2 * (degree - 1) / degree)
            rows.append(dict(model=name, hardware=hardware, devices=devices, lp=lp_groups, tp=degree,
                             weights_bytes=weights, kv_bytes=kv, pool_bytes=pool, total_bytes=weights + kv + pool,
                             chip_bytes=chip, fits=weights + kv + pool < 0.9 * chip, tp_bytes_per_step=tp_bytes,
                             lp_bytes_per_step=0 if lp_groups == 1 else LP_GATHER_BYTES))
    return {"benchmark": "tp_plan", "title": "Llama-3.1 under TP, LP and both: memory and communication per device",
            "rows": rows, "context": CONTEXT, "block": BLOCK, "batch": BATCH, "config": [WINDOW, NGRAM, GUESSES]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    out = argparse.ArgumentParser(add_help=False)  # (--out also after the part)
    out.add_argument("--out", type=Path, default=argparse.SUPPRESS, help="results folder (default benchmarks/results)")
    sub = p.add_subparsers(dest="part", required=True)
    a = sub.add_parser("lp", parents=[out], help="lookahead parallelism on 1/2/4/8 devices (stories260K)")
    a.add_argument("--devices", default="1,2,4,8", help="comma-separated device counts")
    a.add_argument("--model", default="stories260K")
    a.add_argument("--context", type=int, default=1024, help="context length for the 7B traffic estimates")
    a = sub.add_parser("tp", parents=[out], help="TP, LP and LP x TP of a random-weight Llama")
    a.add_argument("--new-tokens", type=int, default=32)
    a.add_argument("--repeats", type=int, default=2, help="timed rounds (the fastest is reported)")
    a.add_argument("--smoke", action="store_true", help="a 1-layer model with a 4096 vocabulary, 8 tokens")
    sub.add_parser("plan", parents=[out], help="Llama-3.1-8B / 70B settings, from the configs (nothing runs)")
    args = p.parse_args(argv)
    result = {"lp": lp, "tp": tp, "plan": plan}[args.part](args)
    result["command"] = command_line(__file__, argv)
    name = result["benchmark"] + ("_smoke" if getattr(args, "smoke", False) else "")
    write_result(result, args.out, name)
    return 0 if all(r.get("identical_to_greedy", r.get("identical_to_one_device", True)) for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
