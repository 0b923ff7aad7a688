"""The step-cost model (jaxspec.perf) against this CPU's measured c(T), and its predictions elsewhere.

Measure (default): times one jitted forward (the decode step's model call: a block of T tokens
at T in {1, 8, 16, 32, 64, 128} against a 256-position KV cache, greedy argmax head, batch 1,
float32) of stories260K, pycode-5M and SmolLM2-135M-Instruct, every program interleaved with
every other each round, minimum over rounds; the CPU's calibration programs
(`jaxspec.perf.calibration_cases`: matmul chains, 256 MB streams, tiny decoders, never the
checked models) run in the same rounds, so both see the same load. c(T) = t(T) / t(1),
measured and predicted from the calibrated profile, side by side. Writes
benchmarks/results/roofline.{json,md}.

    python benchmarks/roofline.py                 # ~5 min on 2 busy cores
    python benchmarks/roofline.py --rounds 5 --models stories260K
    python benchmarks/roofline.py --tables        # docs/performance.md's generated tables
    python benchmarks/roofline.py --count-eager   # HF LLaMA eager ops per layer (needs torch + transformers)

--tables reads benchmarks/results/roofline.json (the CPU rows) and computes the accelerator
predictions (pure arithmetic), then rewrites every `<!-- table:NAME -->` ... `<!-- /table -->`
block of docs/performance.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
from pathlib import Path

from machine import ROOT, machine_info

from jaxspec import ModelConfig, perf

RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "performance.md"
TOKENS = (1, 8, 16, 32, 64, 128)
CACHE_LEN = 256
MODELS = ("stories260K", "pycode-5M", "smollm2-135m-instruct")
# The fixed-cost figure's sensitivity: the doc reports c with it scaled by these factors.
FIXED_SCALES = (0.0, 1.0, 4.0)


def llama(name, vocab, hidden, ffn, layers, heads, kv_heads, head_dim=128, qk_norm=False, model_type="llama"):
    return name, ModelConfig(model_type=model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                             num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                             max_position_embeddings=32768, qk_norm=qk_norm)


LLAMA2_7B = llama("LLaMA-2-7B", 32000, 4096, 11008, 32, 32, 32)[1]
TARGETS = dict([llama("Llama-3.1-8B", 128256, 4096, 14336, 32, 32, 8),
                llama("Qwen3-8B", 151936, 4096, 12288, 36, 32, 8, qk_norm=True, model_type="qwen3")])

# The paper (Fu et al. 2024, LLaMA-2-7B-chat, MT-Bench, A100, fp16): (W, N, G) = (15, 5, 15) with
# the prompt pool, S = 2.05 tokens/step, 1.88x over greedy. MT-Bench turns: a few hundred tokens of
# prompt + up to ~500 generated: the cache is taken as 512 positions.
PAPER = dict(window=15, ngram=5, guesses=15, S=2.05, speedup=1.88, cache_len=512)

# S for the prediction tables: the paper's for (15,5,15) (LLaMA-2-7B-chat, MT-Bench: the nearest
# model size with a published S), this project's SmolLM2-135M-Instruct measurement for the two
# configurations the paper did not publish (benchmarks/results/real_bench.json: 16 MT-Bench
# first turns + 8 HumanEval, 128 tokens each). An 8B model's S is not measured here.
METHODS = (
    ("lookahead (15,5,15)", perf.lookahead_block_tokens(15, 5, 15), 2.05, "paper, LLaMA-2-7B-chat MT-Bench"),
    ("lookahead (7,4,7)", perf.lookahead_block_tokens(7, 4, 7), None, "real_bench.json, SmolLM2-135M"),
    ("prompt lookup (N=4,G=8)", perf.prompt_lookup_block_tokens(4, 8), None, "real_bench.json, SmolLM2-135M"),
)
REAL_BENCH_KEYS = {"lookahead (7,4,7)": "lookahead (7,4,7)", "prompt lookup (N=4,G=8)": "prompt lookup (N=4,G=8)"}
HARDWARE = ("h100", "h200", "v5e", "v5p")


# ----------------------------------------------------------------------------- measuring


def forward_case(model, tokens: int):
    """The forward of `tokens` block tokens (causal block, a CACHE_LEN cache with 192 valid
    positions, greedy argmax head) as a decode loop runs it: `steps` forwards inside one jitted
    loop, each fed the previous one's argmax (so none is hoisted); `(fn, args, calls, steps)` with
    steps chosen so the program runs ~30 ms, as the calibration programs do. Calling the jitted
    forward once per step would time the host's dispatch and parameter flattening too, which
    decoding (one `while_loop` on the device) never pays."""
    import time

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec.kv_cache import KVCache
    from jaxspec.model import causal_mask

    cfg = model.config
    graphdef = model.graphdef

    def loop(params, tokens, positions, mask, cache, steps):
        net = nnx.merge(graphdef, params)
        body = lambda i, tok: net(tok, positions, mask, cache, head="argmax").preds  # noqa: E731
        return jax.lax.fori_loop(0, steps, body, tokens)

    fn = jax.jit(loop)
    cache = KVCache.zeros(cfg.num_layers, 1, CACHE_LEN, cfg.num_kv_heads, cfg.head_dim)
    cache = cache.replace(lengths=jnp.array([192], jnp.int32))
    args = (model.params, jnp.full((1, tokens), 5, jnp.int32), 192 + jnp.arange(tokens, dtype=jnp.int32)[None],
            causal_mask(jnp.array([tokens]), tokens), cache)
    jax.block_until_ready(fn(*args, jnp.int32(1)))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args, jnp.int32(2)))
    steps = max(1, min(512, round(0.03 / ((time.perf_counter() - start) / 2))))
    return fn, (*args, jnp.int32(steps)), 1, steps


def measure(models, rounds: int) -> dict:
    import jax

    import jaxspec

    loaded = {name: jaxspec.load(name) for name in models}
    cases = dict(perf.calibration_cases())
    for name, model in loaded.items():
        for t in TOKENS:
            cases[("forward", name, t)] = forward_case(model, t)
    seconds = perf.min_seconds(cases, rounds)
    calib = dict(perf.calibration(seconds), rounds=rounds)
    info = machine_info()
    profile = perf.profile_from_measurements(calib, name=f"{info['cpu']} ({info['cpu_count']} cores)")
    rows = []
    for name, model in loaded.items():
        cfg = model.config
        base = seconds[("forward", name, 1)]
        p1 = perf.forward_seconds(cfg, 1, 1, CACHE_LEN, 4, profile, "xla")
        for t in TOKENS:
            cost = perf.forward_cost(cfg, t, 1, CACHE_LEN, 4, profile, "xla")
            measured = seconds[("forward", name, t)]
            rows.append(dict(model=name, params=cfg.num_params, tokens=t, steps=cases[("forward", name, t)][3],
                             measured_seconds=measured, predicted_seconds=cost.seconds, measured_c=measured / base,
                             predicted_c=cost.seconds / p1, compute_bound_fraction=cost.compute_bound_fraction))
    configs = {name: model.config.to_hf() for name, model in loaded.items()}
    return dict(benchmark="roofline", calibration=calib, profile=dataclasses.asdict(profile), configs=configs,
                cache_len=CACHE_LEN,
                dtype="float32", batch=1, implementation="xla", rows=rows, machine=info,
                device=str(jax.devices()[0]),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command="python benchmarks/roofline.py " + " ".join(sys.argv[1:]))


def count_eager() -> dict:
    """transformers' LlamaDecoderLayer (eager attention): top-level aten ops per layer and outside
    the layers (2 vs 6 layers), and PyTorch eager's host seconds per tiny op on this CPU."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import LlamaConfig, LlamaForCausalLM

    def ops(layers):
        cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=4, attn_implementation="eager")
        model = LlamaForCausalLM(cfg).eval()
        with torch.no_grad():
            past = model(torch.ones((1, 8), dtype=torch.long), use_cache=True).past_key_values
            token = torch.ones((1, 1), dtype=torch.long)
            model(token, past_key_values=past, use_cache=True)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(token, past_key_values=past, use_cache=True)
        return sum(1 for e in prof.events() if e.name.startswith("aten::")
                   and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))

    two, six = ops(2), ops(6)
    per_layer = (six - two) / 4
    x = torch.ones(4)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20000):
            x = x + 1
        best = min(best, (time.perf_counter() - start) / 20000)
    return dict(ops_per_layer=per_layer, ops_outside_layers=two - 2 * per_layer, seconds_per_op=best,
                torch=torch.__version__, transformers=__import__("transformers").__version__)


