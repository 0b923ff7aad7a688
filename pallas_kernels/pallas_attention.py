"""The `"pallas"` attention backend: one entry point, the kernel chosen by the mask.

* `PardMask` over an empty cache (a training forward): `pard_attention`;
* everything else (`TreeMask`, dense masks, `PardMask` over a cache):
  `decode_attention`, which computes a `TreeMask` in the kernel and reads the others
  as a dense mask.
"""

from __future__ import annotations

from jaxtyping import Array, Float, Int

from pallas_kernels.masks import BlockMask, PardMask
from pallas_kernels.decode_attention import decode_attention
from pallas_kernels.pard_attention import pard_attention


def pallas_attention(
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
    """`pallas_kernels.reference.xla_attention`'s signature and results, with Pallas kernels."""
    if isinstance(block_mask, PardMask) and k_cache.shape[2] == 0:
        return pard_attention(q, k_new, v_new, block_mask.block_ids, q_positions, sliding_window, softcap)
    return decode_attention(q, k_cache, v_cache, cache_lengths, k_new, v_new, block_mask, q_positions,
                            sliding_window, softcap)
