"""`jaxspec serve`'s n, logprobs / top_logprobs, penalties and min_p, through the `openai` client.

Every answer is compared with `jaxspec.generate` run alone with the same arguments (whose
penalties, min-p and logprobs are checked against independent references in
test_penalties_logprobs): the server's slots and the methods change nothing.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import openai
import pytest

import jaxspec
from jaxspec.checkpoint.chat_template import ChatTemplate
from jaxspec.serving import make_server
from jaxspec.serving.app import background

MODEL_ID = "pycode-5M"
PROMPT = "def fibonacci(n):"
PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.3)


@pytest.fixture(scope="module")
def model():
    model = jaxspec.load()
    # a chat template, so chat's logprobs can be asked for too (the base model has none)
    tokenizer = copy.copy(model.tokenizer)
    tokenizer.chat_template = ChatTemplate("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    return dataclasses.replace(model, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def server(model):
    # (each method x greedy / sampled x penalties / logprobs is a plan of its own)
    srv = make_server(model, MODEL_ID, method="autoregressive", slots=4, context=256, chunk_steps=3, max_plans=16)
    with background(srv) as url:
        srv.url = url
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def alone(model, server, prompt, n, **kwargs) -> jaxspec.GenerateOutput:
    return jaxspec.generate(model, prompt, max_new_tokens=n, stop_ids=server.requests.eos_ids, **kwargs)


@pytest.mark.parametrize("method", ["autoregressive", "lookahead"])
def test_completion_logprobs_are_the_targets_whatever_the_method(model, server, client, method):
    r = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=24, logprobs=3,
                                  extra_body={"method": method})
    ref = alone(model, server, PROMPT, 24, method=method, logprobs=3)
    choice = r.choices[0]
    assert r.model_extra["jaxspec"]["token_ids"] == ref.tokens
    lp = choice.logprobs
    np.testing.assert_allclose(lp.token_logprobs, [t["logprob"] for t in ref.logprobs], atol=1e-4)
    assert all(len(top) == 3 for top in lp.top_logprobs)
    assert "".join(lp.tokens) == choice.text  # each token's text is what it adds
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(lp.tokens))]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert max(top.values()) >= value - 1e-6  # the top-3 hold the most likely tokens


def test_chat_logprobs_and_top_logprobs_stream_as_they_come(model, server, client):
    messages = [{"role": "user", "content": "def add(a, b):"}]
    whole = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=20, logprobs=True,
                                           top_logprobs=2)
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content).startswith(whole.choices[0].message.content)
    assert all(len(t.top_logprobs) == 2 and bytes(t.bytes).decode() == t.token for t in content)
    ids = whole.model_extra["jaxspec"]["token_ids"]
    ref = alone(model, server, model.tokenizer.encode_chat(messages), 20, logprobs=2)
    np.testing.assert_allclose([t.logprob for t in content], [t["logprob"] for t in ref.logprobs][:len(ids)],
                               atol=1e-4)
    streamed = [t for chunk in client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=20,
                                                              logprobs=True, top_logprobs=2, stream=True)
                if chunk.choices and chunk.choices[0].logprobs for t in chunk.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    np.testing.assert_allclose([t.logprob for t in streamed], [t.logprob for t in content], atol=1e-6)
    plain = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=20)
    assert plain.choices[0].logprobs is None


def test_n_choices_are_n_seeds(model, server, client):
    r = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=24, n=3, temperature=0.9, seed=40,
                                  extra_body={"method": "lookahead"})
    assert [c.index for c in r.choices] == [0, 1, 2]
    ids = [c.model_extra["jaxspec"]["token_ids"] for c in r.choices]
    for i, row in enumerate(ids):
        assert row == alone(model, server, PROMPT, 24, method="lookahead", temperature=0.9, seed=40 + i).tokens
    assert len({tuple(row) for row in ids}) == 3
    assert r.usage.completion_tokens == sum(map(len, ids))
    texts = {0: "", 1: "", 2: ""}
    for chunk in client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=24, n=3, temperature=0.9,
                                           seed=40, stream=True, extra_body={"method": "lookahead"}):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert [texts[i] for i in range(3)] == [c.text for c in r.choices]


@pytest.mark.parametrize("method", ["autoregressive", "lookahead", "prompt-lookup"])
def test_penalties_and_min_p_equal_generate_alone(model, server, client, method):
    greedy = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=32, extra_body={
        "method": method, **PENALTIES})
    ref = alone(model, server, PROMPT, 32, method=method, **PENALTIES)
    assert greedy.model_extra["jaxspec"]["token_ids"] == ref.tokens
    assert ref.tokens != alone(model, server, PROMPT, 32).tokens  # the penalties change this output
    sampled = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=32, temperature=1.0, seed=3,
                                        extra_body={"method": method, "min_p": 0.1, **PENALTIES})
    ref = alone(model, server, PROMPT, 32, method=method, temperature=1.0, seed=3, min_p=0.1, **PENALTIES)
    assert sampled.model_extra["jaxspec"]["token_ids"] == ref.tokens


@pytest.mark.parametrize("body, param", [
    ({"n": 5}, "n"),  # more choices than slots
    ({"logprobs": 21}, "logprobs"),
    ({"min_p": 1.5}, "min_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
])
def test_out_of_range_values_get_openai_errors(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4, extra_body=body)
    assert e.value.body["param"] == param


def test_top_logprobs_without_logprobs_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       top_logprobs=2)


def test_vllms_top_k_minus_one_is_off_and_continuous_usage_counts_as_it_goes(model, server, client):
    """LangChain's vLLM client sends top_k = -1 (vLLM's "off") by default."""
    off = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=16, temperature=0.8, seed=9,
                                    extra_body={"top_k": -1})
    assert off.model_extra["jaxspec"]["token_ids"] == alone(model, server, PROMPT, 16, temperature=0.8, seed=9).tokens
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4, extra_body={"top_k": -2})
    chunks = list(client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=16, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"stream_options": {"include_usage": True,
                                                                           "continuous_usage_stats": True}}))
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == chunks[-1].usage.completion_tokens > 0 and len(set(counts)) > 1
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in chunks)
