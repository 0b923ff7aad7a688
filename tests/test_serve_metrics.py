"""`jaxspec serve` as vLLM serves (issue 42): `/metrics`, `--log-requests`, `/tokenize`,
`/detokenize`, `/v1/models/{id}`, vLLM's flag spellings and vLLM's no-op request fields.

The metrics are checked against what the responses themselves say: request counts against the
requests sent, token counters against the sum of their `usage`, decoding steps and accepted
tokens against each answer's `jaxspec` extension (its `steps` and the engine's accept
histogram), the draft tokens against the token tree of the lookahead options asked for.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import jaxspec
from jaxspec import cli
from jaxspec.chat import chat_prompt
from jaxspec.checkpoint.chat_template import ChatTemplate
from jaxspec.serving import make_server
from jaxspec.serving.app import background
from jaxspec.serving.guard import Limits

MODEL_ID = "pycode-5M"
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n    def push(self, x):", "for i in range(10):"]
# the lookahead setting of the spec-decode checks: its window is not verified, so each step's
# draft tokens are the pool's guesses x (ngram - 1) (jaxspec/decoding/sources/pool.py)
LOOKAHEAD = {"window": 4, "ngram": 3, "guesses": 4, "verify_window": False}
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
CHAT = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def model():
    model = jaxspec.load()
    # a chat template, so chat requests work on the default model (its tokenizer has none)
    tokenizer = copy.copy(model.tokenizer)
    tokenizer.chat_template = ChatTemplate(TEMPLATE)
    tokenizer.special_texts = ("<|im_end|>",)  # (what chat content may not spell: the base model has none)
    return dataclasses.replace(model, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def server(model):
    srv = make_server(model, MODEL_ID, method="autoregressive", slots=2, context=128, chunk_steps=3)
    with background(srv) as url:
        srv.url, srv.base = url, url[:-3]
        yield srv


def post(server, path: str, body, **kw) -> httpx.Response:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.base + path, content=data, headers={"content-type": "application/json"}, timeout=300,
                      **kw)


def stream(server, path: str, body) -> tuple[list[dict], httpx.Headers]:
    with httpx.stream("POST", server.base + path, json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line]
        headers = r.headers
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[6:]) for line in lines[:-1]], headers


def assert_error(response: httpx.Response, status: int, param=None, code=None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error["message"]


def scrape(server) -> dict[tuple, float]:
    """Every sample of /metrics, parsed by prometheus_client: (name, sorted labels) -> value."""
    r = httpx.get(server.base + "/metrics", timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def emitted(histogram: list[int]) -> tuple[int, int]:
    """(decoding steps, accepted draft tokens) of an accept histogram (steps that emitted k tokens)."""
    return sum(histogram), sum(max(k - 1, 0) * n for k, n in enumerate(histogram))


# ----------------------------------------------------------------------------- /metrics
def test_metrics_count_what_was_sent_and_what_the_answers_say(server):
    before = scrape(server)
    answers = {"/v1/completions": [], "/v1/chat/completions": []}  # (usage, finish reasons, extension)
    method_of = []  # (method, extension) per choice
    for i, limit in enumerate((8, 12, 16)):  # greedy, whole
        r = post(server, "/v1/completions", {"model": MODEL_ID, "prompt": PROMPTS[i], "max_tokens": limit})
        body = r.json()
        answers["/v1/completions"].append((body["usage"], [c["finish_reason"] for c in body["choices"]]))
        method_of.append(("autoregressive", body["jaxspec"]))
    for i in range(2):  # greedy, streamed (usage in the last chunk)
        chunks, _ = stream(server, "/v1/completions", {"model": MODEL_ID, "prompt": PROMPTS[i], "max_tokens": 10,
                                                       "stream": True, "stream_options": {"include_usage": True}})
        finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][0]
        answers["/v1/completions"].append((chunks[-1]["usage"], [finish["choices"][0]["finish_reason"]]))
        method_of.append(("autoregressive", finish["jaxspec"]))
    for i in range(2):  # lookahead, whole
        r = post(server, "/v1/completions", {"model": MODEL_ID, "prompt": PROMPTS[i], "max_tokens": 24,
                                             "method": "lookahead", "method_options": LOOKAHEAD})
        body = r.json()
        answers["/v1/completions"].append((body["usage"], [c["finish_reason"] for c in body["choices"]]))
        method_of.append(("lookahead", body["jaxspec"]))
    r = post(server, "/v1/chat/completions", {"model": MODEL_ID, "messages": CHAT, "max_tokens": 9})
    body = r.json()
    answers["/v1/chat/completions"].append((body["usage"], [body["choices"][0]["finish_reason"]]))
    method_of.append(("autoregressive", body["jaxspec"]))
    chunks, _ = stream(server, "/v1/chat/completions", {"model": MODEL_ID, "messages": CHAT, "max_tokens": 7,
                                                        "stream": True, "stream_options": {"include_usage": True}})
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][0]
    answers["/v1/chat/completions"].append((chunks[-1]["usage"], [finish["choices"][0]["finish_reason"]]))
    method_of.append(("autoregressive", finish["jaxspec"]))
    # refused: 2 x 400 and a 404 on completions, a 400 on chat (none of them decodes)
    assert_error(post(server, "/v1/completions", {"model": MODEL_ID, "prompt": "x", "max_tokens": 0}), 400)
    assert_error(post(server, "/v1/completions", {"model": MODEL_ID, "prompt": "x", "top_a": 0.1}), 400, "top_a")
    assert_error(post(server, "/v1/completions", {"model": "gpt-4", "prompt": "x"}), 404, "model")
    assert_error(post(server, "/v1/chat/completions", {"model": MODEL_ID, "messages": []}), 400, "messages")
    after = scrape(server)

    assert delta(before, after, "jaxspec:requests_total", endpoint="/v1/completions", status="200") == 7
    assert delta(before, after, "jaxspec:requests_total", endpoint="/v1/completions", status="400") == 2
    assert delta(before, after, "jaxspec:requests_total", endpoint="/v1/completions", status="404") == 1
    assert delta(before, after, "jaxspec:requests_total", endpoint="/v1/chat/completions", status="200") == 2
    assert delta(before, after, "jaxspec:requests_total", endpoint="/v1/chat/completions", status="400") == 1
    for endpoint, sent in answers.items():
        assert delta(before, after, "jaxspec:prompt_tokens_total", endpoint=endpoint) == \
            sum(u["prompt_tokens"] for u, _ in sent)
        assert delta(before, after, "jaxspec:generation_tokens_total", endpoint=endpoint) == \
            sum(u["completion_tokens"] for u, _ in sent)
        assert delta(before, after, "jaxspec:request_generation_tokens_sum", endpoint=endpoint) == \
            sum(u["completion_tokens"] for u, _ in sent)
        for reason in ("stop", "length"):
            assert delta(before, after, "jaxspec:request_success_total", endpoint=endpoint,
                         finished_reason=reason) == sum(r.count(reason) for _, r in sent)
        for histogram in ("e2e_request_latency_seconds", "time_to_first_token_seconds", "request_queue_time_seconds",
                          "request_prompt_tokens"):
            assert delta(before, after, f"jaxspec:{histogram}_count", endpoint=endpoint) == len(sent)
        assert delta(before, after, "jaxspec:time_per_output_token_seconds_count", endpoint=endpoint) == \
            sum(u["completion_tokens"] > 1 for u, _ in sent)
        assert delta(before, after, "jaxspec:e2e_request_latency_seconds_sum", endpoint=endpoint) > 0

    # decoding work, per method, from each answer's own steps and accept histogram
    for method in ("autoregressive", "lookahead"):
        mine = [ext for m, ext in method_of if m == method]
        steps = sum(ext["steps"] - 1 for ext in mine)  # (steps: the prefill included)
        assert steps == sum(emitted(ext["accept_histogram"])[0] for ext in mine)
        accepted = sum(emitted(ext["accept_histogram"])[1] for ext in mine)
        assert delta(before, after, "jaxspec:decode_steps_total", method=method) == steps
        if method == "autoregressive":
            assert accepted == 0 and delta(before, after, "jaxspec:spec_decode_num_drafts_total", method=method) == 0
            assert after[("jaxspec:mean_accepted_length", (("method", method),))] == 1.0
            continue
        # every token came from the prefill, a step's root or an accepted draft token (a step
        # that reaches max_tokens may accept past it: the answer keeps max_tokens of them)
        tokens = sum(len(ext["token_ids"]) for ext in mine)
        assert 0 < tokens - len(mine) - steps <= accepted
        assert delta(before, after, "jaxspec:spec_decode_num_accepted_tokens_total", method=method) == accepted
        assert delta(before, after, "jaxspec:spec_decode_num_drafts_total", method=method) == steps
        assert delta(before, after, "jaxspec:spec_decode_num_draft_tokens_total", method=method) == \
            steps * LOOKAHEAD["guesses"] * (LOOKAHEAD["ngram"] - 1)
        per_pos = [delta(before, after, "jaxspec:spec_decode_num_accepted_tokens_per_pos_total", method=method,
                         position=str(p)) for p in range(LOOKAHEAD["ngram"] - 1)]
        assert sum(per_pos) == accepted and per_pos[0] >= per_pos[1]
        # (the only lookahead requests of this server: the gauge is theirs alone)
        assert after[("jaxspec:mean_accepted_length", (("method", method),))] == pytest.approx(
            (steps + accepted) / steps)

    # the slots: all free again; 2 per group, the greedy group and the lookahead one built
    assert after[("jaxspec:num_requests_running", ())] == 0 and after[("jaxspec:num_requests_waiting", ())] == 0
    assert after[("jaxspec:slots_per_group", ())] == 2
    assert after[("jaxspec:slots_total", ())] == 2 * after[("jaxspec:slot_groups", ())] >= 4
    assert delta(before, after, "jaxspec:scheduler_jobs_total", event="completed") == 9


def test_metrics_show_a_request_in_its_slot_and_a_stream_the_client_left(server, monkeypatch):
    from jaxspec.serving.slots import SlotGroup

    advance = SlotGroup.advance
    hold = threading.Event()  # cleared while the test looks: the request stays in its slot however slow the scrape
    hold.set()

    def slowly(group):  # (110 tokens of pycode-5M decode in ~0.1 s: a scrape must find them in their slot)
        time.sleep(0.05)
        hold.wait(60)
        return advance(group)

    monkeypatch.setattr(SlotGroup, "advance", slowly)
    before = scrape(server)
    body = {"model": MODEL_ID, "prompt": PROMPTS[0], "max_tokens": 110, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text": ""' not in line:
                hold.clear()
                break  # decoding: look, then hang up
        try:
            during = scrape(server)
        finally:
            hold.set()
    assert during[("jaxspec:num_requests_running", ())] == 1 and during[("jaxspec:slots_in_use", ())] == 1
    deadline = time.time() + 60
    while time.time() < deadline:
        after = scrape(server)
        if delta(before, after, "jaxspec:requests_total", endpoint="/v1/completions", status="499"):
            break
        time.sleep(0.1)
    assert delta(before, after, "jaxspec:requests_total", endpoint="/v1/completions", status="499") == 1
    assert delta(before, after, "jaxspec:requests_total", endpoint="/v1/completions", status="200") == 0
    assert delta(before, after, "jaxspec:generation_tokens_total", endpoint="/v1/completions") == 0
    deadline = time.time() + 60
    while time.time() < deadline and scrape(server)[("jaxspec:num_requests_running", ())]:
        time.sleep(0.1)
    assert scrape(server)[("jaxspec:num_requests_running", ())] == 0


def test_vllm_names_carry_the_same_counts_with_the_model_name(server):
    """A scraper written for vLLM finds its metric names and `model_name` label; each vllm: sample
    is the sum of jaxspec's over the labels vLLM does not have (endpoint, method)."""
    post(server, "/v1/completions", {"model": MODEL_ID, "prompt": PROMPTS[1], "max_tokens": 5})
    post(server, "/v1/chat/completions", {"model": MODEL_ID, "messages": CHAT, "max_tokens": 3})
    post(server, "/v1/completions", {"model": MODEL_ID, "prompt": PROMPTS[0], "max_tokens": 24,
                                     "method": "lookahead", "method_options": LOOKAHEAD})
    samples = scrape(server)
    ours = {name.removeprefix("jaxspec:") for name, _ in samples if name.startswith("jaxspec:")}
    theirs = [(name, dict(labels)) for name, labels in samples if name.startswith("vllm:")]
    assert theirs and all(labels.get("model_name") == MODEL_ID for _, labels in theirs)
    assert {name.removeprefix("vllm:") for name, _ in theirs} <= ours  # a view of jaxspec's, nothing new

    def total(prefix, name, **labels):
        return sum(v for (n, ls), v in samples.items() if n == prefix + name
                   and all(dict(ls).get(k) == want for k, want in labels.items()))

    for name in ("prompt_tokens_total", "generation_tokens_total", "num_requests_running",
                 "time_to_first_token_seconds_count", "e2e_request_latency_seconds_sum",
                 "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total"):
        assert ("vllm:" + name, (("model_name", MODEL_ID),)) in samples, name
        assert total("vllm:", name) == total("jaxspec:", name), name
    assert total("vllm:", "generation_tokens_total") >= 8
    assert total("vllm:", "request_success_total", finished_reason="length") == \
        total("jaxspec:", "request_success_total", finished_reason="length") >= 2
    assert total("vllm:", "time_to_first_token_seconds_bucket", le="+Inf") == \
        total("jaxspec:", "time_to_first_token_seconds_bucket", le="+Inf")
    assert total("vllm:", "spec_decode_num_draft_tokens_total") > 0
    assert total("vllm:", "spec_decode_num_accepted_tokens_per_pos_total", position="0") == \
        total("jaxspec:", "spec_decode_num_accepted_tokens_per_pos_total", position="0")
    assert not [n for n, _ in theirs if n.endswith("_created")]


