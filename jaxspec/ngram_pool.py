"""Fixed-shape n-gram pool: `[batch, vocab, G, N-1]` ring buffers keyed by an n-gram's first token.

Memory: batch * vocab * G * (N-1) * 4 bytes of tokens plus batch * vocab * 4 bytes of
counters (32k vocab, G=15, N=5: 7.7 MB per row; 152k vocab: 36 MB per row).

Each key keeps at most G distinct continuations; inserting one already present is a no-op
(duplicates would waste verification slots), and a full key overwrites its oldest entry.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Int


@struct.dataclass
class NGramPool:
    continuations: Int[Array, "b vocab g n1"]  # the N-1 tokens that followed the key
    inserted: Int[Array, "b vocab"]  # insertions ever made per key; slot = inserted % G

    @classmethod
    def empty(cls, batch: int, vocab: int, guesses: int, ngram: int) -> "NGramPool":
        return cls(continuations=jnp.zeros((batch, vocab, max(guesses, 1), ngram - 1), jnp.int32),
                   inserted=jnp.zeros((batch, vocab), jnp.int32))

    @property
    def capacity(self) -> int:
        return self.continuations.shape[2]

    def lookup(self, keys: Int[Array, " b"]) -> tuple[Int[Array, "b g n1"], Bool[Array, "b g"]]:
        """Candidates keyed by each row's token, and which of the G slots hold one."""
        rows = jnp.arange(keys.shape[0])
        cands = self.continuations[rows, keys]
        size = jnp.minimum(self.inserted[rows, keys], self.capacity)
        return cands, jnp.arange(self.capacity)[None, :] < size[:, None]


def insert(pool: NGramPool, keys: Int[Array, "b m"], values: Int[Array, "b m n1"],
           valid: Bool[Array, "b m"]) -> NGramPool:
    """Insert m n-grams per row, in order (later ones are newer), skipping duplicates."""
    capacity = pool.capacity

    def insert_row(conts, inserted, keys, values, valid):
        def one(i, carry):
            conts, inserted = carry
            key, value = keys[i], values[i]
            entries = conts[key]  # [G, N-1]
            size = jnp.minimum(inserted[key], capacity)
            present = jnp.any(jnp.all(entries == value, axis=-1) & (jnp.arange(capacity) < size))
            do = valid[i] & ~present
            slot = inserted[key] % capacity
            conts = conts.at[key, slot].set(jnp.where(do, value, entries[slot]))
            return conts, inserted.at[key].add(do.astype(inserted.dtype))

        return jax.lax.fori_loop(0, keys.shape[0], one, (conts, inserted))

    conts, inserted = jax.vmap(insert_row)(pool.continuations, pool.inserted, keys, values, valid)
    return NGramPool(continuations=conts, inserted=inserted)


def sequence_ngrams(sequence: Int[Array, "b s"], length: Int[Array, " b"], ngram: int,
                    starts: Int[Array, "b m"]) -> tuple[Int[Array, "b m"], Int[Array, "b m n1"], Bool[Array, "b m"]]:
    """The n-grams of `sequence` beginning at `starts` (valid where they end before `length`)."""
    offsets = jnp.arange(ngram)
    idx = starts[..., None] + offsets  # [b, m, N]
    rows = jnp.arange(sequence.shape[0])[:, None, None]
    grams = sequence[rows, jnp.clip(idx, 0, sequence.shape[1] - 1)]
    valid = (starts >= 0) & (starts + ngram <= length[:, None])
    return grams[..., 0], grams[..., 1:], valid
