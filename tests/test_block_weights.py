"""dtype "blocks" (`jaxspec.load(gguf, dtype="blocks")`, `jaxspec.models.quantize`): a GGUF's block-format
weights kept as int8 values with each block's scale and offset, dequantized inside each matmul.

Each case writes a tiny random llama as llama.cpp writes it (tests/gguf_files.py: its names, its q/k row
permutation, `gguf.quants.quantize` for every matrix) in one of the block formats with one scale (and
offset) per 32 values, and loads it twice, float32 and blocks:
(a) every matrix is kept in blocks, and dequantizes to the float32 load's weights bit for bit (through
    XLA, as decoding dequantizes it; the embedding table too, as a drafter reads it);
(b) so a forward's logits are float32's exactly, and every method's tokens are float32 greedy's;
(c) the kept matrices take about a third of their float32 bytes;
(d) a tensor in another format stays float32; bad requests are ConfigErrors.
SmolLM2's real file (Q4_1 layers, Q8_0 embeddings) against transformers' references: tests/test_smollm2.py.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxspec  # noqa: E402
from gguf_files import Q, write_gguf  # noqa: E402
from jaxspec.errors import ConfigError  # noqa: E402
from jaxspec.models import quantize, tensor_parallel  # noqa: E402
from jaxspec.models.model import unstack_layers  # noqa: E402
from jaxspec.runtime.memory import tree_bytes  # noqa: E402
from test_gguf import SMALL  # noqa: E402  (test_gguf's tiny llama, every width a multiple of 32)
from test_hf_parity import build_hf, jax_logits  # noqa: E402
from test_speculative import random_drafter  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

# format -> tied head (both layouts of the head are covered)
FORMATS = {Q.Q8_0: True, Q.Q4_0: False, Q.Q4_1: True, Q.Q5_0: True, Q.Q5_1: False}
NEW = 24


def _loads(tmp_path, quant, tied: bool, seed: int, **tensor_types):
    source = build_hf(transformers.LlamaConfig, {**SMALL, "tie_word_embeddings": tied}, seed=seed)
    # a larger weight scale than build_hf's: loop-prone text, so the methods' multi-token steps happen
    with torch.no_grad():
        for p in source.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    path = write_gguf(tmp_path / f"{quant.name}.gguf", source, quant, tensor_types=tensor_types or None)
    return jaxspec.load(path, dtype="float32"), jaxspec.load(path, dtype="blocks")


@pytest.fixture(scope="module", params=list(FORMATS), ids=[q.name for q in FORMATS])
def pair(request, tmp_path_factory):
    quant = request.param
    return quant, *_loads(tmp_path_factory.mktemp(quant.name), quant, FORMATS[quant], seed=list(FORMATS).index(quant))


def _matrices(module):
    """Every matrix of `module` by path, layer by layer (a scanned stack unstacked)."""
    return {tuple(path): sub for path, sub in nnx.iter_modules(unstack_layers(module))
            if isinstance(sub, (nnx.Linear, nnx.Embed, *quantize.QUANTIZED))}


def test_every_matrix_is_kept_and_is_the_float32_weight_bit_for_bit(pair):
    quant, f32, blocks = pair
    floats, kept = _matrices(f32.module), _matrices(blocks.module)
    assert floats.keys() == kept.keys() and len(kept) == 2 * 7 + 1 + (not FORMATS[quant])
    x = jnp.zeros((1, 4), jnp.float32)  # (the input a dequantization waits for)
    for path, sub in kept.items():
        if isinstance(sub, quantize.BlockLinear):
            weight = quantize.block_dequantize(sub.kernel[...], sub.scale[...], sub.offset[...], x)
            expected = floats[path].kernel[...]
        else:
            assert isinstance(sub, quantize.BlockEmbed), path
            weight = quantize.block_dequantize(sub.embedding[...], sub.scale[...], sub.offset[...], x, transposed=True)
            expected = floats[path].embedding[...]
            np.testing.assert_array_equal(quantize.float_table(sub), expected)  # what a drafter reads
            ids = jnp.arange(SMALL["vocab_size"])
            np.testing.assert_array_equal(sub(ids), floats[path](ids))  # the embedding lookup
        assert sub.embedding.dtype == jnp.int8 if isinstance(sub, quantize.BlockEmbed) else sub.kernel.dtype == jnp.int8
        np.testing.assert_array_equal(np.asarray(weight), np.asarray(expected))
    # int8 values plus two float32 per 32 of them: 1.25 bytes a weight against 4
    matrices = sum(np.prod(s.kernel.shape if hasattr(s, "kernel") else s.embedding.shape) for s in kept.values())
    assert tree_bytes(blocks.params) < tree_bytes(f32.params) - 2.7 * matrices
    assert blocks.dtype == "blocks" and quantize.module_dtype(blocks.module) == jnp.float32
    # load's default: kept blocks scanned, float32 weights on a CPU unrolled (`scan_by_default`)
    assert blocks.layer_scan and not f32.layer_scan


def test_logits_and_every_method_equal_float32(pair):
    quant, f32, blocks = pair
    tokens = np.random.default_rng(3).integers(0, SMALL["vocab_size"], (2, 20))
    expected = jax_logits(f32, tokens)
    assert expected.std() > 0.5
    np.testing.assert_array_equal(jax_logits(blocks, tokens), expected)
    prompts = [tokens[0, :8].tolist(), tokens[1, :5].tolist()]
    greedy = jaxspec.generate(f32, prompts, max_new_tokens=NEW, stop_at_eos=False).tokens
    assert jaxspec.generate(blocks, prompts, max_new_tokens=NEW, stop_at_eos=False).tokens == greedy
    drafter = random_drafter(f32.config, 0, num_layers=1)
    for method, options in [("lookahead", dict(window=4, ngram=3, guesses=4)), ("prompt-lookup", dict(ngram=2, guesses=3)),
                            ("speculative", dict(drafter=dataclasses.replace(drafter, projection=0.1 * drafter.projection),
                                                 draft_len=3))]:
        out = jaxspec.generate(blocks, prompts, method=method, max_new_tokens=NEW, stop_at_eos=False, **options)
        assert out.tokens == greedy, method


def test_a_tensor_in_another_format_stays_float32(tmp_path):
    """Q8_0 everywhere but one layer's up projection, written as F16: that one stays a float32
    `nnx.Linear`, the rest are kept, and the logits are still float32's exactly."""
    f32, blocks = _loads(tmp_path, Q.Q8_0, True, seed=9, **{"blk.1.ffn_up.weight": Q.F16})
    kept = _matrices(blocks.module)
    plain = [path for path, sub in kept.items() if not isinstance(sub, quantize.QUANTIZED)]
    assert plain == [("layers", 1, "mlp", "up_proj")] and kept[plain[0]].kernel.dtype == jnp.float32
    assert not blocks.layer_scan  # (layers of two structures: unrolled)
    tokens = np.random.default_rng(4).integers(0, SMALL["vocab_size"], (1, 12))
    np.testing.assert_array_equal(jax_logits(blocks, tokens), jax_logits(f32, tokens))


