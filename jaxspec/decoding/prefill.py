"""Prompt prefill: one causal forward over the right-padded prompts, committed to the cache."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxspec.kv_cache import KVCache, commit
from jaxspec.model import Transformer, causal_mask


def prefill(model: Transformer, prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"],
            cache: KVCache) -> tuple[Float[Array, "b vocab"], KVCache]:
    """Commit each row's prompt K/V; return the logits after each row's last prompt token."""
    batch, p = prompts.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
    out = model(prompts, positions, causal_mask(prompt_lengths, p), cache)
    take = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
    cache = commit(cache, out.block_kv, take, prompt_lengths)
    last = jnp.take_along_axis(out.logits, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0]
    return last, cache
