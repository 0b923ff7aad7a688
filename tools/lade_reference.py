"""The authors' lookahead decoding (`lade`, Fu et al.) on SmolLM2-135M-Instruct: a peer for jaxspec's S.

Runs in its own environment, not jaxspec's: lade monkey-patches transformers 4.36's greedy search
and Llama modelling code. Set it up once (CPU torch; lade from the authors' repository at commit
eed010da, which adds POOL_FROM_PROMPT over the PyPI release lade 0.0.2; both call themselves 0.0.2).
Commands run from the repository root; the venv and the exported model sit beside it, as ../shared does:

    python3 -m venv ../lade_venv
    ../lade_venv/bin/pip install torch==2.13.0 transformers==4.36.2 accelerate==0.23.0 einops==0.7.0
    ../lade_venv/bin/pip install --no-deps <checkout of hao-ai-lab/LookaheadDecoding at eed010da>

and export the model once with jaxspec's environment:

    python tools/make_smollm2_references.py --export ../smollm2_hf

Then:

    ../lade_venv/bin/python tools/lade_reference.py --split quick|bench|heldout \
        [--max-new-tokens 128] [--configs 15,5,15 7,4,7]

The PyPI release (`pip install lade==0.0.2 transformers==4.34.1` plus the CPU torch, in another
venv) also runs under this script; it has no POOL_FROM_PROMPT, and its files get a `_pypi` suffix.

It loads the exported folder in float32 on CPU (eager attention), renders each chat of the split
(`real_prompts.chat_prompts`, imported by path) with the chat template, tokenizes without extra
special tokens, and for each prompt runs plain greedy transformers decoding (before lade patches
anything) and lade's greedy lookahead decoding at each (W, N, G) config, with an explicit all-ones
attention_mask, EOS stop off, batch 1. It writes `benchmarks/results/lade_reference_{split}.json`
and `.md`.

Steps: each call of lade's `jforward_multilevel` is one target forward pass (one pass of all the
decoder layers over the query block: the 1 new token, the lookahead window and the guesses). The
prefill is the first such call (it also runs the initial window and yields the first new token),
so steps = 1 + decode calls; plain greedy takes new_tokens steps by the same count (S = 1). The
count is taken by wrapping `jforward_multilevel` and checked against lade's own DEBUG count and a
hook on the token embedding (which also gives the mean query tokens per step; the bench and heldout
results of 2026-12-01 were checked with a hook on decoder layer 0 instead). S = new tokens / steps;
a category's or the total's S is the sum of tokens over the sum of steps. If lade's last step
overshoots max_new_tokens, lade truncates the output and that step still counts.

lade initializes its lookahead window by random draws of prompt tokens (`random.choice`; its
`random.seed(10)` is commented out upstream), so `random.seed(--seed)` is set before every lade run.

A quirk of the repository version, measured as it is: after accepting k+1 tokens in one step, its
loop appends the last accepted token k+1 times to its token history instead of the k+1 tokens, so
the n-grams that POOL_FROM_PROMPT adds from generated text right after such a step are wrong (the
output is not affected: it comes from input_ids; the pool from the prompt itself is right).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import inspect
import io
import json
import os
import platform
import random
import re
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_MODEL = str(ROOT.parent / "smollm2_hf")  # beside the repository, as ../shared is


def recorded_path(path) -> str:
    """A path as the results record it: relative to the repository when it lies beside it
    (../lade_venv, ../smollm2_hf), else its name alone; never this machine's absolute path."""
    path = Path(path).absolute()
    return os.path.relpath(path, ROOT) if path.is_relative_to(ROOT.parent) else path.name
REFERENCES = ROOT / "tests" / "data" / "smollm2_references.json"
GITHUB_SOURCE = "github.com/hao-ai-lab/LookaheadDecoding @ eed010da9c7b1867912675d480feec5629e0c2d0 (2025-03-05)"
PYPI_SOURCE = "the PyPI release lade 0.0.2 (2023-11)"


