"""Fit the expected tokens per step S that `method="auto"` uses (`jaxspec.runtime.auto`) on this
project's benchmark results, and write `configs/auto.toml`.

Lookahead follows the paper's scaling law: S grows with the log of a step's work. Per model,
S = 1 + slope * ln(T) over the lookahead settings measured (T = block tokens), fitted through
S(1) = 1 by least squares. Prompt lookup and speculative decoding are kept as measured, per
setting. A model without results gets the smallest slope measured (the conservative choice:
`auto` must not promise a speed-up it will not deliver) and no prompt-lookup or speculative
estimate of its own (the smallest measured S).

    python tools/fit_auto.py                # reads benchmarks/results, writes configs/auto.toml
    python tools/fit_auto.py --check        # exit 1 if configs/auto.toml is not what the fit writes
"""

from __future__ import annotations

import difflib
import json
import math
import re
import sys
from pathlib import Path

from jaxspec.decoding.methods import lookahead_block_tokens

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


def measured(results: Path = RESULTS) -> dict:
    """Per model: [(label, S)] from the benchmark results (held-out prompts where the benchmark has them)."""
    runs: dict = {}
    bench = json.loads((results / "lookahead_bench.json").read_text())
    runs["stories260K"] = [(k, v["S_per_category"]["held-out"]) for k, v in bench["summary"].items()]
    code = json.loads((results / "code_bench.json").read_text())["summary"]
    runs["pycode-5M"] = [(_speculative_label(k), _S(v)) for k, v in code.items()]
    # real_bench_drafter: the SmolLM2 drafter (bench split); real_bench_routed: the shipped one (stage 5)
    # beside and routed with prompt lookup (bench split), its S replacing the earlier drafter's;
    # real_bench_alternatives: routed with the drafter's runner-up first draft beside (a later file's
    # S of a setting measured again replaces the earlier one)
    for name in ("real_bench", "real_bench_drafter", "real_bench_routed", "real_bench_alternatives"):
        summary = json.loads((results / f"{name}.json").read_text())["summary"]
        runs.setdefault("smollm2-135m-instruct", []).extend(
            (_speculative_label(k), _S(v)) for k, v in summary.items()
            if not k.startswith("transformers") and (name == "real_bench" or _speculative_label(k) != k))
    return runs


def _speculative_label(label: str) -> str:
    """real_bench's "speculative TD (K=4)" is auto's candidate "speculative K=4" (target features on),
    "speculative TD (K=4) + lookup (N=5,G=1)" its "speculative K=4 N=5 G=1", "speculative TD (K=4) or
    lookup (N=5,G=4)" (one routed chain) its "speculative K=4 N=5 G=4 routed", and a trailing "+ 1 alt"
    (the drafter's runner-up first draft beside) a trailing " alt=1"."""
    m = re.match(r"speculative TD \(K=(\d+)\)( (\+|or) lookup \(N=(\d+),G=(\d+)\))?( \+ (\d+) alt)?$", label)
    if not m:
        return label
    lookup = f" N={m.group(4)} G={m.group(5)}" + (" routed" if m.group(3) == "or" else "") if m.group(2) else ""
    return f"speculative K={m.group(1)}" + lookup + (f" alt={m.group(7)}" if m.group(6) else "")


def fit(runs: list) -> dict:
    points = [(lookahead_block_tokens(*cfg), s) for label, s in runs if (cfg := _lookahead(label))]
    slope = sum((s - 1) * math.log(t) for t, s in points) / sum(math.log(t) ** 2 for t, _ in points)
    worst = max(abs(1 + slope * math.log(t) - s) / s for t, s in points)
    out = {"lookahead_slope": round(slope, 4), "lookahead_points": len(points), "lookahead_max_error": round(worst, 3)}
    for label, s in runs:
        if (pl := _prompt_lookup(label)):
            out[f"prompt_lookup_{pl[0]}_{pl[1]}"] = round(s, 3)
        elif (m := re.match(r"speculative K=(\d+)( alt=(\d+))?$", label)):
            out[f"speculative_{m.group(1)}" + (f"_alt_{m.group(3)}" if m.group(2) else "")] = round(s, 3)
        elif (m := re.match(r"speculative K=(\d+) N=(\d+) G=(\d+)( routed)?( alt=(\d+))?$", label)):
            kind = "routed" if m.group(4) else "lookup"
            out[f"speculative_{m.group(1)}_{kind}_{m.group(2)}_{m.group(3)}"
                + (f"_alt_{m.group(6)}" if m.group(5) else "")] = round(s, 3)
    return out


def table(results: Path = RESULTS) -> str:
    """configs/auto.toml's text: the fit of `results`."""
    fitted = {name: fit(runs) for name, runs in measured(results).items()}
    lines = ["# Expected tokens per step S for `method=\"auto\"` (jaxspec/runtime/auto.py), fitted on the benchmark",
             "# results by `python tools/fit_auto.py`: do not edit by hand.",
             "# lookahead: S = 1 + lookahead_slope * ln(block tokens), fitted through S(1) = 1 (the paper's law:",
             "# S grows with the log of a step's work); lookahead_max_error: the fit's worst relative error.",
             "# prompt_lookup_N_G, speculative_K, speculative_K_lookup_N_G (the drafter's chain beside G prompt-lookup",
             "# candidates of N-1 tokens), speculative_K_routed_N_G (one chain a step, a candidate's or the",
             "# drafter's), any of them ending _alt_A (the drafter's A runner-up first drafts beside, one token",
             "# each): S as measured. [default]: models without results.", ""]
    slopes = [f["lookahead_slope"] for f in fitted.values()]
    pl = [v for f in fitted.values() for k, v in f.items() if k.startswith("prompt_lookup")]
    lines += ["[default]", f"lookahead_slope = {min(slopes)}", f"prompt_lookup_4_8 = {min(pl)}", ""]
    for name, f in fitted.items():
        lines.append(f'[models."{name}"]')
        lines += [f"{k} = {v}" for k, v in f.items()]
        lines.append("")
    return "\n".join(lines)


def _shown(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def check(results: Path = RESULTS, out: Path = OUT) -> list[str]:
    """One line per problem: `out` is not the fit of `results` (it was edited by hand, or the
    results changed and the fit was not rerun)."""
    want = table(results)
    try:
        have = Path(out).read_text()
    except OSError as e:
        return [f"{_shown(out)} is unreadable ({e}); run python tools/fit_auto.py"]
    if have == want:
        return []
    diff = [line for line in difflib.unified_diff(have.splitlines(), want.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return [f"{_shown(out)} {'has' if line[0] == '-' else 'lacks'} {line[1:]!r}, which the fit of {_shown(results)} "
            f"{'does not write' if line[0] == '-' else 'writes'} (rerun python tools/fit_auto.py)" for line in diff]


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help="the benchmark results to fit (default: %(default)s)")
    p.add_argument("--out", type=Path, default=OUT, help="the table to write, or with --check to compare")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 (one line per problem) if --out is not what the fit writes")
    args = p.parse_args(argv)
    if args.check:
        problems = check(args.results, args.out)
        print("\n".join(problems) if problems else f"{_shown(args.out)} is the fit of {_shown(args.results)}")
        return 1 if problems else 0
    args.out.write_text(table(args.results))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