def test_each_server_has_its_own_registry(model, server):
    """A second server in the same process registers the same names without a clash, and
    counts only its own requests."""
    other = make_server(model, "other", method="autoregressive", slots=1, context=64, warm=False)
    post(server, "/v1/completions", {"model": MODEL_ID, "prompt": "x", "max_tokens": 2})
    mine = scrape(server)
    theirs = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in text_string_to_metric_families(other.metrics.text().decode()) for s in f.samples}
    assert mine[("jaxspec:requests_total", (("endpoint", "/v1/completions"), ("status", "200")))] >= 1
    assert not [k for k in theirs if k[0] == "jaxspec:requests_total"]
    assert theirs[("jaxspec:slots_per_group", ())] == 1 and theirs[("jaxspec:slot_groups", ())] == 0


# ----------------------------------------------------------------------------- --log-requests
LINE = re.compile(r"^jaxspec: request (\S+) (\S+) method=(\S+) prompt_tokens=(\d+) completion_tokens=(\d+) "
                  r"finish=(\S+) latency_ms=([\d.]+) status=(\d+)( error=\S+)?$")


def test_log_requests_writes_one_line_per_answered_request(server, capsys):
    assert make_server.__kwdefaults__["log_requests"] is False and server.log_requests is False
    post(server, "/v1/completions", {"model": MODEL_ID, "prompt": "x", "max_tokens": 2})
    assert "jaxspec: request" not in capsys.readouterr().err  # off by default
    server.log_requests = True
    try:
        ok = post(server, "/v1/completions", {"model": MODEL_ID, "prompt": PROMPTS[1], "max_tokens": 5}).json()
        chunks, _ = stream(server, "/v1/chat/completions", {"model": MODEL_ID, "messages": CHAT, "max_tokens": 3,
                                                            "stream": True})
        refused = post(server, "/v1/completions", {"model": MODEL_ID, "prompt": "x", "max_tokens": 500})
        assert refused.status_code == 400
    finally:
        server.log_requests = False
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("jaxspec: request")]
    assert len(lines) == 3, lines
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    ident, endpoint, method, prompt, completion, finish, latency, status, error = parsed[0].groups()
    assert (ident, endpoint, method, status, error) == (ok["id"], "/v1/completions", "autoregressive", "200", None)
    assert (int(prompt), int(completion), finish) == (ok["usage"]["prompt_tokens"], 5, "length")
    assert float(latency) > 0
    ident, endpoint, *_, status, _ = parsed[1].groups()
    assert (ident, endpoint, status) == (chunks[0]["id"], "/v1/chat/completions", "200")
    assert int(parsed[1].group(5)) == len(chunks[-1]["jaxspec"]["token_ids"])
    _, _, method, _, completion, finish, _, status, error = parsed[2].groups()
    assert (method, completion, finish, status, error) == ("-", "0", "-", "400", " error=context_length_exceeded")


