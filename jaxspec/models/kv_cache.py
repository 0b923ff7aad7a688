"""Fixed-shape KV cache and the scratch K/V of one forward block.

A forward over T query tokens never writes the cache: it returns the block's K/V as a
`BlockKV` (the scratch region), and the caller commits the subset it accepted with
`commit`. Rejected drafts, lookahead windows and padding therefore cost nothing to undo.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Float, Int

from jaxspec.models.quantize import module_dtype


@struct.dataclass
class KVCache:
    """Committed keys/values of every layer; row b holds `lengths[b]` valid positions 0..len-1.

    Heads-major (`[layers, b, kv, s, d]`): attention's batched matmuls run over (b, kv) with the
    positions inside, so each layer's cache is read as it is stored. Stored `[.., s, kv, d]`, each
    step transposed every layer's whole cache first (docs/performance.md, "KV cache layout")."""

    k: Float[Array, "layers b kv s d"]
    v: Float[Array, "layers b kv s d"]
    lengths: Int[Array, " b"]

    @classmethod
    def zeros(cls, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int,
              dtype=jnp.float32) -> "KVCache":
        shape = (num_layers, batch, num_kv_heads, max_len, head_dim)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   lengths=jnp.zeros((batch,), jnp.int32))

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


def init_cache(model, batch: int, max_len: int) -> KVCache:
    """An empty cache for `model` (a `jaxspec.Transformer`): its layers, KV heads and dtype."""
    cfg = model.config
    return KVCache.zeros(cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim,
                         module_dtype(model))


@struct.dataclass
class BlockKV:
    """Keys/values computed for the T tokens of one forward block (not yet committed)."""

    k: Float[Array, "layers b t kv d"]
    v: Float[Array, "layers b t kv d"]


def commit(cache: KVCache, block: BlockKV, take: Int[Array, "b n"], count: Int[Array, " b"]) -> KVCache:
    """Append block tokens `take[b, :count[b]]` (indices into the block) to row b of the cache.

    Entries past `count` (and any that would land beyond `max_len`) are dropped, so `take`
    keeps one fixed shape whatever was accepted.
    """
    batch, n = take.shape
    j = jnp.arange(n)[None, :]
    dest = jnp.where(j < count[:, None], cache.lengths[:, None] + j, cache.max_len)  # OOB -> dropped
    rows = jnp.arange(batch)[:, None]
    # The indices (rows, dest) are split by the kv axis' slice, so NumPy's rule puts their axes
    # first in the indexed view: [b, n, layers, kv, d], which the selected block rows are moved to.
    k_sel = block.k[:, rows, take].transpose(1, 2, 0, 3, 4)
    v_sel = block.v[:, rows, take].transpose(1, 2, 0, 3, 4)
    k = cache.k.at[:, rows, :, dest].set(k_sel, mode="drop")
    v = cache.v.at[:, rows, :, dest].set(v_sel, mode="drop")
    return KVCache(k=k, v=v, lengths=cache.lengths + count.astype(cache.lengths.dtype))
