"""int8 weights (`jaxspec.load(..., dtype="int8")`, `jaxspec.models.quantize`): quantized per output channel,
dequantized inside each matmul, activations float32.

(a) the int8 model's logits are the float32 model's within the quantization error, and exactly
    (to float32 rounding) those of a float32 model holding the dequantized weights;
(b) every decoding method on the int8 model equals int8 greedy decoding token for token (the
    exactness rule: the reference is the same quantized model, not float32 greedy);
(c) the quantized matrices take a quarter of their float32 bytes;
plus the convert's ordering (a large float32 copy is neither made up front nor hoisted out of a
decoding loop), chunked heads and matmuls, the load path, the errors and the CLI's --dtype int8.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
import jaxspec.models.quantize as quantize
from jaxspec.models.model import unstack_layers
from jaxspec import exactness
from jaxspec.cli import main
from jaxspec.errors import ConfigError
from jaxspec.runtime.memory import tree_bytes
from stories import CASES, CHECKPOINT, needs_stories
from test_speculative import random_drafter

TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=1, eos_token_ids=(),
    tie_word_embeddings=False,
)
WEIGHT_SCALE = 5.0  # as in test_lookahead / test_speculative: loop-prone text, so multi-token steps happen
PROMPTS = [[1], [1, 50, 8, 8, 43, 47, 50, 37, 49, 36, 5]]
NEW = 24


def _tiny_module(tied: bool = False) -> jaxspec.Transformer:
    module = jaxspec.Transformer(dataclasses.replace(TINY, tie_word_embeddings=tied), rngs=nnx.Rngs(0))
    _, params = nnx.split(module)
    nnx.update(module, jax.tree.map(lambda x: x * WEIGHT_SCALE if x.ndim == 2 else x, params))
    return module


def _pair(tied: bool = False) -> tuple[jaxspec.Model, jaxspec.Model]:
    """(float32, int8) models of the same tiny random weights."""
    f32, q = _tiny_module(tied), quantize.quantize_model(_tiny_module(tied))
    return jaxspec.Model.from_module(f32), jaxspec.Model.from_module(q, dtype="int8")


def _dequantized(model: jaxspec.Model) -> jaxspec.Model:
    """A float32 model whose weights are the int8 model's dequantized values (q * scale)."""
    module = jaxspec.Transformer(model.config, rngs=nnx.Rngs(1))
    q = unstack_layers(model.module)  # (per layer, as the fresh module's)
    for path, sub in nnx.iter_modules(q):
        if isinstance(sub, quantize.QUANTIZED):
            target = module
            for key in path:
                target = target[key] if isinstance(key, int) else getattr(target, key)
            if isinstance(sub, quantize.Int8Linear):
                target.kernel[...] = sub.kernel[...].astype(jnp.float32) * sub.scale[...]
            else:
                target.embedding[...] = jnp.asarray(quantize.float_table(sub))
    for i, layer in enumerate(q.layers):  # the norms (float32 in both)
        for name in ("input_layernorm", "post_attention_layernorm"):
            getattr(module.layers[i], name).weight[...] = getattr(layer, name).weight[...]
    module.norm.weight[...] = q.norm.weight[...]
    return jaxspec.Model.from_module(module)


def _logits(model, prompt):
    return exactness.next_logits(model, prompt)


def test_quantize_int8_rounds_each_channel_to_its_own_scale():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 20)).astype(np.float32) * np.linspace(0.01, 3.0, 20, dtype=np.float32)
    w[:, 7] = 0.0  # a channel of zeros
    q, scale = quantize.quantize_int8(w, axis=0)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (20,)
    assert np.abs(q).max() == 127 and q.min() >= -127  # symmetric: -128 never used
    assert (np.abs(q).max(axis=0)[np.arange(20) != 7] == 127).all()  # each channel uses its full range
    assert scale[7] == 1.0 and (q[:, 7] == 0).all()
    assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-7)  # within half a step, per channel
    qt, st = quantize.quantize_int8(w.T, axis=1)  # an embedding table's layout: one scale per row
    assert (qt == q.T).all() and (st == scale).all()


@pytest.mark.parametrize("tied", [False, True], ids=["lm-head", "tied"])
def test_int8_logits_are_float32_within_the_quantization_error(tied):
    f32, q = _pair(tied)
    kinds = {type(m) for _, m in nnx.iter_modules(q.module)}
    assert nnx.Linear not in kinds and nnx.Embed not in kinds and quantize.Int8Linear in kinds
    reference = _dequantized(q)
    for prompt in PROMPTS:
        exact, ours, quantized = _logits(f32, prompt), _logits(q, prompt), _logits(reference, prompt)
        # The int8 model is the float32 model of its dequantized weights (up to float32 rounding) ...
        np.testing.assert_allclose(ours, quantized, rtol=1e-5, atol=1e-5 * np.abs(quantized).max())
        # ... which differs from the float32 model's by the quantization error: small, not zero.
        error = np.abs(ours - exact).max() / np.abs(exact).max()
        assert 1e-5 < error < 0.03, error


