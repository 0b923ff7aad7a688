"""Block-decode attention as one Pallas kernel: the `"pallas"` attention backend.

Computes exactly what `jaxspec.attention.xla_attention` computes (same signature, same
masking rules, scores and softmax in float32) for a block of T queries:

* the committed KV cache, masked per row by `cache_lengths` (and by `sliding_window`),
  visited in blocks of `block_s` keys with an online softmax (running max, denominator and
  accumulator in float32); cache blocks wholly past a row's length, or wholly before every
  query's sliding window, are never loaded: the loop runs over only the needed blocks;
* then the block's own T keys under `block_mask[b, i, j]` ("query i sees block key j").

One kernel instance per (batch row, KV head): its `h // kv` query heads x T queries form
one `[g*T, d]` matrix (row = group * T + i), so GQA costs one K/V read per group.

This first version takes the block relation as a dense `[b, T, T]` mask (an int32 copy,
tiled over the query group). The Pallas issue asks for it to be computed in-kernel from the
step layout (window W, levels N, guesses G): the relation is a handful of comparisons of
the block index against W / N / G, so the dense mask and its DMA can go away.

Platforms: on CPU the kernel runs in interpret mode (chosen automatically); on TPU it
lowers through Mosaic (lengths in SMEM); on GPU through the Triton backend (explicit
`CompilerParams`: Mosaic GPU, the default GPU backend, needs warpgroup-shaped tiles and
`plgpu.kernel`, which this grid-over-(row, head) kernel does not use yet). Triton needs
power-of-two block shapes, so rows, block keys and (on GPU) the cache length are padded.

Known costs of this first version: the wrapper transposes the cache to `[b, kv, s, d]`
(one copy per call; a head-major cache layout in jaxspec or manual DMA would avoid it) and
each kernel instance holds its (row, head) slice of the cache in fast memory, which bounds
the cache length on TPU by VMEM (~s * d * 2 arrays * dtype size).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Bool, Float, Int

# Same large finite negative as the XLA reference: fully masked rows stay finite (no NaN).
_MASKED = -1e30
_MIN_ROWS = 16  # Triton dots need every dim >= 16; bf16 sublane tiles on TPU are 16 rows


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _online_update(m, l, acc, scores, visible, v):
    """Fold one block of scores [R, K] (float32) and values [K, d] into the running softmax."""
    scores = jnp.where(visible, scores, _MASKED)
    m_new = jnp.maximum(m, jnp.max(scores, axis=1, keepdims=True))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new)
    l_new = alpha * l + jnp.sum(p, axis=1, keepdims=True)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                         preferred_element_type=jnp.float32)
    return m_new, l_new, alpha * acc + pv


def _qk(q, k, scale):
    # q [R, d] . k [K, d]^T in float32, scaled after the matmul as the reference does.
    return lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale


def _kernel(len_ref, lo_ref, q_ref, kc_ref, vc_ref, kn_ref, vn_ref, mask_ref, qpos_ref, kpos_ref,
            o_ref, *, block_s: int, scale: float, window: int | None, scalars_whole: bool):
    # On TPU the scalar arrays sit whole in SMEM; elsewhere each instance gets its own (1,) block.
    row = pl.program_id(0) if scalars_whole else 0
    length = len_ref[row]
    first_block = lo_ref[row]
    q = q_ref[...]
    qpos = qpos_ref[...]  # [R, 1] int32
    rows, d = q.shape

    def cache_block(blk, carry):
        m, l, acc = carry
        start = pl.multiple_of(blk * block_s, block_s)
        k = kc_ref[pl.ds(start, block_s), :]
        v = vc_ref[pl.ds(start, block_s), :]
        col = start + lax.broadcasted_iota(jnp.int32, (rows, block_s), 1)
        visible = col < length
        if window is not None:
            visible = visible & (qpos - col < window)
        return _online_update(m, l, acc, _qk(q, k, scale), visible, v)

    carry = (jnp.full((rows, 1), _MASKED, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
             jnp.zeros((rows, d), jnp.float32))
    # lax.div: lengths are non-negative, and `//` lowers through `sign` (device-specific on TPU).
    last_block = lax.div(length + block_s - 1, block_s)  # blocks from here on hold no key
    m, l, acc = lax.fori_loop(first_block, last_block, cache_block, carry)

    visible = mask_ref[...] != 0  # [R, T]
    if window is not None:
        visible = visible & (qpos - kpos_ref[...] < window)
    m, l, acc = _online_update(m, l, acc, _qk(q, kn_ref[...], scale), visible, vn_ref[...])
    o_ref[...] = (acc / l).astype(o_ref.dtype)


def _platform_params(platform: str, interpret: bool):
    if interpret:
        return None
    if platform == "tpu":
        from jax.experimental.pallas import tpu as pltpu
        return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"))
    if platform in ("gpu", "cuda", "rocm"):
        from jax.experimental.pallas import triton as pltriton
        return pltriton.CompilerParams(num_warps=4, num_stages=2)
    raise ValueError(f"no compiled Pallas backend for platform {platform!r}; use interpret=True")


def decode_attention(
    q: Float[Array, "b t h d"],
    k_cache: Float[Array, "b s kv d"],
    v_cache: Float[Array, "b s kv d"],
    cache_lengths: Int[Array, " b"],
    k_new: Float[Array, "b t kv d"],
    v_new: Float[Array, "b t kv d"],
    block_mask: Bool[Array, "b t t"],
    q_positions: Int[Array, "b t"],
    sliding_window: int | None = None,
    *,
    block_s: int = 128,
    interpret: bool | None = None,
    platform: str | None = None,
) -> Float[Array, "b t h d"]:
    """Pallas attention with `xla_attention`'s signature and results.

    `block_s` (a power of two) is the number of cache keys per online-softmax step.
    `platform` ("cpu" | "tpu" | "gpu"/"cuda") selects the backend-specific layout; it
    defaults to `jax.default_backend()`, and `interpret` defaults to running on CPU. Pass
    both to lower for another platform (e.g. `jax.export` for TPU from a CPU machine).
    """
    platform = platform or jax.default_backend()
    if interpret is None:
        interpret = platform == "cpu"
    if block_s < 16 or block_s & (block_s - 1):
        raise ValueError(f"block_s must be a power of two >= 16, got {block_s}")
    b, t, h, d = q.shape
    s, kv = k_cache.shape[1], k_cache.shape[2]
    if h % kv:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({kv})")
    g = h // kv
    gpu = platform in ("gpu", "cuda", "rocm") and not interpret
    tpu = platform == "tpu" and not interpret

    rows = max(_next_pow2(g * t), _MIN_ROWS)
    keys = max(_next_pow2(t), _MIN_ROWS)
    bs = min(block_s, max(_next_pow2(s), 16))
    s_pad = _round_up(max(s, 1), bs)
    if gpu:
        s_pad = _next_pow2(s_pad)  # Triton block shapes are powers of two

    def heads_major(x, length):  # [b, n, kv, d] -> [b, kv, length, d], zero padded
        x = x.transpose(0, 2, 1, 3)
        return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))

    qg = q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)
    qg = jnp.pad(qg, ((0, 0), (0, 0), (0, rows - g * t), (0, 0)))
    kc, vc = heads_major(k_cache, s_pad), heads_major(v_cache.astype(k_cache.dtype), s_pad)
    kn, vn = heads_major(k_new.astype(k_cache.dtype), keys), heads_major(v_new.astype(k_cache.dtype), keys)
    mask = jnp.tile(block_mask.astype(jnp.int32), (1, g, 1))  # row = group * t + i
    mask = jnp.pad(mask, ((0, 0), (0, rows - g * t), (0, keys - t)))
    q_positions = q_positions.astype(jnp.int32)
    qpos = jnp.pad(jnp.tile(q_positions, (1, g)), ((0, 0), (0, rows - g * t)))[:, :, None]
    kpos = jnp.pad(q_positions, ((0, 0), (0, keys - t)))[:, None, :]
    lengths = jnp.minimum(cache_lengths.astype(jnp.int32), s)
    if sliding_window is None:
        first = jnp.zeros((b,), jnp.int32)
    else:
        # Cache key j is visible to query p iff j > p - window: blocks ending before the
        # earliest query's window are skipped.
        earliest = jnp.min(q_positions, axis=1) - sliding_window + 1
        first = jnp.clip(earliest // bs, 0, None).astype(jnp.int32)

    if tpu:
        from jax.experimental.pallas import tpu as pltpu
        scalar_spec = pl.BlockSpec(memory_space=pltpu.SMEM)
    else:
        scalar_spec = pl.BlockSpec((1,), lambda i, j: (i,))
    per_head = lambda n: pl.BlockSpec((None, None, n, d), lambda i, j: (i, j, 0, 0))  # noqa: E731
    kernel = functools.partial(_kernel, block_s=bs, scale=d ** -0.5, window=sliding_window,
                               scalars_whole=tpu)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((b, kv, rows, d), q.dtype),
        grid=(b, kv),
        in_specs=[
            scalar_spec,
            scalar_spec,
            per_head(rows),
            per_head(s_pad),
            per_head(s_pad),
            per_head(keys),
            per_head(keys),
            pl.BlockSpec((None, rows, keys), lambda i, j: (i, 0, 0)),
            pl.BlockSpec((None, rows, 1), lambda i, j: (i, 0, 0)),
            pl.BlockSpec((None, 1, keys), lambda i, j: (i, 0, 0)),
        ],
        out_specs=per_head(rows),
        interpret=interpret,
        compiler_params=_platform_params(platform, interpret),
        name="jaxspec_decode_attention",
    )(lengths, first, qg, kc, vc, kn, vn, mask, qpos, kpos)
    out = out[:, :, :g * t].reshape(b, kv, g, t, d).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, t, h, d)
