"""Fixed-shape n-gram pool: `[batch, vocab, G, N-1]` continuations keyed by an n-gram's first token.

Memory: batch * vocab * G * N * 4 bytes (continuations + one recency stamp per slot);
32k vocab, G=15, N=5: 9.6 MB per row; 152k vocab: 46 MB per row.

Each key keeps its G most recently *seen* distinct continuations (LRU): inserting an
n-gram that is already present refreshes it instead of duplicating it, so n-grams the
model keeps producing survive the stream of one-off ones; a full key evicts the least
recently seen entry.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Int


@struct.dataclass
class NGramPool:
    continuations: Int[Array, "b vocab g n1"]  # the N-1 tokens that followed the key
    last_seen: Int[Array, "b vocab g"]  # insertion clock when last inserted; 0 = empty slot
    clock: Int[Array, " b"]

    @classmethod
    def empty(cls, batch: int, vocab: int, guesses: int, ngram: int) -> "NGramPool":
        g = max(guesses, 1)
        return cls(continuations=jnp.zeros((batch, vocab, g, ngram - 1), jnp.int32),
                   last_seen=jnp.zeros((batch, vocab, g), jnp.int32),
                   clock=jnp.zeros((batch,), jnp.int32))

    @property
    def capacity(self) -> int:
        return self.continuations.shape[2]

    def lookup(self, keys: Int[Array, " b"]) -> tuple[Int[Array, "b g n1"], Bool[Array, "b g"]]:
        """Candidates keyed by each row's token, and which of the G slots hold one."""
        rows = jnp.arange(keys.shape[0])
        return self.continuations[rows, keys], self.last_seen[rows, keys] > 0


def insert(pool: NGramPool, keys: Int[Array, "b m"], values: Int[Array, "b m n1"],
           valid: Bool[Array, "b m"]) -> NGramPool:
    """Insert m n-grams per row, in order (later ones are more recent)."""

    def insert_row(conts, seen, clock, keys, values, valid):
        def one(i, carry):
            conts, seen, clock = carry
            key, value = keys[i], values[i]
            slots = seen[key]  # [G]
            same = jnp.all(conts[key] == value, axis=-1) & (slots > 0)
            # refresh the duplicate, else take the least recently seen (empty slots are 0)
            slot = jnp.where(jnp.any(same), jnp.argmax(same), jnp.argmin(slots))
            clock = clock + valid[i]
            conts = conts.at[key, slot].set(jnp.where(valid[i], value, conts[key, slot]))
            seen = seen.at[key, slot].set(jnp.where(valid[i], clock, slots[slot]))
            return conts, seen, clock

        return jax.lax.fori_loop(0, keys.shape[0], one, (conts, seen, clock))

    conts, seen, clock = jax.vmap(insert_row)(pool.continuations, pool.last_seen, pool.clock, keys, values, valid)
    return NGramPool(continuations=conts, last_seen=seen, clock=clock)


def sequence_ngrams(sequence: Int[Array, "b s"], length: Int[Array, " b"], ngram: int,
                    starts: Int[Array, "b m"]) -> tuple[Int[Array, "b m"], Int[Array, "b m n1"], Bool[Array, "b m"]]:
    """The n-grams of `sequence` beginning at `starts` (valid where they end before `length`)."""
    idx = starts[..., None] + jnp.arange(ngram)  # [b, m, N]
    rows = jnp.arange(sequence.shape[0])[:, None, None]
    grams = sequence[rows, jnp.clip(idx, 0, sequence.shape[1] - 1)]
    valid = (starts >= 0) & (starts + ngram <= length[:, None])
    return grams[..., 0], grams[..., 1:], valid
