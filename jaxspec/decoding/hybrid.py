"""Hybrid: a PARD drafter's proposal and Lookahead Decoding's candidates in ONE target forward.

A lookahead step (`jaxspec.decoding.lookahead`: the window, G n-gram pool candidates) gets one
more verification branch: the drafter's K tokens, a causal chain after the last token that
sees only the last token and itself. The drafter path is verified together with the pool
candidates and the window's diagonals, and the longest accepted run wins (greedy), or the
multi-draft verifier (Algorithm 4, `verify_sampled`) walks all of them (sampling). Under
sampling the drafter's branch carries its argmax tokens: like every other branch here the
drafts are then a deterministic function of the state, which Algorithm 4 requires.

Per step: one drafter forward (the accepted run, whichever branch it came from, plus K-1
masks; see `speculative.py`) and one target forward over the lookahead block + K tokens.
The features of target-dependent mode come from the target's hidden states along the
accepted path. The `stats` add `drafter_wins`: steps whose emitted run came from the drafter
branch and was strictly longer than any other branch's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxspec.decoding.state import append
from jaxspec.decoding.lookahead import LookaheadState, StepLayout, candidates, finish_step, start_state
from jaxspec.decoding.speculative import (DraftSpec, DraftState, concat_features, draft_step, drafter_prefill, finish_stats,
                                          init_stats, next_pending, split_models, update_stats)
from jaxspec.decoding.verify import verify_greedy, verify_sampled
from jaxspec.kv_cache import KVCache, commit
from jaxspec.model import causal_mask
from jaxspec.sampling import SamplingParams


def hybrid_layout(layout: StepLayout, draft_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position offsets, dense relation, paths) of the lookahead block + the drafter branch.

    The drafter branch is the last `draft_len` block tokens; its path is path 0."""
    base = layout.size
    t = base + draft_len
    offsets = np.concatenate([layout.position_offsets(), 1 + np.arange(draft_len)]).astype(np.int32)
    relation = np.zeros((t, t), bool)
    relation[:base, :base] = layout.attention_relation()
    for j in range(draft_len):
        relation[base + j, 0] = True
        relation[base + j, base:base + j + 1] = True
    lookahead_paths = layout.paths()
    longest = max(draft_len, lookahead_paths.shape[1])
    rows = [list(range(base, t)) + [-1] * (longest - draft_len)]
    rows += [list(p) + [-1] * (longest - len(p)) for p in lookahead_paths.tolist()]
    return offsets, relation, np.asarray(rows, np.int32)


@struct.dataclass
class HybridState:
    lookahead: LookaheadState
    draft: DraftState
    stats: dict


