"""Greedy decoding throughput: jaxspec vs Hugging Face transformers, same machine, one run.

Both decode the same prompt for the same number of new tokens on stories260K (float32, batch 1,
EOS stop disabled) and must produce identical tokens. The HF side loads the checkpoint that
`jaxspec.load("stories260K").save(tmpdir)` exports, with `LlamaForCausalLM.from_pretrained`.
Both are warmed up first (jaxspec: compilation; torch: first-call allocation), then timed in
interleaved repeats; the medians are reported. torch runs with os.cpu_count() threads and, as a
second configuration, with 1 thread (on a small or busy machine intra-op threading can make a tiny
model several times slower); speedups are quoted against the faster of the two.

    python benchmarks/greedy_bench.py                  # 256 new tokens from prompt [1], 5 repeats
    python benchmarks/greedy_bench.py --new-tokens 128 --repeats 3

Writes benchmarks/results/greedy_bench.json and benchmarks/results/greedy_bench.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


import jaxspec
from machine import machine_info, repo_relative

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="stories260K", help="checkpoint name or path (default: stories260K)")
    p.add_argument("--prompt-ids", default="1", help="comma-separated prompt ids (default: 1 = BOS)")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--torch-threads", default=None,
                   help="comma-separated torch thread counts to time (default: os.cpu_count() and 1)")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch
    import transformers

    prompt = [int(t) for t in args.prompt_ids.split(",")]
    n = args.new_tokens
    threads = ([int(t) for t in args.torch_threads.split(",")] if args.torch_threads
               else sorted({os.cpu_count(), 1}, reverse=True))
    torch.set_num_threads(threads[0])
    load_before = os.getloadavg()

    # --- jaxspec
    model = jaxspec.load(args.model)
    warm = jaxspec.generate(model, prompt, max_new_tokens=n, stop_at_eos=False)  # compiles
    jax_tokens = warm.tokens

    # --- HF transformers, from the same weights
    with tempfile.TemporaryDirectory() as tmp:
        model.save(tmp)
        hf = transformers.LlamaForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    gen_config = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None, pad_token_id=0,
        bos_token_id=model.config.bos_token_id,
    )
    hf.generation_config = gen_config
    input_ids = torch.tensor([prompt], dtype=torch.long)
    attention_mask = torch.ones_like(input_ids)

    def hf_generate():
        with torch.inference_mode():
            return hf.generate(input_ids, attention_mask=attention_mask, generation_config=gen_config)

    hf_tokens = hf_generate()[0, len(prompt):].tolist()  # warm-up
    assert len(hf_tokens) == n and len(jax_tokens) == n, (len(hf_tokens), len(jax_tokens))

    # --- timed, interleaved repeats
    jax_decode, jax_wall, hf_wall = [], [], {t: [] for t in threads}
    identical = jax_tokens == hf_tokens
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = jaxspec.generate(model, prompt, max_new_tokens=n, stop_at_eos=False)
        jax_wall.append(time.perf_counter() - t0)
        jax_decode.append(out.seconds)
        identical &= out.tokens == jax_tokens and out.compile_seconds == 0.0
        for t in threads:
            torch.set_num_threads(t)
            hf_generate()  # re-warm after a thread-count change (not timed)
            t0 = time.perf_counter()
            tokens = hf_generate()[0, len(prompt):].tolist()
            hf_wall[t].append(time.perf_counter() - t0)
            identical &= tokens == hf_tokens

    med = statistics.median
    first_diff = next((i for i, (a, b) in enumerate(zip(jax_tokens, hf_tokens)) if a != b), None)
    result = {
        "benchmark": "greedy decoding throughput, batch 1, float32, EOS stop disabled",
        "command": "python " + " ".join([str(Path(sys.argv[0]))] + (sys.argv[1:] if argv is None else argv)),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            **machine_info(),
            "torch": torch.__version__, "torch_threads": threads,
            "transformers": transformers.__version__,
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "model": repo_relative(model.source), "prompt": prompt, "new_tokens": n, "repeats": args.repeats,
        "identical_tokens": bool(identical), "first_difference_at": first_diff,
        "jaxspec": {
            "compile_seconds": warm.compile_seconds,
            "decode_seconds": jax_decode, "wall_seconds": jax_wall,
            "median_decode_seconds": med(jax_decode), "median_wall_seconds": med(jax_wall),
            "tokens_per_second_decode": n / med(jax_decode), "tokens_per_second_wall": n / med(jax_wall),
        },
        "transformers": {
            str(t): {"threads": t, "wall_seconds": w, "median_wall_seconds": med(w), "tokens_per_second": n / med(w)}
            for t, w in hf_wall.items()
        },
    }
    best = max(result["transformers"].values(), key=lambda v: v["tokens_per_second"])
    result["transformers_best_threads"] = best["threads"]
    result["speedup_wall"] = result["jaxspec"]["tokens_per_second_wall"] / best["tokens_per_second"]
    result["speedup_decode"] = result["jaxspec"]["tokens_per_second_decode"] / best["tokens_per_second"]
    write(result, args.out)
    return result


def write(r: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "greedy_bench.json").write_text(json.dumps(r, indent=2) + "\n")
    m, j = r["machine"], r["jaxspec"]
    best = r["transformers"][str(r["transformers_best_threads"])]
    hf_rows = "".join(
        f"| transformers `generate` (torch, {h['threads']} thread{'s' if h['threads'] > 1 else ''}) "
        f"| {h['median_wall_seconds']:.4f} | {h['tokens_per_second']:.0f} "
        f"| {h['tokens_per_second'] / best['tokens_per_second']:.2f}x |\n"
        for h in r["transformers"].values()
    )
    busy = ""
    if max(m["load_average_before"][0], m["load_average_after"][0]) > m["cpu_count"]:
        busy = (" The machine was busy with other work during this run (1-minute load average above the core"
                " count, see below): per-repeat times in greedy_bench.json vary, the medians are indicative only.")
    md = f"""# Greedy decoding: jaxspec vs transformers

