"""Lookahead Decoding on stories260K: compression S of greedy, Jacobi, prompt lookup and lookahead
over a (W, N, G = W) grid, plus the default (15, 5, 15) without seeding the n-gram pool from the
prompt. Batch 1, float32, EOS stop off.

Cases, two categories: "reference", stories260K's reference cases (`story_cases`), each run to its
reference length and checked against the reference continuation; "held-out", `--held-out` prompts
`[1] + the first 8 + i % 24 tokens` of a story the model samples itself (`generate(model, [1], 48,
temperature=1.0, seed=1000 + i)`), 256 new tokens each, checked against greedy. Where an output
differs, `jaxspec.exactness` gives the float32 logit gap of the two disputed tokens: a near-tie
(within 4 ulps; a block forward and a one-token forward round differently) or not. Block tokens per
step (FLOPs per step are proportional to it) are in the JSON's `block_tokens`.

    python -m benchmarks.lookahead_bench           # 17 settings x (3 + 24) cases (~15 min on 2 idle cores)
    python -m benchmarks.lookahead_bench --quick   # 7 settings x (2 + 6) cases -> lookahead_bench_quick
    python -m benchmarks.lookahead_bench --batch-invariant   # the same grid, batch-invariant numerics

Exits 1 when an output differs from its expected tokens other than at a near-tie.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxspec  # noqa: E402
from benchmarks.harness import Case, DecodeBench, Setting, main_decode, story_cases, write_result  # noqa: E402
from benchmarks.harness.decode import decode, differences  # noqa: E402
from jaxspec import exactness  # noqa: E402
from jaxspec.decoding.methods import lookahead_block_tokens, prompt_lookup_block_tokens  # noqa: E402

HELD_OUT_NEW_TOKENS = 256
RUN = {}  # the arguments and bench of this run, for the near-tie analysis after it


def arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="W 4, N 3 and 5, 2 reference + 6 held-out cases")
    p.add_argument("--windows", type=int, nargs="+", help="lookahead W grid, G = W (default 1 4 8 15)")
    p.add_argument("--ngrams", type=int, nargs="+", help="lookahead N grid (default 3 5 7)")
    p.add_argument("--held-out", type=int, help="held-out cases (default 24; quick: 6)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="stories260K loaded with batch_invariant=True (results: lookahead_bench_invariant)")


def block_tokens(method: str, o: dict) -> int:
    """Tokens in one step's forward (jacobi: its window and the last token; greedy: one)."""
    if method == "lookahead":
        return lookahead_block_tokens(o["window"], o["ngram"], o["guesses"])
    return prompt_lookup_block_tokens(o["ngram"], o["guesses"]) if method == "prompt-lookup" else 1 + o.get("window", 0)


def grid(windows, ngrams, jacobi_windows) -> list[tuple[str, str, dict]]:
    configs = [("greedy", "autoregressive", {})]
    configs += [(f"jacobi (W={w})", "jacobi", {"window": w}) for w in jacobi_windows]
    configs.append(("prompt lookup (N=5,G=15)", "prompt-lookup", {"ngram": 5, "guesses": 15}))
    for w, n in sorted({(w, n) for w in windows for n in ngrams} | {(15, 5)}, key=lambda wn: (wn[1], wn[0])):
        configs.append((f"lookahead ({w},{n},{w})", "lookahead",
                        {"window": w, "ngram": n, "guesses": w, "pool_from_prompt": True}))
    configs.append(("lookahead (15,5,15) no prompt pool", "lookahead",
                    {"window": 15, "ngram": 5, "guesses": 15, "pool_from_prompt": False}))
    return configs


def own_length(model, method: str, options: dict):
    """The harness decodes every case to one length; a reference case runs to its reference's."""
    def run(case: Case, new_tokens: int) -> dict:
        length = len(case.reference) if case.reference else new_tokens
        return decode(DecodeBench("", "", model, (), (), length), Setting("", method, options), case)
    return run


def held_out_cases(model, count: int) -> list[Case]:
    cases = []
    for i in range(count):
        story = jaxspec.generate(model, [1], max_new_tokens=48, temperature=1.0, seed=1000 + i, stop_at_eos=False)
        cases.append(Case(f"held-out {i}", tuple([1] + story.tokens[:8 + i % 24]), "held-out"))
    return cases


def declare(args) -> DecodeBench:
    full = not args.quick
    windows = args.windows or ([1, 4, 8, 15] if full else [4])
    ngrams = args.ngrams or ([3, 5, 7] if full else [3, 5])
    held = args.held_out if args.held_out is not None else (24 if full else 6)
    model = jaxspec.load("stories260K", batch_invariant=args.batch_invariant)
    cases = [dataclasses.replace(c, category="reference") for c in story_cases(None if full else 2)]
    configs = grid(windows, ngrams, [5, 15] if full else [5])
    settings = [Setting(name, method, o, peer=own_length(model, method, o)) for name, method, o in configs]
    name = ("lookahead_bench" if full else "lookahead_bench_quick") + ("_invariant" if args.batch_invariant else "")
    RUN.update(args=args, bench=DecodeBench(
        name, "Lookahead Decoding over a (W, N, G) grid on stories260K"
        + (", batch-invariant numerics" if args.batch_invariant else ""), model, cases + held_out_cases(model, held), settings, HELD_OUT_NEW_TOKENS,
        facts={"block_tokens": {n: block_tokens(m, o) for n, m, o in configs},
               "held_out_recipe": "[1] + generate(model, [1], 48, temperature=1.0, seed=1000+i).tokens[:8 + i % 24]"}))
    return RUN["bench"]


def near_ties(status: int) -> int:
    """Each output that differs from its case's reference (else greedy's), with the float32 logit gap
    at the first difference, added to the result; 1 if one is not a near-tie."""
    args, bench = RUN["args"], RUN["bench"]
    name = args.name or bench.name
    result = json.loads((args.out / f"{name}.json").read_text())
    diffs = differences(bench.model, bench.cases, result["runs"], "greedy")
    if not diffs:
        return status
    ties = sum(d["near_tie"] for d in diffs)
    places = sorted({f"{d['case']} token {d['index']} (gap {d['logit_gap']:.2g})" for d in diffs})
    result["differences"] = diffs
    result["note"] = (f"{len(diffs)} outputs differ from their expected tokens (a reference case's reference, else "
                      f"greedy's), {ties} of them at float32 near-ties (logit gap within {exactness.NEAR_TIE_ULPS} "
                      f"ulps), {len(diffs) - ties} not; where: {', '.join(places)}.")
    write_result(result, args.out, name, quiet=True)
    print(result["note"], file=sys.stderr)
    return int(ties < len(diffs))


if __name__ == "__main__":
    sys.exit(near_ties(main_decode(__file__, __doc__, arguments, declare)))