# ----------------------------------------------------------------------------- tables


def _err(pred: float, meas: float) -> str:
    return f"{100 * (pred - meas) / meas:+.0f}%"


def predict(result: dict) -> list[dict]:
    """The recorded measurements with predictions recomputed by the current model from the recorded
    calibration (so the model can be revised without measuring again; the measurement is the record)."""
    profile = perf.profile_from_measurements(result["calibration"], name=result["profile"]["name"])
    rows = []
    for r in result["rows"]:
        cfg = ModelConfig.from_hf(result["configs"][r["model"]])
        cost = perf.forward_cost(cfg, r["tokens"], 1, result["cache_len"], 4, profile, result["implementation"])
        base = perf.forward_seconds(cfg, 1, 1, result["cache_len"], 4, profile, result["implementation"])
        rows.append(dict(r, predicted_seconds=cost.seconds, predicted_c=cost.seconds / base,
                         compute_bound_fraction=cost.compute_bound_fraction))
    return rows


def cpu_table(result: dict) -> list[str]:
    lines = [f"c(T) = t(T) / t(1) of one jitted forward, batch 1, float32, cache {result['cache_len']}, "
             f"attention `xla`; measured on {result['machine']['cpu']} ({result['machine']['cpu_count']} cores), "
             f"{result['date'][:10]}, minimum of {result['calibration']['rounds']} interleaved rounds. "
             "Predicted from the calibrated profile (no model-specific input but the shapes).", "",
             "| model | params | T | measured ms | predicted ms | measured c(T) | predicted c(T) | error of c |"
             " compute-bound share |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in predict(result):
        lines.append(f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['tokens']} | {1e3 * r['measured_seconds']:.2f} | "
                     f"{1e3 * r['predicted_seconds']:.2f} | {r['measured_c']:.2f} | {r['predicted_c']:.2f} | "
                     f"{_err(r['predicted_c'], r['measured_c']) if r['tokens'] > 1 else ''} | "
                     f"{100 * r['compute_bound_fraction']:.0f}% |")
    return lines


