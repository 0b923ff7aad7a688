"""The Pallas attention kernels (`pallas_kernels`) against the XLA reference and the mask definitions.

On CPU the kernels run in Pallas interpret mode, so shapes stay small and every kernel call
counts (each costs a compilation). Lowering for TPU and GPU (without that hardware) is
checked by running `python -m pallas_kernels --check-lowering`.

The references are independent of the kernels: the lookahead relation is
`tests/trees.py`'s `StepLayout.definition()` (written out from the paper's description, not
from the token tree the kernel evaluates), the PARD mask is rebuilt below by a literal
transcription of `../shared/docs/pard2.md`.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.models.attention import get_attention, xla_attention
from jaxspec.models.config import ModelConfig
from jaxspec.errors import ConfigError
from jaxspec.models.kv_cache import KVCache
from jaxspec.models.masks import PardMask, dense_block_mask, pard_layout, pard_mask
from pallas_kernels import KernelConfigError, decode_attention, pallas_attention, pard_attention, pard_reference

ROOT = Path(__file__).resolve().parents[1]
from stories import CASES as STORIES_CASES, CHECKPOINT, needs_stories
from test_speculative import copy_drafter
from trees import StepLayout

_pallas = jax.jit(decode_attention, static_argnames=("sliding_window", "softcap", "block_s", "block_rows"))
_xla = jax.jit(xla_attention, static_argnames=("sliding_window", "softcap"))
_pard = jax.jit(pard_attention, static_argnames=("sliding_window", "softcap", "block_q", "block_k"))
_pard_ref = jax.jit(pard_reference, static_argnames=("sliding_window", "softcap"))


def _inputs(seed, b, t, h, kv, d, s, dtype, lengths, mask=None):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    if mask is None:
        mask = (rng.random((b, t, t)) < 0.4) | np.eye(t, dtype=bool)
    lengths = jnp.asarray(lengths, jnp.int32)
    positions = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    return dict(q=normal(b, t, h, d), k_cache=normal(b, kv, s, d), v_cache=normal(b, kv, s, d),
                cache_lengths=lengths, k_new=normal(b, t, kv, d), v_new=normal(b, t, kv, d),
                block_mask=jnp.asarray(np.broadcast_to(mask, (b, t, t))), q_positions=positions)


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == jnp.float32 else dict(atol=2e-2, rtol=2e-2)


def _close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **_tol(dtype))


def _layout(w, n, g):
    """The decoder's layout for lookahead (W, N, G); W = 0: prompt lookup; N = 0: jacobi with G tokens."""
    if n == 0:
        return StepLayout(window=0, levels=0, guesses=1, cand_len=g)
    return StepLayout(window=w, levels=n - 1 if w else 0, guesses=g, cand_len=n - 1, verify_window=True)


# --- the lookahead relation --------------------------------------------------------------

def test_tree_mask_equals_the_lookahead_definition():
    layouts = [StepLayout(window=w, levels=n - 1, guesses=g, cand_len=n - 1, verify_window=vw)
               for w, n, g, vw in itertools.product([1, 2, 3, 5, 15], [2, 3, 5, 7], [0, 1, 4, 15], [False, True])]
    layouts += [_layout(0, n, g) for n, g in itertools.product([2, 3, 5], [0, 1, 3, 15])]  # prompt lookup
    layouts += [_layout(0, 0, w) for w in (1, 2, 5, 16)]  # jacobi
    for layout in layouts:
        assert layout.tree.mask(1).size == layout.size
        np.testing.assert_array_equal(layout.tree.relation(), layout.definition(), err_msg=str(layout))


