"""A server's slots hold the cache their busy rows may reach, not the context's: the state grows
before a longer request is inserted and shrinks once only short ones are left, and every row
decodes what its request decodes alone (`jaxspec.serving.slots`)."""

from __future__ import annotations

import numpy as np
import pytest

import jaxspec
from jaxspec.decoding.sampling import SamplingParams
from jaxspec.runtime import memory
from jaxspec.runtime.plan import plan_decode
from jaxspec.serving.slots import SlotGroup

CONTEXT = 640


@pytest.fixture(scope="module")
def model():
    return jaxspec.load()


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 400, n).tolist()


def test_the_state_grows_and_shrinks_with_the_rows_and_every_row_decodes_as_alone(model):
    plan = plan_decode(model, "greedy", {}, greedy=True, batch=2, prompt_len=CONTEXT, max_new_tokens=CONTEXT)
    group = SlotGroup(model, plan, slots=2, context=CONTEXT, chunk_steps=4)
    assert group.length == group.lengths[0] == 256 and group.cache_len > 512
    small = memory.tree_bytes(group.state)
    requests = {0: (_ids(20, 0), 30), 1: (_ids(420, 1), 30)}
    got, lengths = {}, []

    def put(slot, k):
        prompt, limit = requests[k]
        group.insert(slot, prompt, limit, 0, SamplingParams.create())
        owner[slot] = k

    owner = {}
    put(0, 0)
    group.advance()
    assert group.length == 256
    put(1, 1)  # 420 prompt tokens: the state grows before the row is written
    assert group.length == 512 and 1.9 * small < memory.tree_bytes(group.state) < 2 * small  # (the caches double)
    requests[2] = (_ids(30, 2), 40)
    while group.busy:
        views = group.advance()
        lengths.append(group.length)
        for slot, view in enumerate(views):
            if group.limit[slot] and view.done:
                got[owner[slot]] = view.tokens.tolist()
                group.release(slot)
                if owner[slot] == 1:  # the long one is gone: a short one takes its slot
                    put(slot, 2)
    assert 512 in lengths and lengths[-1] == 256  # cut back once only short rows were left
    assert memory.tree_bytes(group.state) == small
    for k, (prompt, limit) in requests.items():
        alone = jaxspec.generate(model, [prompt], max_new_tokens=limit, stop_at_eos=False).tokens[0]
        assert got[k] == alone, k