def calibration_table(result: dict) -> list[str]:
    c = result["calibration"]
    eff = ", ".join(f"{r}: {f / 1e9:.0f}" for r, f in c["matmul_flops"].items())
    curve = lambda points: ", ".join(f"{a / 2 ** 20:g} MiB: {b / 1e9:.1f}" for a, b in points)  # noqa: E731
    w = c["matmul_width"]
    return ["| quantity | measured | how |", "|---|---:|---|",
            f"| fp32 matmul peak | {max(c['matmul_flops'].values()) / 1e9:.0f} GFLOP/s | [rows, {w}] x [{w}, {w}] "
            "(1 MB, stays in L2) looped in one program, best row count |",
            f"| fp32 matmul by rows (GFLOP/s) | {eff} | the same per row count: the efficiency curve |",
            f"| bf16 matmul | {c['bf16_flops'] / 1e9:.0f} GFLOP/s | the same in bf16, 256 rows |",
            f"| read bytes/s by working set (GB/s) | {curve(c['read_curve'])} | one-row product through that "
            "many bytes of distinct 1 MB weights (matrix by matrix, as a forward streams them) |",
            f"| read+write bytes/s by working set (GB/s) | {curve(c['rw_curve'])} | elementwise pass over an array "
            "of that size |",
            f"| tied-head row-dot read | {c['tied_head_bytes_per_s'] / 1e9:.1f} GB/s | one row against a tied "
            "[32768, 512] table, whole (argmax's reduce subtracted) |",
            f"| head chunk copy | {c['copy_bytes_per_s'] / 1e9:.1f} GB/s | the same table in jaxspec's 16384-row "
            "chunks minus whole: 2 x table bytes / extra time |",
            f"| batched-matmul entry | {1e6 * c['matmul_call_seconds']:.2f} us | [n, 8, 8] x [n, 8, 256], "
            "n = 256 vs 2 |",
            f"| softmax pass | {1e9 * c['softmax_access_seconds']:.3f} ns per float32 access | jax.nn.softmax over "
            "8 x 128 x 512 floats / its 6 accesses per element (from its compiled HLO) |",
            f"| exp per element | {1e9 * c['exp_seconds']:.2f} ns | exp minus multiply-add over 8 x 128 x 512 floats |",
            f"| argmax per element | {1e9 * c['reduce_seconds']:.2f} ns | argmax minus max over the same |",
            f"| fixed per layer | {1e6 * c['fixed_layer_seconds']:.2f} us | tiny decoder (hidden 8), "
            "10 layers minus 2 layers, / 8 |",
            f"| fixed per call | {1e6 * c['fixed_call_seconds']:.2f} us | the 2-layer decoder less 3 layers' cost |"]