def hybrid_decode(graphdef, params, prompts, prompt_lengths, rng, sampling: SamplingParams, *,
                  max_new_tokens: int, cache_len: int, eos_ids: tuple[int, ...], greedy: bool,
                  draft_spec: DraftSpec, window: int, ngram: int, guesses: int, pool_from_prompt: bool,
                  verify_window: bool = True) -> tuple:
    target, drafter, projection = split_models(graphdef, params)
    spec = draft_spec
    k = spec.draft_len
    batch, p = prompts.shape
    rows = jnp.arange(batch)
    layout = StepLayout(window=window, levels=ngram - 1, guesses=guesses, cand_len=ngram - 1,
                        verify_window=verify_window)
    offsets_np, relation_np, path_idx = hybrid_layout(layout, k)
    num_paths, max_path = path_idx.shape
    pred_idx = np.concatenate([np.zeros((num_paths, 1), np.int32), np.maximum(path_idx, 0)], axis=1)
    window_paths = num_paths - 1 - guesses
    pending_len = max_path + 1
    uses_pool = guesses > 0

    state = start_state(target, prompts, prompt_lengths, rng, sampling, max_new_tokens=max_new_tokens,
                        cache_len=cache_len, eos_ids=eos_ids, greedy=greedy,
                        window_shape=(layout.levels, layout.window), ngram=ngram, guesses=guesses,
                        uses_pool=uses_pool, pool_from_prompt=pool_from_prompt, max_emit=max_path + 1)
    # The drafter's prefill needs the target's hidden states over the prompt: one more prompt
    # forward in target-dependent mode (`start_state` owns the target's own prefill).
    tcfg, dcfg = target.config, drafter.config
    if spec.target_features:
        scratch = KVCache.zeros(tcfg.num_layers, batch, 1, tcfg.num_kv_heads, tcfg.head_dim,
                                target.embed_tokens.embedding.dtype)
        positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (batch, p))
        hidden = concat_features(target(prompts, positions, causal_mask(prompt_lengths, p), scratch,
                                        hidden_layers=spec.target_layers).hidden_states, batch, p)
    else:
        hidden = jnp.zeros((batch, p, 0), jnp.float32)
    d_cache = KVCache.zeros(dcfg.num_layers, batch, cache_len, dcfg.num_kv_heads, dcfg.head_dim,
                            drafter.embed_tokens.embedding.dtype)
    draft = drafter_prefill(drafter, projection, spec, prompts, prompt_lengths, hidden, d_cache, pending_len)
    if spec.bonus_in_context:
        draft = draft.replace(pending=draft.pending.at[:, 0].set(state.decode.last_token))
    stats = {**init_stats(batch, max_path + 1, k), "drafter_wins": jnp.zeros((batch,), jnp.int32)}
    hstate = HybridState(lookahead=state, draft=draft, stats=stats)

    offsets = jnp.asarray(offsets_np)
    relation = jnp.asarray(relation_np)

    def step(hstate: HybridState) -> HybridState:
        state, draft = hstate.lookahead, hstate.draft
        decode = state.decode
        active = ~decode.done
        cache = decode.cache
        last = decode.last_token
        draft_logits, draft = draft_step(drafter, projection, spec, draft, active)
        drafts = jnp.argmax(draft_logits, axis=-1).astype(jnp.int32)  # deterministic: see the docstring
        if guesses > 0:
            prev = state.history[rows, jnp.maximum(state.history_len - 2, 0)]
            cands, valid = candidates(state.pool, prev, last)
        else:
            cands, valid = jnp.zeros((batch, 0, layout.cand_len), jnp.int32), jnp.zeros((batch, 0), bool)
        window_tokens = state.window.at[:, 0, 0].set(last)
        tokens = jnp.concatenate([window_tokens.reshape(batch, -1), cands.reshape(batch, -1), drafts], axis=1)
        out = target(tokens, cache.lengths[:, None] + offsets, relation, cache, hidden_layers=spec.target_layers)
        preds = jnp.argmax(out.logits, axis=-1).astype(jnp.int32)
        path_tokens = jnp.where(path_idx >= 0, tokens[:, jnp.maximum(path_idx, 0)], -1)  # [b, paths, P]
        path_valid = jnp.concatenate([jnp.ones((batch, 1), bool), valid,
                                      jnp.ones((batch, window_paths), bool)], axis=1)
        rng, key = jax.random.split(decode.rng)
        if greedy:
            best, n_acc, emitted = verify_greedy(path_tokens, path_valid, preds, pred_idx)
        else:
            best, n_acc, emitted = verify_sampled(key, path_tokens, path_valid, out.logits, pred_idx, sampling)
        take = jnp.asarray(pred_idx)[best]
        count = jnp.where(active, n_acc + 1, 0)
        cache = commit(cache, out.block_kv, take, count)
        decode, kept = append(decode.replace(cache=cache, rng=rng), emitted, count, eos_ids)
        decode = decode.replace(steps=decode.steps + active)

        hidden = concat_features(out.hidden_states, batch, tokens.shape[1])
        draft = next_pending(spec, draft, emitted, n_acc, jnp.take_along_axis(tokens, take, axis=1),
                             jnp.take_along_axis(hidden, take[..., None], axis=1))
        # The drafter's own accepted run (its path is path 0), whichever path was emitted.
        drafter_match = jnp.cumprod((drafts == preds[:, pred_idx[0, :k]]).astype(jnp.int32), axis=-1)
        drafter_accepted = jnp.where(best == 0, n_acc, jnp.minimum(jnp.sum(drafter_match, -1), n_acc))
        if not greedy:
            drafter_accepted = jnp.where(best == 0, n_acc, 0)
        stats = update_stats(hstate.stats, active, kept, n_acc, drafter_accepted)
        wins = (best == 0) & (n_acc > 0) & active
        if greedy:  # strictly longer than any other branch
            path_preds = preds[:, pred_idx]
            runs = jnp.sum(jnp.cumprod((path_tokens == path_preds[..., :-1]).astype(jnp.int32), -1), -1) * path_valid
            wins &= n_acc > jnp.max(runs[:, 1:], axis=-1, initial=0)
        stats["drafter_wins"] = hstate.stats["drafter_wins"] + wins

        grams = None
        if layout.levels:
            top = (layout.levels - 1) * layout.window
            new_level = preds[:, top:top + layout.window]
            grams = jnp.concatenate([window_tokens, new_level[:, None]], axis=1)
            window_tokens = grams[:, 1:]
        state = finish_step(state, decode, emitted, kept, active, grams, window_tokens, ngram=ngram,
                            uses_pool=uses_pool)
        return HybridState(lookahead=state, draft=draft, stats=stats)

    final = jax.lax.while_loop(lambda s: ~jnp.all(s.lookahead.decode.done), step, hstate)
    return final.lookahead.decode, finish_stats(final.stats)
