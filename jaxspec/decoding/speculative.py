"""Speculative decoding with a PARD / PARD-2 parallel drafter, in both modes (`../shared/docs/pard2.md`).

One step is TWO forwards, whatever the draft length K:

* the drafter's forward over `[pending real tokens, m x (K-1)]`: the real tokens are the ones
  the target accepted since the drafter last ran (its cache holds exactly the target's
  committed tokens, so the pending run always ends with the target's last token); the logits
  at the last real token and at the K-1 masks give K drafts at once. Only the real tokens'
  K/V are committed to the drafter's cache: mask slots never are.
* the target's forward over `[last token, d_1 .. d_K]` (causal), which verifies them:
  greedy keeps the longest prefix equal to the target's argmax plus one bonus token;
  sampling is standard speculative sampling (Leviathan et al.) with the drafter's q: accept
  d_i with probability min(1, p/q), on rejection draw from norm(max(0, p - q)), after K
  accepted draws the bonus from p; p and q are warped by the one `warp_logits`.

Target-dependent mode (PARD-2): the token at position t enters the drafter with the target's
hidden states at `target_layers` for token t-1 (zeros at t = 0), projected and added to its
embedding; masks get the last real token's feature. The verification forward returns those
hidden states for `[last token, d_1 .. d_a]`, which are exactly the features of the next
pending run `[d_1 .. d_a, bonus]`, so no feature history is kept. Target-independent mode is
the same step with no features (the projection has no bias: features 0 = no offset).

`bonus_in_context=False` is the variant whose features all match the trainer's convention
(`jaxspec.train.pard_batch.feature_index`: a mask gets the hidden state OF the last real
token, which the target has not computed for a bonus token): the drafter then reads only
target-verified tokens, `[last, d_1 .. d_a] + m x K`, and does not see the bonus.

The pending run is held in a fixed `[b, P]` buffer (P = the longest run one step can accept,
plus 1) and the drafter block has a fixed size P + K - 1; unused slots are padding that sees
only itself and is seen by nobody. Everything is one `lax.while_loop`; rows finish on their own.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.decoding.state import DecodeState, append
from jaxspec.decoding.verify import verify_greedy
from jaxspec.drafter import embed_offset
from jaxspec.kv_cache import KVCache, commit
from jaxspec.model import Transformer, causal_mask
from jaxspec.sampling import SamplingParams, target_probs, warp_logits


@dataclasses.dataclass(frozen=True)
class DraftSpec:
    """The hashable (compile-time) part of a drafter: everything but its weights."""

    draft_len: int  # K drafts per step
    mask_token_id: int
    target_vocab_size: int
    target_layers: tuple[int, ...]  # () = target-independent mode
    feature_scale: float
    # True: the pending run ends with the bonus token (its feature is exact) and the masks get
    # the bonus's own feature, h_{n-2}; the trainer (`pard_batch.feature_index`) gave masks the
    # hidden state OF the last real token, h_{n-1}, which the target has not computed for a
    # bonus token. False: the drafter sees only target-verified tokens, so every feature is
    # the trained one, but it does not see the bonus (K masks, the first at the bonus's slot).
    bonus_in_context: bool = True

    @property
    def num_masks(self) -> int:
        return self.draft_len - 1 if self.bonus_in_context else self.draft_len

    @property
    def target_features(self) -> bool:
        return bool(self.target_layers)


@struct.dataclass
class DraftState:
    """The drafter's side of the loop: its committed cache and the tokens it has yet to see."""

    cache: KVCache  # drafter K/V of exactly the tokens the target has committed
    pending: Int[Array, "b p"]  # real tokens not yet in the drafter cache (bonus in context: ends with the last token)
    pending_count: Int[Array, " b"]  # >= 1
    features: Float[Array, "b p f"]  # target feature of each pending token (f = 0: target-independent)
    mask_feature: Float[Array, "b f"]  # the feature every mask of the next drafter block gets


def concat_features(hidden_states: tuple, batch: int, length: int) -> Float[Array, "b t f"]:
    """The target's hidden states at the drafter's layers, side by side (f = 0 without any)."""
    if not hidden_states:
        return jnp.zeros((batch, length, 0), jnp.float32)
    return jnp.concatenate([h.astype(jnp.float32) for h in hidden_states], axis=-1)