def test_chunked_int8_head_and_matmul_equal_the_whole(monkeypatch):
    """A weight whose float32 copy exceeds DEQUANT_PIECE_BYTES is converted chunk by chunk in a loop
    (the last chunk shifted back to end at the last channel): the same values as whole."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((3, 32)), jnp.float32)
    q, s = (jnp.asarray(a) for a in quantize.quantize_int8(rng.standard_normal((32, 100)), axis=0))
    whole = quantize.int8_matmul(x, q, s)
    chunked = quantize.int8_matmul(x, q, s, piece_bytes=4 * 32 * 24)  # 24 channels a piece: 5 chunks of 20
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(quantize.int8_matmul(x, q.T, s, transposed=True, piece_bytes=4 * 32 * 24), whole,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(whole, x @ (q.astype(jnp.float32) * s), rtol=1e-5, atol=1e-5)
    for tied in (False, True):
        _, model = _pair(tied)
        module, final = model.module, jnp.asarray(rng.standard_normal((2, 5, 32)), jnp.float32)
        logits, preds = module.head_logits(final), module.head_argmax(final)
        monkeypatch.setattr(quantize, "DEQUANT_PIECE_BYTES", 4 * 32 * 16)  # the 64-entry head in 4 chunks
        np.testing.assert_allclose(module.head_logits(final), logits, rtol=1e-6, atol=1e-6)
        assert (module.head_argmax(final) == preds).all() and (preds == jnp.argmax(logits, -1)).all()
        monkeypatch.undo()


def _memory_of(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_the_convert_is_ordered_and_not_hoisted_out_of_a_loop(monkeypatch):
    """XLA:CPU writes a converted weight to a temporary: unordered, every convert of a chain of
    matmuls runs first (all copies live at once) and, in a loop, is hoisted out of it (the float32
    copies carried through the loop). `dequantize_after` keeps one copy at a time."""
    n, d, f = 6, 256, 1024  # six [256, 1024] weights: 1 MB each as float32
    rng = np.random.default_rng(2)
    weights = [tuple(jnp.asarray(a) for a in quantize.quantize_int8(rng.standard_normal((d, f)), axis=0))
               for _ in range(n)]
    back = jnp.asarray(rng.standard_normal((f, d)), jnp.float32) / f

    def temporaries() -> list[int]:  # (new functions each time: traced afresh, under the patch or not)
        def chain(ws, x):
            for q, s in ws:
                x = jnp.tanh(quantize.int8_matmul(x, q, s) @ back)
            return x

        def loop(ws, x):
            return jax.lax.fori_loop(0, 4, lambda i, x: chain(ws, x), x)

        x = jnp.ones((1, d), jnp.float32)
        return [_memory_of(chain, weights, x), _memory_of(loop, weights, x)]

    copy = 4 * d * f
    ordered = temporaries()
    monkeypatch.setattr(quantize, "dequantize_after", lambda q, x: q.astype(x.dtype))
    unordered = temporaries()
    assert max(ordered) <= 2 * copy, ordered
    assert min(unordered) >= n * copy, unordered  # (what the ordering prevents: still so in this XLA)


# ----------------------------------------------------------------------------- (b) exactness


@pytest.fixture(scope="module")
def tiny_int8() -> tuple[jaxspec.Model, jaxspec.Model]:
    return _pair(tied=False)


_greedy: dict = {}


def _greedy_tokens(model, prompts, n):
    key = (id(model), tuple(map(tuple, prompts)), n)
    if key not in _greedy:
        _greedy[key] = jaxspec.generate(model, prompts, method="greedy", max_new_tokens=n, stop_at_eos=False).tokens
    return _greedy[key]


@pytest.mark.parametrize("method, options", [
    ("lookahead", dict(window=4, ngram=3, guesses=4)),
    ("prompt-lookup", dict(ngram=2, guesses=3)),
    ("jacobi", dict(window=4)),
], ids=["lookahead", "prompt-lookup", "jacobi"])
def test_methods_equal_int8_greedy(tiny_int8, method, options):
    f32, q = tiny_int8
    reference = _greedy_tokens(q, PROMPTS, NEW)
    out = jaxspec.generate(q, PROMPTS, method=method, max_new_tokens=NEW, stop_at_eos=False, **options)
    assert out.tokens == reference
    assert max(out.compression) > 1.0  # multi-token steps happened: the check saw accepted candidates


def test_speculative_equals_int8_greedy_with_a_float32_drafter(tiny_int8):
    """The drafter drafts with the float32 weights (good drafts, but not always the int8 model's
    tokens): every accepted token is still int8 greedy's."""
    f32, q = tiny_int8
    drafter = random_drafter(TINY, 0, num_layers=TINY.num_layers)
    params = jax.tree.map(lambda dp, tp: jnp.pad(tp, [(0, a - b) for a, b in zip(dp.shape, tp.shape)]),
                          drafter.model.params, f32.params)
    drafter = dataclasses.replace(drafter, model=dataclasses.replace(drafter.model, params=params, compiled={}),
                                  projection=0.1 * drafter.projection)
    out = jaxspec.generate(q, PROMPTS, method="speculative", drafter=drafter, draft_len=4, max_new_tokens=NEW,
                           stop_at_eos=False)
    assert out.tokens == _greedy_tokens(q, PROMPTS, NEW)
    assert max(out.compression) > 1.0


