"""The prompts benchmarks decode: held-out code, stories260K's references, real chats.

Code (`code_cases`, the default model pycode-5M): files the model never saw, the standard-library
files `jaxspec.train.corpus.is_heldout` puts in configs/pycode.toml's held-out split. A prompt is a
function start: the `def` line of a file's k-th definition and up to `context_lines` lines before.

Stories (`story_cases`): the prompts of stories260K's greedy references (in the shared folder, beside
the model).
Chats (`chat_cases`): jaxspec/real_prompts.py's MT-Bench and HumanEval splits, rendered with the
model's chat template (a base model without one continues the first turn's text).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from jaxspec.checkpoint.loading import shared_dir
from jaxspec.train.train_config import load_train_config
from jaxspec.train.corpus import is_heldout, list_documents, read_text
from benchmarks.harness.decode import Case
from benchmarks.harness.machine import ROOT

_DEF = re.compile(r"^\s*def \w+\(")


def heldout_files() -> tuple:
    cfg = load_train_config(ROOT / "configs" / "pycode.toml")
    root, files = list_documents(cfg.data)
    return root, [f for f in files if is_heldout(f, cfg.data.heldout_fraction)]


def code_prompts(count: int, context_lines: int = 6) -> list[dict]:
    """`count` prompts, cycling over held-out files and taking their 1st, 2nd, ... function."""
    root, files = heldout_files()
    defs = {f: [i for i, line in enumerate(read_text(root / f).splitlines()) if _DEF.match(line)] for f in files}
    prompts, rank = [], 0
    while len(prompts) < count and any(len(d) > rank for d in defs.values()):
        for f in files:
            if len(prompts) < count and len(defs[f]) > rank:
                lines = read_text(root / f).splitlines()
                i = defs[f][rank]
                text = "\n".join(lines[max(0, i - context_lines): i + 1]) + "\n"
                prompts.append({"file": f, "line": i + 1, "text": text})
        rank += 1
    return prompts


def code_cases(model, count: int, length: int | None = None) -> list[Case]:
    """`count` held-out function starts as cases; with `length`, each cut to its last `length`
    tokens (prompts shorter than that skipped), so every case shares one compiled program."""
    cases = []
    for p in code_prompts(4 * count if length else count):
        ids = model.tokenizer.encode(p["text"])
        if length is None or len(ids) >= length:
            cases.append(Case(f"{p['file']}:{p['line']}", tuple(ids[-length:] if length else ids)))
        if len(cases) == count:
            return cases
    if length is None:
        return cases
    raise SystemExit(f"only {len(cases)} held-out prompts have >= {length} tokens; ask for shorter prompts")


def story_reference() -> Path:
    """stories260K's greedy references: kept outside the repository, beside the model in the shared
    folder (`jaxspec.checkpoint.loading.shared_dir()`; the tests read the same file)."""
    return shared_dir() / "models" / "stories260K" / "greedy_reference.json"


def story_cases(count: int | None = None) -> list[Case]:
    """stories260K's reference cases (`story_reference()`), each with its reference continuation."""
    path = story_reference()
    if not path.exists():
        raise SystemExit(f"stories260K's greedy references are not at {path} (kept outside the repository, "
                         "with the model; JAXSPEC_SHARED names another shared folder)")
    cases = json.loads(path.read_text())["cases"]
    return [Case(f"story {i}", tuple(c["prompt"]), reference=tuple(c["greedy"]))
            for i, c in enumerate(cases[:count])]


def chat_cases(model, split: str, count: int | None = None) -> list[Case]:
    """A split of jaxspec/real_prompts.py, chat-templated (or the first turn's text for a base model)."""
    from jaxspec.chat import chat_prompt
    from jaxspec.real_prompts import chat_prompts

    templated = model.tokenizer.chat_template is not None
    return [Case(c["name"], tuple(chat_prompt(model, c["messages"]) if templated
                                  else model.tokenizer.encode(c["messages"][0]["content"])), category=c["category"])
            for c in chat_prompts(split)[:count]]