# ----------------------------------------------------------------------------- /tokenize, /detokenize, models
def test_tokenize_gives_the_ids_a_completion_decodes_from(model, server):
    prompt = "class Stack:    def push(self, x):"  # (no newline: a byte piece, <0x0A>, spells no text)
    r = post(server, "/tokenize", {"model": MODEL_ID, "prompt": prompt})
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) == {"count", "max_model_len", "tokens"}
    assert out["tokens"] == model.tokenizer.encode(prompt) and out["count"] == len(out["tokens"])
    assert out["max_model_len"] == 128
    used = post(server, "/v1/completions", {"model": MODEL_ID, "prompt": prompt, "max_tokens": 1}).json()
    assert used["usage"]["prompt_tokens"] == out["count"]
    # without the BOS the tokenizer adds; the pieces spell the prompt
    bare = post(server, "/tokenize", {"prompt": prompt, "add_special_tokens": False, "return_token_strs": True})
    assert bare.json()["tokens"] == out["tokens"][1:]
    assert "".join(bare.json()["token_strs"]).replace("\u2581", " ") == prompt
    # round trip
    back = post(server, "/detokenize", {"model": MODEL_ID, "tokens": bare.json()["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": prompt}


def test_tokenize_messages_as_a_chat_completion_does(model, server):
    out = post(server, "/tokenize", {"model": MODEL_ID, "messages": CHAT}).json()
    assert out["tokens"] == chat_prompt(model, CHAT)
    used = post(server, "/v1/chat/completions", {"model": MODEL_ID, "messages": CHAT, "max_tokens": 1}).json()
    assert used["usage"]["prompt_tokens"] == out["count"]
    plain = post(server, "/tokenize", {"messages": CHAT, "add_generation_prompt": False}).json()
    assert plain["tokens"] == model.tokenizer.encode("user: def add(a, b):\n", add_special_tokens=False)
    assert plain["count"] < out["count"]
    framed = post(server, "/tokenize", {"messages": CHAT, "add_special_tokens": True}).json()
    assert framed["tokens"] == [model.tokenizer.bos_id] + out["tokens"]


@pytest.mark.parametrize("path,body,status,param,code", [
    ("/tokenize", {"model": MODEL_ID}, 400, "prompt", None),
    ("/tokenize", {"prompt": [1, 2, 3]}, 400, "prompt", None),
    ("/tokenize", {"prompt": "x", "truncate": 3}, 400, "truncate", "unknown_parameter"),
    ("/tokenize", {"model": "gpt-4", "prompt": "x"}, 404, "model", "model_not_found"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, 400, "add_special_tokens", None),
    ("/tokenize", {"messages": "hi"}, 400, "messages", None),
    ("/tokenize", {"messages": [{"role": "user", "content": "x<|im_end|>"}]}, 400, "messages",
     "special_token_in_content"),
    ("/tokenize", [1], 400, None, None),
    ("/tokenize", b"{", 400, None, None),
    ("/detokenize", {"model": MODEL_ID}, 400, "tokens", None),
    ("/detokenize", {"tokens": [1, -1]}, 400, "tokens", None),
    ("/detokenize", {"tokens": [1, 4096]}, 400, "tokens", None),
    ("/detokenize", {"tokens": [True]}, 400, "tokens", None),
    ("/detokenize", {"tokens": "1 2"}, 400, "tokens", None),
    ("/detokenize", {"tokens": [1], "prompt": "x"}, 400, "prompt", "unknown_parameter"),
    ("/detokenize", {"model": "gpt-4", "tokens": [1]}, 404, "model", "model_not_found"),
])
def test_bad_tokenize_and_detokenize_bodies_get_openai_errors(server, path, body, status, param, code):
    assert_error(post(server, path, body), status, param, code)


def test_a_model_by_id(server):
    listed = httpx.get(server.url + "/models").json()["data"][0]
    r = httpx.get(server.url + f"/models/{MODEL_ID}")
    assert r.status_code == 200 and r.json() == listed
    message = assert_error(httpx.get(server.url + "/models/gpt-4"), 404, "model", "model_not_found")
    assert "gpt-4" in message


def test_a_model_id_with_a_slash_is_found(model):
    """Hugging Face ids have a slash: `/v1/models/org/name` is that model, not a route of its own."""
    from starlette.testclient import TestClient

    server = make_server(model, "org/name", method="autoregressive", slots=1, context=64, warm=False,
                         limits=Limits(allowed_hosts=("*",)))
    client = TestClient(server.app())  # (no lifespan: the scheduler never started, nothing to stop)
    assert client.get("/v1/models/org/name").json()["id"] == "org/name"
    assert_error(client.get("/v1/models/org/other"), 404, "model", "model_not_found")
    assert client.get("/metrics").status_code == 200


# ----------------------------------------------------------------------------- vLLM's request fields
VLLM_NOOPS = {"use_beam_search": False, "skip_special_tokens": True, "spaces_between_special_tokens": True,
              "include_stop_str_in_output": False, "min_tokens": 0, "priority": 0, "request_id": "abc-1",
              "length_penalty": 1.0, "guided_json": None, "bad_words": [], "cache_salt": "s"}


def test_vllm_fields_that_change_nothing_are_accepted_with_a_warning(server):
    body = {"model": MODEL_ID, "prompt": PROMPTS[3], "max_tokens": 6}
    plain = post(server, "/v1/completions", body)
    extra = post(server, "/v1/completions", {**body, **VLLM_NOOPS})
    assert plain.status_code == extra.status_code == 200, extra.text
    assert "warning" not in plain.headers
    warning = extra.headers["warning"]
    assert warning.startswith('299 - "') and warning.endswith('"')
    assert all(name in warning for name in VLLM_NOOPS)
    assert extra.json()["jaxspec"]["token_ids"] == plain.json()["jaxspec"]["token_ids"]
    chat = {"model": MODEL_ID, "messages": CHAT, "max_tokens": 4}
    r = post(server, "/v1/chat/completions", {**chat, "add_generation_prompt": True, "echo": False,
                                              "continue_final_message": False, "chat_template_kwargs": {}})
    assert r.status_code == 200 and "add_generation_prompt" in r.headers["warning"]
    assert r.json()["jaxspec"]["token_ids"] == post(server, "/v1/chat/completions", chat).json()["jaxspec"]["token_ids"]
    _, headers = stream(server, "/v1/completions", {**body, "stream": True, "use_beam_search": False})
    assert "use_beam_search" in headers["warning"]


@pytest.mark.parametrize("path,field,value", [
    ("/v1/completions", "use_beam_search", True), ("/v1/completions", "min_tokens", 4),
    ("/v1/completions", "include_stop_str_in_output", True), ("/v1/completions", "skip_special_tokens", False),
    ("/v1/completions", "guided_regex", "[0-9]+"), ("/v1/completions", "priority", 1),
    ("/v1/completions", "add_special_tokens", False), ("/v1/completions", "request_id", 7),
    ("/v1/completions", "allowed_token_ids", [1, 2]), ("/v1/completions", "truncate_prompt_tokens", 3),
    ("/v1/completions", "use_beam_search", 0), ("/v1/chat/completions", "add_generation_prompt", False),
    ("/v1/chat/completions", "add_special_tokens", True), ("/v1/chat/completions", "echo", True),
    ("/v1/chat/completions", "chat_template", "{{ messages }}"), ("/v1/chat/completions", "best_of", 2),
])
def test_vllm_fields_that_would_change_the_answer_are_refused_by_name(server, path, field, value):
    body = {"model": MODEL_ID, "max_tokens": 2, field: value,
            **({"messages": CHAT} if "chat" in path else {"prompt": "x"})}
    message = assert_error(post(server, path, body), 400, field, "unsupported_parameter")
    assert field in message


# ----------------------------------------------------------------------------- vLLM's flag spellings
def test_serve_help_lists_vllms_flag_spellings(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for flag in ("--max-model-len", "--max-num-seqs", "--served-model-name", "--host", "--port", "--seed",
                 "--log-requests", "--disable-log-requests", "--api-key"):
        assert flag in text, flag


def test_vllms_flag_spellings_parse_to_the_same_settings():
    parse = cli.build_parser().parse_args
    vllm = parse(["serve", "--max-model-len", "512", "--max-num-seqs", "3", "--served-model-name", "m",
                  "--seed", "7", "--disable-log-requests"])
    ours = parse(["serve", "--context", "512", "--slots", "3", "--served-model-name", "m", "--seed", "7"])
    assert vars(vllm) == vars(ours)
    assert (ours.context, ours.slots, ours.served_model_name, ours.seed, ours.log_requests) == (512, 3, "m", 7, False)
    assert parse(["serve", "--log-requests"]).log_requests is True
    assert parse(["serve", "--log-requests", "--disable-log-requests"]).log_requests is False
    defaults = parse(["serve"])
    assert (defaults.log_requests, defaults.seed, defaults.slots, defaults.context) == (False, None, 8, None)
    assert parse(["generate", "--prompt", "x"]).seed == 0  # (generate's --seed is its own, unchanged)


def test_cli_serves_with_vllms_flags():
    """`jaxspec serve` started with vLLM's spellings: the id, context and slots it reports, one
    log line per answered request, and the seeds of unseeded requests drawn from --seed."""
    env = {**os.environ, "JAXSPEC_COMPILE_CACHE": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "jaxspec", "serve", "--port", "0", "--method", "greedy",
                             "--max-model-len", "96", "--max-num-seqs", "1", "--served-model-name", "tiny",
                             "--log-requests", "--seed", "7", "--quiet"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            if "serving" in line:
                url = line.split(" at ")[1].split()[0]
                break
        else:
            raise AssertionError(f"the server did not start (exit {proc.wait()})")
        card = httpx.get(url + "/models/tiny", timeout=30).json()
        assert (card["id"], card["max_model_len"]) == ("tiny", 96)
        assert httpx.get(url.removesuffix("/v1") + "/health", timeout=30).json()["slots"] == 1
        answers = [httpx.post(url + "/completions", json={"model": "tiny", "prompt": "def f(x):", "max_tokens": 3},
                              timeout=120).json() for _ in range(2)]
        rng = np.random.default_rng(7)  # (greedy requests get a seed too: it is reported, and replays them)
        assert [a["jaxspec"]["seed"] for a in answers] == [int(rng.integers(0, 2**32)) for _ in range(2)]
        logged = []
        for line in proc.stderr:  # (the lines are written before each answer is sent)
            if line.startswith("jaxspec: request"):
                logged.append(LINE.match(line.strip()))
                if len(logged) == 2:
                    break
        assert [m.group(1) for m in logged] == [a["id"] for a in answers]
        assert all(m.group(2) == "/v1/completions" and m.group(8) == "200" for m in logged)
    finally:
        proc.terminate()
        proc.wait(60)