def _offset(projection, features, spec: DraftSpec):
    if not spec.target_features:
        return None
    return embed_offset(projection, features, spec.feature_scale)


def drafter_prefill(drafter: Transformer, projection, spec: DraftSpec, prompts: Int[Array, "b p"],
                    prompt_lengths: Int[Array, " b"], hidden: Float[Array, "b p f"], cache: KVCache,
                    pending_len: int) -> DraftState:
    """Commit the prompt to the drafter (`hidden`: the target's features over the prompt). The
    pending run is then the caller's first generated token (`bonus_in_context`: slot 0 is left
    for the caller to set) or the prompt's last token (the target has its hidden state)."""
    batch, p = prompts.shape
    rows = jnp.arange(batch)
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
    # Token t is paired with the target's state at t-1; token 0 with zeros.
    shifted = jnp.concatenate([jnp.zeros_like(hidden[:, :1]), hidden[:, :-1]], axis=1)
    out = drafter(prompts, positions, causal_mask(prompt_lengths, p), cache,
                  embed_offset=_offset(projection, shifted, spec))
    take = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
    last = prompt_lengths - 1
    if spec.bonus_in_context:
        cache = commit(cache, out.block_kv, take, prompt_lengths)
        first_feature, pending = hidden[rows, last], jnp.zeros((batch, pending_len), jnp.int32)
    else:
        cache = commit(cache, out.block_kv, take, last)
        first_feature = shifted[rows, last]
        pending = jnp.zeros((batch, pending_len), jnp.int32).at[:, 0].set(prompts[rows, last])
    features = jnp.zeros((batch, pending_len, hidden.shape[-1]), jnp.float32).at[:, 0].set(first_feature)
    return DraftState(cache=cache, pending=pending, pending_count=jnp.ones((batch,), jnp.int32), features=features,
                      mask_feature=hidden[rows, last])


def prefill_with_drafter(target: Transformer, drafter: Transformer, projection, spec: DraftSpec,
                         prompts: Int[Array, "b p"], prompt_lengths: Int[Array, " b"], target_cache: KVCache,
                         drafter_cache: KVCache, pending_len: int):
    """Both prompt prefills: (target logits after the prompt, target cache, DraftState)."""
    batch, p = prompts.shape
    rows = jnp.arange(batch)
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
    out = target(prompts, positions, causal_mask(prompt_lengths, p), target_cache, hidden_layers=spec.target_layers)
    take = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
    target_cache = commit(target_cache, out.block_kv, take, prompt_lengths)
    hidden = concat_features(out.hidden_states, batch, p)
    draft = drafter_prefill(drafter, projection, spec, prompts, prompt_lengths, hidden, drafter_cache, pending_len)
    return out.logits[rows, prompt_lengths - 1], target_cache, draft


def drafter_block(pending_count: Int[Array, " b"], pending_len: int, num_masks: int, bonus_in_context: bool
                  ) -> tuple[Bool[Array, "b t t"], Int[Array, "b t"], Int[Array, "b k"]]:
    """Relation, position offsets (from the drafter cache length) and the K logit rows of the
    drafter's block `[pending (P slots, the first `count` real), m x num_masks]`."""
    t = pending_len + num_masks
    batch = pending_count.shape[0]
    slot = jnp.arange(t)
    q, k = slot[:, None], slot[None, :]
    c = pending_count[:, None, None]
    key_real = (k < pending_len) & (k < c)
    query_real = (q < pending_len) & (q < c)
    query_mask, key_mask = q >= pending_len, k >= pending_len
    relation = ((q == k) | (query_real & key_real & (k <= q)) | (query_mask & key_real)
                | (query_mask & key_mask & (k <= q)))
    offsets = jnp.where(slot[None] < pending_len, slot[None], pending_count[:, None] + slot[None] - pending_len)
    masks = jnp.broadcast_to(pending_len + jnp.arange(num_masks), (batch, num_masks))
    read = jnp.concatenate([pending_count[:, None] - 1, masks], axis=1) if bonus_in_context else masks
    return relation, offsets, read


