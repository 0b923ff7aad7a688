"""What `jaxspec serve` holds in memory, and why: resident memory (RSS) of a server at its defaults
once it is warm and under 8 concurrent requests, then once the requests that build other slot
groups (penalties, ignore_eos) came; and, in this process, what one compiled program and one
program loaded from the compile cache add (XLA:CPU keeps each executable's code and buffers).

The server runs as a user starts it (`jaxspec serve --model M --port 0`, a fresh compile cache and
auto store, so the warm-up compiles); "warm" is when /health says nothing is compiling. RSS is read
from /proc every 0.2 s while the requests run (peak) and once after them (after).

    python -m benchmarks.serve_memory                       # SmolLM2-135M-Instruct, 8 slots x 2048
    python -m benchmarks.serve_memory --model pycode-5M --name serve_memory_smoke
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import RESULTS, command_line, write_result  # noqa: E402

LOADS = (("requests", {}), ("frequency_penalty", {"frequency_penalty": 0.5}),
         ("ignore_eos", {"ignore_eos": True, "max_tokens": 64}))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) / 1024


class Peak:
    """The largest RSS of `pid` seen while it runs (sampled every 0.2 s)."""

    def __init__(self, pid: int):
        self.pid, self.value, self._stop = pid, rss_mb(pid), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.value = max(self.value, rss_mb(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.value, rss_mb(self.pid))


def serve(model: str, clients: int, max_tokens: int, layer_scan: bool | None = None) -> dict:
    import httpx

    caches = tempfile.mkdtemp(prefix="jaxspec-serve-memory-")
    env = {**os.environ, "JAXSPEC_COMPILE_CACHE": f"{caches}/xla", "JAXSPEC_AUTO_CACHE": f"{caches}/auto"}
    t0 = time.perf_counter()
    scan = [] if layer_scan is None else ["--layer-scan" if layer_scan else "--no-layer-scan"]
    proc = subprocess.Popen([sys.executable, "-m", "jaxspec", "serve", "--model", model, "--port", "0", *scan], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            if " serving " in line:  # "jaxspec: serving M at URL (8 slots, context 2048)"
                url, shape = line.split(" at ")[1].split()[0], line[line.rindex("(") + 1:line.rindex(")")]
                break
        if url is None:
            raise SystemExit(f"the server did not start (exit {proc.wait()})")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # (keep the pipe drained)
        ready = time.perf_counter() - t0
        at_ready = rss_mb(proc.pid)
        health = url.removesuffix("/v1") + "/health"
        while httpx.get(health, timeout=60).json()["compiling"]:
            time.sleep(1)
        out = {"shape": shape, "ready_seconds": round(ready, 1), "rss_ready_mb": round(at_ready),
               "warm_seconds": round(time.perf_counter() - t0, 1), "rss_warm_mb": round(rss_mb(proc.pid)),
               "loads": []}
        for name, extra in LOADS:
            def one(i):
                # (completions: a model without a chat template is measured alike)
                body = {"model": model, "max_tokens": max_tokens, "prompt": f"Tell me story number {i} about a cat.",
                        **extra}
                return httpx.post(url + "/completions", json=body, timeout=1200).status_code

            peak, start = Peak(proc.pid), time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(clients) as pool:
                statuses = list(pool.map(one, range(clients)))
            out["loads"].append({"load": name, "options": extra, "clients": clients, "statuses": statuses,
                                 "seconds": round(time.perf_counter() - start, 1), "rss_peak_mb": round(peak.stop()),
                                 "rss_after_mb": round(rss_mb(proc.pid)),
                                 "groups": httpx.get(health, timeout=60).json()["groups"]})
            print(out["loads"][-1], file=sys.stderr)
        return out
    finally:
        proc.terminate()
        proc.wait(120)


def _own_rss() -> float:
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)  # (what is freed, returned: the deltas are what stays)
    except (AttributeError, OSError):
        pass
    return rss_mb(os.getpid())


def programs(model_name: str, count: int, layer_scan: bool | None = None) -> dict:
    """RSS each of `count` distinct greedy decode programs adds, compiled and then loaded from its
    serialized form (what the compile cache holds)."""
    import jax
    from jax.experimental import serialize_executable

    import jaxspec
    from jaxspec.decoding.methods import decode  # (the decode loop itself: the program `generate` compiles)
    from jaxspec.generate import prepare

    model = jaxspec.load(model_name, layer_scan=layer_scan)
    compiled, loaded, sizes, kept = [], [], [], []
    for i in range(count):
        request = prepare(model, list(range(10, 60)), 32 + 16 * i, "autoregressive")
        before = _own_rss()
        program = jax.jit(decode, static_argnames=tuple(request.statics)).lower(
            *request.args, **request.statics).compile()
        compiled.append(_own_rss() - before)
        serialized = serialize_executable.serialize(program)
        sizes.append(len(serialized[0]) / 2**20)
        kept.append((program, serialized))
    held = []
    for _, serialized in kept:
        before = _own_rss()
        held.append(serialize_executable.deserialize_and_load(*serialized))
        loaded.append(_own_rss() - before)
    return {"model": model_name, "layer_scan": model.layer_scan, "programs": count,
            "compiled_mb": [round(x) for x in compiled],
            "loaded_mb": [round(x) for x in loaded], "serialized_mb": [round(x, 1) for x in sizes]}


def guard(model_name: str) -> dict:
    """The memory guard's estimate for the server's default slot group (before anything is built)
    against what the group holds once built: its state and the largest temporary buffer of its
    `advance` programs (XLA's memory analysis of each compiled program: the warm-up's and the one
    of half the slots over the whole cache, the largest copy a chunk makes)."""
    import jaxspec
    from jaxspec.runtime import memory  # (the guard's estimate, read where it is checked)
    from jaxspec.serving import make_server

    seen, check = [], memory.check

    def spy(estimate, what):
        seen.append((estimate, what))
        return check(estimate, what)

    memory.check = spy
    try:
        model = jaxspec.load(model_name)
        server = make_server(model, model_name, method="auto")
    finally:
        memory.check = check
    server.scheduler.compiler.wait(3600)
    group = next(iter(server.scheduler.groups.values()))
    # the state grown to the whole cache (what the guard counts: every slot's request may reach it)
    state = memory.tree_bytes(group.state_shapes(group.cache_len))
    # beside what the warm-up compiled, the chunk that copies the most: half the slots over the whole cache
    group.advance_program(max(1, group.slots // 2), group.cache_len)
    temp = max(p.memory_analysis().temp_size_in_bytes for k, p in model.compiled.items() if "advance" in k)
    estimate, what = seen[-1]
    return {"plan": what, "estimate_mb": round(estimate.need_bytes / 2**20), "state_mb": round(state / 2**20),
            "largest_temp_mb": round(temp / 2**20),
            "estimate_over_actual": round(estimate.need_bytes / (state + temp), 3)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--programs", type=int, default=4)
    p.add_argument("--name", default="serve_memory")
    p.add_argument("--layer-scan", action=argparse.BooleanOptionalAction, default=None,
                   help="the server's and the programs' layer_scan (default: load's default)")
    args = p.parse_args(argv)
    result = {"benchmark": "serve_memory", "title": "What jaxspec serve holds in memory",
              "command": command_line(__file__, argv), "model": args.model,
              "server": serve(args.model, args.clients, args.max_tokens, args.layer_scan),
              "program_memory": programs(args.model, args.programs, args.layer_scan), "guard": guard(args.model)}
    write_result(result, RESULTS, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