def test_block_factors_refuse_what_is_not_of_the_form():
    rng = np.random.default_rng(0)
    scale = rng.random((3, 2), dtype=np.float32).astype(np.float16).astype(np.float32)
    offset = -scale * 8
    q = rng.integers(0, 16, (3, 64)).astype(np.int8)
    w = q.astype(np.float32) * np.repeat(scale, 32, 1) + np.repeat(offset, 32, 1)
    np.testing.assert_array_equal(quantize.block_factors(w, scale, offset, rows_at_once=2), q)
    off_grid = w.copy()
    off_grid[2, 40] = np.nextafter(off_grid[2, 40], np.float32(np.inf))  # one value off its block's grid
    assert quantize.block_factors(off_grid, scale, offset) is None
    assert quantize.block_factors(w * 1000, scale, offset) is None  # levels beyond int8
    assert quantize.block_factors(w[:, :48], scale, offset) is None  # not whole blocks


def test_blocks_errors(tmp_path):
    with pytest.raises(ConfigError, match="not a .gguf file"):
        jaxspec.load("pycode-5M", dtype="blocks")
    with pytest.raises(ConfigError, match="one device"):
        jaxspec.load("smollm2-135m-instruct", dtype="blocks", tensor_parallel=2)
    int8 = jaxspec.load("pycode-5M", dtype="int8")
    with pytest.raises(ConfigError, match="not saved"):
        int8.save(tmp_path / "out")
    with pytest.raises(ConfigError, match="one device"):
        tensor_parallel.shard(int8, tensor_parallel.tp_mesh(1, 1))


def test_a_gguf_loads_as_blocks_by_default_and_saves_and_shards_as_its_float32_self(tmp_path):
    """The default load of a GGUF keeps its blocks (the float32 model); saving it writes the float32
    weights and laying it out on a mesh uses them, both with float32's logits bit for bit. A file
    with no block-format matrix loads as, and says, float32."""
    f32, _ = _loads(tmp_path, Q.Q4_1, False, seed=6)
    default = jaxspec.load(f32.source)
    assert default.dtype == "blocks" and any(isinstance(m, quantize.BlockLinear) for _, m in
                                             nnx.iter_modules(default.module))
    tokens = np.random.default_rng(5).integers(0, SMALL["vocab_size"], (1, 16))
    expected = jax_logits(f32, tokens)
    saved = jaxspec.load(default.save(tmp_path / "saved"))
    assert saved.dtype == "float32"
    np.testing.assert_array_equal(jax_logits(saved, tokens), expected)
    sharded = tensor_parallel.shard(default, tensor_parallel.tp_mesh(1, 1))
    assert sharded.dtype == "float32" and not any(isinstance(m, quantize.QUANTIZED) for _, m in
                                                  nnx.iter_modules(sharded.module))
    np.testing.assert_array_equal(jax_logits(sharded, tokens), expected)
    assert jaxspec.load(_loads(tmp_path, Q.F16, True, seed=7)[0].source).dtype == "float32"
