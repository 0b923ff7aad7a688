"""Lookahead parallelism (LP): per-device work and bytes exchanged per step on 1/2/4/8 devices.

At the paper's (W, N, G) = (15, 5, 15), batch 1, greedy:

* per device and step: block tokens (from the split tables of `shard_tree`), a FLOPs
  estimate and the replicated memory (weights, KV cache, n-gram pool), for the model decoded
  here (stories260K) and for a Llama-2-7B shape (bf16, analytical);
* bytes exchanged per step, from the formula and measured: the collectives of the compiled
  LP program, read from its HLO;
* against the per-step traffic of the alternatives: the accepted tokens' K/V (what a design
  that ships K/V instead of re-feeding would send), tensor parallelism's two all-reduces per
  layer, and the HBM traffic every device pays anyway (weights + KV cache read per forward);
* a decode of stories260K's reference prompts on each device count: tokens, steps and S must
  be identical (LP is the same algorithm); seconds are recorded but on a CPU the "devices"
  share the same cores, so only the structure is meaningful there, not the speed.

    python benchmarks/lp_bench.py                      # 1,2,4,8 devices
    python benchmarks/lp_bench.py --devices 1,2,4      # on a host with fewer devices

On a CPU the script forces 8 host devices (XLA_FLAGS) before importing JAX; on a GPU/TPU host
it runs unchanged on the accelerators. Writes benchmarks/results/lp_bench.{json,md}; exits
non-zero if any device count's tokens or steps differ from one device's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Only the CPU platform reads this; accelerators are unaffected.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

import jaxspec  # noqa: E402
from jaxspec.decoding.engine import Engine  # noqa: E402
from jaxspec.decoding.options import LookaheadOptions  # noqa: E402
from jaxspec.decoding.parallel import shard_tree  # noqa: E402
from jaxspec.methods import lookahead_sources  # noqa: E402
from jaxspec.parallel import hlo_collectives as collectives  # noqa: E402
from machine import machine_info, repo_relative  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
REFERENCE = jaxspec.loading.shared_dir() / "models" / "stories260K" / "greedy_reference.json"
WINDOW, NGRAM, GUESSES = 15, 5, 15
# Llama-2-7B: the paper's LP experiments; 2 bytes per value (bf16).
LLAMA_7B = jaxspec.ModelConfig(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                               num_layers=32, num_heads=32, num_kv_heads=32, head_dim=128,
                               max_position_embeddings=4096, bos_token_id=1, eos_token_ids=(2,))


def step_tokens(devices: int) -> dict:
    """Block tokens in one device's forward, and how they split (1 device: the plain layout)."""
    layout = Engine(sources=lookahead_sources(LookaheadOptions(window=WINDOW, ngram=NGRAM, guesses=GUESSES))).tree
    if devices == 1:
        return {"tokens": layout.size, "refeed": 0, "level0": WINDOW, "upper": (NGRAM - 2) * WINDOW,
                "candidates": GUESSES * (NGRAM - 1), "row_ints": 0}
    s = shard_tree(layout, devices)
    cols = -(-WINDOW // devices)
    return {"tokens": s.size, "refeed": s.refeed, "level0": WINDOW, "upper": (NGRAM - 2) * cols,
            "candidates": -(-GUESSES // devices) * (NGRAM - 1),
            "row_ints": 2 + s.max_path + 1 + s.observed_per_device}  # accepted, path id, emitted, new window tokens


def model_costs(cfg: jaxspec.ModelConfig, bytes_per_value: int, tokens: int, context: int) -> dict:
    """Per device and step (`tokens` in its forward): matmul + attention FLOPs, HBM reads, replicated
    memory, and the bytes tensor parallelism over the whole single-device block would all-reduce."""
    dense = cfg.num_params - cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    lm_head = cfg.vocab_size * cfg.hidden_size
    attention = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * (context + tokens)
    kv_per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * bytes_per_value
    return {
        "flops": 2 * (dense + lm_head) * tokens + attention,
        "weights_bytes": cfg.num_params * bytes_per_value,  # read by every device every forward
        "kv_cache_read_bytes": kv_per_token * context,
        "kv_per_token_bytes": kv_per_token,
        "pool_bytes": cfg.vocab_size * GUESSES * NGRAM * 4,  # the replicated n-gram pool, int32
        # TP over the whole block instead: two all-reduces of [block, hidden] per layer (attention out, MLP out)
        "tp_allreduce_bytes": 2 * cfg.num_layers * step_tokens(1)["tokens"] * cfg.hidden_size * bytes_per_value,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--devices", default="1,2,4,8", help="comma-separated device counts")
    p.add_argument("--model", default="stories260K")
    p.add_argument("--context", type=int, default=1024, help="context length for the 7B traffic estimates")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    command = "python " + " ".join([repo_relative(sys.argv[0])] + (sys.argv[1:] if argv is None else list(argv)))
    counts = [int(x) for x in args.devices.split(",")]
    available = jax.device_count()
    counts = [d for d in counts if d <= available]
    model = jaxspec.load(args.model)
    cases = json.loads(REFERENCE.read_text())["cases"]
    options = dict(window=WINDOW, ngram=NGRAM, guesses=GUESSES)

    rows, reference_tokens, reference_steps, ok = [], None, None, True
    for devices in counts:
        lp = {"lp_devices": devices} if devices > 1 else {}
        before = set(model.compiled)
        tokens, steps, seconds, compile_s = [], [], 0.0, 0.0
        for case in cases:
            out = jaxspec.generate(model, case["prompt"], max_new_tokens=len(case["greedy"]), method="lookahead",
                                   stop_at_eos=False, **options, **lp)
            tokens.append(out.tokens)
            steps.append(out.steps)
            seconds += out.seconds
            compile_s += out.compile_seconds
        programs = [model.compiled[k] for k in sorted(set(model.compiled) - before, key=str)]
        found = collectives(programs[0].as_text())  # same (W, N, G, batch 1) in every prompt bucket
        if reference_tokens is None:
            reference_tokens, reference_steps = tokens, steps
        same = tokens == reference_tokens and steps == reference_steps
        matches_greedy = all(t == c["greedy"] for t, c in zip(tokens, cases))
        ok &= same
        split = step_tokens(devices)
        new_tokens = sum(len(t) for t in tokens)
        row = {
            "devices": devices, **split,
            "collectives": found,
            "exchanged_bytes_measured": sum(c["bytes"] for c in found if c["in_loop"]),
            "exchanged_bytes_formula": devices * split["row_ints"] * 4 if devices > 1 else 0,
            "steps": steps, "S": new_tokens / sum(steps), "identical_to_one_device": same,
            "equals_greedy_reference": matches_greedy, "decode_seconds": seconds, "compile_seconds": compile_s,
            "stories260K": model_costs(model.config, 4, split["tokens"], 512),
            "llama2_7b_bf16": model_costs(LLAMA_7B, 2, split["tokens"], args.context),
        }
        rows.append(row)
        print(f"{devices} device(s): {split['tokens']} tokens/forward, exchanged {row['exchanged_bytes_measured']} B/step "
              f"(formula {row['exchanged_bytes_formula']}), S={row['S']:.3f}, identical={same}", flush=True)

    result = {
        "benchmark": f"lookahead parallelism at (W, N, G) = ({WINDOW}, {NGRAM}, {GUESSES}), batch 1, greedy",
        "command": command, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "device_count": available, "load_average": list(os.getloadavg())},
        "model": repo_relative(jaxspec.loading.resolve(args.model)), "context_7b": args.context,
        "identical_tokens_and_steps": ok, "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lp_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "lp_bench.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if ok else 1


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _gflops(flops: float) -> str:
    g = flops / 1e9
    return f"{g:.0f}" if g >= 10 else f"{g:.3g}"


def markdown(r: dict) -> str:
    rows = r["rows"]
    m = r["machine"]
    work = ["| devices | tokens / forward (per device) | re-fed | level 0 | upper levels | candidates | "
            "1 device / this | exchanged per step (measured, HLO) | formula | collectives in the step |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = rows[0]["tokens"] if rows and rows[0]["devices"] == 1 else None
    for x in rows:
        ops = ", ".join(f"{c['op']} {c['dtype']}{c['shape']}" for c in x["collectives"]) or "none"
        ratio = f"{base / x['tokens']:.2f}x" if base else ""
        work.append(f"| {x['devices']} | {x['tokens']} | {x['refeed']} | {x['level0']} | {x['upper']} | "
                    f"{x['candidates']} | {ratio} | {x['exchanged_bytes_measured']} B | "
                    f"{x['exchanged_bytes_formula']} B | {ops} |")
    traffic = []
    for key, title in (("llama2_7b_bf16", f"Llama-2-7B shape, bf16, {r['context_7b']}-token context"),
                       ("stories260K", "stories260K, float32, 512-token context")):
        traffic += [f"**{title}**", "",
                    "| devices | LP exchange / step | K/V of the accepted tokens, if shipped instead (max) | "
                    "TP all-reduces / step (same block) | weights read / forward (HBM) | KV cache read / forward "
                    "(HBM) | GFLOPs / device / step | replicated memory / device |",
                    "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for x in rows:
            c = x[key]
            shipped = c["kv_per_token_bytes"] * x["refeed"]
            memory = c["weights_bytes"] + c["kv_cache_read_bytes"] + c["pool_bytes"]
            traffic.append(f"| {x['devices']} | {_bytes(x['exchanged_bytes_formula'])} | {_bytes(shipped)} | "
                           f"{_bytes(c['tp_allreduce_bytes']) if x['devices'] > 1 else '0'} | "
                           f"{_bytes(c['weights_bytes'])} | {_bytes(c['kv_cache_read_bytes'])} | "
                           f"{_gflops(c['flops'])} | {_bytes(memory)} |")
        traffic.append("")
    decode = ["| devices | steps per prompt | S | identical to 1 device | equals greedy reference | "
              "decode s (CPU: shared cores) | compile s |", "|---:|---|---:|:---:|:---:|---:|---:|"]
    for x in rows:
        decode.append(f"| {x['devices']} | {x['steps']} | {x['S']:.3f} | {'yes' if x['identical_to_one_device'] else 'NO'} | "
                      f"{'yes' if x['equals_greedy_reference'] else 'no'} | {x['decode_seconds']:.2f} | "
                      f"{x['compile_seconds']:.1f} |")
    return f"""# Lookahead parallelism: work and communication per step

{r['benchmark']}. Model decoded: `{r['model']}`; every device count gives
{'**the same tokens and steps as one device**' if r['identical_tokens_and_steps'] else '**DIFFERENT tokens or steps (a bug)**'}.

## Per-device work and bytes exchanged

Each device's forward: `re-fed` pending tokens (accepted on another device last step) + the
whole level 0 of the window + its columns of the upper levels + its candidates. The step's one
collective is an all_gather of one int32 row per device: accepted length, path id, the
{WINDOW - 1 + NGRAM - 2 + 1}-token emitted run (the longest verified path is a window diagonal,
W-1 + N-2 tokens, plus the bonus) and its columns' new window tokens. Measured = result bytes
of the collectives inside the decoding loop of the compiled program (HLO); it does not depend
on the model.

{chr(10).join(work)}

## Against the traffic of the alternatives (analytical, from the model shapes)

Per step, per device. LP's exchange is independent of the model size. *K/V if shipped*: the
K/V of the longest accepted run only one device computed (up to N-1 candidate tokens), what
an LP that sent K/V instead of re-feeding tokens would broadcast at most. *TP*: two all-reduces of [block tokens,
hidden] per layer, in sequence (64 per step for the 7B). *Weights / KV cache read*: HBM traffic
every device pays each forward, LP or not (LP replicates it; TP divides it). *Replicated
memory*: weights + KV cache at that context + the n-gram pool (batch 1), on every device.

{chr(10).join(traffic)}

## Decode (stories260K reference prompts, batch 1)

{chr(10).join(decode)}

On a CPU the devices are threads on the same {m['cpu_count']} cores, so the replicated part of each
step (level 0, re-fed tokens, pool updates) is paid once per device on shared hardware: the seconds show
the structure, not a speed-up.

## Machine

| machine | |
|---|---|
| platform | {m['platform']} |
| CPU | {m['cpu']} ({m['cpu_count']} cores), load average {[round(v, 2) for v in m['load_average']]} |
| devices | {m['device_count']} x {m['device']} |
| python / jax ({m['jax_backend']}) / jaxspec | {m['python']} / {m['jax']} / {m['jaxspec']} |
| date | {r['date']} |
| command | `{r['command']}` |
"""


if __name__ == "__main__":
    sys.exit(main())
