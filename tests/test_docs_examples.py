"""Code printed in the docs runs as printed: the README's Python API example (on the shipped
default model) and docs/design.md's sketch of a new draft source."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import jax
from flax import nnx

import jaxspec
import jaxspec.decoding.options as options_module
from jaxspec.decoding.methods import METHODS, Method

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_api_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (example,) = [b for b in blocks if "lookahead_decode" in b and "tokens_per_step" in b]
    namespace: dict = {}
    exec(compile(example, str(README), "exec"), namespace)  # the example asserts its own claims
    s = namespace["tokens_per_step"](namespace["model"].params, namespace["jnp"].array([[1, 0, 0, 0], [1, 461, 461, 0]]),
                                     namespace["jnp"].array([1, 3]))
    assert s.shape == (2,) and bool((s >= 1).all())  # S per row: at least one token per step


def test_design_doc_draft_source_sketch_is_a_working_method(monkeypatch):
    """docs/design.md's "Adding a draft source": the new file and the options class as printed,
    plus the registry entry, make a method that decodes exactly like greedy."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    section = text[text.index("## Adding a draft source"):]
    source_block, options_block = re.findall(r"```python\n(.*?)```", section, flags=re.S)[:2]
    namespace: dict = {}
    exec(compile(source_block, "design.md: the source", "exec"), namespace)
    registry_line = next(line.strip() for line in options_block.splitlines() if line.strip().startswith('"repeat"'))
    options_ns = dict(vars(options_module))
    exec(compile(options_block.split("# jaxspec/decoding/methods.py")[0], "design.md: the options", "exec"), options_ns)
    entry = eval(registry_line.split(":", 1)[1].strip().rstrip(","),  # noqa: S307 -- the doc's own registry entry
                 {"Method": Method, "RepeatOptions": options_ns["RepeatOptions"], "RepeatLast": namespace["RepeatLast"]})
    monkeypatch.setitem(METHODS, "repeat", entry)

    cfg = jaxspec.ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                              num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=1,
                              eos_token_ids=())
    model = jaxspec.Model.from_module(jaxspec.Transformer(cfg, rngs=nnx.Rngs(0)))
    model = dataclasses.replace(model, params=jax.tree.map(lambda x: x * 5.0 if x.ndim == 2 else x, model.params),
                                compiled={})
    prompts = [[1, 7, 7, 7, 7], [1, 50, 8, 8, 43]]
    out = jaxspec.generate(model, prompts, max_new_tokens=20, method="repeat", draft_len=3)
    assert out.tokens == jaxspec.generate(model, prompts, max_new_tokens=20, method="greedy").tokens
    assert out.options == {"draft_len": 3} and len(out.extras["accept_histogram"][0]) == 3 + 2
