"""What XLA:CPU's own options do to a drafted step's cost on this CPU: c(T), the target's forward of T
tokens in one-token forwards, and greedy decoding's tokens/s, per option set, with the tokens
checked identical to the default's.

Each option set runs in a fresh process (XLA_FLAGS is read once, when JAX starts); the sets
are interleaved round by round (default, A, B, ..., default, A, B, ...) so a machine that gets
slower affects them alike, and each figure is the best over rounds. In each process: SmolLM2's
forward of T = 1, 2, 3, 5, 9 tokens (`--sizes`) after a 256-token context (`auto`'s own forward programs, the
median of 25 round-robin runs), then greedy decoding of the real_bench quick split's chats x 48
tokens, whose token lists every option set must reproduce exactly.

    python -m benchmarks.cpu_options                   # every option set below, 2 rounds
    python -m benchmarks.cpu_options --sets default,xnnpack --rounds 1
    python -m benchmarks.cpu_options --sets default --sizes 1-10 --name cpu_cost   # c(T) at every T

Writes benchmarks/results/cpu_options.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import RESULTS, command_line, write_result  # noqa: E402

SIZES = (1, 2, 3, 5, 9)
NEW_TOKENS = 48
ROUNDS = 25
OPTION_SETS = {
    "default": "",
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    "xnn dot fusion": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "ynn dot fusion": "--xla_cpu_experimental_ynn_fusion_type=dot",
    # An empty list turns YNNPACK off: JAX 0.10's XLA:CPU already hands every dot of 2+ rows to it
    # (the compiled HLO's `__ynn_fusion`s), so this set is the Eigen path those dots had before.
    "no ynn (eigen dots)": "--xla_cpu_experimental_ynn_fusion_type=",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn custom calls": "--xla_cpu_experimental_onednn_custom_call=true",
    "eigen single-threaded": "--xla_cpu_multi_thread_eigen=false",
    "vector width 512": "--xla_cpu_prefer_vector_width=512",
    # not a flag: the GGUF's block-format weights kept (`jaxspec.load(dtype="blocks")`), XLA's defaults
    "blocks weights": "",
}
# Option sets that load the model with another `jaxspec.load` dtype than float32.
SET_DTYPES = {"blocks weights": "blocks"}


def parse_sizes(text: str) -> tuple[int, ...]:
    """`--sizes`: "1,2,3,5,9" or "1-10"; 1 is always measured (c(T) is relative to it)."""
    try:
        sizes = {int(x) for part in text.split(",") for x in (
            range(int(part.split("-")[0]), int(part.split("-")[1]) + 1) if "-" in part else [part])}
    except ValueError:
        raise SystemExit(f"--sizes: {text!r} is not a list of token counts like 1,2,3,5,9 or 1-10") from None
    if not sizes or min(sizes) < 1:
        raise SystemExit(f"--sizes: {text!r} has no count, or one below 1")
    return tuple(sorted(sizes | {1}))


def child(model_name: str, sizes: tuple[int, ...], dtype: str = "float32") -> dict:
    import jaxspec
    from jaxspec.runtime import forward_timing
    from jaxspec.real_prompts import chat_prompts

    import jax
    import numpy as np

    from jaxspec.models.quantize import module_dtype

    model = jaxspec.load(model_name, dtype=dtype)
    # the forward programs of `jaxspec.runtime.forward_timing`, timed here round-robin for ROUNDS
    # rounds (its own timing stops after 0.1 s: too few rounds to compare option sets), the median kept
    dtype = module_dtype(model.module)
    programs = [forward_timing._forward(model.graphdef, model.params, 1, 512, t, model.config, dtype) for t in sizes]
    for program, args in programs:
        jax.block_until_ready(program(*args))
    times = [[] for _ in sizes]
    for _ in range(ROUNDS):
        for i, (program, args) in enumerate(programs):
            t0 = time.perf_counter()
            jax.block_until_ready(program(*args))
            times[i].append(time.perf_counter() - t0)
    seconds = {t: float(np.median(x)) for t, x in zip(sizes, times)}
    prompts = [model.tokenizer.encode_chat(c["messages"]) for c in chat_prompts("quick")]
    jaxspec.generate(model, prompts[0], max_new_tokens=NEW_TOKENS, stop_at_eos=False)  # compile
    tokens, best = [], float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        outs = [jaxspec.generate(model, p, max_new_tokens=NEW_TOKENS, stop_at_eos=False).tokens for p in prompts]
        best = min(best, time.perf_counter() - t0)
        tokens = outs
    return {"forward_seconds": {str(t): s for t, s in seconds.items()}, "tokens": tokens,
            "greedy_tokens_per_second": len(prompts) * NEW_TOKENS / best}


def run_set(name: str, flags: str, model: str, sizes: tuple[int, ...]) -> dict:
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()}
    out = subprocess.run([sys.executable, __file__, "--child", "--model", model, "--sizes", ",".join(map(str, sizes)),
                          "--dtype", SET_DTYPES.get(name, "float32")], env=env, capture_output=True, text=True)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--sets", help=f"comma-separated subset of: {', '.join(OPTION_SETS)}")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="forward sizes T timed: 1,2,3,5,9 or 1-10")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)  # (the child's load)
    p.add_argument("--name", default="cpu_options")
    args = p.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    if args.child:
        print(json.dumps(child(args.model, sizes, args.dtype)))
        return 0
    names = args.sets.split(",") if args.sets else list(OPTION_SETS)
    if unknown := [n for n in names if n not in OPTION_SETS]:
        raise SystemExit(f"--sets: unknown {unknown}; known: {', '.join(OPTION_SETS)}")
    if "default" not in names:
        names.insert(0, "default")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names:
            t0 = time.time()
            runs[n].append(run_set(n, OPTION_SETS[n], args.model, sizes))
            print(f"round {r + 1} {n}: {time.time() - t0:.0f} s", file=sys.stderr)
    reference = next((x["tokens"] for x in runs["default"] if "tokens" in x), None)
    rows = {}
    for n, results in runs.items():
        ok = [x for x in results if "tokens" in x]
        if not ok:
            rows[n] = {"flags": OPTION_SETS[n], "error": results[0]["error"]}
            continue
        fwd = {t: min(x["forward_seconds"][str(t)] for x in ok) for t in sizes}  # the best round's median
        rows[n] = {"flags": OPTION_SETS[n], "dtype": SET_DTYPES.get(n, "float32"), "forward_ms": {str(t): round(1e3 * s, 2) for t, s in fwd.items()},
                   "c": {str(t): round(fwd[t] / fwd[1], 3) for t in sizes},  # (JSON keys are strings)
                   "greedy_tokens_per_second": round(max(x["greedy_tokens_per_second"] for x in ok), 2),
                   "tokens_identical": all(x["tokens"] == reference for x in ok)}
    result = {"benchmark": "cpu_options", "title": f"XLA:CPU options and c(T) ({args.model})", "model": args.model,
              "rounds": args.rounds, "sizes": list(sizes), "new_tokens": NEW_TOKENS,
              "command": command_line(__file__, argv), "rows": rows}
    write_result(result, RESULTS, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
