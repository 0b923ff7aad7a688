"""Block-decode attention as one Pallas kernel: the `"pallas"` attention backend's decode path.

Computes exactly what `pallas_kernels.reference.xla_attention` computes (same signature, same
masking rules, scores and softmax in float32) for a block of T queries:

* the committed KV cache, masked per row by `cache_lengths` (and by `sliding_window`),
  visited in blocks of `block_s` keys with an online softmax (running max, denominator and
  accumulator in float32); cache blocks wholly past a row's length, or wholly before every
  query's sliding window, are never loaded: the loop runs over only the needed blocks;
* then the block's own T keys under the block relation ("query i sees block key j"):
  - a `pallas_kernels.masks.TreeMask` (every decoding step: the block is a token tree): the
    relation is computed in the kernel from each token's DFS interval (two int32 vectors
    of length T per row; `pallas_kernels.masks.tree_relation`, two comparisons per element), so
    no T x T mask is read from memory;
  - any other relation as a dense `[b, T, T]` mask (an int32 copy, tiled over the query
    group): the fallback for prefill, arbitrary masks and tests.

One kernel instance per (batch row, KV head, tile of query rows): the KV head's `h // kv`
query heads x T queries form one `[g*T, d]` matrix (row = group * T + i), so GQA costs
one K/V read per group (per row tile: on TPU the default is a single tile).

Backends (TPU Mosaic, GPU Triton, CPU interpret) and why not Mosaic GPU: see
`pallas_kernels.backend`. Triton needs power-of-two block shapes, so rows, block keys and
(on GPU) the cache length are padded.

Known costs: the wrapper transposes the cache to `[b, kv, s, d]` (one copy per call; a
head-major cache layout in jaxspec or manual DMA would avoid it) and each kernel instance
holds its (row, head) slice of the cache in fast memory, which bounds the cache length on
TPU by VMEM (~s * d * 2 arrays * dtype size).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from pallas_kernels.errors import KernelConfigError
from pallas_kernels.masks import BlockMask, TreeMask, dense_block_mask, tree_relation
from pallas_kernels.backend import MASKED, MIN_ROWS, compiler_params, next_pow2, pv, qk, resolve, round_up

_GPU_ROWS = 64  # query rows per Triton program (its float32 accumulator lives in registers)


def _online_update(m, l, acc, scores, visible, v):
    """Fold one block of scores [R, K] (float32) and values [K, d] into the running softmax."""
    scores = jnp.where(visible, scores, MASKED)
    m_new = jnp.maximum(m, jnp.max(scores, axis=1, keepdims=True))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new)
    l_new = alpha * l + jnp.sum(p, axis=1, keepdims=True)
    return m_new, l_new, alpha * acc + pv(p, v)


def _kernel(len_ref, lo_ref, q_ref, kc_ref, vc_ref, kn_ref, vn_ref, qpos_ref, kpos_ref, *refs,
            block_s: int, scale: float, window: int | None, softcap: float | None, scalars_whole: bool, tree: bool):
    if tree:  # per-row DFS intervals: the query rows' preorder numbers, the keys' intervals
        qpre_ref, kpre_ref, kend_ref, o_ref = refs
    else:
        mask_ref, o_ref = refs
    # On TPU the scalar arrays sit whole in SMEM; elsewhere each instance gets its own (1,) block.
    batch_row = pl.program_id(0) if scalars_whole else 0
    length = len_ref[batch_row]
    first_block = lo_ref[batch_row]
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
        return _online_update(m, l, acc, qk(q, k, scale, softcap), visible, v)

    carry = (jnp.full((rows, 1), MASKED, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
             jnp.zeros((rows, d), jnp.float32))
    # lax.div: lengths are non-negative, and `//` lowers through `sign` (device-specific on TPU).
    last_block = lax.div(length + block_s - 1, block_s)  # blocks from here on hold no key
    m, l, acc = lax.fori_loop(first_block, last_block, cache_block, carry)

    if tree:
        visible = tree_relation(qpre_ref[...], kpre_ref[...], kend_ref[...])  # [R, 1] vs [1, T] -> [R, T]
    else:
        visible = mask_ref[...] != 0  # [R, T]
    if window is not None:
        visible = visible & (qpos - kpos_ref[...] < window)
    m, l, acc = _online_update(m, l, acc, qk(q, kn_ref[...], scale, softcap), visible, vn_ref[...])
    o_ref[...] = (acc / l).astype(o_ref.dtype)


def decode_attention(
    q: Float[Array, "b t h d"],
    k_cache: Float[Array, "b kv s d"],
    v_cache: Float[Array, "b kv s d"],
    cache_lengths: Int[Array, " b"],
    k_new: Float[Array, "b t kv d"],
    v_new: Float[Array, "b t kv d"],
    block_mask: BlockMask,
    q_positions: Int[Array, "b t"],
    sliding_window: int | None = None,
    softcap: float | None = None,
    *,
    block_s: int = 128,
    block_rows: int | None = None,
    interpret: bool | None = None,
    platform: str | None = None,
) -> Float[Array, "b t h d"]:
    """Pallas attention with `xla_attention`'s signature and results.

    `block_mask` is a `TreeMask` (relation computed in the kernel) or anything
    `pallas_kernels.masks.dense_block_mask` accepts (read as a dense mask). `block_s` (a power of
    two) is the number of cache keys per online-softmax step. `block_rows` (a power of two
    >= 16) splits each instance's `g*T` query rows into tiles of that many rows, one grid
    step each (each re-reads the cache); default: one tile on TPU and in interpret mode,
    64 rows on GPU, where a Triton program keeps its tile's accumulator in registers.
    `platform` and `interpret`: see `pallas_kernels.backend`. `softcap`: scores soft-capped
    before the softmax (Gemma 2's attention logit soft-capping).
    """
    platform, interpret = resolve(platform, interpret)
    if block_s < 16 or block_s & (block_s - 1):
        raise KernelConfigError(f"block_s must be a power of two >= 16, got {block_s}")
    b, t, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    if h % kv:
        raise KernelConfigError(f"query heads ({h}) must be a multiple of KV heads ({kv})")
    g = h // kv
    gpu = not interpret and platform != "tpu"
    tpu = platform == "tpu" and not interpret
    tree = isinstance(block_mask, TreeMask)
    if tree and block_mask.size != t:
        raise KernelConfigError(f"TreeMask describes a block of {block_mask.size} tokens, the forward has {t}")

    rows = max(next_pow2(g * t), MIN_ROWS)
    if block_rows is None:
        block_rows = min(rows, _GPU_ROWS) if gpu else rows
    if block_rows < MIN_ROWS or block_rows & (block_rows - 1):
        raise KernelConfigError(f"block_rows must be a power of two >= {MIN_ROWS}, got {block_rows}")
    block_rows = min(block_rows, rows)
    keys = max(next_pow2(t), MIN_ROWS)
    bs = min(block_s, max(next_pow2(s), 16))
    s_pad = round_up(max(s, 1), bs)
    if gpu:
        s_pad = next_pow2(s_pad)  # Triton block shapes are powers of two

    def padded(x, length):  # [b, kv, n, d] -> [b, kv, length, d], zero padded
        return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))

    qg = q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)
    qg = jnp.pad(qg, ((0, 0), (0, 0), (0, rows - g * t), (0, 0)))
    kc, vc = padded(k_cache, s_pad), padded(v_cache.astype(k_cache.dtype), s_pad)  # the cache is heads-major
    kn, vn = (padded(x.astype(k_cache.dtype).transpose(0, 2, 1, 3), keys) for x in (k_new, v_new))
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
        scalar_spec = pl.BlockSpec((1,), lambda i, j, r: (i,))
    per_head = lambda n: pl.BlockSpec((None, None, n, d), lambda i, j, r: (i, j, 0, 0))  # noqa: E731
    row_tile = pl.BlockSpec((None, None, block_rows, d), lambda i, j, r: (i, j, r, 0))
    per_row = lambda *shape: pl.BlockSpec((None, *shape), lambda i, j, r: (i, r, 0))  # noqa: E731
    args = [lengths, first, qg, kc, vc, kn, vn, qpos, kpos]
    in_specs = [scalar_spec, scalar_spec, row_tile, per_head(s_pad), per_head(s_pad), per_head(keys),
                per_head(keys), per_row(block_rows, 1), pl.BlockSpec((None, 1, keys), lambda i, j, r: (i, 0, 0))]
    if tree:
        pre = jnp.broadcast_to(block_mask.pre, (b, t)).astype(jnp.int32)
        end = jnp.broadcast_to(block_mask.end, (b, t)).astype(jnp.int32)
        # Padded key slots get an empty interval (seen by nobody); row = group * t + i.
        args += [jnp.pad(jnp.tile(pre, (1, g)), ((0, 0), (0, rows - g * t)))[:, :, None],
                 jnp.pad(pre, ((0, 0), (0, keys - t)), constant_values=1)[:, None, :],
                 jnp.pad(end, ((0, 0), (0, keys - t)), constant_values=0)[:, None, :]]
        key_row = pl.BlockSpec((None, 1, keys), lambda i, j, r: (i, 0, 0))
        in_specs += [per_row(block_rows, 1), key_row, key_row]
    else:
        mask = dense_block_mask(block_mask, q_positions)
        mask = jnp.tile(mask.astype(jnp.int32), (1, g, 1))  # row = group * t + i
        args.append(jnp.pad(mask, ((0, 0), (0, rows - g * t), (0, keys - t))))
        in_specs.append(per_row(block_rows, keys))
    kernel = functools.partial(_kernel, block_s=bs, scale=d ** -0.5, window=sliding_window, softcap=softcap,
                               scalars_whole=tpu, tree=tree)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((b, kv, rows, d), q.dtype),
        grid=(b, kv, rows // block_rows),
        in_specs=in_specs,
        out_specs=row_tile,
        interpret=interpret,
        compiler_params=compiler_params(platform, interpret, 3),
        name="jaxspec_tree_attention" if tree else "jaxspec_decode_attention",
    )(*args)
    out = out[:, :, :g * t].reshape(b, kv, g, t, d).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, t, h, d)
