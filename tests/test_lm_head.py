"""The LM head's chunked argmax: the same ids as the full logits' argmax, without the logits.

Greedy verification reads only each block token's argmax; at a large vocabulary a large block's
float32 logits are the step's largest buffer, so the head runs over vocabulary chunks there."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec

CFG = jaxspec.ModelConfig(
    model_type="llama", vocab_size=1000, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
    num_kv_heads=1, head_dim=8, max_position_embeddings=128, bos_token_id=1,
)


def head_weight(module) -> np.ndarray:
    """[vocab, d] whatever the storage."""
    if module.config.tie_word_embeddings:
        return np.asarray(module.embed_tokens.embedding[...])
    return np.asarray(module.lm_head.kernel[...]).T


def set_head_weight(module, w: np.ndarray) -> None:
    if module.config.tie_word_embeddings:
        module.embed_tokens.embedding[...] = jnp.asarray(w)
    else:
        module.lm_head.kernel[...] = jnp.asarray(w.T)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk", [7, 128, 999, 1000, 4096])  # 1000 % 7 and % 128 != 0: the last chunk overlaps
@pytest.mark.parametrize("shards", [1, 4])  # 4: the vocabulary split over 4 devices (chunks within each 250)
def test_chunked_argmax_equals_full_argmax(tied, chunk, shards):
    module = jaxspec.Transformer(dataclasses.replace(CFG, tie_word_embeddings=tied), rngs=nnx.Rngs(0))
    module.vocab_shards = shards
    x = jax.random.normal(jax.random.key(1), (3, 5, CFG.hidden_size))
    full = np.asarray(jnp.argmax(module.head_logits(x), axis=-1))
    chunked = np.asarray(jax.jit(lambda x: module.head_argmax(x, chunk))(x))
    np.testing.assert_array_equal(chunked, full)
    assert chunked.dtype == np.int32 and len(np.unique(full)) > 3  # not a degenerate head


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("shards", [1, 4])
def test_chunked_argmax_breaks_ties_like_jnp_argmax(tied, shards):
    """Exact ties across chunks (and across the slices of a split vocabulary: 5 and 997), and
    inside the overlap of the shifted last chunk, go to the lowest id, as `jnp.argmax` does
    (greedy decoding's tie rule)."""
    module = jaxspec.Transformer(dataclasses.replace(CFG, tie_word_embeddings=tied), rngs=nnx.Rngs(0))
    module.vocab_shards = shards
    x = np.zeros((4, CFG.hidden_size), np.float32)
    x[np.arange(4), np.arange(4)] = 1.0  # state i reads the head's column i
    w = np.zeros((CFG.vocab_size, CFG.hidden_size), np.float32)
    # column 0: ids 5 and 997 tie (different chunks); column 1: 3 and 2 tie in one chunk;
    # column 2: 996 and 999 tie, 996 lies in the overlap of the last chunk (chunk 7: starts 993);
    # column 3: a unique max in the last chunk's fresh part.
    for col, ids in ((0, (5, 997)), (1, (3, 2)), (2, (996, 999)), (3, (998,))):
        w[list(ids), col] = 2.0
    set_head_weight(module, w)
    got = np.asarray(module.head_argmax(jnp.asarray(x), 7))
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(module.head_logits(jnp.asarray(x)), -1)))
    np.testing.assert_array_equal(got, [5, 2, 996, 998])


def vocab_buffers(compiled, vocab: int) -> set[str]:
    """The float32 buffer shapes of a compiled program whose last dimension is the vocabulary
    (the untied head's weight [d, vocab] aside)."""
    shapes = set(re.findall(r"f32\[[0-9,]*\]", compiled.as_text()))
    return {s for s in shapes if s.endswith(f",{vocab}]")} - {f"f32[{CFG.hidden_size},{vocab}]"}


def test_greedy_step_never_materialises_block_logits_over_the_budget(monkeypatch):
    """Where a block's logits exceed ARGMAX_LOGITS_BYTES, the compiled greedy lookahead program
    holds no [b, T, vocab] float32 buffer, only the prefill's last-token logits [b, vocab]; the
    sampled program still has the block's (its verifier reads the probabilities). Where they fit,
    the greedy program keeps the head whole (chunks would copy its weight). Lookahead equals
    greedy either way."""
    prompts = [[1, 5, 9], [1, 7]]
    opts = dict(method="lookahead", window=4, ngram=3, guesses=4, max_new_tokens=6)
    # (two vocabularies: a program traced once keeps the budget it was traced with)
    whole = jaxspec.Model.from_module(jaxspec.Transformer(dataclasses.replace(CFG, vocab_size=19384),
                                                          rngs=nnx.Rngs(0)))
    assert jaxspec.generate(whole, prompts, **opts).tokens == jaxspec.generate(whole, prompts, max_new_tokens=6).tokens
    lookahead = list(whole.compiled.values())[0]  # 2 rows x 21 block tokens: within the default budget
    assert vocab_buffers(lookahead, 19384) > {"f32[2,19384]"}  # the block's logits too

    monkeypatch.setattr(jaxspec.models.model, "ARGMAX_LOGITS_BYTES", 64 << 10)  # the block's logits: 3 MB
    vocab = 19385
    model = jaxspec.Model.from_module(jaxspec.Transformer(dataclasses.replace(CFG, vocab_size=vocab),
                                                          rngs=nnx.Rngs(0)))
    assert jaxspec.generate(model, prompts, **opts).tokens == jaxspec.generate(model, prompts, max_new_tokens=6).tokens
    greedy_programs = list(model.compiled.values())
    assert len(greedy_programs) == 2
    for program in greedy_programs:
        assert vocab_buffers(program, vocab) == {f"f32[2,{vocab}]"}
    jaxspec.generate(model, prompts, temperature=1.0, **opts)
    (sampled,) = [p for p in model.compiled.values() if all(p is not g for g in greedy_programs)]
    assert any(s.startswith("f32[2,") and s.count(",") == 2 for s in vocab_buffers(sampled, vocab))
