"""The Pallas attention kernel (`pallas_kernels.decode_attention`) against `xla_attention`.

On CPU the kernel runs in Pallas interpret mode, so shapes stay small. Lowering for TPU and
GPU (without that hardware) is checked by running `python -m pallas_kernels --check-lowering`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.attention import get_attention, xla_attention
from jaxspec.decoding.lookahead import StepLayout
from pallas_kernels import decode_attention

ROOT = Path(__file__).resolve().parents[1]
from stories import CASES as STORIES_CASES, CHECKPOINT, needs_stories

_pallas = jax.jit(decode_attention, static_argnames=("sliding_window", "block_s"))
_xla = jax.jit(xla_attention, static_argnames=("sliding_window",))


def _inputs(seed, b, t, h, kv, d, s, dtype, lengths, mask=None):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)  # noqa: E731
    if mask is None:
        mask = (rng.random((b, t, t)) < 0.4) | np.eye(t, dtype=bool)
    lengths = jnp.asarray(lengths, jnp.int32)
    positions = lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None]
    return dict(q=normal(b, t, h, d), k_cache=normal(b, s, kv, d), v_cache=normal(b, s, kv, d),
                cache_lengths=lengths, k_new=normal(b, t, kv, d), v_new=normal(b, t, kv, d),
                block_mask=jnp.asarray(np.broadcast_to(mask, (b, t, t))), q_positions=positions)


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == jnp.float32 else dict(atol=2e-2, rtol=2e-2)


# (t, heads, kv heads, head_dim, cache slots, block_s, dtype): each batch has rows with an
# empty cache, a length that is not a multiple of block_s, and a full cache.
CASES = [
    (1, 4, 4, 64, 40, 16, jnp.float32),     # GQA 1, decode; s not a multiple of block_s
    (7, 8, 2, 64, 100, 32, jnp.float32),    # GQA 4
    (33, 8, 1, 128, 50, 16, jnp.float32),   # GQA 8, a block longer than the query tiles
    (7, 8, 2, 128, 72, 128, jnp.float32),   # one cache block, longer than the cache
    (1, 8, 1, 64, 90, 32, jnp.bfloat16),
    (33, 4, 1, 128, 45, 16, jnp.bfloat16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"t{c[0]}-h{c[1]}-kv{c[2]}-d{c[3]}-s{c[4]}-bs{c[5]}-{jnp.dtype(c[6]).name}")
def test_matches_xla_attention(case):
    t, h, kv, d, s, block_s, dtype = case
    rng = np.random.default_rng(s)
    lengths = [0, int(rng.integers(1, s)) | 1, s]  # odd middle length: never block-aligned
    args = _inputs(s + t, 3, t, h, kv, d, s, dtype, lengths)
    got = _pallas(**args, block_s=block_s)
    want = _xla(**args)
    assert got.shape == want.shape and got.dtype == want.dtype == dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **_tol(dtype))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_lookahead_step_relation(dtype):
    layout = StepLayout(window=3, levels=2, guesses=2, cand_len=2)
    mask = layout.attention_relation()
    t = layout.size
    args = _inputs(1, 2, t, 8, 2, 64, 70, dtype, [23, 70], mask=mask)
    last = args["cache_lengths"]  # the last committed token sits at position = cache length
    args["q_positions"] = last[:, None] + jnp.asarray(layout.position_offsets())[None]
    got, want = _pallas(**args, block_s=16), _xla(**args)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **_tol(dtype))


def test_sliding_window_matches_xla_attention():
    args = _inputs(2, 2, 7, 8, 2, 64, 96, jnp.float32, [0, 75])
    for window in (5, 40):
        got, want = _pallas(**args, sliding_window=window, block_s=16), _xla(**args, sliding_window=window)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_blocks_outside_the_cache_length_and_window_are_never_read():
    # NaN in every cache block past the length (and, with a window, before it): the XLA
    # reference would propagate them (0 * NaN); the kernel must not load those blocks.
    block_s, length = 16, 37
    args = _inputs(3, 1, 4, 4, 2, 64, 96, jnp.float32, [length])
    clean = _xla(**args)
    poisoned = dict(args)
    poisoned["k_cache"] = args["k_cache"].at[:, 48:].set(jnp.nan)
    poisoned["v_cache"] = args["v_cache"].at[:, 48:].set(jnp.nan)
    np.testing.assert_allclose(np.asarray(_pallas(**poisoned, block_s=block_s)), np.asarray(clean),
                               atol=1e-5, rtol=1e-5)
    window = 10  # queries at 37..40 see keys > 27..30: blocks [0, 16) are skipped
    clean = _xla(**args, sliding_window=window)
    poisoned["k_cache"] = poisoned["k_cache"].at[:, :16].set(jnp.nan)
    poisoned["v_cache"] = poisoned["v_cache"].at[:, :16].set(jnp.nan)
    got = _pallas(**poisoned, sliding_window=window, block_s=block_s)
    np.testing.assert_allclose(np.asarray(got), np.asarray(clean), atol=1e-5, rtol=1e-5)


def test_registered_as_the_pallas_backend():
    assert get_attention("pallas") is decode_attention
    assert "pallas" in jaxspec.attention.available_attention()


@needs_stories
def test_stories260k_lookahead_and_greedy_with_pallas_match_reference():
    greedy = STORIES_CASES[0]
    assert greedy["prompt"] == [1]
    model = jaxspec.load(str(CHECKPOINT), attention="pallas")
    out = jaxspec.generate(model, [1], method="lookahead", window=4, ngram=3, guesses=4,
                           max_new_tokens=24, stop_at_eos=False)
    assert out.tokens == greedy["greedy"][:24]
    out = jaxspec.generate(model, [1], max_new_tokens=24, stop_at_eos=False)
    assert out.tokens == greedy["greedy"][:24]


def test_kernel_lowers_for_tpu_and_gpu():
    # Deliberately not skipped: if lowering for a platform is impossible here, that is a failure.
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "pallas_kernels", "--check-lowering"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("OK", "FAIL"))]
    assert {line.split()[1] for line in lines} == {"tpu", "cuda"}
    assert all(line.startswith("OK") for line in lines), proc.stdout