@needs_stories
def test_stories260k_int8_load_methods_and_memory():
    """The load path (quantized tensor by tensor as read): (c) the matrices take a quarter of their
    float32 bytes, norms stay float32; (b) lookahead and prompt lookup equal int8 greedy."""
    # (layer by layer: the check reads each matrix as a 2-D array)
    f32, q = jaxspec.load("stories260K", layer_scan=False), jaxspec.load("stories260K", dtype="int8", layer_scan=False)
    assert repr(q).count("int8") == 1 and q.dtype == "int8"
    flat32 = dict(jax.tree_util.tree_leaves_with_path(f32.params))
    flat8 = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(q.params)}
    matrices = 0
    for path, x in flat32.items():
        key = jax.tree_util.keystr(path)
        if x.ndim == 2:  # every matrix: int8, a quarter of the bytes, one float32 scale per output channel
            y = flat8[key]
            assert y.dtype == jnp.int8 and y.nbytes * 4 == x.nbytes
            scale = flat8[key.replace("'kernel'", "'scale'").replace("'embedding'", "'scale'")]
            assert scale.dtype == jnp.float32 and scale.size == (x.shape[1] if "kernel" in key else x.shape[0])
            matrices += x.nbytes
        else:
            assert flat8[key].dtype == jnp.float32 and (np.asarray(flat8[key]) == np.asarray(x)).all()
    assert 0.25 < tree_bytes(q.params) / tree_bytes(f32.params) < 0.27
    assert matrices > 0.95 * tree_bytes(f32.params)
    prompts = [CASES[0]["prompt"], CASES[1]["prompt"]]
    greedy = _greedy_tokens(q, prompts, 40)
    assert greedy != _greedy_tokens(f32, prompts, 40)  # a different reference: quantization changed tokens
    for method, options in (("lookahead", dict(window=4, ngram=3, guesses=4)), ("prompt-lookup", {})):
        out = jaxspec.generate(q, prompts, method=method, max_new_tokens=40, stop_at_eos=False, **options)
        assert out.tokens == greedy, method


def test_int8_errors_and_the_shared_embeddings_table(tmp_path):
    with pytest.raises(ConfigError, match="int8"):
        jaxspec.load("pycode-5M", dtype="int4")
    with pytest.raises(ConfigError, match="one device"):
        jaxspec.load("pycode-5M", dtype="int8", tensor_parallel=2)
    _, q = _pair(tied=True)
    with pytest.raises(ConfigError, match="not saved"):
        q.save(tmp_path / "out")
    embed = q.module.embed_tokens
    table = quantize.float_table(embed)  # what a drafter sharing an int8 target's embeddings reads
    np.testing.assert_array_equal(table, np.asarray(embed.embedding[...], np.float32)
                                  * np.asarray(embed.scale[...])[:, None])
    assert quantize.activation_dtype("int8") == jnp.float32 and quantize.module_dtype(q.module) == jnp.float32
    assert exactness.near_tie_tolerance("int8", np.array([1.0])) == exactness.near_tie_tolerance("float32",
                                                                                                 np.array([1.0]))


@needs_stories
def test_cli_dtype_int8_is_compared_with_int8_greedy(capsys):
    code = main(["generate", "--model", str(CHECKPOINT), "--prompt-ids", ",".join(map(str, CASES[1]["prompt"])),
                 "--dtype", "int8", "--method", "prompt-lookup", "--max-new-tokens", "24", "--no-eos-stop"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "identical to greedy: yes" in err  # its greedy: the int8 model's
    code = main(["generate", "--model", str(CHECKPOINT), "--prompt-ids", ",".join(map(str, CASES[1]["prompt"])),
                 "--dtype", "int8", "--method", "greedy", "--max-new-tokens", "24", "--no-eos-stop", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and json.loads(out)["config"]["dtype"] == "int8"
