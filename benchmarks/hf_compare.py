"""jaxspec vs Hugging Face transformers on the default model: greedy and prompt lookup, same checkpoint.

Both sides decode the same held-out code prompts (benchmarks/code_prompts.py) from the same
weights: transformers loads the HF folder the default model ships as (or, for a model given
by another path, the folder `jaxspec.load(...).save()` exports), in float32, batch 1, EOS
stop off, prompt token ids from jaxspec's tokenizer. Methods:

* jaxspec greedy and jaxspec prompt lookup (`method="prompt-lookup"`, N-1 = 3 draft tokens,
  up to G = 8 candidates; one compiled `lax.while_loop` each, compilation excluded);
* transformers `generate` greedy and with prompt lookup decoding
  (`prompt_lookup_num_tokens=10`, `max_matching_ngram_size=2`, transformers' defaults), each
  with torch using 1 and 2 threads.

Reported: tokens/s (sum new tokens / sum seconds over the prompts), S = new tokens / model
forwards (transformers' forwards counted with a hook, prefill included, like jaxspec's steps),
and whether every output is identical to jaxspec's greedy tokens. Warm-up first (jaxspec
compiles, torch allocates), then the configurations run interleaved per prompt.

    python benchmarks/hf_compare.py                      # 10 prompts x 128 new tokens

Writes benchmarks/results/hf_compare.{json,md}. Exits 1 if an output differs from greedy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jaxspec  # noqa: E402
from code_prompts import code_prompts  # noqa: E402
from machine import ROOT, machine_info, repo_relative  # noqa: E402

JAX_PROMPT_LOOKUP = {"ngram": 4, "guesses": 8}
HF_PROMPT_LOOKUP = {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=jaxspec.loading.DEFAULT_MODEL)
    p.add_argument("--prompts", type=int, default=10)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--torch-threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    return p.parse_args(argv)


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import transformers

    n = args.new_tokens
    threads = [int(t) for t in args.torch_threads.split(",")]
    load_before = os.getloadavg()
    model = jaxspec.load(args.model)
    prompts = code_prompts(args.prompts)
    ids = [model.tokenizer.encode(p["text"]) for p in prompts]

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(model.source)
        if not (folder.is_dir() and (folder / "config.json").exists()):
            folder = model.save(tmp)  # a llama2.c .bin: export the same weights
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    forwards = [0]
    hf.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))

    def hf_run(prompt_ids, extra):
        config = transformers.GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                                               pad_token_id=0, bos_token_id=model.config.bos_token_id, **extra)
        x = torch.tensor([prompt_ids], dtype=torch.long)
        forwards[0] = 0
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
        return {"tokens": out[0, len(prompt_ids):].tolist(), "seconds": time.perf_counter() - t0,
                "steps": forwards[0]}

    def jax_run(prompt_ids, options):
        t0 = time.perf_counter()
        out = jaxspec.generate(model, prompt_ids, max_new_tokens=n, stop_at_eos=False, **options)
        return {"tokens": out.tokens, "seconds": out.seconds, "wall_seconds": time.perf_counter() - t0,
                "steps": out.steps}

    configs = {"jaxspec greedy": ("jax", {}, None),
               "jaxspec prompt lookup": ("jax", {"method": "prompt-lookup", **JAX_PROMPT_LOOKUP}, None)}
    for t in threads:
        configs[f"transformers greedy ({t} thread{'s' if t > 1 else ''})"] = ("hf", {}, t)
        configs[f"transformers prompt lookup ({t} thread{'s' if t > 1 else ''})"] = ("hf", HF_PROMPT_LOOKUP, t)

    def run(name, prompt_ids):
        side, options, t = configs[name]
        if side == "jax":
            return jax_run(prompt_ids, options)
        torch.set_num_threads(t)
        return hf_run(prompt_ids, options)

    compile_seconds = {}
    for name, (side, options, _) in configs.items():  # warm-up: compile / allocate, every prompt bucket
        for prompt_ids in ids:
            if side == "jax":
                out = jaxspec.generate(model, prompt_ids, max_new_tokens=n, stop_at_eos=False, **options)
                compile_seconds[name] = compile_seconds.get(name, 0.0) + out.compile_seconds
            else:
                run(name, prompt_ids)
                break
    runs = {name: [] for name in configs}
    names = list(configs)
    for i, prompt_ids in enumerate(ids):  # interleaved, rotating the order per prompt
        for name in names[i % len(names):] + names[:i % len(names)]:
            runs[name].append(run(name, prompt_ids))

    reference = runs["jaxspec greedy"]
    summary = {}
    for name, rs in runs.items():
        new = sum(len(r["tokens"]) for r in rs)
        summary[name] = {
            "tokens_per_second": new / sum(r["seconds"] for r in rs),
            "S": new / sum(r["steps"] for r in rs),
            "identical_to_jaxspec_greedy": sum(r["tokens"] == g["tokens"] for r, g in zip(rs, reference)),
            "first_differences": [first_difference(r["tokens"], g["tokens"]) for r, g in zip(rs, reference)],
        }
        if "wall_seconds" in rs[0]:
            summary[name]["tokens_per_second_wall"] = new / sum(r["wall_seconds"] for r in rs)
    best_hf_greedy = max(v["tokens_per_second"] for k, v in summary.items() if k.startswith("transformers greedy"))
    for s in summary.values():
        s["vs_best_transformers_greedy"] = s["tokens_per_second"] / best_hf_greedy

    result = {
        "benchmark": "jaxspec vs transformers: greedy and prompt lookup, batch 1, float32, EOS stop off",
        "command": "python " + " ".join([repo_relative(Path(__file__))] + (sys.argv[1:] if argv is None else argv)),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "torch": torch.__version__, "transformers": transformers.__version__,
                    "torch_threads": threads, "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "model": repo_relative(model.source) if Path(model.source).resolve().is_relative_to(ROOT) else model.source,
        "prompts": len(ids), "prompt_tokens": [len(x) for x in ids], "new_tokens": n,
        "prompt_sources": [f"{p['file']}:{p['line']}" for p in prompts],
        "jaxspec_prompt_lookup": JAX_PROMPT_LOOKUP, "transformers_prompt_lookup": HF_PROMPT_LOOKUP,
        "jaxspec_compile_seconds": compile_seconds, "summary": summary,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hf_compare.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "hf_compare.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(s["identical_to_jaxspec_greedy"] == len(ids) for s in summary.values()) else 1


def table(result: dict) -> list[str]:
    """The comparison table (also used by benchmarks/report.py)."""
    n = result["prompts"]
    lines = ["| implementation | tokens/s | vs best transformers greedy | S (tokens / forward) | identical to jaxspec greedy |",
             "|---|---:|---:|---:|---:|"]
    for name, s in result["summary"].items():
        lines.append(f"| {name} | {s['tokens_per_second']:.0f} | {s['vs_best_transformers_greedy']:.2f}x | "
                     f"{s['S']:.2f} | {s['identical_to_jaxspec_greedy']}/{n} |")
    return lines


def markdown(result: dict) -> str:
    m = result["machine"]
    jpl, hpl = result["jaxspec_prompt_lookup"], result["transformers_prompt_lookup"]
    lines = [
        "# jaxspec vs transformers on the default model: greedy and prompt lookup", "",
        f"{result['benchmark']}. Model `{result['model']}` (transformers loads the same HF folder), "
        f"{result['prompts']} held-out code prompts x {result['new_tokens']} new tokens. tokens/s = new tokens / "
        "decode seconds summed over the prompts (jaxspec: the compiled loop, compilation excluded; "
        "transformers: the `generate` call), after a warm-up, configurations interleaved per prompt. "
        f"jaxspec prompt lookup: N = {jpl['ngram']}, G = {jpl['guesses']}; transformers: "
        f"`prompt_lookup_num_tokens={hpl['prompt_lookup_num_tokens']}`, "
        f"`max_matching_ngram_size={hpl['max_matching_ngram_size']}`.", "",
        *table(result), "",
        "| machine | |", "|---|---|",
        f"| CPU | {m['cpu']} ({m['cpu_count']} cores), load average before / after "
        f"{m['load_average_before']} / {m['load_average_after']} |",
        f"| python / jax ({m['jax_backend']}) / torch / transformers | {m['python']} / {m['jax']} / {m['torch']} / "
        f"{m['transformers']} |",
        f"| torch threads | {', '.join(map(str, m['torch_threads']))} (one row each) |",
        f"| date | {result['date']} |", f"| command | `{result['command']}` |",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