def load_real_prompts():
    spec = importlib.util.spec_from_file_location("real_prompts", HERE.parent / "jaxspec" / "real_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def data_search_paths(extra):
    """Where the prompt data packages may be: this environment, then jaxspec's .venv."""
    return [Path(p) for p in extra] + sorted(ROOT.glob(".venv/lib/python*/site-packages"))


def load_model(folder: str, model_class=None):
    """The exported folder, read by transformers 4.36 (it was written by transformers 5).

    Two format changes are bridged in memory: config.json keeps rope_theta under `rope_parameters`
    (4.36 would silently use 10000 instead of 100000), and tokenizer.json writes BPE merges as pairs
    and has `ignore_merges` (tokenizers 0.15 cannot parse it); the chat template is in
    chat_template.jinja, not tokenizer_config.json.
    """
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    raw = json.loads((folder / "config.json").read_text())
    rope = raw.pop("rope_parameters", None) or {}
    if "rope_theta" not in raw and "rope_theta" in rope:
        raw["rope_theta"] = rope["rope_theta"]
    assert rope.get("rope_type", "default") == "default", rope
    raw.pop("dtype", None)
    config = LlamaConfig(**raw)
    config._attn_implementation = "eager"  # lade's decoder layer passes extra arguments only eager attention takes

    tok_json = json.loads((folder / "tokenizer.json").read_text())
    bpe = tok_json["model"]
    bpe.pop("ignore_merges", None)
    if bpe["merges"] and isinstance(bpe["merges"][0], list):
        assert not any(" " in a or " " in b for a, b in bpe["merges"])
        bpe["merges"] = [f"{a} {b}" for a, b in bpe["merges"]]
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    specials = {k: tok_config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if k in tok_config}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(tok_json)), **specials)
    template = folder / "chat_template.jinja"
    tokenizer.chat_template = template.read_text() if template.is_file() else tok_config["chat_template"]

    model = (model_class or LlamaForCausalLM).from_pretrained(folder, config=config, torch_dtype=torch.float32)
    model.eval()
    attention = type(model.model.layers[0].self_attn).__name__
    assert attention == "LlamaAttention", attention
    model.tokenizer = tokenizer
    return model, tokenizer


class Counter:
    """Counts lade's forward calls, passes through the token embedding (with their query lengths)
    and through decoder layer 0 (the PyPI release calls the layers' .forward directly, which
    skips hooks, so there it stays 0)."""

    def __init__(self, model):
        self.calls = self.passes = self.query_tokens = self.layer_passes = 0
        model.model.embed_tokens.register_forward_pre_hook(self._embed_hook)
        model.model.layers[0].register_forward_pre_hook(self._layer_hook)

    def _embed_hook(self, module, args):
        self.passes += 1
        self.query_tokens += args[0].shape[1]

    def _layer_hook(self, module, args):
        self.layer_passes += 1

    def wrap_lade(self, model):
        original = model.jforward_multilevel

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        model.jforward_multilevel = counted

    def reset(self):
        self.calls = self.passes = self.query_tokens = self.layer_passes = 0


def lade_defaults(lade_decoding) -> dict:
    """lade's built-in defaults, read from the source of its greedy lookahead loop."""
    source = inspect.getsource(lade_decoding.jacobi_greedy_search_multilevel)
    return {k: int(v) for k, v in re.findall(r'CONFIG_MAP\.get\("(\w+)",\s*(-?\d+)\)', source)}


def generate(model, ids, n, pad_id):
    import torch
    from transformers import GenerationConfig

    input_ids = torch.tensor([ids])
    config = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=pad_id)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
    wall = time.perf_counter() - t0
    return out[0, len(ids):].tolist(), wall


