"""The fixed-shape n-gram pool behind lookahead / prompt-lookup decoding.

Contract (jaxspec/decoding/ngram_pool.py): per batch row and key token, at most G distinct
continuations; inserting one already present does not duplicate it but refreshes it;
a full key evicts its least recently seen entry; `lookup` marks which of the G slots hold
an entry. Tests read the pool only through `lookup` (slot order is not part of the contract).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from jaxspec.decoding.ngram_pool import NGramPool, insert, sequence_ngrams

VOCAB = 8
insert_jit = jax.jit(insert)
lookup_jit = jax.jit(lambda pool, keys: pool.lookup(keys))


def entries(pool: NGramPool, row: int, key: int) -> list[tuple[int, ...]]:
    """The valid continuations of `key` in `row`, as a sorted list (duplicates kept, to catch them)."""
    keys = jnp.full((pool.continuations.shape[0],), key, jnp.int32)
    cands, valid = lookup_jit(pool, keys)
    cands, valid = np.asarray(cands[row]), np.asarray(valid[row])
    assert valid.shape == (pool.capacity,) and valid.dtype == bool
    return sorted(tuple(int(t) for t in c) for c in cands[valid])


def put(pool: NGramPool, grams: list[tuple[int, tuple[int, ...]]], row: int = 0, valid=None) -> NGramPool:
    """Insert (key, continuation) pairs into one row (other rows get invalid entries)."""
    batch, n1 = pool.continuations.shape[0], pool.continuations.shape[-1]
    m = len(grams)
    keys = np.zeros((batch, m), np.int32)
    values = np.zeros((batch, m, n1), np.int32)
    ok = np.zeros((batch, m), bool)
    for i, (k, v) in enumerate(grams):
        keys[row, i], values[row, i], ok[row, i] = k, v, True if valid is None else valid[i]
    return insert_jit(pool, jnp.asarray(keys), jnp.asarray(values), jnp.asarray(ok))


def test_empty_pool_has_no_candidates():
    pool = NGramPool.empty(batch=2, vocab=VOCAB, guesses=3, ngram=4)
    assert pool.capacity == 3 and pool.continuations.shape == (2, VOCAB, 3, 3)
    cands, valid = pool.lookup(jnp.asarray([0, 7], jnp.int32))
    assert cands.shape == (2, 3, 3) and valid.shape == (2, 3)
    assert not np.asarray(valid).any()
    assert NGramPool.empty(batch=1, vocab=VOCAB, guesses=0, ngram=2).capacity == 1  # G=0: a dummy slot


def test_insert_then_lookup():
    pool = put(NGramPool.empty(1, VOCAB, 3, 3), [(5, (1, 2))])
    assert entries(pool, 0, 5) == [(1, 2)]
    assert all(entries(pool, 0, k) == [] for k in range(VOCAB) if k != 5)  # keys are independent


def test_duplicates_are_filtered_within_and_across_calls():
    pool = put(NGramPool.empty(1, VOCAB, 3, 3), [(5, (1, 2)), (5, (1, 2)), (5, (2, 1)), (5, (1, 2))])
    assert entries(pool, 0, 5) == [(1, 2), (2, 1)]
    pool = put(pool, [(5, (2, 1)), (5, (1, 2))])
    assert entries(pool, 0, 5) == [(1, 2), (2, 1)]
    # same continuation under another key is a different n-gram
    pool = put(pool, [(6, (1, 2))])
    assert entries(pool, 0, 6) == [(1, 2)] and entries(pool, 0, 5) == [(1, 2), (2, 1)]


def test_full_key_evicts_the_oldest():
    g = [(3, (i, i)) for i in range(1, 7)]
    pool = put(NGramPool.empty(1, VOCAB, 3, 3), g[:3])
    assert entries(pool, 0, 3) == [(1, 1), (2, 2), (3, 3)]
    pool = put(pool, g[3:4])
    assert entries(pool, 0, 3) == [(2, 2), (3, 3), (4, 4)]
    pool = put(pool, g[4:6])  # within one call too: order = recency
    assert entries(pool, 0, 3) == [(4, 4), (5, 5), (6, 6)]


def test_reinserting_refreshes_an_entry():
    """LRU: an n-gram seen again outlives one seen once, earlier."""
    pool = put(NGramPool.empty(1, VOCAB, 3, 3), [(3, (1, 1)), (3, (2, 2)), (3, (3, 3)), (3, (1, 1))])
    pool = put(pool, [(3, (4, 4))])
    assert entries(pool, 0, 3) == [(1, 1), (3, 3), (4, 4)]


def test_invalid_entries_are_ignored():
    pool = put(NGramPool.empty(1, VOCAB, 2, 3), [(2, (1, 1)), (2, (5, 5)), (2, (6, 6))], valid=[True, False, True])
    assert entries(pool, 0, 2) == [(1, 1), (6, 6)]


def test_rows_of_a_batch_are_independent():
    keys = jnp.asarray([[4, 4, 4], [4, 1, 4]], jnp.int32)
    values = jnp.asarray([[[1, 2], [3, 4], [5, 6]], [[7, 7], [1, 2], [7, 7]]], jnp.int32)
    valid = jnp.asarray([[True, True, True], [True, True, False]])
    pool = insert_jit(NGramPool.empty(2, VOCAB, 2, 3), keys, values, valid)
    assert entries(pool, 0, 4) == [(3, 4), (5, 6)]  # row 0 filled key 4 (and evicted (1, 2))
    assert entries(pool, 1, 4) == [(7, 7)]  # row 1: its own history only
    assert entries(pool, 1, 1) == [(1, 2)] and entries(pool, 0, 1) == []
    for row in range(2):  # each row equals the same row inserted alone
        alone = insert_jit(NGramPool.empty(1, VOCAB, 2, 3), keys[row:row + 1], values[row:row + 1],
                           valid[row:row + 1])
        for k in range(VOCAB):
            assert entries(alone, 0, k) == entries(pool, row, k)


class ReferencePool:
    """Plain-Python model of the contract: per key, G distinct continuations, least recently seen evicted."""

    def __init__(self, capacity: int):
        self.capacity, self.clock, self.table = capacity, 0, {}

    def insert(self, key, value):
        self.clock += 1
        slots = self.table.setdefault(key, {})
        if value not in slots and len(slots) == self.capacity:
            del slots[min(slots, key=slots.get)]
        slots[value] = self.clock

    def entries(self, key):
        return sorted(self.table.get(key, {}))


@settings(max_examples=25, deadline=None, derandomize=True, database=None, phases=(Phase.explicit, Phase.generate))
@given(capacity=st.integers(1, 4),
       calls=st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 2), st.booleans()),
                               min_size=6, max_size=6), min_size=1, max_size=5))
def test_pool_matches_a_reference_model(capacity, calls):
    """Random insert sequences (few keys and values, so duplicates and evictions are common)."""
    pool = NGramPool.empty(1, VOCAB, capacity, 3)
    ref = ReferencePool(capacity)
    for call in calls:
        keys = jnp.asarray([[k for k, *_ in call]], jnp.int32)
        values = jnp.asarray([[[a, b] for _, a, b, _ in call]], jnp.int32)
        valid = jnp.asarray([[ok for *_, ok in call]])
        pool = insert_jit(pool, keys, values, valid)
        for k, a, b, ok in call:
            if ok:
                ref.insert(k, (a, b))
        for k in range(4):
            assert entries(pool, 0, k) == ref.entries(k), (k, call)


def test_sequence_ngrams_validity_at_the_sequence_end():
    seq = jnp.asarray([[10, 11, 12, 13, 14, 0, 0, 0], [20, 21, 22, 23, 24, 25, 26, 27]], jnp.int32)
    length = jnp.asarray([5, 8], jnp.int32)
    starts = jnp.asarray([[-1, 0, 2, 3, 5, 9], [-2, 0, 4, 5, 6, 7]], jnp.int32)
    keys, values, valid = sequence_ngrams(seq, length, 3, starts)
    assert keys.shape == (2, 6) and values.shape == (2, 6, 2) and valid.shape == (2, 6)
    np.testing.assert_array_equal(valid, [[False, True, True, False, False, False],
                                          [False, True, True, True, False, False]])
    np.testing.assert_array_equal(keys[0, 1:3], [10, 12])
    np.testing.assert_array_equal(values[0, 1:3], [[11, 12], [13, 14]])  # the last gram ends at length-1
    np.testing.assert_array_equal(keys[1, 1:4], [20, 24, 25])
    np.testing.assert_array_equal(values[1, 1:4], [[21, 22], [25, 26], [26, 27]])


def prompt_pool(prompts: list[list[int]], first: list[int], ngram: int, guesses: int, from_prompt: bool):
    """The pool the decoding loop starts from: the n-grams of prompt + first token, or none."""
    batch, p = len(prompts), max(map(len, prompts))
    history = np.zeros((batch, p + 4), np.int32)
    for i, (pr, f) in enumerate(zip(prompts, first)):
        history[i, :len(pr)] = pr
        history[i, len(pr)] = f
    pool = NGramPool.empty(batch, VOCAB, guesses, ngram)
    if from_prompt:
        starts = jnp.broadcast_to(jnp.arange(p), (batch, p))
        lengths = jnp.asarray([len(pr) + 1 for pr in prompts], jnp.int32)
        pool = insert_jit(pool, *sequence_ngrams(jnp.asarray(history), lengths, ngram, starts))
    return pool


def test_pool_from_prompt_holds_the_prompt_ngrams():
    prompts, first = [[5, 6, 7, 5, 6, 2, 5], [3, 3, 3]], [6, 3]
    seeded = prompt_pool(prompts, first, ngram=3, guesses=4, from_prompt=True)
    empty = prompt_pool(prompts, first, ngram=3, guesses=4, from_prompt=False)
    expected = {  # n-grams of 5 6 7 5 6 2 5 | 6
        5: [(6, 2), (6, 7)], 6: [(2, 5), (7, 5)], 7: [(5, 6)], 2: [(5, 6)],
    }
    for k in range(VOCAB):
        assert entries(seeded, 0, k) == expected.get(k, [])
        assert entries(empty, 0, k) == [] and entries(empty, 1, k) == []
    assert entries(seeded, 1, 3) == [(3, 3)]  # 3 3 3 | 3: the repeated gram is stored once
    assert all(entries(seeded, 1, k) == [] for k in range(VOCAB) if k != 3)  # padding made no n-grams


@pytest.mark.parametrize("ngram", [2, 4])
def test_pool_from_prompt_skips_grams_past_the_prompt(ngram):
    prompt = [1, 2, 3, 4]
    pool = prompt_pool([prompt], [5], ngram=ngram, guesses=2, from_prompt=True)
    seq = prompt + [5]
    grams = {(seq[i], tuple(seq[i + 1:i + ngram])) for i in range(len(seq) - ngram + 1)}
    got = {(k, e) for k in range(VOCAB) for e in entries(pool, 0, k)}
    assert got == grams
