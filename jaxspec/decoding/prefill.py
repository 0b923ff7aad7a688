"""Prompt prefill in chunks of one fixed size, committed to the cache.

A prompt longer than PREFILL_CHUNK is run as a `lax.while_loop` over chunks of PREFILL_CHUNK
tokens, each attending to the cache the chunks before it filled: the loop runs as many chunks
as the longest row needs (a traced count), so one compiled program serves every prompt length
up to its buffer (`stream` and `chat` pad every turn's prompt to one buffer per context: no new
prompt length ever compiles), at a cost that follows the prompt, not the buffer."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxspec.models.kv_cache import KVCache, commit
from jaxspec.models.model import Transformer, causal_mask

# Tokens per prefill forward. 128 keeps the GEMMs of a chunk near full efficiency on a CPU
# (the target's 128-token forward costs ~40x its one-token forward on this project's CPU for
# SmolLM2, against 128x for 128 one-token forwards) while a prompt of a few dozen tokens wastes
# at most one chunk's padding.
PREFILL_CHUNK = 128


def concat_features(hidden_states: tuple, batch: int, length: int) -> Float[Array, "b t f"]:
    """A forward's hidden states at the requested layers, side by side (f = 0 without any):
    the target features a PARD-2 drafter reads."""
    if not hidden_states:
        return jnp.zeros((batch, length, 0), jnp.float32)
    return jnp.concatenate([h.astype(jnp.float32) for h in hidden_states], axis=-1)


def forward_chunks(model: Transformer, tokens: Int[Array, "b p"], count: Int[Array, " b"], cache: KVCache, *,
                   hidden_layers: tuple[int, ...] = (), embed_offset: Float[Array, "b p d"] | None = None,
                   chunk: int | None = None) -> tuple[Float[Array, "b p d"], KVCache, Float[Array, "b p f"]]:
    """Commit each row's first `count` tokens (right-padded `tokens`, positions from 0) to an
    empty `cache`, `chunk` tokens (default PREFILL_CHUNK, read when traced) a forward; return the
    final states of every token, the cache, and the hidden states at `hidden_layers`
    (`concat_features`). Positions past a row's count are padding: their states are garbage and
    never committed."""
    batch, p = tokens.shape
    chunk = chunk or PREFILL_CHUNK

    def forward(ids, start, offset, cache):
        t = ids.shape[1]
        positions = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (batch, t))
        here = jnp.clip(count - start, 0, t)  # this chunk's tokens of each row
        out = model(ids, positions, causal_mask(here, t), cache, hidden_layers=hidden_layers,
                    embed_offset=offset, head="none")
        take = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (batch, t))
        return out.final, commit(cache, out.block_kv, take, here), concat_features(out.hidden_states, batch, t)

    if p <= chunk:
        return forward(tokens, 0, embed_offset, cache)
    padded = -(-p // chunk) * chunk
    tokens = jnp.pad(tokens, ((0, 0), (0, padded - p)))
    if embed_offset is not None:
        embed_offset = jnp.pad(embed_offset, ((0, 0), (0, padded - p), (0, 0)))

    def piece(x, start):
        return None if x is None else jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=1)

    shapes = jax.eval_shape(lambda: forward(piece(tokens, 0), 0, piece(embed_offset, 0), cache))
    final = jnp.zeros((batch, padded, shapes[0].shape[-1]), shapes[0].dtype)
    hidden = jnp.zeros((batch, padded, shapes[2].shape[-1]), shapes[2].dtype)
    chunks = (jnp.max(count) + chunk - 1) // chunk

    def body(carry):
        i, cache, final, hidden = carry
        start = i * chunk
        f, cache, h = forward(piece(tokens, start), start, piece(embed_offset, start), cache)
        return (i + 1, cache, jax.lax.dynamic_update_slice_in_dim(final, f, start, axis=1),
                jax.lax.dynamic_update_slice_in_dim(hidden, h, start, axis=1))

    _, cache, final, hidden = jax.lax.while_loop(lambda c: c[0] < chunks, body, (jnp.int32(0), cache, final, hidden))
    return final[:, :p], cache, hidden[:, :p]


def prefill(model: Transformer, prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"], cache: KVCache,
            hidden_layers: tuple[int, ...] = ()
            ) -> tuple[Float[Array, "b vocab"], KVCache, Float[Array, "b p f"]]:
    """Commit each row's prompt K/V (`forward_chunks`); return the logits after each row's last
    prompt token, the cache, and the hidden states at `hidden_layers` over the prompt."""
    final, cache, hidden = forward_chunks(model, prompts, prompt_lengths, cache, hidden_layers=hidden_layers)
    # Logits only at each row's last token: the whole prompt's ([b, p, vocab]) are never needed.
    last = model.head_logits(jnp.take_along_axis(final, (prompt_lengths - 1)[:, None, None], axis=1)[:, 0])
    return last, cache, hidden