def first_mismatch(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def summarize(rows):
    tokens = sum(r["new_tokens"] for r in rows)
    steps = sum(r["steps"] for r in rows)
    return {"prompts": len(rows), "new_tokens": tokens, "steps": steps, "S": round(tokens / steps, 4),
            "all_equal_greedy": all(r["equals_greedy"] for r in rows),
            "wall_s": round(sum(r["wall_s"] for r in rows), 2)}


def check_references(model, tokenizer, pad_id):
    """Plain greedy here vs the transformers-5 references (same weights, other transformers)."""
    if not REFERENCES.is_file():
        return {"skipped": f"{REFERENCES} not found"}
    refs = json.loads(REFERENCES.read_text())
    out = []
    for chat in refs["chats"]:
        text = tokenizer.apply_chat_template(chat["messages"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        new, _ = generate(model, ids, len(chat["continuation_ids"]), pad_id)
        out.append({"name": chat["name"], "text_equal": text == chat["text"], "prompt_ids_equal": ids == chat["prompt_ids"],
                    "continuation_equal": new == chat["continuation_ids"],
                    "first_mismatch": first_mismatch(new, chat["continuation_ids"])})
    return {"file": str(REFERENCES.relative_to(ROOT)), "versions": refs["versions"], "chats": out}


def dumps(data) -> str:
    """JSON with one key per line but each list of numbers on one line."""
    text = json.dumps(data, indent=1)
    return re.sub(r"\[\s*(-?[\d.]+(?:,\s*-?[\d.]+)*)\s*\]", lambda m: "[" + re.sub(r"\s+", "", m.group(1)) + "]", text)


def markdown(data) -> str:
    lines = [f"# lade (authors' lookahead decoding) on SmolLM2-135M-Instruct: split `{data['split']}`", "",
             f"{data['setup']}", "",
             f"Steps: {data['steps_definition']}", ""]
    cats = list(dict.fromkeys(r["category"] for r in data["prompts"]))
    head = "| category | prompts | " + " | ".join(f"S ({c['name']})" for c in data["configs"]) + " |"
    lines += [head, "|" + " --- |" * (2 + len(data["configs"]))]
    for cat in cats + ["total"]:
        cells = []
        for c in data["configs"]:
            s = c["total"] if cat == "total" else c["per_category"][cat]
            cells.append(f"{s['S']:.3f} ({s['new_tokens']}/{s['steps']})")
        n = data["configs"][0]["total" if cat == "total" else "per_category"][cat]["prompts"] if cat != "total" else len(data["prompts"])
        name = f"**{cat}**" if cat == "total" else cat
        lines.append(f"| {name} | {n} | " + " | ".join(cells) + " |")
    lines += ["", "S = new tokens / steps (tokens/steps in brackets; category and total S = sum of tokens / sum of steps).", ""]
    lines += ["| config | equal to greedy | wall s (lade) | wall s (greedy) | mean query tokens/step |", "| --- | --- | --- | --- | --- |"]
    greedy_wall = sum(p["greedy_wall_s"] for p in data["prompts"])
    for c in data["configs"]:
        eq = sum(r["equals_greedy"] for r in c["rows"])
        q = sum(r["query_tokens"] for r in c["rows"]) / sum(r.get("forward_passes", r["layer0_passes"]) for r in c["rows"])
        lines.append(f"| {c['name']} | {eq}/{len(c['rows'])} | {c['total']['wall_s']:.1f} | {greedy_wall:.1f} | {q:.1f} |")
    lines += ["", "Per prompt (S):", "", "| prompt | category | prompt tokens | " + " | ".join(c["name"] for c in data["configs"]) + " |",
              "|" + " --- |" * (3 + len(data["configs"]))]
    for i, p in enumerate(data["prompts"]):
        cells = []
        for c in data["configs"]:
            r = c["rows"][i]
            cells.append(f"{r['S']:.3f}" + ("" if r["equals_greedy"] else f" (differs at {r['first_mismatch']})"))
        lines.append(f"| {p['name']} | {p['category']} | {p['prompt_tokens']} | " + " | ".join(cells) + " |")
    ref = data.get("reference_check") or {}
    if "chats" in ref:
        ok = all(c["prompt_ids_equal"] and c["continuation_equal"] for c in ref["chats"])
        lines += ["", f"Reference check (plain greedy here vs `{ref['file']}` made by transformers "
                      f"{ref['versions']['transformers']}): " + ("all 3 equal." if ok else json.dumps(ref["chats"]))]
    lines += ["", f"Versions: {json.dumps(data['versions'])}. lade defaults: {json.dumps(data['lade_defaults'])}.",
              "", f"Command: `{data['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="quick", choices=["quick", "bench", "heldout"])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--configs", nargs="+", default=["15,5,15", "7,4,7"], help="W,N,G triples")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--seed", type=int, default=0, help="random.seed before each lade run (window init)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts of the split")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-path", nargs="*", default=[], help="extra site-packages holding the prompt data")
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--no-reference-check", action="store_true")
    parser.add_argument("--tag", default="", help="suffix for the output file names")
    args = parser.parse_args()

    import torch
    import transformers

    torch.set_num_threads(args.threads)
    real_prompts = load_real_prompts()
    chats = real_prompts.chat_prompts(args.split, search_paths=data_search_paths(args.data_path))
    if args.limit:
        chats = chats[: args.limit]
    configs = []
    for spec in args.configs:
        w, n, g = (int(x) for x in spec.split(","))
        configs.append({"name": f"W{w} N{n} G{g}", "W": w, "N": n, "G": g})

    t_start = time.time()
    model, tokenizer = load_model(args.model)
    model.generation_config.eos_token_id = None  # lade falls back to it when eos_token_id is None
    pad_id = tokenizer.pad_token_id
    counter = Counter(model)

    # 1. plain greedy transformers, before lade patches any class
    reference_check = None if args.no_reference_check else check_references(model, tokenizer, pad_id)
    if reference_check:
        print("reference check:", json.dumps(reference_check.get("chats", reference_check)), flush=True)
    prompts = []
    for chat in chats:
        text = tokenizer.apply_chat_template(chat["messages"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        counter.reset()
        greedy, wall = generate(model, ids, args.max_new_tokens, pad_id)
        assert len(greedy) == args.max_new_tokens
        prompts.append({"name": chat["name"], "category": chat["category"], "prompt_tokens": len(ids),
                        "prompt_ids": ids, "greedy_ids": greedy, "greedy_steps": counter.passes,
                        "greedy_wall_s": round(wall, 3)})
        print(f"greedy {chat['name']}: {len(ids)} prompt tokens, {counter.passes} steps, {wall:.1f}s", flush=True)

    # 2. lade
    import lade
    from lade import decoding as lade_decoding

    # The authors' repository version (lade.utils.inject_module) and the PyPI release differ:
    github = hasattr(lade.utils, "inject_module")
    if github:
        # lade.augment_all() = augment_llama() (copy the methods of lade's Llama classes onto
        # transformers' classes) + augment_generate() (GenerationMixin.greedy_search -> lade's proxy).
        # augment_llama() breaks here: its copy loop also copies inherited callables, so transformers'
        # LlamaForCausalLM gets the unpatched GenerationMixin.greedy_search as its own attribute (the
        # proxy is never reached), LlamaModel gets nn.Module._forward_unimplemented as forward, and the
        # copied __init__s use zero-argument super() bound to lade's classes, which fails on
        # transformers' instances. So the model is built from lade's own classes instead (the same
        # methods augment_llama() means to install), with augment_generate() as lade has it.
        from lade.models import modeling_llama as lade_llama

        lade.augment_generate()
        model_class = lade_llama.LlamaForCausalLM
        patching = ("lade.augment_generate() (GenerationMixin.greedy_search -> lade's greedy_search_proxy, USE_LADE=1) "
                    "and the model built as lade.models.modeling_llama.LlamaForCausalLM; not lade.augment_all(), "
                    "whose method copying breaks transformers' Llama classes (see the script)")
    else:
        # PyPI 0.0.2: augment_llama() adds three functions to transformers' Llama classes; it works as is.
        lade.augment_all()
        model_class = None
        patching = "lade.augment_all(), USE_LADE=1"
    source = GITHUB_SOURCE if github else PYPI_SOURCE
    del model, counter
    model, tokenizer = load_model(args.model, model_class)
    model.generation_config.eos_token_id = None
    counter = Counter(model)
    counter.wrap_lade(model)
    os.environ["USE_LADE"] = "1"
    os.environ.pop("CHAT", None)
    for cfg in configs:
        rows = []
        for p in prompts:
            options = dict(LEVEL=cfg["N"], WINDOW_SIZE=cfg["W"], GUESS_SET_SIZE=cfg["G"], DEBUG=1)
            lade.config_lade(**options, **({"POOL_FROM_PROMPT": True} if github else {}))
            random.seed(args.seed)  # the PyPI release calls random.seed(10) itself
            counter.reset()
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):  # lade's DEBUG summary
                new, wall = generate(model, p["prompt_ids"], args.max_new_tokens, pad_id)
            debug_steps = int(re.search(r"Total steps:\s+(\d+)", printed.getvalue()).group(1))
            if github:
                assert lade_decoding.CONFIG_MAP["log"][-1][1] == debug_steps
            assert debug_steps == counter.calls == counter.passes, (debug_steps, counter.calls, counter.passes)
            assert counter.layer_passes in (0, counter.calls), counter.layer_passes
            mismatch = first_mismatch(new, p["greedy_ids"])
            rows.append({"name": p["name"], "category": p["category"], "new_tokens": len(new), "steps": counter.calls,
                         "S": round(len(new) / counter.calls, 4), "lade_debug_steps": debug_steps,
                         "forward_passes": counter.passes, "layer0_passes": counter.layer_passes,
                         "query_tokens": counter.query_tokens,
                         "wall_s": round(wall, 3), "equals_greedy": mismatch is None, "first_mismatch": mismatch})
            print(f"lade {cfg['name']} {p['name']}: {len(new)} tokens / {counter.calls} steps = {len(new) / counter.calls:.3f}"
                  f", {wall:.1f}s, equal to greedy: {mismatch is None}", flush=True)
        cfg["rows"] = rows
        cfg["per_category"] = {c: summarize([r for r in rows if r["category"] == c])
                               for c in dict.fromkeys(r["category"] for r in rows)}
        cfg["total"] = summarize(rows)
        print(f"== {cfg['name']}: total S {cfg['total']['S']}", flush=True)

    versions = {name: importlib.metadata.version(name) for name in ("transformers", "torch", "tokenizers", "lade")}
    versions["python"] = platform.python_version()
    data = {
        "benchmark": "lade lookahead decoding vs plain greedy transformers, SmolLM2-135M-Instruct, batch 1, float32, CPU, EOS stop off",
        "split": args.split,
        "setup": (f"SmolLM2-135M-Instruct ({recorded_path(args.model)}, exported from the Q4_1 GGUF, float32, eager attention, CPU, "
                  f"{args.threads} thread(s)); chat template with generation prompt; {args.max_new_tokens} new tokens, "
                  f"greedy, EOS stop off, explicit all-ones attention_mask; lade from {source} with "
                  + ("POOL_FROM_PROMPT=True, " if github else "no POOL_FROM_PROMPT (not in this release), ")
                  + "ALWAYS_FWD_ONE=1 (its only mode), "
                  + (f"random.seed({args.seed}) before each run." if github else "lade's own random.seed(10) in each run.")),
        "steps_definition": ("target forward passes = calls of lade's jforward_multilevel, the prefill (prompt + initial "
                             "window, yields the first token) counted as one; checked equal to lade's DEBUG step count "
                             "and to the passes through the token embedding (and decoder layer 0, where hooks see it). Plain greedy: one pass per new token (S = 1)."),
        "lade_source": source,
        "pool_from_prompt": github,
        "lade_defaults": lade_defaults(lade_decoding),
        "lade_patching": patching,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed if github else "10 (set by lade itself)",
        "versions": versions,
        "command": f"{recorded_path(sys.executable)} tools/lade_reference.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "total_wall_s": None,
        "reference_check": reference_check,
        "prompts": prompts,
        "configs": configs,
    }
    data["total_wall_s"] = round(time.time() - t_start, 1)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = (f"lade_reference_{args.split}" + ("" if github else "_pypi")
            + (f"_first{args.limit}" if args.limit else "") + (f"_{args.tag}" if args.tag else ""))
    (out_dir / f"{stem}.json").write_text(dumps(data) + "\n")
    (out_dir / f"{stem}.md").write_text(markdown(data))
    print(f"wrote {out_dir / stem}.json/.md in {data['total_wall_s']}s")


if __name__ == "__main__":
    main()