@pytest.mark.parametrize("wng", [(15, 5, 15), (1, 3, 0), (0, 0, 5)], ids=lambda c: "W{}-N{}-G{}".format(*c))
def test_kernel_computes_the_step_relation(wng):
    # All scores equal (q = 0) and v_new[j] = e_j: output row i is relation[i] / |relation[i]|,
    # so the kernel's in-kernel relation can be read back exactly, for every query head; the
    # g*t query rows are split into tiles of 32 (as on GPU), so row -> (head, token) is checked.
    layout = _layout(*wng)
    t, h, kv, d = layout.size, 8, 2, 128
    assert t <= d
    eye = jnp.broadcast_to(jnp.eye(t, d, dtype=jnp.float32)[None, :, None], (2, t, kv, d))
    zeros = jnp.zeros((2, kv, 16, d), jnp.float32)
    out = _pallas(jnp.zeros((2, t, h, d), jnp.float32), zeros, zeros, jnp.zeros((2,), jnp.int32), eye, eye,
                  layout.tree.mask(2), jnp.zeros((2, t), jnp.int32), block_s=16, block_rows=32)
    seen = np.asarray(out)[..., :t] > 0  # [b, t, h, t]
    want = np.broadcast_to(layout.definition()[None, :, None], seen.shape)
    np.testing.assert_array_equal(seen, want)


# --- decode kernel vs the XLA reference -------------------------------------------------

# Dense random masks. (t, heads, kv heads, head_dim, cache slots, block_s, query row tile, dtype):
# each batch has rows with an empty cache, a length that is not a multiple of block_s, and a full cache.
CASES = [
    (1, 4, 4, 64, 40, 16, None, jnp.float32),   # GQA 1, decode; s not a multiple of block_s
    (7, 8, 2, 64, 100, 32, None, jnp.float32),  # GQA 4
    (33, 8, 1, 128, 50, 16, 64, jnp.float32),   # GQA 8, a block longer than the query tiles, 4 row tiles
    (33, 4, 1, 128, 45, 16, None, jnp.bfloat16),
]


def _case_id(case) -> str:
    def part(x):
        return "W{}N{}G{}".format(*x) if isinstance(x, tuple) else jnp.dtype(x).name if isinstance(x, type) else str(x)
    return "-".join(part(x) for x in case if x is not None)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_dense_mask_matches_xla_attention(case):
    t, h, kv, d, s, block_s, block_rows, dtype = case
    rng = np.random.default_rng(s)
    lengths = [0, int(rng.integers(1, s)) | 1, s]  # odd middle length: never block-aligned
    args = _inputs(s + t, 3, t, h, kv, d, s, dtype, lengths)
    _close(_pallas(**args, block_s=block_s, block_rows=block_rows), _xla(**args), dtype)


# The step relation computed in the kernel. ((W, N, G), heads, kv heads, head_dim, cache slots,
# block_s, dtype, sliding window); the reference gets StepLayout's dense relation.
STEP_CASES = [
    ((15, 5, 15), 8, 2, 128, 300, 64, jnp.bfloat16, None),  # the paper's 7B configuration, GQA 4
    ((1, 3, 0), 8, 1, 64, 50, 16, jnp.float32, None),       # W = 1, G = 0, GQA 8
    ((4, 3, 2), 4, 4, 128, 90, 32, jnp.float32, 20),        # GQA 1, sliding window
    ((5, 2, 3), 4, 1, 64, 41, 16, jnp.float32, None),       # N = 2: one level, 1-token candidates
    ((0, 4, 3), 8, 2, 64, 60, 32, jnp.bfloat16, None),      # prompt lookup: no window
    ((0, 0, 6), 8, 1, 128, 33, 16, jnp.float32, None),      # jacobi
]


@pytest.mark.parametrize("case", STEP_CASES, ids=_case_id)
def test_step_relation_matches_xla_attention(case):
    wng, h, kv, d, s, block_s, dtype, window = case
    layout = _layout(*wng)
    t = layout.size
    rng = np.random.default_rng(s)
    lengths = [0, int(rng.integers(1, s)) | 1, s - 1]  # the last token sits at position = cache length
    args = _inputs(s + t, 3, t, h, kv, d, s, dtype, lengths, mask=layout.definition())
    args["q_positions"] = args["cache_lengths"][:, None] + jnp.asarray(layout.position_offsets())[None]
    want = _xla(**args, sliding_window=window)
    args["block_mask"] = layout.tree.mask(3)
    _close(_pallas(**args, sliding_window=window, block_s=block_s), want, dtype)


