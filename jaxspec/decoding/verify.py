"""Verification of draft paths against the target model: greedy and sampled.

A *path* is a chain of draft tokens that starts right after the last committed token;
`pred_idx[k, j]` is the block index whose output predicts path k's j-th token (index 0 is
the last token; then the path's own tokens). Drafts here are deterministic (n-gram pool,
lookahead window, Jacobi guesses), so the draft distribution q is one-hot.

Greedy: accept the longest prefix equal to the model's argmax, then one bonus token.
Sampled (Lookahead's Algorithm 4, SpecInfer-style multi-draft verification): at each
position walk the distinct draft tokens in path order, accepting token x with probability
p(x) / (mass not yet rejected); on acceptance keep only the paths sharing x and move to
their next position; if all are rejected, sample from the residual (p without the rejected
tokens) and stop; after a fully accepted path, sample the bonus token from the target. The
emitted tokens are distributed exactly as autoregressive sampling from p.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from jaxspec.sampling import SamplingParams, target_probs


def verify_greedy(path_tokens: Int[Array, "b k p"], valid: Bool[Array, "b k"], preds: Int[Array, "b t"],
                  pred_idx: np.ndarray) -> tuple[Int[Array, " b"], Int[Array, " b"], Int[Array, "b p1"]]:
    """(best path, accepted draft tokens, emitted tokens = accepted prefix + bonus)."""
    rows = jnp.arange(preds.shape[0])
    path_preds = preds[:, pred_idx]  # [b, K, P+1]
    match = (path_tokens == path_preds[..., :-1]).astype(jnp.int32)
    accepted = jnp.sum(jnp.cumprod(match, axis=-1), axis=-1) * valid
    best = jnp.argmax(accepted, axis=-1)
    return best, accepted[rows, best], path_preds[rows, best]


def verify_sampled(key, path_tokens: Int[Array, "b k p"], valid: Bool[Array, "b k"],
                   logits: Float[Array, "b t vocab"], pred_idx: np.ndarray,
                   sampling: SamplingParams) -> tuple[Int[Array, " b"], Int[Array, " b"], Int[Array, "b p1"]]:
    """(lead path, accepted draft tokens, emitted tokens); see the module docstring."""
    batch, num_paths, length = path_tokens.shape
    vocab = logits.shape[-1]
    rows = jnp.arange(batch)
    pred_idx = jnp.asarray(pred_idx)
    earlier = jnp.tril(jnp.ones((num_paths, num_paths), bool), k=-1)  # [c, c'] : c' before c
    keys = jax.random.split(key, length + 1)

    def target_at(lead, j):
        return target_probs(logits[rows, pred_idx[lead, j]], sampling)

    def position(j, carry):
        # `lead` is a path holding every token accepted so far (all alive paths share them);
        # its K/V are the ones committed, and it stays put once the walk stops.
        alive, lead, stopped, n_acc, emitted = carry
        p = target_at(lead, j)
        x = path_tokens[:, :, j]
        live = alive & (x >= 0) & ~stopped[:, None]
        same = (x[:, :, None] == x[:, None, :]) & earlier[None] & live[:, None, :]
        first = live & ~jnp.any(same, axis=-1)  # each distinct draft token once, in path order
        px = jnp.where(first, jnp.take_along_axis(p, jnp.maximum(x, 0), axis=-1), 0.0)
        rejected_before = jnp.cumsum(px, axis=-1) - px
        u_key, r_key = jax.random.split(keys[j])
        u = jax.random.uniform(u_key, (batch, num_paths))
        accept = first & (u * (1.0 - rejected_before) < px)
        any_accept = jnp.any(accept, axis=-1)
        chosen = jnp.take_along_axis(x, jnp.argmax(accept, axis=-1)[:, None], axis=-1)[:, 0]
        residual = p.at[rows[:, None], jnp.where(first, x, vocab)].set(0.0, mode="drop")
        residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p)  # float round-off guard
        fallback = jax.random.categorical(r_key, jnp.log(residual))
        token = jnp.where(any_accept, chosen, fallback).astype(jnp.int32)
        emitted = emitted.at[:, j].set(jnp.where(stopped, emitted[:, j], token))
        n_acc = n_acc + (any_accept & ~stopped)
        alive = alive & (x == chosen[:, None]) & any_accept[:, None]
        lead = jnp.where(any_accept & ~stopped, jnp.argmax(alive, axis=-1), lead)
        return alive, lead, stopped | ~any_accept, n_acc, emitted

    carry = (valid, jnp.argmax(valid, axis=-1), jnp.zeros((batch,), bool), jnp.zeros((batch,), jnp.int32),
             jnp.zeros((batch, length + 1), jnp.int32))
    alive, lead, stopped, n_acc, emitted = jax.lax.fori_loop(0, length, position, carry)
    # A path accepted to its end: the bonus token comes from the target after it.
    p = target_at(lead, length)
    bonus = jax.random.categorical(keys[length], jnp.log(p)).astype(jnp.int32)
    emitted = emitted.at[:, length].set(jnp.where(stopped, emitted[:, length], bonus))
    return lead, n_acc, emitted
