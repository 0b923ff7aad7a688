"""Training objectives over the model's block entry point (no KV cache: the whole sequence is the block)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxspec.models.kv_cache import init_cache
from jaxspec.models.model import Transformer, causal_mask


def sequence_logits(model: Transformer, inputs: Int[Array, "b t"]) -> Float[Array, "b t vocab"]:
    """Causal float32 logits for full sequences, through the same forward decoding uses."""
    b, t = inputs.shape
    empty = init_cache(model, b, 0)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return model(inputs, positions, causal_mask(jnp.full((b,), t, jnp.int32), t), empty).logits


def token_nats(model: Transformer, tokens: Int[Array, "b t1"]) -> Float[Array, "b t"]:
    """Per-position negative log-likelihood of tokens[:, 1:] given tokens[:, :-1] (natural log)."""
    logits = sequence_logits(model, tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
