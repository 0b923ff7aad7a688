"""`method="auto"` against greedy and every fixed setting it weighs, on this machine.

For each model, the prompts decode with `auto` and with each candidate of `jaxspec.auto`
(greedy, the lookahead grid, prompt lookup, speculative where a drafter is known), every
setting compiled first, then timed over the prompts in rounds. Within each prompt the settings
run in a rotation of their list, then in the same order backwards: each runs twice, as often
right after its neighbour as that one runs right after it. (A program that ran just before finds
the caches warm; when `auto` picks greedy it runs greedy's program, and with a rotation alone, or
one reversed every other prompt, greedy ran right after `auto` more often than the other way
round, which cost `auto` ~15% on stories260K.) Python's garbage collector runs between prompts,
not inside a timed call. Times are wall-clock around `jaxspec.generate` (`auto`'s own choice
included: it is measured once per shape and cached, and that first measurement is reported
apart). Every setting must give greedy's tokens.

    python benchmarks/auto_bench.py                        # pycode-5M, stories260K, SmolLM2-135M-Instruct
    python benchmarks/auto_bench.py --models pycode-5M --prompts 2 --new-tokens 16 --rounds 1   # quick
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import time
from pathlib import Path

import jaxspec
import report
from jaxspec import auto
from machine import machine_info

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("pycode-5M", "stories260K", "smollm2-135m-instruct")


def prompts_for(name: str, model, count: int) -> list:
    if name == "pycode-5M":
        from code_prompts import code_prompts

        return [model.tokenizer.encode(p["text"]) for p in code_prompts(count)]
    if name == "stories260K":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from stories import CASES

        return [c["prompt"] for c in CASES[:count]]
    from real_bench import chat_prompt
    from jaxspec.real_prompts import chat_prompts

    return [chat_prompt(model, c["messages"]) for c in chat_prompts("bench")[:count]]


def bench_model(name: str, args) -> dict:
    model = jaxspec.load(name)
    prompts = prompts_for(name, model, args.prompts)
    settings = {"auto": ("auto", {})}
    settings.update({c.label: (c.method, c.options) for c in auto.candidates(model)})
    call = lambda setting, ids: jaxspec.generate(  # noqa: E731
        model, ids, max_new_tokens=args.new_tokens, method=settings[setting][0], stop_at_eos=False,
        **settings[setting][1])
    first = {}
    t0 = time.perf_counter()
    first["auto"] = call("auto", prompts[0]).auto  # the one-time measurement (forwards, maybe a timed race)
    auto_first_seconds = time.perf_counter() - t0
    for setting in settings:  # compile every setting (and auto's choice) on every prompt shape
        for ids in prompts:
            try:
                call(setting, ids)
            except jaxspec.GenerationError as e:
                settings[setting] = None
                print(f"{name}: {setting} skipped ({e})", file=sys.stderr)
                break
    settings = {k: v for k, v in settings.items() if v is not None}
    names = list(settings)
    seconds = {k: 0.0 for k in names}
    tokens = {k: 0 for k in names}
    identical = {k: True for k in names}
    chosen = set()
    gc.disable()  # as timeit does: a collection lands on whichever call is running, at random
    for r in range(args.rounds):
        for i, ids in enumerate(prompts):
            gc.collect()
            order = names[(i + r) % len(names):] + names[:(i + r) % len(names)]
            # ... then backwards from the one before last (the last is run again at the end, not
            # twice in a row): each setting runs twice, as often right after its neighbour as that
            # one after it.
            order += order[-2::-1] + order[-1:]
            results = []
            for setting in order:
                t0 = time.perf_counter()
                out = call(setting, ids)
                seconds[setting] += time.perf_counter() - t0
                tokens[setting] += len(out.tokens)
                results.append((setting, out.tokens))
                if setting == "auto":
                    chosen.add(out.auto["reason"].split(":")[0])
            greedy = dict(results)["autoregressive"]
            for setting, toks in results:
                identical[setting] &= toks == greedy
        print(f"{name}: round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    gc.enable()
    rows = [dict(setting=k, tokens_per_second=tokens[k] / seconds[k], identical_to_greedy=identical[k]) for k in names]
    best_fixed = max((r for r in rows if r["setting"] != "auto"), key=lambda r: r["tokens_per_second"])
    auto_row = rows[0]
    return dict(model=name, prompts=len(prompts), rows=rows, best_fixed=best_fixed["setting"],
                auto_vs_best=auto_row["tokens_per_second"] / best_fixed["tokens_per_second"],
                auto_chose=sorted(chosen), auto_first_call_seconds=auto_first_seconds,
                auto_measure_seconds=first["auto"]["measure_seconds"], auto_candidates=first["auto"]["candidates"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    result = dict(new_tokens=args.new_tokens, rounds=args.rounds, models=[bench_model(m, args) for m in args.models],
                  machine=machine_info(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command="python " + " ".join(["benchmarks/auto_bench.py", *(argv if argv is not None else sys.argv[1:])]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "auto_bench.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# method=\"auto\" against greedy and every fixed setting it weighs", "",
             f"{result['date']}, `{result['command']}`.", "", *report.auto_bench(result)]
    (args.out / "auto_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