def test_sliding_window_matches_xla_attention():
    args = _inputs(2, 2, 7, 8, 2, 64, 96, jnp.float32, [0, 75])
    for window in (5, 40):
        got, want = _pallas(**args, sliding_window=window, block_s=16), _xla(**args, sliding_window=window)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_softcap_matches_xla_attention():
    """Gemma 2's attention soft-capping in both kernels: the same capped scores as the XLA path,
    and a cap small enough to change the result (so the test would see it ignored)."""
    layout = _layout(4, 3, 2)
    t = layout.size
    args = _inputs(60 + t, 2, t, 4, 2, 64, 60, jnp.float32, [17, 59], mask=layout.definition())
    args["q_positions"] = args["cache_lengths"][:, None] + jnp.asarray(layout.position_offsets())[None]
    want = _xla(**args, sliding_window=20, softcap=0.5)
    assert np.abs(np.asarray(want) - np.asarray(_xla(**args, sliding_window=20))).max() > 1e-2
    args["block_mask"] = layout.tree.mask(2)
    _close(_pallas(**args, sliding_window=20, softcap=0.5, block_s=16), want, jnp.float32)
    full = tuple(np.asarray(x) for x in pard_layout(17, 4))
    q, k, v, block_ids, positions = _pard_inputs(17, [full], 4, 2, 64, jnp.float32)
    got = _pard(q, k, v, block_ids, positions, softcap=0.5, block_q=16, block_k=16)
    want = _pard_ref(q, k, v, block_ids, positions, softcap=0.5)
    _close(got, jnp.where((block_ids >= 0)[:, :, None, None], want, 0), jnp.float32)


def test_blocks_outside_the_cache_length_and_window_are_never_read():
    # NaN in every cache block past the length (and, with a window, before it): the XLA
    # reference would propagate them (0 * NaN); the kernel must not load those blocks.
    block_s, length = 16, 37
    args = _inputs(3, 1, 4, 4, 2, 64, 96, jnp.float32, [length])
    clean = _xla(**args)
    poisoned = dict(args)
    poisoned["k_cache"] = args["k_cache"].at[:, :, 48:].set(jnp.nan)
    poisoned["v_cache"] = args["v_cache"].at[:, :, 48:].set(jnp.nan)
    np.testing.assert_allclose(np.asarray(_pallas(**poisoned, block_s=block_s)), np.asarray(clean),
                               atol=1e-5, rtol=1e-5)
    window = 10  # queries at 37..40 see keys > 27..30: blocks [0, 16) are skipped
    clean = _xla(**args, sliding_window=window)
    poisoned["k_cache"] = poisoned["k_cache"].at[:, :, :16].set(jnp.nan)
    poisoned["v_cache"] = poisoned["v_cache"].at[:, :, :16].set(jnp.nan)
    got = _pallas(**poisoned, sliding_window=window, block_s=block_s)
    np.testing.assert_allclose(np.asarray(got), np.asarray(clean), atol=1e-5, rtol=1e-5)


def test_tree_mask_of_the_wrong_size_is_an_error():
    args = _inputs(4, 1, 5, 4, 2, 64, 16, jnp.float32, [3])
    args["block_mask"] = StepLayout(window=2, levels=2, guesses=1, cand_len=2).tree.mask(1)  # 6 tokens, not 5
    # The kernels raise their own error (pallas_kernels imports nothing from jaxspec), a ValueError;
    # jaxspec's backends and masks raise its ConfigError for the same input.
    with pytest.raises(KernelConfigError, match="TreeMask"):
        decode_attention(**args)
    for fn in (get_attention("pallas"), xla_attention):
        with pytest.raises(ConfigError, match="TreeMask"):
            fn(**args)
    with pytest.raises(ConfigError, match="TreeMask"):
        dense_block_mask(args["block_mask"], args["q_positions"])


