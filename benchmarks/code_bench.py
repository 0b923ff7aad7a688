"""The default model (pycode-5M) on held-out code: greedy vs Lookahead Decoding vs prompt lookup.

For each of `--prompts` held-out function starts (benchmarks/code_prompts.py), every method
continues the prompt for `--new-tokens` tokens (EOS stop off, float32, batch 1) and must
reproduce greedy's tokens. Reported per method: compression S = new tokens / steps (total
and per-prompt mean), tokens/s (decode time, compile excluded) and the ratio to greedy from
the same run, plus token identity with greedy. Methods run interleaved per prompt, after one
untimed warm-up per program, so machine drift spreads evenly.

    python benchmarks/code_bench.py                # 10 prompts x 128 tokens (~2 min on 2 CPU cores)

Writes benchmarks/results/code_bench.{json,md}. Exits 1 if an output differs from greedy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import jaxspec
from code_prompts import code_prompts
from machine import ROOT, machine_info

METHODS = {
    "greedy": ("autoregressive", {}),
    "lookahead (15,5,15)": ("lookahead", {"window": 15, "ngram": 5, "guesses": 15}),
    "lookahead (7,4,7)": ("lookahead", {"window": 7, "ngram": 4, "guesses": 7}),
    "prompt-lookup (N=4,G=8)": ("prompt-lookup", {"ngram": 4, "guesses": 8}),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=jaxspec.loading.DEFAULT_MODEL)
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)

    model = jaxspec.load(args.model)
    prompts = code_prompts(args.prompts)
    run = lambda name, text: jaxspec.generate(  # noqa: E731
        model, text, max_new_tokens=args.new_tokens, method=METHODS[name][0], stop_at_eos=False,
        **METHODS[name][1])
    for name in METHODS:  # warm-up: compile every (method, prompt bucket) program
        for prompt in prompts:
            run(name, prompt["text"])
    rows = {name: [] for name in METHODS}
    names = list(METHODS)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[:i % len(names)]:
            out = run(name, prompt["text"])
            rows[name].append({"file": prompt["file"], "line": prompt["line"], "tokens": out.tokens,
                               "steps": out.steps, "seconds": out.seconds})
    greedy = rows["greedy"]
    summary = {}
    for name, rs in rows.items():
        new = sum(len(r["tokens"]) for r in rs)
        summary[name] = {
            "S_total": new / sum(r["steps"] for r in rs),
            "S_mean": sum(len(r["tokens"]) / r["steps"] for r in rs) / len(rs),
            "tokens_per_second": new / sum(r["seconds"] for r in rs),
            "identical_to_greedy": sum(r["tokens"] == g["tokens"] for r, g in zip(rs, greedy)),
        }
    for s in summary.values():
        s["speed_vs_greedy"] = s["tokens_per_second"] / summary["greedy"]["tokens_per_second"]

    args.out.mkdir(parents=True, exist_ok=True)
    result = {"model": args.model, "prompts": len(prompts), "new_tokens": args.new_tokens,
              "machine": machine_info(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "summary": summary, "runs": rows,
              "prompt_sources": [{"file": p["file"], "line": p["line"]} for p in prompts]}
    (args.out / "code_bench.json").write_text(json.dumps(result, indent=1))
    lines = [f"# {args.model} on {len(prompts)} held-out code prompts, {args.new_tokens} new tokens each",
             "", f"{machine_info()['cpu']} ({machine_info()['cpu_count']} cores), JAX {machine_info()['jax']}, "
             f"{result['date']}", "",
             "| method | S total | S mean | tokens/s | vs greedy | identical to greedy |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['S_total']:.2f} | {s['S_mean']:.2f} | {s['tokens_per_second']:.0f} | "
                     f"{s['speed_vs_greedy']:.2f}x | {s['identical_to_greedy']}/{len(prompts)} |")
    (args.out / "code_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if all(s["identical_to_greedy"] == len(prompts) for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
