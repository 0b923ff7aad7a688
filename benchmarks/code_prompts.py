"""Held-out Python prompts for benchmarks on the default model (pycode-5M).

The default model never saw these files: they are the standard-library files that
`jaxspec.train.corpus.is_heldout` puts in the held-out split of configs/pycode.toml. A
prompt is the start of a function: the `def` line of the k-th top-level or method
definition of a held-out file and the lines before it (up to `context_lines`), so the
model continues real, unseen code.
"""

from __future__ import annotations

import re

from jaxspec.train.config import load_train_config
from jaxspec.train.corpus import is_heldout, list_documents, read_text
from machine import ROOT

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
