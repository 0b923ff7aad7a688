"""Lookahead Decoding (Fu et al., 2024) and its two relatives on the same step.

One step is ONE forward over the block `[last token] + lookahead window + G candidates`:

* the lookahead window holds N-1 levels of W tokens: a 2D Jacobi iteration whose columns
  yield W fresh n-grams per step for the n-gram pool;
* the verification branch holds up to G candidate (N-1)-grams from the pool, keyed by the
  last committed token; every causal chain that starts at the last token (each candidate
  and, with `verify_window`, each diagonal of the window) is verified in `verify.py`, and the
  longest accepted prefix is emitted with one bonus token (greedy: the argmax; sampling: the
  paper's Algorithm 4, so the output keeps the target distribution);
* only the accepted tokens' K/V are committed, so the output equals greedy decoding.

`prompt-lookup` is the same step without a window (the pool is fed by the prompt and the
generated text); `jacobi` verifies a single candidate: the previous step's own predictions.
Everything is fixed-shape: empty candidate slots are masked out, never a shape change.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jaxtyping import Array, Int

from jaxspec.decoding.prefill import prefill
from jaxspec.decoding.state import DecodeState, append
from jaxspec.decoding.verify import verify_greedy, verify_sampled
from jaxspec.errors import GenerationError
from jaxspec.kv_cache import KVCache, commit
from jaxspec.masks import LookaheadMask
from jaxspec.ngram_pool import NGramPool, insert, sequence_ngrams
from jaxspec.sampling import SamplingParams, next_token


@dataclasses.dataclass(frozen=True)
class LookaheadConfig:
    """Window W (lookahead columns), n-gram size N (N-1 levels), up to G verified candidates."""

    window: int = 15
    ngram: int = 5
    guesses: int = 15
    pool_from_prompt: bool = True
    # Also verify the window's own diagonals (Jacobi paths): free extra candidates, still exact.
    verify_window: bool = True

    def __post_init__(self):
        for name, low in (("window", 1), ("ngram", 2), ("guesses", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise GenerationError(f"lookahead {name} must be an integer >= {low}, got {value!r}")
        for name in ("pool_from_prompt", "verify_window"):
            if not isinstance(getattr(self, name), bool):
                raise GenerationError(f"{name} must be true or false, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class StepLayout:
    """Static layout of a step's block.

    The lookahead window is `levels` x `window` tokens, level-major, and its level-0 column 0
    IS the last committed token (block index 0): column 0 then Jacobi-decodes the real
    continuation and yields an n-gram keyed by the last token. Level l column i sits at
    position p + l + i. Without a window the block starts with the last token alone.
    Candidates (`guesses` x `cand_len` tokens) follow; candidate token j sits at p + 1 + j.
    """

    window: int
    levels: int
    guesses: int
    cand_len: int
    verify_window: bool = False

    @property
    def cand_start(self) -> int:
        return max(self.levels * self.window, 1)

    @property
    def size(self) -> int:
        return self.cand_start + self.guesses * self.cand_len

    def position_offsets(self) -> np.ndarray:
        """Position of each block token relative to the last token's position."""
        level, col = np.divmod(np.arange(self.cand_start), max(self.window, 1))
        cand = np.tile(np.arange(self.cand_len), self.guesses)
        return np.concatenate([level + col, 1 + cand]).astype(np.int32)

    def attention_relation(self) -> np.ndarray:
        """`mask[i, j]`: block token i sees block token j (the committed cache is always seen).

        A level-l token at column i sees level 0 up to column i and column i of levels 1..l:
        a causal path along a diagonal of the window. A candidate token sees the last token
        and the earlier tokens of its own candidate. The branches never see each other.
        """
        t, w = self.size, self.window
        mask = np.eye(t, dtype=bool)
        mask[:, 0] = True
        for level in range(self.levels):
            for col in range(w):
                q = level * w + col
                mask[q, :col + 1] = True
                mask[q, [lv * w + col for lv in range(1, level + 1)]] = True
        for c in range(self.guesses):
            start = self.cand_start + c * self.cand_len
            for j in range(self.cand_len):
                mask[start + j, start:start + j + 1] = True
        return mask

    def paths(self) -> np.ndarray:
        """Block indices of every verifiable path `[K, max_path]` (-1 = padding).

        Each path is a causal chain that starts right after the last token: the G candidates
        and, with `verify_window`, the window's diagonals (level 0 up to column i, then up
        column i). A path token's prediction is the output at the previous path token, so
        accepting a path's matching prefix is exact greedy decoding, whichever branch it is in.
        """
        paths = [[self.cand_start + c * self.cand_len + j for j in range(self.cand_len)]
                 for c in range(self.guesses)]
        if self.verify_window and self.levels:
            w = self.window
            paths += [list(range(1, col + 1)) + [lv * w + col for lv in range(1, self.levels)]
                      for col in range(w)]
        paths = paths or [[]]  # no drafts: one empty path, i.e. plain decoding of one token
        longest = max(len(p) for p in paths)
        return np.array([p + [-1] * (longest - len(p)) for p in paths], dtype=np.int32).reshape(len(paths), longest)


