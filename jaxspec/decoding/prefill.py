"""Prompt prefill: one causal forward over the right-padded prompts, committed to the cache."""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxspec.models.kv_cache import KVCache, commit
from jaxspec.models.model import Transformer, causal_mask


def concat_features(hidden_states: tuple, batch: int, length: int) -> Float[Array, "b t f"]:
    """A forward's hidden states at the requested layers, side by side (f = 0 without any):
    the target features a PARD-2 drafter reads."""
    if not hidden_states:
        return jnp.zeros((batch, length, 0), jnp.float32)
    return jnp.concatenate([h.astype(jnp.float32) for h in hidden_states], axis=-1)


def prefill(model: Transformer, prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"], cache: KVCache,
            hidden_layers: tuple[int, ...] = ()
            ) -> tuple[Float[Array, "b vocab"], KVCache, Float[Array, "b p f"]]:
    """Commit each row's prompt K/V; return the logits after each row's last prompt token, the
    cache, and the hidden states at `hidden_layers` over the prompt (`concat_features`)."""
    batch, p = prompts.shape
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
    # Logits only at each row's last token: the whole prompt's ([b, p, vocab]) are never needed.
    out = model(prompts, positions, causal_mask(prompt_lengths, p), cache, hidden_layers=hidden_layers, head="none")
    take = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
    cache = commit(cache, out.block_kv, take, prompt_lengths)
    last = model.head_logits(jnp.take_along_axis(out.final, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0])
    return last, cache, concat_features(out.hidden_states, batch, p)
