"""Fit the expected tokens per step S that `method="auto"` uses (`jaxspec.runtime.auto`) on this
project's benchmark results, and write `configs/auto.toml`.

Lookahead follows the paper's scaling law: S grows with the log of a step's work. Per model,
S = 1 + slope * ln(T) over the lookahead settings measured (T = block tokens), fitted through
S(1) = 1 by least squares. Prompt lookup and speculative decoding are kept as measured, per
setting. A model without results gets the smallest slope measured (the conservative choice:
`auto` must not promise a speed-up it will not deliver) and no prompt-lookup or speculative
estimate of its own (the smallest measured S).

    python tools/fit_auto.py                # reads benchmarks/results, writes configs/auto.toml
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from jaxspec import roofline

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUT = ROOT / "configs" / "auto.toml"


def _lookahead(label: str):
    """(W, N, G) of a result label: "lookahead (15,5,15)" or "lookahead W=4 N=3 G=4"."""
    m = re.match(r"lookahead \((\d+),(\d+),(\d+)\)$", label) or re.match(r"lookahead W=(\d+) N=(\d+) G=(\d+)$", label)
    return tuple(int(x) for x in m.groups()) if m else None


def _prompt_lookup(label: str):
    m = re.match(r"prompt[- ]lookup \(?N=(\d+),? ?G=(\d+)\)?$", label)
    return tuple(int(x) for x in m.groups()) if m else None


def _S(entry: dict) -> float:
    return entry["S"] if "S" in entry else entry["S_total"]  # the harness's layout, or the earlier one


def measured() -> dict:
    """Per model: [(label, S)] from the benchmark results (held-out prompts where the benchmark has them)."""
    runs: dict = {}
    bench = json.loads((RESULTS / "lookahead_bench.json").read_text())
    runs["stories260K"] = [(k, v["S_per_category"]["held-out"]) for k, v in bench["summary"].items()]
    code = json.loads((RESULTS / "code_bench.json").read_text())["summary"]
    runs["pycode-5M"] = [(_speculative_label(k), _S(v)) for k, v in code.items()]
    for name in ("real_bench", "real_bench_drafter"):  # the second: the shipped SmolLM2 drafter (bench split)
        summary = json.loads((RESULTS / f"{name}.json").read_text())["summary"]
        runs.setdefault("smollm2-135m-instruct", []).extend(
            (_speculative_label(k), _S(v)) for k, v in summary.items()
            if not k.startswith("transformers") and (name == "real_bench" or _speculative_label(k) != k))
    return runs


def _speculative_label(label: str) -> str:
    """real_bench's "speculative TD (K=4)" is auto's candidate "speculative K=4" (target features on),
    "speculative TD (K=4) + lookup (N=5,G=1)" its "speculative K=4 N=5 G=1"."""
    m = re.match(r"speculative TD \(K=(\d+)\)( \+ lookup \(N=(\d+),G=(\d+)\))?$", label)
    if not m:
        return label
    return f"speculative K={m.group(1)}" + (f" N={m.group(3)} G={m.group(4)}" if m.group(2) else "")


def fit(runs: list) -> dict:
    points = [(roofline.lookahead_block_tokens(*cfg), s) for label, s in runs if (cfg := _lookahead(label))]
    slope = sum((s - 1) * math.log(t) for t, s in points) / sum(math.log(t) ** 2 for t, _ in points)
    worst = max(abs(1 + slope * math.log(t) - s) / s for t, s in points)
    out = {"lookahead_slope": round(slope, 4), "lookahead_points": len(points), "lookahead_max_error": round(worst, 3)}
    for label, s in runs:
        if (pl := _prompt_lookup(label)):
            out[f"prompt_lookup_{pl[0]}_{pl[1]}"] = round(s, 3)
        elif (m := re.match(r"speculative K=(\d+)$", label)):
            out[f"speculative_{m.group(1)}"] = round(s, 3)
        elif (m := re.match(r"speculative K=(\d+) N=(\d+) G=(\d+)$", label)):
            out[f"speculative_{m.group(1)}_lookup_{m.group(2)}_{m.group(3)}"] = round(s, 3)
    return out


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT)
    out = p.parse_args(argv).out
    fitted = {name: fit(runs) for name, runs in measured().items()}
    lines = ["# Expected tokens per step S for `method=\"auto\"` (jaxspec/runtime/auto.py), fitted on the benchmark",
             "# results by `python tools/fit_auto.py`: do not edit by hand.",
             "# lookahead: S = 1 + lookahead_slope * ln(block tokens), fitted through S(1) = 1 (the paper's law:",
             "# S grows with the log of a step's work); lookahead_max_error: the fit's worst relative error.",
             "# prompt_lookup_N_G, speculative_K, speculative_K_lookup_N_G (the drafter's chain beside G prompt-lookup",
             "# candidates of N-1 tokens): S as measured. [default]: models without results.", ""]
    slopes = [f["lookahead_slope"] for f in fitted.values()]
    pl = [v for f in fitted.values() for k, v in f.items() if k.startswith("prompt_lookup")]
    lines += ["[default]", f"lookahead_slope = {min(slopes)}", f"prompt_lookup_4_8 = {min(pl)}", ""]
    for name, f in fitted.items():
        lines.append(f'[models."{name}"]')
        lines += [f"{k} = {v}" for k, v in f.items()]
        lines.append("")
    out.write_text("\n".join(lines))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
