"""Tests that start several jaxspec processes on this machine (a multi-process JAX run over
gloo): a free coordinator port, and the processes run to the end or killed."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def cpu_env(devices: int, **extra: str) -> dict:
    """This process's environment for a JAX process on `devices` forced CPU devices: the
    session's XLA flags (conftest's) kept, the device count added, and the repository root on
    the path as pytest's own (a worker script under tests/ imports `benchmarks`)."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu", PYTHONPATH=path, **extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(argvs: list[list[str]], env: dict | list[dict], timeout: float) -> list[tuple[int, str, str]]:
    """Start every command at once (`env`: one for all, or one each), wait up to `timeout`
    seconds in all; (return code, stdout, stderr) of each. A process still running at the
    deadline is killed (its code is then -9) and what it wrote so far is returned: none
    outlives the test.

    Output goes to files, not pipes: a pipe nobody reads fills at 64 KiB and blocks its writer,
    and a peer blocked on a write stalls the whole group at its next collective."""
    envs = env if isinstance(env, list) else [env] * len(argvs)
    with tempfile.TemporaryDirectory() as tmp:
        procs, files = [], []
        try:
            for i, (argv, e) in enumerate(zip(argvs, envs, strict=True)):
                out, err = open(f"{tmp}/{i}.out", "w+"), open(f"{tmp}/{i}.err", "w+")
                files.append((out, err))
                procs.append(subprocess.Popen(argv, env=e, stdout=out, stderr=err, text=True))
            deadline = time.monotonic() + timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        results = []
        for p, (out, err) in zip(procs, files):
            out.seek(0), err.seek(0)
            results.append((p.returncode, out.read(), err.read()))
            out.close(), err.close()
    return results


def check_all_succeeded(finished: list[tuple[int, str, str]]) -> None:
    """Fail with every failed command's own error (numbered as started): a peer that died shows
    up in the others only as lost heartbeats, so the first failure listed is often not the cause."""
    failed = [f"command {i} exited {code}:\n{err[-3000:]}" for i, (code, _, err) in enumerate(finished) if code != 0]
    assert not failed, "\n\n".join(failed)
