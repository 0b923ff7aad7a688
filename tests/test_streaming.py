"""`jaxspec.stream`: the same tokens as `generate`, chunk by chunk, from two compiled programs."""

from __future__ import annotations

import pytest

import jaxspec

PROMPT = "def fibonacci(n):"
NEW = 40


@pytest.fixture(scope="module")
def model():
    return jaxspec.load()  # the shipped default model (it has a tokenizer)


@pytest.mark.parametrize("method,options", [
    ("autoregressive", {}),
    ("lookahead", dict(window=5, ngram=3, guesses=5)),
    ("lookahead", dict(window=5, ngram=3, guesses=5, temperature=0.9, seed=7)),
])
def test_stream_equals_generate(model, method, options):
    expected = jaxspec.generate(model, PROMPT, max_new_tokens=NEW, method=method, stop_at_eos=False, **options)
    live = jaxspec.stream(model, PROMPT, max_new_tokens=NEW, method=method, stop_at_eos=False, chunk_steps=3,
                          **options)
    chunks = list(live)
    assert [t for c in chunks for t in c.tokens] == expected.tokens
    assert "".join(c.text for c in chunks) == expected.text
    assert live.result.tokens == expected.tokens and live.result.steps == expected.steps
    assert live.result.extras["accept_histogram"] == expected.extras["accept_histogram"]
    assert len(chunks) == -(-(expected.steps - 1) // 3)  # one chunk per 3 steps after the prefill's
    per_step = len(expected.extras["accept_histogram"]) - 1  # the most tokens one step emits
    assert len(chunks[0].tokens) <= 1 + 3 * per_step  # (the first chunk also has the prefill's token)
    assert all(len(c.tokens) <= 3 * per_step for c in chunks[1:])


def test_chunks_reuse_one_compiled_program(model):
    first = jaxspec.stream(model, PROMPT, max_new_tokens=NEW, chunk_steps=2, stop_at_eos=False)
    list(first)
    programs = set(model.compiled)
    again = jaxspec.stream(model, PROMPT + " ", max_new_tokens=NEW, chunk_steps=5, stop_at_eos=False)
    list(again)
    assert again.result.compile_seconds == 0  # same shapes: begin and advance come from the cache
    assert set(model.compiled) == programs
    assert {k[0] for k in programs} >= {"begin", "advance"}


def test_stream_rejects_a_batch_and_bad_chunks(model):
    with pytest.raises(jaxspec.PromptError, match="one prompt"):
        jaxspec.stream(model, [PROMPT, PROMPT])
    with pytest.raises(jaxspec.GenerationError, match="chunk_steps"):
        jaxspec.stream(model, PROMPT, chunk_steps=0)
