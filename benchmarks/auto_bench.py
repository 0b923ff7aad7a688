"""`method="auto"` against greedy and every fixed setting it weighs, on this machine.

For each model the prompts decode with `auto` and with each candidate of `jaxspec.runtime.auto` (greedy,
the lookahead grid, prompt lookup, speculative where a drafter is known), every setting compiled on
every prompt first (`auto` learning meanwhile: greedy, then the settings it tries, compiled in the
background), then timed wall-clock around `jaxspec.generate` (`auto`'s choice included), interleaved
by the harness. `auto`'s first call is timed apart. Every setting must give greedy's tokens.

    python -m benchmarks.auto_bench                        # pycode-5M, stories260K, SmolLM2-135M-Instruct
    python -m benchmarks.auto_bench --models pycode-5M --prompts 2 --new-tokens 16 --rounds 1   # quick
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, DecodeBench, Setting, chat_cases, code_cases, command_line, run_decode, story_cases  # noqa: E402
from benchmarks.harness import write_result  # noqa: E402
from jaxspec.runtime import auto  # noqa: E402

MODELS = ("pycode-5M", "stories260K", "smollm2-135m-instruct")


def cases_for(name: str, model, count: int) -> list:
    if name == "pycode-5M":
        return code_cases(model, count)
    if name == "stories260K":
        return story_cases(count)
    return chat_cases(model, "bench", count)


def declare(name: str, args) -> DecodeBench:
    model = jaxspec.load(name)
    cases = cases_for(name, model, args.prompts)
    t0 = time.perf_counter()  # auto's first call: loading its ledger, one compile, the decode
    first = jaxspec.generate(model, list(cases[0].ids), max_new_tokens=args.new_tokens, method="auto",
                             stop_at_eos=False).auto
    first_seconds = time.perf_counter() - t0
    settings = [Setting("auto", "auto")] + [Setting(c.label, c.method, c.options) for c in auto.candidates(model)]
    return DecodeBench(f"auto_bench_{name}", f"auto on {name}", model, cases, settings, args.new_tokens,
                       rounds=args.rounds, reference="autoregressive", clock="wall", warmup="all",
                       facts={"auto_first_call_seconds": round(first_seconds, 2), "auto_candidates": first["candidates"]})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--fresh", action="store_true", help="discard the runs of an interrupted run instead of resuming")
    args = p.parse_args(argv)
    models = []
    for name in args.models:
        bench = declare(name, args)
        journal = args.out / f".{bench.name}.runs.jsonl"
        models.append(run_decode(bench, journal, fresh=args.fresh))
        journal.unlink()
    write_result({"benchmark": "auto_bench", "title": "method=\"auto\" against greedy and every setting it weighs",
                  "new_tokens": args.new_tokens, "rounds": args.rounds, "models": models,
                  "command": command_line(__file__, argv)}, args.out)
    wrong = [f"{m['model']}: {n}" for m in models for n, s in m["summary"].items()
             if s["identical_to_reference"] != s["cases"]]
    print(*(["outputs differ from greedy:", *wrong] if wrong else []), file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