def draft_step(drafter: Transformer, projection, spec: DraftSpec, draft: DraftState, active: Bool[Array, " b"]
               ) -> tuple[Float[Array, "b k v"], DraftState]:
    """One drafter forward: the K drafts' logits over the target vocabulary; pending committed."""
    batch, pending_len = draft.pending.shape
    m = spec.num_masks
    relation, offsets, read = drafter_block(draft.pending_count, pending_len, m, spec.bonus_in_context)
    tokens = jnp.concatenate([draft.pending, jnp.full((batch, m), spec.mask_token_id, jnp.int32)], axis=1)
    features = jnp.concatenate([draft.features, jnp.repeat(draft.mask_feature[:, None], m, axis=1)], axis=1)
    out = drafter(tokens, draft.cache.lengths[:, None] + offsets, relation, draft.cache,
                  embed_offset=_offset(projection, features, spec))
    logits = jnp.take_along_axis(out.logits, read[..., None], axis=1)[..., :spec.target_vocab_size]
    take = jnp.broadcast_to(jnp.arange(pending_len, dtype=jnp.int32), (batch, pending_len))
    cache = commit(draft.cache, out.block_kv, take, jnp.where(active, draft.pending_count, 0))
    return logits, draft.replace(cache=cache)


def next_pending(spec: DraftSpec, draft: DraftState, emitted: Int[Array, "b e"], n_acc: Int[Array, " b"],
                 path_tokens: Int[Array, "b e"], path_hidden: Float[Array, "b e f"]) -> DraftState:
    """The drafter's next pending run after a step that accepted `n_acc` drafts.

    `path_tokens` / `path_hidden`: the verified block's tokens along the accepted path (the
    last token first) and the target's features there. With the bonus in context the run is
    the emitted tokens `[d_1 .. d_a, bonus]`, each paired with its predecessor's state
    (`path_hidden[:, i]`); otherwise it is `[last, d_1 .. d_a]`, paired with the previous mask
    feature and `path_hidden[:, :a]`. Either way the masks get `path_hidden[:, a]`."""
    batch, pending_len = draft.pending.shape
    rows = jnp.arange(batch)
    if spec.bonus_in_context:
        tokens, features = emitted, path_hidden
    else:
        tokens = path_tokens
        features = jnp.concatenate([draft.mask_feature[:, None], path_hidden[:, :-1]], axis=1)
    pad = pending_len - tokens.shape[1]
    return draft.replace(pending=jnp.pad(tokens, ((0, 0), (0, pad))), pending_count=n_acc + 1,
                         features=jnp.pad(features, ((0, 0), (0, pad), (0, 0))), mask_feature=path_hidden[rows, n_acc])


def propose(key, logits: Float[Array, "b k v"], sampling: SamplingParams, greedy: bool
            ) -> tuple[Int[Array, "b k"], Float[Array, "b k v"] | None]:
    """Drafts (argmax, or one draw per position from the warped q) and q (None when greedy)."""
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
    q = target_probs(logits, sampling)
    drafts = jax.random.categorical(key, warp_logits(logits, sampling), axis=-1).astype(jnp.int32)
    return drafts, q


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


@struct.dataclass
class SpeculativeState:
    decode: DecodeState
    draft: DraftState
    stats: dict


def init_stats(batch: int, max_emit: int, draft_len: int) -> dict:
    return {"accept_histogram": jnp.zeros((batch, max_emit + 1), jnp.int32),  # steps that emitted k tokens
            "draft_accepts": jnp.zeros((batch, draft_len), jnp.int32),  # steps that accepted draft i
            "target_steps": jnp.zeros((batch,), jnp.int32),  # verification forwards
            "accepted_tokens": jnp.zeros((batch,), jnp.int32)}  # accepted drafts + bonus, before EOS/budget cuts


def update_stats(stats: dict, active, kept, n_acc, drafter_accepted) -> dict:
    """`drafter_accepted[b]`: drafter tokens accepted this step (= n_acc for speculative)."""
    rows = jnp.arange(kept.shape[0])
    on = active.astype(jnp.int32)
    k = stats["draft_accepts"].shape[1]
    return {**stats,
            "accept_histogram": stats["accept_histogram"].at[rows, kept].add(on),
            "draft_accepts": stats["draft_accepts"] + on[:, None] * (jnp.arange(k)[None] < drafter_accepted[:, None]),
            "target_steps": stats["target_steps"] + on,
            "accepted_tokens": stats["accepted_tokens"] + on * (n_acc + 1)}