{r['benchmark']}; model `{Path(r['model']).name}`, prompt {r['prompt']}, {r['new_tokens']} new tokens,
median of {r['repeats']} interleaved repeats after a warm-up. Identical tokens: **{r['identical_tokens']}**.

| implementation | median seconds | tokens/s | vs best transformers |
|---|---:|---:|---:|
| jaxspec, whole `generate` call (wall) | {j['median_wall_seconds']:.4f} | {j['tokens_per_second_wall']:.0f} | {r['speedup_wall']:.2f}x |
| jaxspec, compiled decode only (`out.seconds`) | {j['median_decode_seconds']:.4f} | {j['tokens_per_second_decode']:.0f} | {r['speedup_decode']:.2f}x |
{hf_rows}
jaxspec compile time (excluded above): {j['compile_seconds']:.2f} s.{busy}

| machine | |
|---|---|
| platform | {m['platform']} |
| CPU | {m['cpu']} ({m['cpu_count']} cores) |
| load average before / after | {m['load_average_before']} / {m['load_average_after']} |
| python / jax ({m['jax_backend']}) / torch / transformers | {m['python']} / {m['jax']} / {m['torch']} / {m['transformers']} |
| date | {r['date']} |
| command | `{r['command']}` |
"""
    (out / "greedy_bench.md").write_text(md)


if __name__ == "__main__":
    res = main()
    print(json.dumps({k: res[k] for k in ("identical_tokens", "speedup_wall", "speedup_decode")}
                     | {"jaxspec_tok_s_wall": res["jaxspec"]["tokens_per_second_wall"],
                        "jaxspec_tok_s_decode": res["jaxspec"]["tokens_per_second_decode"],
                        "transformers_tok_s": {t: v["tokens_per_second"] for t, v in res["transformers"].items()}},
                     indent=2))
