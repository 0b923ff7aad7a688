"""A prompt prefilled in chunks (`jaxspec.decoding.prefill`): the same continuation as the
llama2.c reference, for the target and for a drafter's own prefill, whatever the chunk size."""

from __future__ import annotations

import pytest

import jaxspec
from jaxspec.decoding import prefill
from stories import CASES, CHECKPOINT, needs_stories


@needs_stories
def test_a_prompt_prefilled_in_chunks_continues_as_the_reference(monkeypatch):
    """The reference's prompt and its first 80 greedy tokens (105 tokens: seven chunks of 16)
    continue with the reference's next tokens; beside a short row in one batch (its own count:
    its chunks stop where its prompt does)."""
    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 16)
    model = jaxspec.load(str(CHECKPOINT))  # (its own program table: programs traced at this chunk size)
    case = CASES[2]
    prompt = case["prompt"] + case["greedy"][:80]
    out = jaxspec.generate(model, prompt, max_new_tokens=16, stop_at_eos=False)
    assert out.tokens == case["greedy"][80:96]
    both = jaxspec.generate(model, [prompt, CASES[1]["prompt"]], max_new_tokens=16, stop_at_eos=False)
    assert both.tokens == [case["greedy"][80:96], CASES[1]["greedy"][:16]]
    streamed = jaxspec.stream(model, prompt, max_new_tokens=16, stop_at_eos=False)
    assert sum((c.tokens for c in streamed), []) == case["greedy"][80:96]


@pytest.mark.parametrize("chunk", [16, 128])
def test_a_drafter_prefilled_in_chunks_drafts_as_in_one(monkeypatch, chunk):
    """pycode-5M's drafter reads a 300-token prompt in chunks (its own prefill beside the
    target's): greedy's tokens, and the same steps at every chunk size (the drafts are the same)."""
    monkeypatch.setattr(prefill, "PREFILL_CHUNK", chunk)
    model = jaxspec.load("pycode-5M")
    ids = model.tokenizer.encode("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n" * 30)[:300]
    greedy = jaxspec.generate(model, ids, max_new_tokens=32, stop_at_eos=False)
    drafted = jaxspec.generate(model, ids, max_new_tokens=32, stop_at_eos=False, method="speculative", draft_len=4)
    assert drafted.tokens == greedy.tokens and drafted.steps < 32
    monkeypatch.setattr(prefill, "PREFILL_CHUNK", 512)  # one forward over the whole prompt
    whole = jaxspec.generate(jaxspec.load("pycode-5M"), ids, max_new_tokens=32, stop_at_eos=False,
                             method="speculative", draft_len=4)
    assert whole.tokens == drafted.tokens and whole.steps == drafted.steps