# --- the PARD training mask -------------------------------------------------------------

def _pard_mask_by_the_definition(block_ids, positions):
    """pard2.md, literally: row (block j, position t) attends to real tokens x_0..x_{t-j} and to
    (block j', position t-(j-j')) for j' = 1..j; block 0 rows attend causally; -1 is padding."""
    n = len(block_ids)
    index = {(int(b), int(p)): k for k, (b, p) in enumerate(zip(block_ids, positions)) if b >= 0}
    mask = np.zeros((n, n), bool)
    for row, (j, t) in enumerate(zip(block_ids, positions)):
        if j < 0:
            continue
        for t_real in range(t - j + 1):
            if (0, t_real) in index:
                mask[row, index[(0, t_real)]] = True
        for j_prev in range(1, j + 1):
            key = (j_prev, t - (j - j_prev))
            if key in index:
                mask[row, index[key]] = True
    return mask


def _cod_layout(rng, seq_len, num_blocks, n=None):
    """A conditional-drop layout (pard2.md): block i keeps positions whose predecessor block
    i-1 kept position t-1, then shuffled and right padded with block -1 to `n` tokens."""
    block_ids, positions = [np.zeros(seq_len, int)], [np.arange(seq_len)]
    kept = np.arange(seq_len)
    for i in range(1, num_blocks):
        eligible = kept[kept + 1 < seq_len] + 1
        kept = np.sort(rng.choice(eligible, size=max(1, int(len(eligible) * 0.7)), replace=False))
        block_ids.append(np.full(len(kept), i))
        positions.append(kept)
    block_ids, positions = np.concatenate(block_ids), np.concatenate(positions)
    order = rng.permutation(len(block_ids))
    n_pad = 0 if n is None else n - len(block_ids)
    return (np.concatenate([block_ids[order], np.full(n_pad, -1)]),
            np.concatenate([positions[order], np.zeros(n_pad, int)]))


def test_pard_mask_matches_the_definition():
    rng = np.random.default_rng(0)
    block_ids, positions = pard_layout(7, 4)
    assert block_ids.shape == (28,) and list(positions[:9]) == [0, 1, 2, 3, 4, 5, 6, 0, 1]
    layouts = [(np.asarray(block_ids), np.asarray(positions)), _cod_layout(rng, 9, 5, n=40),
               _cod_layout(rng, 12, 3)]
    for block_ids, positions in layouts:
        np.testing.assert_array_equal(np.asarray(pard_mask(block_ids, positions)),
                                      _pard_mask_by_the_definition(block_ids, positions))
    one_block = pard_mask(*pard_layout(6, 1))  # K = 1 is causal attention
    np.testing.assert_array_equal(np.asarray(one_block), np.tril(np.ones((6, 6), bool)))
    with pytest.raises(ConfigError):
        pard_layout(0, 3)


def _pard_inputs(seed, layouts, h, kv, d, dtype):
    rng = np.random.default_rng(seed)
    block_ids = jnp.asarray(np.stack([b for b, _ in layouts]), jnp.int32)
    positions = jnp.asarray(np.stack([p for _, p in layouts]), jnp.int32)
    b, n = block_ids.shape
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    return normal(b, n, h, d), normal(b, n, kv, d), normal(b, n, kv, d), block_ids, positions


# (seq len L, blocks K, heads, kv heads, head_dim, block_q, block_k, dtype, sliding window):
# row 0 is the full layout, row 1 a shuffled COD layout right padded to the same length.
PARD_CASES = [
    (24, 4, 8, 2, 64, 16, 32, jnp.float32, None),   # GQA 4; n = 96: 6 query tiles, 3 key tiles
    (20, 3, 8, 1, 128, 32, 16, jnp.bfloat16, None),  # GQA 8; n = 60, not a multiple of the tiles
    (17, 5, 4, 4, 64, 16, 16, jnp.float32, 6),     # GQA 1, sliding window
]


