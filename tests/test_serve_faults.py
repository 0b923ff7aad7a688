"""`jaxspec serve` under load and faults, a small form of benchmarks/serve_faults.py (loopback,
bounded): concurrent streaming clients, clients that hang up mid-stream, bad requests and bodies
that never finish arriving, all at once. Every completed answer equals `jaxspec.generate`
alone, nothing is lost, every bad request gets a 4xx in OpenAI's shape, every slow body a 408,
and /health's counters add up afterwards (submitted = completed + cancelled, nothing running).
"""

from __future__ import annotations

import asyncio
import time

import httpx

import jaxspec
from benchmarks import serve_faults
from jaxspec.serving import make_server
from jaxspec.serving.app import background
from jaxspec.serving.guard import Limits


def test_load_with_disconnects_bad_and_slow_requests_loses_nothing():
    model = jaxspec.load()
    server = make_server(model, "pycode-5M", method="autoregressive", slots=4, context=256, chunk_steps=3,
                         limits=Limits(body_timeout_s=1.0, header_timeout_s=1.0))
    requests = serve_faults.plan(48, seed=3)
    kinds = {r["kind"] for r in requests}
    assert kinds == {"good", "hang_up", "bad", "slow"}, kinds  # the draw has every fault
    refs = serve_faults.references(model, [r for r in requests if r["kind"] == "good"], server.requests.eos_ids)
    t0 = time.monotonic()
    with background(server) as url:
        results = asyncio.run(serve_faults.drive(url, "pycode-5M", requests, clients=8))
        deadline = time.monotonic() + 10
        while (health := httpx.get(url[:-3] + "/health").json())["running"] and time.monotonic() < deadline:
            time.sleep(0.1)
    assert time.monotonic() - t0 < 60
    assert not [r for r in results if r.get("status") == -1], [r for r in results if r.get("status") == -1]
    summary = serve_faults.check(requests, results, refs)
    assert summary["good"] > 20 and summary["hang_ups"] > 0 and summary["bad"] > 0 and summary["slow"] > 0
    assert summary["answered"] == summary["exact"] == summary["good"], summary  # nothing lost, nothing wrong
    assert summary["bad_4xx_shaped"] == summary["bad"] and summary["slow_408"] == summary["slow"], summary
    assert health["running"] == 0 and health["waiting"] == 0
    assert health["submitted"] == health["completed"] + health["cancelled"] + health.get("failed", 0), health
    assert health["completed"] >= summary["good"] and health["submitted"] == summary["good"] + summary["hang_ups"]
