"""`jaxspec serve` under load and faults (issue 41): concurrent streaming clients, clients that
hang up mid-stream, bad requests, bodies that never finish arriving. Every completed answer
must equal `jaxspec.generate` alone; nothing may be lost; the counters must add up; RSS must
level off.

    python -m benchmarks.serve_faults                 # 600 requests, 16 clients, pycode-5M
    python -m benchmarks.serve_faults --requests 60   # a quick look

The server runs in this process (`jaxspec.serving.app.background`, loopback only), so its RSS
is this process's. Results: benchmarks/results/serve_faults.{json,md}. `drive` is also
tests/test_serve_faults.py's load (a smaller form).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import sys
import time
from pathlib import Path

import httpx

PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n    def push(self, x):", "for i in range(10):",
           "def parse(s):\n    '''Parse a config line.", "x = [", "print(", "def main():\n    args ="]
BUDGETS = (8, 16, 24)
BAD_BODIES = [b"[" * 20_000, b'{"model": "pycode-5M", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
              b'{"model": "pycode-5M", "prompt": "x", "top_k": 2147483648}', b'{"model": "pycode-5M", "prompt": ""}',
              b'{"model": "pycode-5M", "prompt": "x", "stop": {}}', b"not json",
              b'{"model": "pycode-5M", "prompt": "x", "method": "speculative", '
              b'"method_options": {"drafter": "/etc"}}', b'{"model": "other", "prompt": "x"}']
KINDS = ("good", "good", "good", "good", "good", "good", "hang_up", "bad", "slow")  # drawn per request


def rss_mb() -> float:
    """This process's resident set now (Linux: /proc), in MB."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def plan(count: int, seed: int = 0) -> list[dict]:
    """The requests: kind, prompt, budget, streamed or not (a fixed draw for a seed)."""
    rng = random.Random(seed)
    return [{"kind": rng.choice(KINDS), "prompt": rng.choice(PROMPTS), "max_tokens": rng.choice(BUDGETS),
             "stream": rng.random() < 0.5, "bad": rng.choice(BAD_BODIES), "hang_up_after_chunks": rng.randint(1, 3)}
            for _ in range(count)]


def references(model, requests: list[dict], eos_ids) -> dict:
    """`jaxspec.generate` alone for every (prompt, budget) the good requests use."""
    import jaxspec

    keys = {(r["prompt"], r["max_tokens"]) for r in requests}
    return {k: jaxspec.generate(model, k[0], max_new_tokens=k[1], stop_ids=eos_ids).tokens for k in sorted(keys)}


async def _good(client: httpx.AsyncClient, url: str, model_id: str, r: dict) -> dict:
    body = {"model": model_id, "prompt": r["prompt"], "max_tokens": r["max_tokens"], "temperature": 0,
            "stream": r["stream"]}
    t0 = time.perf_counter()
    if not r["stream"]:
        resp = await client.post(url + "/completions", json=body)
        if resp.status_code != 200:
            return {"status": resp.status_code}
        return {"status": 200, "token_ids": resp.json()["jaxspec"]["token_ids"], "seconds": time.perf_counter() - t0}
    final, chunks = None, 0
    async with client.stream("POST", url + "/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return {"status": resp.status_code}
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            chunks += 1
            if r["kind"] == "hang_up" and chunks >= r["hang_up_after_chunks"]:
                return {"status": 200, "hung_up": True}  # leaving the block closes the connection
            if "error" in chunk:
                return {"status": 500}
            if "jaxspec" in chunk:
                final = chunk
    if final is None:
        return {"status": 200, "hung_up": r["kind"] == "hang_up", "truncated": r["kind"] != "hang_up"}
    return {"status": 200, "token_ids": final["jaxspec"]["token_ids"], "seconds": time.perf_counter() - t0}


async def _bad(client: httpx.AsyncClient, url: str, r: dict) -> dict:
    resp = await client.post(url + "/completions", content=r["bad"], headers={"content-type": "application/json"})
    shaped = set(resp.json().get("error", {})) == {"message", "type", "param", "code"}
    return {"status": resp.status_code, "shaped": shaped}


async def _slow(url: str) -> dict:
    """A body that declares 1000 bytes and sends 9: the server must answer 408 and close."""
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\":")
        await writer.drain()
        head = await asyncio.wait_for(reader.read(200), 60)
        return {"status": int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else 0}
    finally:
        writer.close()


async def drive(url: str, model_id: str, requests: list[dict], clients: int) -> list[dict]:
    """Every request, `clients` at a time; each result has the request's kind."""
    queue = list(enumerate(requests))
    results: list[dict | None] = [None] * len(requests)

    async def worker(client):
        while queue:
            i, r = queue.pop(0)
            try:
                if r["kind"] in ("good", "hang_up"):
                    out = await _good(client, url, model_id, r)
                elif r["kind"] == "bad":
                    out = await _bad(client, url, r)
                else:
                    out = await _slow(url)
            except (httpx.HTTPError, OSError, asyncio.TimeoutError) as e:
                out = {"status": -1, "exception": f"{type(e).__name__}: {e}"}
            results[i] = {"kind": r["kind"], **out}

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=clients)) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    return results