@pytest.mark.parametrize("case", PARD_CASES, ids=_case_id)
def test_pard_kernel_matches_xla_attention(case):
    seq_len, k_blocks, h, kv, d, block_q, block_k, dtype, window = case
    rng = np.random.default_rng(seq_len)
    full = tuple(np.asarray(x) for x in pard_layout(seq_len, k_blocks))
    cod = _cod_layout(rng, seq_len, k_blocks, n=len(full[0]))
    q, k, v, block_ids, positions = _pard_inputs(seq_len, [full, cod], h, kv, d, dtype)
    got = _pard(q, k, v, block_ids, positions, sliding_window=window, block_q=block_q, block_k=block_k)
    want = _pard_ref(q, k, v, block_ids, positions, sliding_window=window)
    sees_something = np.asarray(block_ids >= 0)  # padding rows: kernel 0, reference an average
    _close(got, jnp.where(sees_something[:, :, None, None], want, 0).astype(dtype), dtype)
    assert not np.asarray(got, np.float32)[~sees_something].any()


def test_pard_tile_table_is_conservative_and_skips():
    table_fn = sys.modules["pallas_kernels.pard_attention"]._tile_table
    rng = np.random.default_rng(1)
    seq_len, k_blocks, tile = 64, 4, 16
    full = tuple(np.asarray(x) for x in pard_layout(seq_len, k_blocks))
    cod = _cod_layout(rng, seq_len, k_blocks, n=len(full[0]))
    block_ids, positions = (jnp.asarray(np.stack(x), jnp.int32) for x in zip(full, cod))
    n = block_ids.shape[1]
    nt = n // tile
    table = np.asarray(table_fn(block_ids, positions, tile, tile, 1 + nt))
    mask = np.asarray(pard_mask(block_ids, positions)).reshape(2, nt, tile, nt, tile).any(axis=(2, 4))
    for row in range(2):
        for qt in range(nt):
            listed = set(table[row, qt, 1:1 + table[row, qt, 0]].tolist())
            assert set(np.flatnonzero(mask[row, qt]).tolist()) <= listed
    # Full layout: a tile of block j visits its causal real-token tiles and j diagonal tiles.
    assert table[0, :, 0].sum() < 0.4 * nt * nt


def test_pard_gradients_match_the_reference():
    layout = tuple(np.asarray(x) for x in pard_layout(12, 3))
    q, k, v, block_ids, positions = _pard_inputs(5, [layout], 4, 2, 64, jnp.float32)
    weights = jnp.asarray(np.random.default_rng(6).normal(size=q.shape), jnp.float32)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, block_ids, positions) * weights)

    got = jax.jit(jax.grad(loss(lambda *a: pard_attention(*a, block_q=16, block_k=16)), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss(pard_reference), argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-5)


def test_pard_training_forward_through_the_model():
    # The drafter-training forward: whole sequences as the block, an empty cache, PARD mask.
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=1,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=64)
    model = jaxspec.Transformer(cfg, attention="xla", rngs=nnx.Rngs(0))
    block_ids, positions = (jnp.broadcast_to(x, (2, 40)) for x in pard_layout(10, 4))
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, 64, (2, 40)), jnp.int32)
    empty = KVCache.zeros(cfg.num_layers, 2, 0, cfg.num_kv_heads, cfg.head_dim)
    forward = nnx.jit(lambda model, mask: model(tokens, positions, mask, empty).logits)
    want = forward(model, pard_mask(block_ids, positions))  # the XLA training path: a dense mask
    model.attention = "pallas"
    got = forward(model, PardMask(block_ids))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


# --- the backend ------------------------------------------------------------------------

def test_registered_as_the_pallas_backend():
    assert get_attention("pallas").__wrapped__ is pallas_attention  # (its errors as jaxspec's ConfigError)
    assert "pallas" in jaxspec.models.attention.available_attention()


