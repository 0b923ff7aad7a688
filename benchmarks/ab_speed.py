"""Decode speed of two checkouts of jaxspec, interleaved in one run (a before/after check).

`python benchmarks/ab_speed.py --a PATH --b PATH` starts one worker process per checkout
(`PYTHONPATH` = that checkout, so each imports its own jaxspec); each loads the default model
(pycode-5M) and compiles greedy, lookahead (15, 5, 15), prompt lookup (4, 8) and speculative
decoding (the shipped drafter), or the `--methods` named, on held-out code prompts. Then,
round after round and method after method, the two workers decode every prompt back to back
(A then B, who goes first alternating): the machine's load drifts the same way for both. The
ratio B / A of each method's tokens/s (decode time only, compilation excluded) is reported
as the median over rounds with its spread; tokens and steps of both sides are compared too.
Writes `ab_speed.json` and `ab_speed.md` under `--out`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
METHODS = {
    "greedy": ("greedy", {}),
    "lookahead-15-5-15": ("lookahead", dict(window=15, ngram=5, guesses=15)),
    "prompt-lookup-4-8": ("prompt-lookup", dict(ngram=4, guesses=8)),
    "speculative": ("speculative", {}),
}


def worker(prompts: int, new_tokens: int, names: list[str]) -> None:
    """Reads 'run NAME' lines on stdin; answers each with one JSON line: tokens, seconds, steps."""
    sys.path.insert(0, str(HERE))
    import jaxspec  # noqa: PLC0415 -- imported from the checkout on PYTHONPATH, after it is set
    from code_prompts import code_prompts  # noqa: PLC0415

    model = jaxspec.load()
    texts = [p["text"] for p in code_prompts(prompts)]

    def run(name: str) -> dict:
        method, options = METHODS[name]
        runs = [jaxspec.generate(model, t, max_new_tokens=new_tokens, method=method, stop_at_eos=False, **options)
                for t in texts]
        return {"seconds": sum(r.seconds for r in runs), "tokens": [r.tokens for r in runs],
                "steps": [r.steps for r in runs]}

    for name in names:  # compile everything
        run(name)
    print(json.dumps({"ready": jaxspec.__file__}), flush=True)
    for line in sys.stdin:  # "run NAME": one pass of NAME over every prompt
        print(json.dumps(run(line.split(maxsplit=1)[1].strip())), flush=True)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", type=Path, required=True, help="checkout A (e.g. a git worktree of the old commit)")
    p.add_argument("--b", type=Path, default=HERE.parent, help="checkout B (default: this one)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of: {', '.join(METHODS)}")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    names = [n for n in args.methods.split(",") if n]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        p.error(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    if args.worker:
        worker(args.prompts, args.new_tokens, names)
        return {}

    procs = {}
    for side, root in (("A", args.a), ("B", args.b)):
        env = dict(os.environ, PYTHONPATH=str(root.resolve()))
        # The worker is this script; PYTHONPATH decides which checkout's jaxspec it imports.
        procs[side] = subprocess.Popen([sys.executable, __file__, "--a", ".", "--worker", "--prompts", str(args.prompts),
                                        "--new-tokens", str(args.new_tokens), "--methods", args.methods],
                                       cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sources = {side: json.loads(proc.stdout.readline())["ready"] for side, proc in procs.items()}
    print(f"workers ready: {sources}", file=sys.stderr)
    rounds = {"A": [], "B": []}
    for r in range(args.rounds):
        results = {"A": {}, "B": {}}
        for name in names:  # A and B back to back for each method; who goes first alternates
            for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                procs[side].stdin.write(f"run {name}\n")
                procs[side].stdin.flush()
                results[side][name] = json.loads(procs[side].stdout.readline())
        for side in rounds:
            rounds[side].append(results[side])
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()

    summary = {}
    for name in names:
        tokens = sum(len(t) for t in rounds["A"][0][name]["tokens"])
        tps = {side: [tokens / rd[name]["seconds"] for rd in rounds[side]] for side in rounds}
        ratios = [b / a for a, b in zip(tps["A"], tps["B"])]
        summary[name] = {
            "tokens_per_second_A": statistics.median(tps["A"]), "tokens_per_second_B": statistics.median(tps["B"]),
            "ratio_B_over_A_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "same_tokens": rounds["A"][0][name]["tokens"] == rounds["B"][0][name]["tokens"],
            "same_steps": rounds["A"][0][name]["steps"] == rounds["B"][0][name]["steps"],
            "steps_total": sum(rounds["B"][0][name]["steps"]),
        }
    sys.path.insert(0, str(HERE))
    from machine import machine_info, repo_relative  # noqa: PLC0415 -- the driver imports no jaxspec before here

    def commit(root: Path) -> str:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return proc.stdout.strip() or "unknown"

    # A checkout outside this repository is named by its commit, not by this machine's path.
    result = {"benchmark": "ab_speed", "a": f"commit {commit(args.a)}", "b": f"commit {commit(args.b)}",
              "rounds": args.rounds, "prompts": args.prompts, "new_tokens": args.new_tokens,
              "machine": machine_info(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "summary": summary}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Decode speed, interleaved: B = {result['b']} vs A = {result['a']}", "",
             f"{args.prompts} held-out code prompts x {args.new_tokens} tokens, pycode-5M, {args.rounds} rounds "
             f"(A and B back to back per method); {result['date']}; command: "
             f"`python benchmarks/ab_speed.py {' '.join(sys.argv[1:])}` (A: a git worktree of {result['a']})", "",
             "| method | A tok/s | B tok/s | B / A (median) | B / A (min..max) | same tokens | same steps |",
             "|---|---:|---:|---:|---:|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['tokens_per_second_A']:.1f} | {s['tokens_per_second_B']:.1f} | "
                     f"{s['ratio_B_over_A_median']:.3f} | {s['ratio_min']:.3f}..{s['ratio_max']:.3f} | "
                     f"{s['same_tokens']} | {s['same_steps']} |")
    (args.out / "ab_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