def check(requests: list[dict], results: list[dict], refs: dict) -> dict:
    """answered / exact / wrong / lost counts, and latencies of the completed answers."""
    good = [(r, out) for r, out in zip(requests, results) if r["kind"] == "good"]
    answered = [(r, out) for r, out in good if "token_ids" in out]
    exact = sum(out["token_ids"] == refs[(r["prompt"], r["max_tokens"])] for r, out in answered)
    seconds = sorted(out["seconds"] for _, out in answered)
    pct = lambda q: round(1000 * seconds[min(len(seconds) - 1, int(q * len(seconds)))], 1) if seconds else None  # noqa: E731
    bad = [out for r, out in zip(requests, results) if r["kind"] == "bad"]
    slow = [out for r, out in zip(requests, results) if r["kind"] == "slow"]
    hung = [out for r, out in zip(requests, results) if r["kind"] == "hang_up"]
    return {"requests": len(requests), "good": len(good), "answered": len(answered), "exact": exact,
            "wrong": len(answered) - exact, "lost": len(good) - len(answered),
            "hung_up": sum(bool(out.get("hung_up")) or "token_ids" in out for out in hung), "hang_ups": len(hung),
            "bad": len(bad), "bad_4xx_shaped": sum(400 <= out["status"] < 500 and out["shaped"] for out in bad),
            "slow": len(slow), "slow_408": sum(out["status"] == 408 for out in slow),
            "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "serve_faults"))
    args = p.parse_args(argv)

    import jaxspec
    from jaxspec.serving import make_server
    from jaxspec.serving.app import background
    from jaxspec.serving.guard import Limits

    model = jaxspec.load()
    server = make_server(model, "pycode-5M", method="autoregressive", slots=args.slots, context=256,
                         limits=Limits(body_timeout_s=2.0, header_timeout_s=2.0))
    requests = plan(args.requests)
    refs = references(model, [r for r in requests if r["kind"] == "good"], server.requests.eos_ids)
    with background(server) as url:
        warm = plan(2 * args.clients, seed=1)
        asyncio.run(drive(url, "pycode-5M", [{**r, "kind": "good"} for r in warm], args.clients))
        rss_before = rss_mb()
        t0 = time.perf_counter()
        half = len(requests) // 2
        first = asyncio.run(drive(url, "pycode-5M", requests[:half], args.clients))
        rss_half = rss_mb()
        second = asyncio.run(drive(url, "pycode-5M", requests[half:], args.clients))
        seconds = time.perf_counter() - t0
        rss_after = rss_mb()
        time.sleep(1.0)
        health = httpx.get(url[:-3] + "/health").json()
        after = httpx.post(url + "/completions", json={"model": "pycode-5M", "prompt": PROMPTS[0], "max_tokens": 16,
                                                         "temperature": 0}).json()["jaxspec"]["token_ids"]
    result = check(requests, first + second, refs)
    result.update(seconds=round(seconds, 2), clients=args.clients, slots=args.slots,
                  rss_mb_before=round(rss_before, 1), rss_mb_half=round(rss_half, 1), rss_mb_after=round(rss_after, 1),
                  health_after={k: health.get(k, 0) for k in ("running", "waiting", "submitted", "admitted", "completed",
                                                           "cancelled", "failed")},
                  counters_consistent=health.get("submitted", 0) == health.get("completed", 0)
                  + health.get("cancelled", 0) + health.get("failed", 0) and health["running"] == 0
                  and health["waiting"] == 0,
                  answer_after_exact=after == jaxspec.generate(model, PROMPTS[0], max_new_tokens=16,
                                                               stop_ids=server.requests.eos_ids).tokens)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"command": "python -m benchmarks.serve_faults "
                                                   + " ".join(argv or sys.argv[1:]), **result}, indent=1) + "\n")
    md = ["# serve_faults", "", f"`python -m benchmarks.serve_faults {' '.join(argv or sys.argv[1:])}`: pycode-5M, "
          f"greedy, {args.slots} slots, {args.clients} concurrent clients, in-process server on 127.0.0.1.", "",
          "| requests | good | answered | exact | lost | wrong | hung up | bad (4xx, OpenAI shape) | slow bodies (408) "
          "| p50 / p99 ms | RSS MB before / half / after | counters consistent | seconds |",
          "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|",
          f"| {result['requests']} | {result['good']} | {result['answered']} | {result['exact']} | {result['lost']} "
          f"| {result['wrong']} | {result['hung_up']}/{result['hang_ups']} | {result['bad_4xx_shaped']}/{result['bad']} "
          f"| {result['slow_408']}/{result['slow']} | {result['p50_ms']} / {result['p99_ms']} "
          f"| {result['rss_mb_before']} / {result['rss_mb_half']} / {result['rss_mb_after']} "
          f"| {result['counters_consistent']} | {result['seconds']} |", "",
          f"/health afterwards: {result['health_after']}; a new request afterwards equal to generate alone: "
          f"{result['answer_after_exact']}.", ""]
    out.with_suffix(".md").write_text("\n".join(md))
    print(json.dumps(result))
    return 0 if result["lost"] == 0 and result["wrong"] == 0 and result["counters_consistent"] else 1


if __name__ == "__main__":
    sys.exit(main())
