"""Verification of draft paths against the target model: one verifier per way of accepting.

A *path* is a chain of draft tokens that starts right after the last committed token;
`pred_idx[k, j]` is the block index whose output predicts path k's j-th token (index 0 is
the last token; then the path's own tokens). Every verifier returns a `Verdict`: the path
emitted, the drafts accepted on it, and the emitted tokens (accepted drafts + one more).

* `Greedy`: `verify_greedy`;
* `MultiDraft`: `verify_sampled` (below), for deterministic drafts (n-gram pool, lookahead
  window, Jacobi guesses, argmax drafter tokens), whose draft distribution is one-hot;
* `Speculative`: `verify_speculative`, for one chain of drafts drawn from a proposal q.

Greedy: accept the longest prefix equal to the model's argmax, then one bonus token.
Sampled (Lookahead's Algorithm 4, SpecInfer-style multi-draft verification): at each
position walk the distinct draft tokens in path order, accepting token x with probability
p(x) / (mass not yet rejected); on acceptance keep only the paths sharing x and move to
their next position; if all are rejected, sample from the residual (p without the rejected
tokens) and stop; after a fully accepted path, sample the bonus token from the target. The
emitted tokens are distributed exactly as autoregressive sampling from p.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.decoding.sampling import SamplingParams, next_token, target_probs


@struct.dataclass
class Verdict:
    best: Int[Array, " b"]  # the path whose tokens were accepted (and whose K/V are committed)
    n_acc: Int[Array, " b"]  # drafts accepted on it
    emitted: Int[Array, "b p1"]  # the accepted drafts, then one token from the target
    accepted: Int[Array, "b k"] | None = None  # greedy: every path's accepted run


def verify_greedy(path_tokens: Int[Array, "b k p"], valid: Bool[Array, "b k"], preds: Int[Array, "b t"],
                  pred_idx: np.ndarray) -> Verdict:
    """The first longest prefix equal to the argmax, then the argmax after it (the bonus)."""
    rows = jnp.arange(preds.shape[0])
    path_preds = preds[:, pred_idx]  # [b, K, P+1]
    match = (path_tokens == path_preds[..., :-1]).astype(jnp.int32)
    accepted = jnp.sum(jnp.cumprod(match, axis=-1), axis=-1) * valid
    best = jnp.argmax(accepted, axis=-1)
    return Verdict(best=best, n_acc=accepted[rows, best], emitted=path_preds[rows, best], accepted=accepted)


def verify_sampled(key, path_tokens: Int[Array, "b k p"], valid: Bool[Array, "b k"],
                   logits: Float[Array, "b t vocab"], pred_idx: np.ndarray, sampling: SamplingParams) -> Verdict:
    """Algorithm 4 over every path at once (see the module docstring); `best` is the lead path."""
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
    return Verdict(best=lead, n_acc=n_acc, emitted=emitted)


def verify_speculative(key, drafts: Int[Array, "b k"], q: Float[Array, "b k v"], logits: Float[Array, "b k1 v"],
                       sampling: SamplingParams) -> tuple[Int[Array, " b"], Int[Array, "b k1"]]:
    """Standard speculative sampling: (accepted drafts, emitted = accepted drafts + one token).

    `drafts[:, i]` was drawn from `q[:, i]`; `logits[:, i]` is the target after the prefix and
    drafts < i. Draft i is accepted with probability min(1, p/q); the first rejection is
    replaced by a draw from norm(max(0, p - q)); if all K are accepted the bonus comes from p.
    """
    batch, k = drafts.shape
    rows = jnp.arange(batch)
    p = target_probs(logits, sampling)  # [b, K+1, V]
    p_draft = jnp.take_along_axis(p[:, :k], drafts[..., None], axis=-1)[..., 0]
    q_draft = jnp.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
    u_key, r_key = jax.random.split(key)
    u = jax.random.uniform(u_key, (batch, k))
    accept = u * q_draft < p_draft  # P = min(1, p/q); q(draft) > 0 as it was drawn from q
    n_acc = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=-1), axis=-1)
    q_padded = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)  # after K accepted: plain p
    residual = jnp.maximum(p - q_padded, 0.0)
    residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p)  # p == q: never used
    fallback = jax.random.categorical(r_key, jnp.log(residual[rows, n_acc]), axis=-1).astype(jnp.int32)
    j = jnp.arange(k + 1)[None]
    drafts_padded = jnp.concatenate([drafts, jnp.zeros_like(drafts[:, :1])], axis=1)
    emitted = jnp.where(j < n_acc[:, None], drafts_padded, fallback[:, None])
    return n_acc, emitted


# ----------------------------------------------------------------------------- verifiers
#
# Each is called as `verifier(key, path_tokens, valid, logits, preds, pred_idx, q, sampling)`
# with the step's paths (`path_tokens[b, k, p]`, -1 = padding; `valid[b, k]`), the target's
# logits and argmax over the block, and q (`[b, p, vocab]`, the one branch that has one).
# They look the functions above up at call time, so a test can swap one for a mutant.


@dataclasses.dataclass(frozen=True)
class Greedy:
    sampled = False
    needs_q = False

    def __call__(self, key, path_tokens, valid, logits, preds, pred_idx, q, sampling) -> Verdict:
        if path_tokens.shape[-1] == 0:  # no draft at all (a one-token block): the argmax, nothing to walk
            zeros = jnp.zeros(preds.shape[:1], jnp.int32)
            return Verdict(best=zeros, n_acc=zeros, emitted=preds[:, :1], accepted=zeros[:, None])
        return verify_greedy(path_tokens, valid, preds, pred_idx)


@dataclasses.dataclass(frozen=True)
class MultiDraft:
    """Sampling with deterministic drafts (Algorithm 4). With no draft at all (a one-token
    block) it is plain sampling from the target, with the step's key as it is."""

    sampled = True
    needs_q = False

    def __call__(self, key, path_tokens, valid, logits, preds, pred_idx, q, sampling) -> Verdict:
        if path_tokens.shape[-1] == 0:
            token = next_token(logits[:, 0], key, sampling, greedy=False)
            zeros = jnp.zeros(token.shape, jnp.int32)
            return Verdict(best=zeros, n_acc=zeros, emitted=token[:, None])
        return verify_sampled(key, path_tokens, valid, logits, pred_idx, sampling)


@dataclasses.dataclass(frozen=True)
class Speculative:
    """Speculative sampling of ONE chain of drafts drawn from q (a PARD drafter's)."""

    sampled = True
    needs_q = True

    def __call__(self, key, path_tokens, valid, logits, preds, pred_idx, q, sampling) -> Verdict:
        if path_tokens.shape[1] != 1:
            raise ValueError("speculative sampling verifies one chain of drafts")
        n_acc, emitted = verify_speculative(key, path_tokens[:, 0], q, logits[:, pred_idx[0]], sampling)
        return Verdict(best=jnp.zeros(n_acc.shape, jnp.int32), n_acc=n_acc, emitted=emitted)