def profile_table(cpu: perf.HardwareProfile | None) -> list[str]:
    lines = ["| profile | bf16 TFLOP/s | fp32 TFLOP/s | bytes/s | memory | fixed per layer | matmul tile (rows) "
             "| source |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    profiles = [*perf.PROFILES.values(), perf.PAPER_PROFILE] + ([cpu] if cpu else [])
    for p in profiles:
        tile = "measured curve" if p.matmul_rows else str(p.tile_rows)
        lines.append(f"| {p.name} | {p.peak_bf16_flops / 1e12:.3g} | {p.peak_fp32_flops / 1e12:.3g} | "
                     f"{p.hbm_bytes_per_s / 1e9:,.0f} GB/s | {p.memory_bytes / 1e9:.0f} GB | "
                     f"{1e6 * p.fixed_layer_seconds:.0f} us | {tile} | {p.source} |")
    return lines


def paper_rows() -> list[dict]:
    t = perf.lookahead_block_tokens(PAPER["window"], PAPER["ngram"], PAPER["guesses"])
    rows = []
    for label, profile, impl in (("A100, PyTorch eager (the paper's stack)", perf.PAPER_PROFILE, "eager"),
                                 ("A100, eager attention, no host overhead", dataclasses.replace(
                                     perf.PAPER_PROFILE, fixed_layer_seconds=0.0, fixed_call_seconds=0.0), "eager"),
                                 ("A100, fused attention, XLA-like fixed cost", perf.PROFILES["a100"], "fused")):
        c = perf.step_cost(LLAMA2_7B, t, 1, PAPER["cache_len"], 2, profile, impl)
        g = perf.forward_seconds(LLAMA2_7B, 1, 1, PAPER["cache_len"], 2, profile, impl)
        s = perf.predicted_speedup(PAPER["S"], c)
        rows.append(dict(label=label, tokens=t, c=c, greedy_ms=1e3 * g, predicted=s, reported=PAPER["speedup"],
                         error=(s - PAPER["speedup"]) / PAPER["speedup"]))
    return rows


def paper_table() -> list[str]:
    rows = paper_rows()
    lines = [f"LLaMA-2-7B (hidden 4096, 32 layers, 32 heads, ffn 11008, vocab 32000), fp16, batch 1, cache "
             f"{PAPER['cache_len']}, (W, N, G) = (15, 5, 15): T = {rows[0]['tokens']} block tokens. "
             f"S = {PAPER['S']} (reported, prompt pool on); reported speed-up {PAPER['speedup']}x.", "",
             "| stack | predicted greedy ms/token | predicted c(T) | predicted speed-up S / c | reported | error |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['greedy_ms']:.1f} | {r['c']:.3f} | {r['predicted']:.2f}x | "
                     f"{r['reported']:.2f}x | {100 * r['error']:+.0f}% |")
    return lines


def method_S() -> dict:
    path = RESULTS / "real_bench.json"
    real = json.loads(path.read_text())["summary"] if path.exists() else {}
    out = {}
    for name, t, s, source in METHODS:
        if s is None:
            s = real.get(REAL_BENCH_KEYS[name], {}).get("S_total")
        out[name] = (t, s, source)
    return out


def prediction_rows() -> list[dict]:
    rows, methods = [], method_S()
    for model_name, cfg in TARGETS.items():
        for hw in HARDWARE:
            profile = perf.PROFILES[hw]
            for batch in (1, 8):
                for name, (t, s, source) in methods.items():
                    cost = perf.forward_cost(cfg, t, batch, 4096, 2, profile, "fused")
                    c = perf.step_cost(cfg, t, batch, 4096, 2, profile, "fused")
                    c_xla = perf.step_cost(cfg, t, batch, 4096, 2, profile, "unfused")
                    rows.append(dict(model=model_name, hardware=profile.name, batch=batch, method=name, tokens=t,
                                     S=s, S_source=source, c=c, c_xla=c_xla,
                                     speedup=perf.predicted_speedup(s, c) if s else None,
                                     speedup_xla=perf.predicted_speedup(s, c_xla) if s else None,
                                     compute_bound=cost.compute_bound_fraction,
                                     fits=perf.fits(cfg, batch, 4096, 2, profile)))
    return rows


def prediction_table() -> list[str]:
    lines = ["bf16, 4096-position cache, greedy argmax head. c: with a fused (flash) attention kernel "
             "(`attention=\"pallas\"`); `c unfused`: with the scores materialised once (float32 scores written and "
             "read once, probabilities written and read once: the least any unfused attention, such as XLA's "
             "reference on an accelerator, can move). Compute-bound share: the "
             "part of the T-token step's roofline time spent in compute-bound operations. "
             "\u2020: weights + KV cache exceed one chip's memory (it needs 2 chips, e.g. tensor parallel; "
             "per chip, FLOPs and bytes both halve, so c is about the same, the collectives aside).", "",
             "| model | hardware | batch | method | T | S | c(T) | speed-up | c unfused | speed-up unfused | "
             "compute-bound share |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in prediction_rows():
        mark = "" if r["fits"] else " \u2020"
        sp = f"**{r['speedup']:.2f}x**" if r["speedup"] else "-"
        spx = f"{r['speedup_xla']:.2f}x" if r["speedup_xla"] else "-"
        lines.append(f"| {r['model']} | {r['hardware']}{mark} | {r['batch']} | {r['method']} | {r['tokens']} | "
                     f"{r['S']:.2f} | {r['c']:.2f} | {sp} | {r['c_xla']:.2f} | {spx} | "
                     f"{100 * r['compute_bound']:.0f}% |")
    lines += ["", "S sources: " + "; ".join(f"{name}: {s:.2f} ({source})" for name, (t, s, source)
                                            in method_S().items() if s)]
    return lines


def sensitivity_table() -> list[str]:
    """c(T) of Llama-3.1-8B at (15,5,15) with the accelerators' fixed cost scaled."""
    cfg, t = TARGETS["Llama-3.1-8B"], perf.lookahead_block_tokens(15, 5, 15)
    head = " | ".join(f"fixed x{s:g}" for s in FIXED_SCALES)
    lines = [f"| hardware | batch | {head} |", "|---|---:|" + "---:|" * len(FIXED_SCALES)]
    for hw in HARDWARE:
        p = perf.PROFILES[hw]
        for batch in (1, 8):
            cs = [perf.step_cost(cfg, t, batch, 4096, 2, dataclasses.replace(
                p, fixed_layer_seconds=s * p.fixed_layer_seconds), "fused") for s in FIXED_SCALES]
            lines.append(f"| {p.name} | {batch} | " + " | ".join(f"{c:.2f}" for c in cs) + " |")
    return lines


def regime_table() -> list[str]:
    """c(T) against T for Llama-3.1-8B on H100: flat while memory-bound, then linear."""
    cfg, p = TARGETS["Llama-3.1-8B"], perf.PROFILES["h100"]
    ts = (1, 8, 32, 64, 120, 256, 512, 1024)
    lines = ["| batch | " + " | ".join(f"T={t}" for t in ts) + " |", "|---:|" + "---:|" * len(ts)]
    for batch in (1, 8, 32):
        lines.append(f"| {batch} | " + " | ".join(
            f"{perf.step_cost(cfg, t, batch, 4096, 2, p, 'fused'):.2f}" for t in ts) + " |")
    return lines


def generate_step_table(result: dict | None) -> list[str]:
    """The full decode step of the earlier benchmarks (c = S / speed-up, pool and verification
    included) against the forward's predicted c(T) at that block."""
    if not result:
        return ["(needs benchmarks/results/roofline.json)"]
    profile = perf.profile_from_measurements(result["calibration"], name=result["profile"]["name"])
    lines = ["| model | method | T | S | benchmark speed-up | measured step c | predicted forward c(T) |"
             " source |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for model, file in (("stories260K", "lookahead_bench.json"), ("pycode-5M", "code_bench.json"),
                        ("smollm2-135m-instruct", "real_bench.json")):
        path = RESULTS / file
        if not path.exists():
            continue
        if model not in result["configs"]:
            continue
        cfg = ModelConfig.from_hf(result["configs"][model])
        r = json.loads(path.read_text())
        entries = []  # (name, T, S, speed-up, step c)
        if file == "lookahead_bench.json":  # records the step-cost ratio itself (seconds/step over greedy's)
            for s in r["summary"].values():
                if s["method"] in ("lookahead", "prompt-lookup") and s.get("pool_from_prompt") is not False \
                        and s["block_tokens"] in (16, 32, 61, 64, 120):
                    name = s["label"]
                    entries.append((name, s["block_tokens"], s["all"]["S_total"], s["speedup_vs_greedy"],
                                    s["step_cost_ratio"]))
        else:
            for name, s in r["summary"].items():
                t = _block_of(name)
                if t:
                    entries.append((name, t, s["S_total"], s["speed_vs_greedy"], s["S_total"] / s["speed_vs_greedy"]))
        for name, t, S, speed, c_step in entries:
            c_pred = perf.step_cost(cfg, t, 1, CACHE_LEN, 4, profile, "xla")
            lines.append(f"| {model} | {name} | {t} | {S:.2f} | {speed:.2f}x | {c_step:.1f} | {c_pred:.1f} | "
                         f"`{file}` |")
    return lines


def _block_of(name: str) -> int | None:
    m = re.match(r"lookahead \((\d+),(\d+),(\d+)\)", name)
    if m:
        return perf.lookahead_block_tokens(*map(int, m.groups()))
    m = re.match(r"prompt[- ]lookup \(N=(\d+),G=(\d+)\)", name)
    if m:
        return perf.prompt_lookup_block_tokens(*map(int, m.groups()))
    return None


def write_tables(doc: Path = DOC) -> None:
    path = RESULTS / "roofline.json"
    result = json.loads(path.read_text()) if path.exists() else None
    cpu = None
    if result:
        cpu = perf.profile_from_measurements(result["calibration"], name=result["profile"]["name"])
    missing = ["(run `python benchmarks/roofline.py` first: benchmarks/results/roofline.json is missing)"]
    tables = {
        "profiles": profile_table(cpu),
        "calibration": calibration_table(result) if result else missing,
        "cpu": cpu_table(result) if result else missing,
        "generate": generate_step_table(result),
        "paper": paper_table(),
        "regime": regime_table(),
        "predictions": prediction_table(),
        "sensitivity": sensitivity_table(),
    }
    text = doc.read_text()
    for name, lines in tables.items():
        pattern = re.compile(rf"(<!-- table:{name} -->\n).*?(<!-- /table -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{doc} has no <!-- table:{name} --> ... <!-- /table --> block")
        text = pattern.sub(lambda m: m.group(1) + "\n".join(lines) + "\n" + m.group(2), text)
    doc.write_text(text)
    if result:
        write_markdown(result, RESULTS)
    print(f"wrote {len(tables)} tables into {doc}" + (" and benchmarks/results/roofline.md" if result else ""))


def write_results(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "roofline.json").write_text(json.dumps(result, indent=1) + "\n")
    write_markdown(result, out)


def write_markdown(result: dict, out: Path) -> None:
    """results/roofline.md, predictions recomputed by the current model (`predict`)."""
    lines = ["# Step-cost model vs this CPU: c(T) measured and predicted", "", *cpu_table(result), "",
             "## Calibration (the CPU profile's measurements)", "", *calibration_table(result), "",
             f"{result['date']}, `{result['command']}`, jax {result['machine']['jax']}, {result['device']}; "
             "model: `jaxspec/perf.py`, discussion: `docs/performance.md`."]
    (out / "roofline.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--tables", action="store_true", help="rewrite docs/performance.md's generated tables")
    p.add_argument("--count-eager", action="store_true", help="count HF LLaMA eager ops (torch + transformers)")
    args = p.parse_args(argv)
    if args.tables:
        write_tables()
        return 0
    if args.count_eager:
        print(json.dumps(count_eager(), indent=1))
        return 0
    result = measure(args.models, args.rounds)
    write_results(result, args.out)
    print("\n".join(cpu_table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
