"""Autoregressive decoding: one token per forward (argmax when greedy, sampled otherwise).

The reference every faster method must equal, and the baseline they are measured against.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec.decoding.prefill import prefill
from jaxspec.decoding.state import DecodeState, append
from jaxspec.kv_cache import KVCache, commit
from jaxspec.sampling import SamplingParams, next_token


def autoregressive_decode(graphdef, params, prompts, prompt_lengths, rng, sampling: SamplingParams, *,
                          max_new_tokens: int, cache_len: int, eos_ids: tuple[int, ...],
                          greedy: bool) -> tuple[DecodeState, dict]:
    """Pure and jit-able: `jax.jit(autoregressive_decode, static_argnames=(...))`."""
    model = nnx.merge(graphdef, params)
    cfg = model.config
    batch = prompts.shape[0]
    dtype = model.embed_tokens.embedding.dtype
    cache = KVCache.zeros(cfg.num_layers, batch, cache_len, cfg.num_kv_heads, cfg.head_dim, dtype)
    logits, cache = prefill(model, prompts, prompt_lengths, cache)
    rng, key = jax.random.split(rng)
    first = next_token(logits, key, sampling, greedy)
    state = DecodeState.start(batch, max_new_tokens, cache, rng)
    state, _ = append(state, first[:, None], jnp.ones((batch,), jnp.int32), eos_ids)
    state = state.replace(steps=jnp.ones((batch,), jnp.int32))

    one_token_mask = jnp.ones((batch, 1, 1), bool)
    zeros = jnp.zeros((batch, 1), jnp.int32)

    def step(state: DecodeState) -> DecodeState:
        active = ~state.done
        cache = state.cache
        out = model(state.last_token[:, None], cache.lengths[:, None], one_token_mask, cache)
        cache = commit(cache, out.block_kv, zeros, active.astype(jnp.int32))
        rng, key = jax.random.split(state.rng)
        token = next_token(out.logits[:, 0], key, sampling, greedy)
        state, _ = append(state.replace(cache=cache, rng=rng), token[:, None], active.astype(jnp.int32), eos_ids)
        return state.replace(steps=state.steps + active)

    return jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, state), {}
