"""The per-generation output buffer shared by every decoding method.

Methods emit a variable number of tokens per step per row; `append` writes them into a
fixed `[batch, max_new_tokens]` buffer, cutting at the first EOS and at the budget, so the
loop never changes shape and rows finish independently.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.models.kv_cache import KVCache


@struct.dataclass
class DecodeState:
    tokens: Int[Array, "b max_new"]  # generated ids; entries >= num_generated are padding (0)
    num_generated: Int[Array, " b"]
    done: Bool[Array, " b"]
    steps: Int[Array, " b"]  # model forwards while the row was active (prefill included)
    cache: KVCache
    rng: Array
    # An engine with penalties: the prompt's tokens (the repetition penalty's "seen").
    seen: Bool[Array, "b vocab"] | None = None
    # An engine with logprobs: per generated token, the target's log-probability of it and its
    # `top` most likely tokens (the raw model distribution, as vLLM reports by default).
    logprobs: "TokenLogprobs | None" = None

    @classmethod
    def start(cls, batch: int, max_new_tokens: int, cache: KVCache, rng, *, seen=None,
              top_logprobs: int = -1) -> "DecodeState":
        logprobs = None
        if top_logprobs >= 0:
            logprobs = TokenLogprobs(chosen=jnp.zeros((batch, max_new_tokens), jnp.float32),
                                     top_ids=jnp.zeros((batch, max_new_tokens, top_logprobs), jnp.int32),
                                     top=jnp.zeros((batch, max_new_tokens, top_logprobs), jnp.float32))
        return cls(
            tokens=jnp.zeros((batch, max_new_tokens), jnp.int32),
            num_generated=jnp.zeros((batch,), jnp.int32),
            done=jnp.zeros((batch,), bool),
            steps=jnp.zeros((batch,), jnp.int32),
            cache=cache,
            rng=rng,
            seen=seen,
            logprobs=logprobs,
        )

    def output_counts(self, vocab_size: int) -> Int[Array, "b vocab"]:
        """Each token's occurrences among the generated tokens (the penalties' counts)."""
        batch, max_new = self.tokens.shape
        real = jnp.arange(max_new)[None, :] < self.num_generated[:, None]
        return jnp.zeros((batch, vocab_size), jnp.int32).at[jnp.arange(batch)[:, None], self.tokens].add(real)

    @property
    def last_token(self) -> Int[Array, " b"]:
        idx = jnp.maximum(self.num_generated - 1, 0)
        return jnp.take_along_axis(self.tokens, idx[:, None], axis=1)[:, 0]


@struct.dataclass
class TokenLogprobs:
    """Log-probabilities, one row per generated token (or per emitted token of a step)."""

    chosen: Float[Array, "b n"]  # of the token generated
    top_ids: Int[Array, "b n k"]  # the k most likely tokens, most likely first
    top: Float[Array, "b n k"]  # their log-probabilities

    @classmethod
    def of(cls, logits: Float[Array, "b n vocab"], tokens: Int[Array, "b n"], k: int) -> "TokenLogprobs":
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        chosen = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
        top, top_ids = jax.lax.top_k(logp, k) if k else (logp[..., :0], jnp.zeros(tokens.shape + (0,), jnp.int32))
        return cls(chosen=chosen, top_ids=top_ids.astype(jnp.int32), top=top)


def append(state: DecodeState, new_tokens: Int[Array, "b n"], count: Int[Array, " b"],
           eos_ids: tuple[int, ...], logprobs: TokenLogprobs | None = None) -> tuple[DecodeState, Int[Array, " b"]]:
    """Append `new_tokens[b, :count[b]]` (and their `logprobs`, with an engine that reports
    them) to active rows; returns the state and the count kept.

    A row stops after its first EOS (kept in the output) or when the buffer is full.
    """
    batch, n = new_tokens.shape
    max_new = state.tokens.shape[1]
    j = jnp.arange(n)[None, :]
    count = jnp.where(state.done, 0, count)
    if eos_ids:
        is_eos = jnp.isin(new_tokens, jnp.asarray(eos_ids, jnp.int32)) & (j < count[:, None])
        first_eos = jnp.min(jnp.where(is_eos, j, n), axis=1)
        hit_eos = first_eos < count
        count = jnp.where(hit_eos, first_eos + 1, count)
    else:
        hit_eos = jnp.zeros((batch,), bool)
    room = max_new - state.num_generated
    hit_budget = count >= room
    count = jnp.minimum(count, room)
    dest = jnp.where(j < count[:, None], state.num_generated[:, None] + j, max_new)  # OOB -> dropped
    rows = jnp.arange(batch)[:, None]
    tokens = state.tokens.at[rows, dest].set(new_tokens, mode="drop")
    done = state.done | hit_eos | hit_budget
    if state.logprobs is not None:
        state = state.replace(logprobs=jax.tree.map(lambda buf, new: buf.at[rows, dest].set(new, mode="drop"),
                                                    state.logprobs, logprobs))
    return state.replace(tokens=tokens, num_generated=state.num_generated + count, done=done), count
