"""jaxspec vs Hugging Face transformers from the same weights: greedy and prompt lookup.

transformers loads the HF folder the model ships as (or the one `jaxspec.load(...).save()` exports, for a
llama2.c checkpoint), float32, batch 1, EOS stop off, the prompts' ids from jaxspec's tokenizer. Settings: jaxspec
greedy and prompt lookup (N = 4, G = 8); transformers `generate` greedy and with prompt lookup decoding
(`prompt_lookup_num_tokens=10`, `max_matching_ngram_size=2`, its defaults), torch on each `--torch-threads`
count (on a small or busy machine intra-op threading can make a tiny model several times slower). A
transformers step is a forward (counted with a hook, prefill included, like jaxspec's steps), its seconds the
`generate` call's; jaxspec's are its decode time (compilation excluded). Every output must equal jaxspec greedy's.

    python -m benchmarks.hf_compare            # pycode-5M: 10 held-out code prompts x 128 tokens
    python -m benchmarks.hf_compare --stories  # greedy_bench: stories260K from BOS, 256 tokens, 5 rounds, greedy
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxspec  # noqa: E402
from benchmarks.harness import Case, DecodeBench, Setting, code_cases, main_decode  # noqa: E402

JAX_PROMPT_LOOKUP = {"ngram": 4, "guesses": 8}
HF_PROMPT_LOOKUP = {"prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2}


def arguments(p) -> None:
    p.add_argument("--stories", action="store_true",
                   help="greedy_bench: stories260K from prompt [1] (BOS), 256 new tokens, 5 rounds, greedy only")
    p.add_argument("--model", help="default: pycode-5M (stories260K with --stories)")
    p.add_argument("--prompts", type=int, default=10, help="held-out code prompts")
    p.add_argument("--new-tokens", type=int, help="default 128 (256 with --stories)")
    p.add_argument("--torch-threads", default=",".join(map(str, sorted({1, os.cpu_count()}))),
                   help="comma-separated torch thread counts, a transformers setting each")


def transformers_peers(model, threads: list[int], prompt_lookup: bool) -> list[Setting]:
    """transformers `generate` settings: greedy (and prompt lookup) per torch thread count."""
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(model.source)
        if not (folder.is_dir() and (folder / "config.json").exists()):
            folder = model.save(tmp)  # a llama2.c .bin: export the same weights
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    forwards = [0]
    hf.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))

    def peer(t: int, extra: dict):
        def run(case: Case, new_tokens: int) -> dict:
            torch.set_num_threads(t)
            config = transformers.GenerationConfig(do_sample=False, max_new_tokens=new_tokens,
                                                   min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0,
                                                   bos_token_id=model.config.bos_token_id, **extra)
            x = torch.tensor([case.ids], dtype=torch.long)
            forwards[0] = 0
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = hf.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
            return {"tokens": out[0, len(case.ids):].tolist(), "steps": forwards[0],
                    "seconds": time.perf_counter() - t0}
        return run

    kinds = {"greedy": {}, **({"prompt lookup": HF_PROMPT_LOOKUP} if prompt_lookup else {})}
    return [Setting(f"transformers {kind} ({t} thread{'s' if t > 1 else ''})", peer=peer(t, extra))
            for t in threads for kind, extra in kinds.items()]


def declare(args) -> DecodeBench:
    import torch
    import transformers

    model = jaxspec.load(args.model or ("stories260K" if args.stories else jaxspec.checkpoint.loading.DEFAULT_MODEL))
    threads = [int(t) for t in args.torch_threads.split(",")]
    settings = [Setting("greedy")]
    if not args.stories:
        settings.append(Setting("prompt lookup (N=4,G=8)", "prompt-lookup", JAX_PROMPT_LOOKUP))
    settings += transformers_peers(model, threads, prompt_lookup=not args.stories)
    facts = {"torch": torch.__version__, "transformers": transformers.__version__, "torch_threads": threads,
             "note": "transformers' seconds: the `generate` call; jaxspec's: the decode (compilation excluded)."}
    if args.stories:
        return DecodeBench("greedy_bench", "Greedy decoding: jaxspec vs transformers", model, [Case("BOS", (1,))],
                           settings, args.new_tokens or 256, rounds=5, facts=facts)
    facts["transformers_prompt_lookup"] = HF_PROMPT_LOOKUP
    return DecodeBench("hf_compare", "jaxspec vs transformers: greedy and prompt lookup", model,
                       code_cases(model, args.prompts), settings, args.new_tokens or 128, facts=facts)


if __name__ == "__main__":
    sys.exit(main_decode(__file__, __doc__, arguments, declare))