def finish_stats(stats: dict) -> dict:
    """accept_length: mean tokens per target step (bonus included)."""
    out = dict(stats)
    out["accept_length"] = stats["accepted_tokens"] / jnp.maximum(stats["target_steps"], 1)
    return out


def split_models(graphdef, params):
    """`(graphdef, params)` of speculative methods: (target, drafter) graphs; target, drafter and
    projection parameters (the drafter's weights are arguments, never compile-time constants)."""
    target_def, drafter_def = graphdef
    target = nnx.merge(target_def, params["target"])
    drafter = nnx.merge(drafter_def, params["drafter"])
    return target, drafter, params["projection"]


def speculative_decode(graphdef, params, prompts, prompt_lengths, rng, sampling: SamplingParams, *,
                       max_new_tokens: int, cache_len: int, eos_ids: tuple[int, ...], greedy: bool,
                       draft_spec: DraftSpec) -> tuple[DecodeState, dict]:
    """The whole generation as one `lax.while_loop` (see the module docstring)."""
    target, drafter, projection = split_models(graphdef, params)
    spec = draft_spec
    k = spec.draft_len
    batch = prompts.shape[0]
    tcfg, dcfg = target.config, drafter.config
    t_cache = KVCache.zeros(tcfg.num_layers, batch, cache_len, tcfg.num_kv_heads, tcfg.head_dim,
                            target.embed_tokens.embedding.dtype)
    d_cache = KVCache.zeros(dcfg.num_layers, batch, cache_len, dcfg.num_kv_heads, dcfg.head_dim,
                            drafter.embed_tokens.embedding.dtype)
    logits, t_cache, draft = prefill_with_drafter(target, drafter, projection, spec, prompts, prompt_lengths,
                                                  t_cache, d_cache, pending_len=k + 1)
    rng, key = jax.random.split(rng)
    first = (jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, warp_logits(logits, sampling))
             ).astype(jnp.int32)
    decode = DecodeState.start(batch, max_new_tokens, t_cache, rng)
    decode, _ = append(decode, first[:, None], jnp.ones((batch,), jnp.int32), eos_ids)
    decode = decode.replace(steps=jnp.ones((batch,), jnp.int32))
    if spec.bonus_in_context:
        draft = draft.replace(pending=draft.pending.at[:, 0].set(first))
    state = SpeculativeState(decode=decode, draft=draft, stats=init_stats(batch, k + 1, k))

    causal = jnp.asarray(np.tril(np.ones((k + 1, k + 1), bool)))
    offsets = jnp.arange(k + 1, dtype=jnp.int32)

    def step(state: SpeculativeState) -> SpeculativeState:
        decode, draft = state.decode, state.draft
        active = ~decode.done
        rng, draft_key, verify_key = jax.random.split(decode.rng, 3)
        draft_logits, draft = draft_step(drafter, projection, spec, draft, active)
        drafts, q = propose(draft_key, draft_logits, sampling, greedy)

        cache = decode.cache
        tokens = jnp.concatenate([decode.last_token[:, None], drafts], axis=1)
        out = target(tokens, cache.lengths[:, None] + offsets, causal, cache, hidden_layers=spec.target_layers)
        if greedy:
            preds = jnp.argmax(out.logits, axis=-1).astype(jnp.int32)
            _, n_acc, emitted = verify_greedy(drafts[:, None], jnp.ones((batch, 1), bool), preds,
                                              np.arange(k + 1, dtype=np.int32)[None])
        else:
            n_acc, emitted = verify_speculative(verify_key, drafts, q, out.logits, sampling)
        count = jnp.where(active, n_acc + 1, 0)
        take = jnp.broadcast_to(jnp.arange(k + 1, dtype=jnp.int32), (batch, k + 1))
        cache = commit(cache, out.block_kv, take, count)
        decode, kept = append(decode.replace(cache=cache, rng=rng), emitted, count, eos_ids)
        decode = decode.replace(steps=decode.steps + active)
        draft = next_pending(spec, draft, emitted, n_acc, tokens, concat_features(out.hidden_states, batch, k + 1))
        return SpeculativeState(decode=decode, draft=draft,
                                stats=update_stats(state.stats, active, kept, n_acc, n_acc))

    final = jax.lax.while_loop(lambda s: ~jnp.all(s.decode.done), step, state)
    return final.decode, finish_stats(final.stats)
