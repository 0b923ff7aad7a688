"""The per-generation output buffer shared by every decoding method.

Methods emit a variable number of tokens per step per row; `append` writes them into a
fixed `[batch, max_new_tokens]` buffer, cutting at the first EOS and at the budget, so the
loop never changes shape and rows finish independently.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Int

from jaxspec.kv_cache import KVCache


@struct.dataclass
class DecodeState:
    tokens: Int[Array, "b max_new"]  # generated ids; entries >= num_generated are padding (0)
    num_generated: Int[Array, " b"]
    done: Bool[Array, " b"]
    steps: Int[Array, " b"]  # model forwards while the row was active (prefill included)
    cache: KVCache
    rng: Array

    @classmethod
    def start(cls, batch: int, max_new_tokens: int, cache: KVCache, rng) -> "DecodeState":
        return cls(
            tokens=jnp.zeros((batch, max_new_tokens), jnp.int32),
            num_generated=jnp.zeros((batch,), jnp.int32),
            done=jnp.zeros((batch,), bool),
            steps=jnp.zeros((batch,), jnp.int32),
            cache=cache,
            rng=rng,
        )

    @property
    def last_token(self) -> Int[Array, " b"]:
        idx = jnp.maximum(self.num_generated - 1, 0)
        return jnp.take_along_axis(self.tokens, idx[:, None], axis=1)[:, 0]


def append(state: DecodeState, new_tokens: Int[Array, "b n"], count: Int[Array, " b"],
           eos_ids: tuple[int, ...]) -> tuple[DecodeState, Int[Array, " b"]]:
    """Append `new_tokens[b, :count[b]]` to active rows; returns the state and the count kept.

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
    tokens = state.tokens.at[jnp.arange(batch)[:, None], dest].set(new_tokens, mode="drop")
    done = state.done | hit_eos | hit_budget
    return state.replace(tokens=tokens, num_generated=state.num_generated + count, done=done), count
