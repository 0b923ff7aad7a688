"""How often each method's output is identical to greedy's, per dtype, batch and block size,
and where it is not, how close the disputed logits were (`jaxspec.exactness`). Not timed.

For each model, dtype (float32, bfloat16), method config and batch (1, 4, 8): the same 8
prompts are decoded in groups of `batch` and each row is compared with greedy decoding of
that prompt alone (batch 1) in the same dtype. A differing row records the first differing
position, the logit gap between greedy's token and the method's there (one causal forward
over the common prefix, in the model's dtype) and whether it is a near-tie (within
`near_tie_tolerance`: 4 ulps of the largest |logit| in the dtype). "greedy (batched)" is
greedy itself at batch 4 and 8: batching alone changes the shapes and so the rounding.

Prompts are fixed by order alone: stories260K's 3 reference prompts, then those prompts
extended by 8, 16, ... tokens of their reference continuation; pycode-5M's first 8 held-out
code prompts (`code_cases`); SmolLM2's first 8 "bench" chats (`chat_cases`). An interrupted run
resumes from its journal (results/.exactness.runs.jsonl) unless given --fresh.

    python -m benchmarks.exactness                       # all models (SmolLM2 if installed)
    python -m benchmarks.exactness --models stories260K --smoke
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, chat_cases, code_cases, command_line, story_cases, write_result  # noqa: E402
from benchmarks.harness.decode import Journal  # noqa: E402
from jaxspec.checkpoint.method_defaults import FileDefaults  # noqa: E402
from jaxspec import exactness  # noqa: E402
from jaxspec.decoding.methods import resolve_method  # noqa: E402

PROMPTS = 8
BATCHES = (1, 4, 8)
DTYPES = ("float32", "bfloat16")
# (label, method, options); the block size T is read from the engine
CONFIGS = [
    ("greedy (batched)", "autoregressive", {}),
    ("lookahead (7,4,7)", "lookahead", dict(window=7, ngram=4, guesses=7)),
    ("lookahead (15,5,15)", "lookahead", dict(window=15, ngram=5, guesses=15)),
    ("lookahead (40,5,40)", "lookahead", dict(window=40, ngram=5, guesses=40)),
    ("prompt lookup (5,15)", "prompt-lookup", dict(ngram=5, guesses=15)),
    ("jacobi (15)", "jacobi", dict(window=15)),
    ("speculative (PARD-2)", "speculative", {}),
]
MODELS = {  # name: (new tokens, configs it runs)
    "stories260K": (64, [c[0] for c in CONFIGS if not c[0].startswith("speculative")]),
    "pycode-5M": (64, [c[0] for c in CONFIGS]),
    "smollm2-135m-instruct": (32, ["greedy (batched)", "lookahead (7,4,7)", "lookahead (15,5,15)",
                                   "prompt lookup (5,15)", "jacobi (15)", "speculative (PARD-2)"]),
}


def prompts_for(name: str, model) -> list[list[int]]:
    if name == "stories260K":
        stories, out, k = story_cases(), [], 0
        while len(out) < PROMPTS:
            out += [list(c.ids) + list(c.reference[:8 * k]) for c in stories][:PROMPTS - len(out)]
            k += 1
        return out
    cases = code_cases(model, PROMPTS) if name == "pycode-5M" else chat_cases(model, "bench", PROMPTS)
    return [list(c.ids) for c in cases]


def measure(model, prompts, reference, config, batch: int, new_tokens: int) -> dict:
    """One row: every prompt decoded by `config` in groups of `batch`, against greedy alone."""
    label, method, options = config
    t0 = time.perf_counter()
    tokens = []
    for i in range(0, len(prompts), batch):
        tokens += jaxspec.generate(model, prompts[i:i + batch], method=method, max_new_tokens=new_tokens,
                                   stop_at_eos=False, **options).tokens
    _, spec, resolved = resolve_method(method, model.config, options, FileDefaults(model))  # as generate does
    differences = []
    for i, (p, ref, got) in enumerate(zip(prompts, reference, tokens)):
        d = exactness.compare(model, p, ref, got)
        if d is not None:
            differences.append(dict(prompt=i, index=d.index, expected=d.expected, got=d.got,
                                    logit_gap=d.logit_gap, tolerance=d.tolerance, near_tie=d.near_tie))
    # Drop this config's programs: a process holding every SmolLM2 program runs out of the
    # memory maps LLVM's JIT needs ("LLVM compilation error: Cannot allocate memory").
    model.compiled.clear()
    jax.clear_caches()
    return dict(config=label, method=method, options=options,
                block=spec.engine(resolved, True).block_tokens, batch=batch, prompts=len(prompts),
                new_tokens=new_tokens, identical=len(prompts) - len(differences), differences=differences,
                seconds=time.perf_counter() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    p.add_argument("--smoke", action="store_true", help="8 new tokens, two configs, batches 1 and 4")
    p.add_argument("--fresh", action="store_true", help="discard the rows of an interrupted run instead of resuming")
    p.add_argument("--batches", nargs="+", type=int, default=list(BATCHES), help="batch sizes (default 1 4 8)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="load every model with batch_invariant=True (results: exactness_invariant)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    stem = ("exactness_smoke" if args.smoke else "exactness") + ("_invariant" if args.batch_invariant else "")
    journal = Journal(args.out / f".{stem}.runs.jsonl", f"{stem} {PROMPTS} {CONFIGS} {MODELS} {args.batches}", args.fresh)
    keys = []
    for name in args.models:
        new_tokens, labels = (8, MODELS[name][1][:2]) if args.smoke else MODELS[name]
        for dtype in args.dtypes:
            todo = [(c, b) for c in CONFIGS if c[0] in labels for b in ((1, 4) if args.smoke else args.batches)
                    if b > 1 or c[1] != "autoregressive"]  # greedy at batch 1 is the reference
            group = [(0, f"{name} {dtype}", f"{c[0]} batch {b}") for c, b in todo]
            keys += group
            if all(key in journal.done for key in group):
                continue
            try:
                model = jaxspec.load(name, dtype=dtype, batch_invariant=args.batch_invariant)
            except jaxspec.CheckpointError as e:  # SmolLM2 not installed: say so, go on
                print(f"skipping {name}: {e}", file=sys.stderr)
                keys = [k for k in keys if not k[1].startswith(f"{name} ")]
                break
            prompts = prompts_for(name, model)
            reference = [jaxspec.generate(model, q, max_new_tokens=new_tokens, stop_at_eos=False).tokens
                         for q in prompts]
            for config, batch in todo:
                key = (0, f"{name} {dtype}", f"{config[0]} batch {batch}")
                if key not in journal.done:
                    row = measure(model, prompts, reference, config, batch, new_tokens)
                    journal.add({"round": 0, "case": key[1], "setting": key[2], "model": name, "dtype": dtype, **row})
                    print(f"{key[1]} {key[2]}: {row['identical']}/{row['prompts']} identical ({row['seconds']:.0f}s)",
                          file=sys.stderr, flush=True)
    rows = [{k: v for k, v in journal.done[key].items() if k not in ("round", "case", "setting")} for key in keys]
    write_result({"benchmark": "exactness", "title": "Exactness: identical to greedy (batch 1, same dtype), per "
                  "dtype, batch and block" + (", batch-invariant numerics" if args.batch_invariant else ""),
                  "batch_invariant": args.batch_invariant, "prompts_per_model": PROMPTS, "near_tie_ulps": exactness.NEAR_TIE_ULPS,
                  "rows": rows, "command": command_line(__file__, argv)}, args.out, stem)
    journal.path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