def test_dense_block_mask_accepts_every_kind():
    positions = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
    layout = StepLayout(window=2, levels=2, guesses=1, cand_len=2)
    dense = dense_block_mask(layout.tree.mask(2), positions)
    np.testing.assert_array_equal(np.asarray(dense), np.broadcast_to(layout.definition(), (2, 6, 6)))
    block_ids, pos = pard_layout(3, 2)
    np.testing.assert_array_equal(np.asarray(dense_block_mask(PardMask(block_ids[None]), pos[None])),
                                  np.asarray(pard_mask(block_ids, pos))[None])
    causal = jnp.tril(jnp.ones((6, 6), bool))
    assert dense_block_mask(causal, positions).shape == (2, 6, 6)
    # A spec is a pytree of O(T) int32 arrays: it passes through jit.
    spec = layout.tree.mask(2)
    assert jax.jit(lambda m: dense_block_mask(m, positions))(spec).shape == (2, 6, 6)
    assert [x.shape for x in jax.tree_util.tree_leaves(spec)] == [(2, 6), (2, 6)]


@needs_stories
def test_stories260k_lookahead_with_pallas_matches_greedy_reference():
    # Prefill reads a dense causal mask; every lookahead step passes a TreeMask, whose
    # relation the kernel computes.
    greedy = STORIES_CASES[0]
    assert greedy["prompt"] == [1]
    model = jaxspec.load(str(CHECKPOINT), attention="pallas")
    out = jaxspec.generate(model, [1], method="lookahead", window=4, ngram=3, guesses=4,
                           max_new_tokens=24, stop_at_eos=False)
    assert out.tokens == greedy["greedy"][:24]


@needs_stories
def test_stories260k_every_method_with_pallas_matches_greedy_reference():
    """Every method's steps run the token-tree relation in the kernel (prefill reads the dense
    causal mask); a drafter that copies the target's weights makes its branch win steps."""
    greedy = STORIES_CASES[0]
    model = jaxspec.load(str(CHECKPOINT), attention="pallas")
    drafter = copy_drafter(model)
    n = 16
    for method, options in [("greedy", {}), ("prompt-lookup", dict(ngram=3, guesses=3)), ("jacobi", dict(window=4)),
                            ("speculative", dict(drafter=drafter, draft_len=3)),
                            ("hybrid", dict(drafter=drafter, draft_len=3, window=3, ngram=3, guesses=3))]:
        out = jaxspec.generate(model, [1], method=method, max_new_tokens=n, stop_at_eos=False, **options)
        assert out.tokens == greedy["greedy"][:n], method


def test_attention_benchmark_smoke(tmp_path):
    from benchmarks import attention_bench

    r = attention_bench.main(["--smoke", "--out", str(tmp_path)])
    assert {e["variant"] for e in r["rows"]} == {"xla", "pallas dense", "pallas in-kernel", "pallas"}
    assert {e["kind"] for e in r["rows"]} == {"decode", "pard"}
    assert all(e["ms"] > 0 and e["max_abs_diff"] < 1e-4 for e in r["rows"])
    assert (tmp_path / "attention_bench_smoke.json").exists() and (tmp_path / "attention_bench_smoke.md").exists()


def test_check_lowering_counts_failures(capsys):
    from pallas_kernels.__main__ import check_lowering

    def broken(platform):
        raise RuntimeError("does not lower")

    assert check_lowering(("tpu", "cuda"), (("broken kernel", (broken, [])),)) == 2
    assert capsys.readouterr().out.count("FAIL") == 2


def test_kernel_lowers_for_tpu_and_gpu():
    # Deliberately not skipped: if lowering for a platform is impossible here, that is a failure.
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "pallas_kernels", "--check-lowering"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("OK", "FAIL"))]
    assert {line.split()[1] for line in lines} == {"tpu", "cuda"}
    assert {" ".join(line.split()[2:3]) for line in lines} == {"decode", "lookahead", "jacobi", "hybrid", "pard"}
    assert all(line.startswith("OK") for line in lines), proc.stdout
