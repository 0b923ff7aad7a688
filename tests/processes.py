"""Tests that start several jaxspec processes on this machine (a multi-process JAX run over
gloo): a free coordinator port, and the processes run to the end or killed."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(argvs: list[list[str]], env: dict | list[dict], timeout: float) -> list[tuple[int, str, str]]:
    """Start every command at once (`env`: one for all, or one each), wait up to `timeout`
    seconds in all; (return code, stdout, stderr) of each. A process still running when this
    returns or raises (a timeout, a peer that never connected) is killed: none outlives the test."""
    envs = env if isinstance(env, list) else [env] * len(argvs)
    procs = []
    try:
        for argv, e in zip(argvs, envs, strict=True):
            procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + timeout
        outputs = [p.communicate(timeout=max(deadline - time.monotonic(), 1)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