@struct.dataclass
class LookaheadState:
    decode: DecodeState
    window: Int[Array, "b levels w"]  # lookahead levels (jacobi: the current guess, 1 level)
    pool: NGramPool
    history: Int[Array, "b s"]  # prompt + generated tokens (feeds the pool)
    history_len: Int[Array, " b"]
    stats: dict  # accept_histogram[b, k]: steps that emitted k tokens


def candidates(pool: NGramPool, prev: Int[Array, " b"], last: Int[Array, " b"]):
    """Up to G candidates continuing `last`: the pool's entries keyed by `last`, then, in the
    slots those leave empty, entries keyed by `prev` whose first token is `last` (shifted by
    one, so they are one token shorter; the pad -1 never matches)."""
    primary, primary_ok = pool.lookup(last)
    secondary, secondary_ok = pool.lookup(prev)
    secondary_ok &= secondary[..., 0] == last[:, None]
    secondary = jnp.concatenate([secondary[..., 1:], jnp.full_like(secondary[..., :1], -1)], axis=-1)
    merged = jnp.concatenate([primary, secondary], axis=1)
    ok = jnp.concatenate([primary_ok, secondary_ok], axis=1)
    order = jnp.argsort(~ok, axis=1, stable=True)[:, :pool.capacity]  # valid first, primary before secondary
    return jnp.take_along_axis(merged, order[..., None], axis=1), jnp.take_along_axis(ok, order, axis=1)


def _random_prompt_tokens(key, prompts, prompt_lengths, shape):
    idx = jax.random.randint(key, (prompts.shape[0], *shape), 0, prompt_lengths[:, None, None])
    return jnp.take_along_axis(prompts, idx.reshape(prompts.shape[0], -1), axis=1).reshape(idx.shape)


def start_state(model, prompts, prompt_lengths, rng, sampling: SamplingParams, *, max_new_tokens: int,
                cache_len: int, eos_ids: tuple[int, ...], greedy: bool, window_shape: tuple[int, int], ngram: int,
                guesses: int, uses_pool: bool, pool_from_prompt: bool, max_emit: int) -> LookaheadState:
    """Prefill, the first token, the initial window (random prompt tokens) and the n-gram pool."""
    cfg = model.config
    batch, p = prompts.shape
    rows = jnp.arange(batch)
    dtype = model.embed_tokens.embedding.dtype
    cache = KVCache.zeros(cfg.num_layers, batch, cache_len, cfg.num_kv_heads, cfg.head_dim, dtype)
    logits, cache = prefill(model, prompts, prompt_lengths, cache)
    rng, init_key, first_key = jax.random.split(rng, 3)
    first = next_token(logits, first_key, sampling, greedy)
    decode = DecodeState.start(batch, max_new_tokens, cache, rng)
    decode, _ = append(decode, first[:, None], jnp.ones((batch,), jnp.int32), eos_ids)
    decode = decode.replace(steps=jnp.ones((batch,), jnp.int32))

    history = jnp.zeros((batch, p + max_new_tokens), jnp.int32).at[:, :p].set(prompts)
    history = history.at[rows, prompt_lengths].set(first)
    pool = NGramPool.empty(batch, cfg.vocab_size if uses_pool else 1, guesses, ngram if uses_pool else 2)
    if uses_pool and pool_from_prompt:
        starts = jnp.broadcast_to(jnp.arange(p), (batch, p))
        keys, values, valid = sequence_ngrams(history, prompt_lengths + 1, ngram, starts)
        pool = insert(pool, keys, values, valid)
    window_tokens = _random_prompt_tokens(init_key, prompts, prompt_lengths, window_shape)
    return LookaheadState(
        decode=decode, window=window_tokens, pool=pool, history=history,
        history_len=prompt_lengths + 1, stats={"accept_histogram": jnp.zeros((batch, max_emit + 1), jnp.int32)},
    )


