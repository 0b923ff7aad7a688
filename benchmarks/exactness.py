"""How often each method's output is identical to greedy's, per dtype, batch and block size,
and where it is not, how close the disputed logits were (`jaxspec.exactness`).

For each model, dtype (float32, bfloat16), method config and batch (1, 4, 8): the same 8
prompts are decoded in groups of `batch` and each row is compared with greedy decoding of
that prompt alone (batch 1) in the same dtype. A differing row records the first differing
position, the logit gap between greedy's token and the method's there (one causal forward
over the common prefix, in the model's dtype) and whether it is a near-tie (within
`near_tie_tolerance`: 4 ulps of the largest |logit| in the dtype). "greedy (batched)" is
greedy itself at batch 4 and 8: batching alone changes the shapes and so the rounding.

Prompts are fixed by order alone: stories260K's 3 reference prompts, then those prompts
extended by 8, 16, ... tokens of their reference continuation; pycode-5M's first 8 held-out
code prompts (`code_prompts`); SmolLM2's first 8 "bench" chats (`real_prompts`).

    python benchmarks/exactness.py                       # all models (SmolLM2 if installed)
    python benchmarks/exactness.py --models stories260K --smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import jax

import jaxspec
from jaxspec import exactness
from jaxspec.methods import resolve_method
import report
from machine import machine_info

RESULTS = Path(__file__).resolve().parent / "results"
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
                                   "prompt lookup (5,15)", "jacobi (15)"]),
}


def prompts_for(name: str, model) -> list[list[int]]:
    if name == "stories260K":
        cases = json.loads((jaxspec.loading.shared_dir() / "models" / "stories260K" / "greedy_reference.json")
                           .read_text())["cases"]
        out, k = [], 0
        while len(out) < PROMPTS:
            for c in cases:
                if len(out) < PROMPTS:
                    out.append(c["prompt"] + c["greedy"][:8 * k])
            k += 1
        return out
    if name == "pycode-5M":
        from code_prompts import code_prompts

        return [model.tokenizer.encode(p["text"]) for p in code_prompts(PROMPTS)]
    from jaxspec.chat import chat_prompt
    from jaxspec.real_prompts import chat_prompts

    return [chat_prompt(model, c["messages"]) for c in chat_prompts("bench")[:PROMPTS]]


def run_model(name: str, dtype: str, new_tokens: int, labels: list[str], batches, progress, done: dict
              ) -> list[dict]:
    model = jaxspec.load(name, dtype=dtype)
    prompts = prompts_for(name, model)
    opts = dict(max_new_tokens=new_tokens, stop_at_eos=False)
    reference = [jaxspec.generate(model, p, **opts).tokens for p in prompts]
    rows = []
    for label, method, options in CONFIGS:
        if label not in labels:
            continue
        for batch in batches:
            if method == "autoregressive" and batch == 1:
                continue  # that is the reference
            if (name, dtype, label, batch) in done:  # --resume: measured by the previous run
                progress(done[(name, dtype, label, batch)])
                continue
            t0 = time.perf_counter()
            tokens, block = [], None
            for i in range(0, len(prompts), batch):
                out = jaxspec.generate(model, prompts[i:i + batch], method=method, **options, **opts)
                tokens += out.tokens
            _, spec, resolved = resolve_method(method, model.config, options, model.drafters)
            block = spec.engine(resolved, True).block_tokens
            differences = []
            for i, (p, ref, got) in enumerate(zip(prompts, reference, tokens)):
                d = exactness.compare(model, p, ref, got)
                if d is not None:
                    differences.append(dict(prompt=i, index=d.index, expected=d.expected, got=d.got,
                                            logit_gap=d.logit_gap, tolerance=d.tolerance, near_tie=d.near_tie))
            # Drop this config's programs: a process holding every SmolLM2 program runs out of
            # the memory maps LLVM's JIT needs ("LLVM compilation error: Cannot allocate memory").
            model.compiled.clear()
            jax.clear_caches()
            rows.append(dict(model=name, dtype=dtype, config=label, method=method, options=options, block=block,
                             batch=batch, prompts=len(prompts), new_tokens=new_tokens,
                             identical=len(prompts) - len(differences), differences=differences,
                             seconds=time.perf_counter() - t0))
            progress(rows[-1])
    return rows


def markdown(result: dict) -> str:
    return "\n".join(["# Exactness: identical to greedy (batch 1, same dtype), per dtype, batch and block", "",
                      f"{result['date']}, `{result['command']}`, jax {result['jax']}, {result['device']}.", "",
                      *report.exactness(result)]) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    p.add_argument("--smoke", action="store_true", help="8 new tokens, two configs, batches 1 and 4")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows the previous run's JSON already has (same model, dtype, config, batch)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    result = dict(rows=[], prompts_per_model=PROMPTS, near_tie_ulps=exactness.NEAR_TIE_ULPS, machine=machine_info(), device=str(jax.devices()[0]), jax=jax.__version__,
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command="python " + " ".join(["benchmarks/exactness.py", *argv]))
    stem = "exactness_smoke" if args.smoke else "exactness"
    args.out.mkdir(parents=True, exist_ok=True)

    done = {}
    if args.resume and (args.out / f"{stem}.json").exists():
        previous = json.loads((args.out / f"{stem}.json").read_text())
        done = {(r["model"], r["dtype"], r["config"], r["batch"]): r for r in previous["rows"]}
        # The report says the rows come from several runs, started at these dates.
        result["runs"] = previous.get("runs", [previous["date"]]) + [result["date"]]

    def progress(row):
        print(f"{row['model']} {row['dtype']} {row['config']} batch {row['batch']}: {row['identical']}/{row['prompts']}"
              f" identical ({row['seconds']:.0f}s)", flush=True)
        result["rows"].append(row)
        (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")  # partial results survive
        (args.out / f"{stem}.md").write_text(markdown(result))

    for name in args.models:
        new_tokens, labels = MODELS[name]
        batches = BATCHES
        if args.smoke:
            new_tokens, labels, batches = 8, labels[:2], (1, 4)
        for dtype in args.dtypes:
            try:
                run_model(name, dtype, new_tokens, labels, batches, progress, done)
            except jaxspec.CheckpointError as e:  # SmolLM2 not installed: say so, go on
                print(f"skipping {name}: {e}", file=sys.stderr)
                break
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
