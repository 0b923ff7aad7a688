"""The XLA reference attention, `xla_attention`: what every kernel here computes.

Plain XLA ops with float32 scores and softmax and GQA by grouping: one block of T query
tokens attends to (a) the committed KV cache, a length mask per row, and (b) the block's own
T keys under `block_mask` (a dense relation or a spec from `pallas_kernels.masks`, expanded
with `dense_block_mask`). It is jaxspec's `xla` attention backend (`jaxspec.models.attention`)
and the kernels' definition: `decode_attention` and `pallas_attention` return what it
returns, and the PARD kernel's backward is its VJP (`pallas_kernels.pard_attention.pard_reference`).
It lives here, beside the kernels that are checked against it and differentiate through
it, because `pallas_kernels` imports nothing from `jaxspec`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from pallas_kernels.masks import BlockMask, dense_block_mask

# Large finite negative instead of -inf: a fully masked row (padding) gives a uniform
# distribution over garbage rather than NaN, and padding rows are never read. The kernels
# use the same value (`pallas_kernels.backend`).
MASKED = -1e30


def xla_attention(
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
) -> Float[Array, "b t h d"]:
    """Reference attention in plain XLA ops: scores and softmax in float32, GQA by grouping.
    `softcap`: scores become softcap * tanh(scores / softcap) before the softmax (Gemma 2)."""
    block_mask = dense_block_mask(block_mask, q_positions)
    b, t, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    g = h // kv
    # Queries grouped per KV head as one [g*t, d] matrix: batched matmuls over (b, kv) that
    # CPU and GPU backends run far faster than a 5-D contraction.
    qg = q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)
    kc, vc = k_cache, v_cache  # heads-major already (`KVCache`)
    kn, vn = k_new.transpose(0, 2, 1, 3), v_new.transpose(0, 2, 1, 3)
    scale = d ** -0.5
    # Two score blocks instead of concatenating K/V: the cache is never copied.
    scores_cache = jnp.einsum("bkqd,bksd->bkqs", qg, kc, preferred_element_type=jnp.float32) * scale
    scores_new = jnp.einsum("bkqd,bksd->bkqs", qg, kn, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        scores_cache, scores_new = (softcap * jnp.tanh(x / softcap) for x in (scores_cache, scores_new))
    cache_visible = jnp.arange(s)[None, None, :] < cache_lengths[:, None, None]  # [b, 1, s]
    new_visible = block_mask  # [b, t, t]
    if sliding_window is not None:
        qpos = q_positions[:, :, None]
        cache_visible = cache_visible & (qpos - jnp.arange(s)[None, None, :] < sliding_window)
        new_visible = new_visible & (qpos - q_positions[:, None, :] < sliding_window)
    visible = jnp.concatenate([jnp.broadcast_to(cache_visible, (b, t, s)), new_visible], axis=-1)
    visible = jnp.tile(visible, (1, g, 1))[:, None]  # [b, 1, g*t, s+t], query index = group*t + i
    scores = jnp.where(visible, jnp.concatenate([scores_cache, scores_new], axis=-1), MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_cache.dtype)
    out = jnp.einsum("bkqs,bksd->bkqd", probs[..., :s], vc, preferred_element_type=jnp.float32)
    out = out + jnp.einsum("bkqs,bksd->bkqd", probs[..., s:], vn, preferred_element_type=jnp.float32)
    out = out.reshape(b, kv, g, t, d).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, t, h, d).astype(q.dtype)