def finish_step(state: LookaheadState, decode: DecodeState, emitted: Int[Array, "b e"], kept: Int[Array, " b"],
                active, window_grams, next_window, *, ngram: int, uses_pool: bool) -> LookaheadState:
    """Extend the history with the kept tokens, feed the pool (the window's n-grams `window_grams`
    `[b, N, W]` when given, and the n-grams ending in the new tokens) and count the step."""
    batch = emitted.shape[0]
    rows = jnp.arange(batch)
    j = jnp.arange(emitted.shape[1])[None]
    dest = jnp.where(j < kept[:, None], state.history_len[:, None] + j, state.history.shape[1])
    history = state.history.at[rows[:, None], dest].set(emitted, mode="drop")
    history_len = state.history_len + kept

    pool = state.pool
    if uses_pool:
        keys_list, values_list, valid_list = [], [], []
        if window_grams is not None:
            keys_list.append(window_grams[:, 0])
            values_list.append(jnp.swapaxes(window_grams[:, 1:], 1, 2))
            # From the first step on: n-grams of the random initial levels are mostly noise,
            # but they cost nothing and the pool's LRU evicts them (measured: no gating is
            # better than waiting N-2 steps for the levels to fill).
            valid_list.append(jnp.broadcast_to(active[:, None], window_grams[:, 0].shape))
        # n-grams that end in the tokens just generated
        starts = state.history_len[:, None] + j - (ngram - 1)
        keys, values, valid = sequence_ngrams(history, history_len, ngram, starts)
        keys_list.append(keys)
        values_list.append(values)
        valid_list.append(valid)
        pool = insert(pool, jnp.concatenate(keys_list, 1), jnp.concatenate(values_list, 1),
                      jnp.concatenate(valid_list, 1))
    hist = state.stats["accept_histogram"].at[rows, kept].add(active.astype(jnp.int32))
    return LookaheadState(decode=decode, window=next_window, pool=pool, history=history, history_len=history_len,
                          stats={"accept_histogram": hist})


def speculative_loop(graphdef, params, prompts, prompt_lengths, rng, sampling: SamplingParams, *,
                     max_new_tokens: int, cache_len: int, eos_ids: tuple[int, ...], greedy: bool,
                     mode: str, window: int, ngram: int, guesses: int, pool_from_prompt: bool,
                     verify_window: bool = False) -> tuple[DecodeState, dict]:
    """The whole generation as one `lax.while_loop`; `mode` is lookahead | prompt-lookup | jacobi."""
    model = nnx.merge(graphdef, params)
    batch = prompts.shape[0]
    if mode == "jacobi":
        layout = StepLayout(window=0, levels=0, guesses=1, cand_len=window)
    else:
        has_window = mode == "lookahead"
        layout = StepLayout(window=window if has_window else 0, levels=ngram - 1 if has_window else 0,
                            guesses=guesses, cand_len=ngram - 1, verify_window=verify_window)
    L, G = layout.cand_len, layout.guesses
    path_idx = layout.paths()
    num_paths, max_path = path_idx.shape
    pred_idx = np.concatenate([np.zeros((num_paths, 1), np.int32), np.maximum(path_idx, 0)], axis=1)
    window_paths = num_paths - G

    def path_valid(cand_valid):  # pool slots may be empty; window paths (or the empty path) always exist
        return jnp.concatenate([cand_valid, jnp.ones((batch, window_paths), bool)], axis=1)

    offsets = jnp.asarray(layout.position_offsets())
    relation = LookaheadMask.from_layout(layout)  # attention_relation(); Pallas computes it in-kernel
    rows = jnp.arange(batch)
    uses_pool = mode != "jacobi" and G > 0
    state = start_state(model, prompts, prompt_lengths, rng, sampling, max_new_tokens=max_new_tokens,
                        cache_len=cache_len, eos_ids=eos_ids, greedy=greedy,
                        window_shape=(1, window) if mode == "jacobi" else (layout.levels, layout.window),
                        ngram=ngram, guesses=G, uses_pool=uses_pool, pool_from_prompt=pool_from_prompt,
                        max_emit=max_path + 1)

    def step(state: LookaheadState) -> LookaheadState:
        decode = state.decode
        active = ~decode.done
        cache = decode.cache
        last = decode.last_token
        if mode == "jacobi":
            cands, valid = state.window, jnp.ones((batch, 1), bool)
        elif G > 0:
            prev = state.history[rows, jnp.maximum(state.history_len - 2, 0)]
            cands, valid = candidates(state.pool, prev, last)
        else:
            cands, valid = jnp.zeros((batch, 0, L), jnp.int32), jnp.zeros((batch, 0), bool)
        window_tokens = state.window
        if layout.levels:
            window_tokens = window_tokens.at[:, 0, 0].set(last)
            head = window_tokens.reshape(batch, -1)
        else:
            head = last[:, None]
        tokens = jnp.concatenate([head, cands.reshape(batch, -1)], axis=1)
        out = model(tokens, cache.lengths[:, None] + offsets, relation, cache)
        preds = jnp.argmax(out.logits, axis=-1).astype(jnp.int32)  # [b, T]

        # Verification: each path is accepted up to its first disagreement with the model
        # (greedy) or by Algorithm 4 (sampling); accepted tokens plus one bonus token are emitted.
        path_tokens = jnp.where(path_idx >= 0, tokens[:, jnp.maximum(path_idx, 0)], -1)  # [b, K, P]
        rng, key = jax.random.split(decode.rng)
        if greedy:
            best, n_acc, emitted = verify_greedy(path_tokens, path_valid(valid), preds, pred_idx)
        else:
            best, n_acc, emitted = verify_sampled(key, path_tokens, path_valid(valid), out.logits, pred_idx,
                                                  sampling)
        take = jnp.asarray(pred_idx)[best]  # the last token + the path's tokens
        count = jnp.where(active, n_acc + 1, 0)
        cache = commit(cache, out.block_kv, take, count)
        decode, kept = append(decode.replace(cache=cache, rng=rng), emitted, count, eos_ids)
        decode = decode.replace(steps=decode.steps + active)

        grams = None
        if mode == "jacobi":
            # Next guess: the model's argmax predictions past the accepted run, padded with the
            # last one (argmax even when sampling: drafts stay deterministic; `emitted` holds
            # sampled tokens only up to the first rejection).
            path_preds = jnp.take_along_axis(preds, take, axis=1)
            idx = jnp.minimum(n_acc[:, None] + 1 + jnp.arange(L)[None], L)
            window_tokens = jnp.take_along_axis(path_preds, idx, axis=1)[:, None, :]
        elif layout.levels:
            top = (layout.levels - 1) * layout.window
            new_level = preds[:, top:top + layout.window]
            grams = jnp.concatenate([window_tokens, new_level[:, None]], axis=1)  # [b, N, W]
            window_tokens = grams[:, 1:]
        return finish_step(state, decode, emitted, kept, active, grams, window_tokens, ngram=ngram,
                           uses_pool=uses_pool)

    final = jax.lax.while_loop(lambda s: ~jnp.all(s.decode.done), step, state)
    return final.decode, final.stats


def lookahead_decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, window, ngram, guesses,
                     pool_from_prompt, verify_window, **kw):
    return speculative_loop(graphdef, params, prompts, prompt_lengths, rng, sampling, mode="lookahead",
                            window=window, ngram=ngram, guesses=guesses, pool_from_prompt=pool_from_prompt,
                            verify_window=verify_window, **kw)


def prompt_lookup_decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, ngram, guesses, **kw):
    return speculative_loop(graphdef, params, prompts, prompt_lengths, rng, sampling, mode="prompt-lookup",
                            window=0, ngram=ngram, guesses=guesses, pool_from_prompt=True, **kw)


def jacobi_decode(graphdef, params, prompts, prompt_lengths, rng, sampling, *, window, **kw):
    return speculative_loop(graphdef, params, prompts, prompt_lengths, rng, sampling, mode="jacobi",
                            window=window, ngram=2, guesses=1, pool_from_prompt=False, **kw)
