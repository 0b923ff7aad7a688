"""`jaxspec serve` under load: N concurrent clients against the same requests served one at a time.

One server process (`jaxspec serve --slots S`) serves every method (each request names its method). This
process first decodes every request alone with `jaxspec.generate`: the references every served response must
equal, and (their decode time) the one-at-a-time baseline. Then for N = 1, 4, 16, 32 closed-loop clients (each
sends its next request when the previous one ends; methods interleaved), all requests are streamed:
requests/s, output tokens/s, time to first token and time per output token (p50 / p99). Last a soak: >= 500
requests from 16 clients with random disconnects and bad requests mixed in; every good response is checked,
every bad one must get a 4xx, and afterwards the server must be idle and still answer.

    python -m benchmarks.serve_bench                    # pycode-5M, 32 requests, soak 500
    python -m benchmarks.serve_bench --smoke            # seconds: the machinery only
    python -m benchmarks.serve_bench --model smollm2-135m-instruct --slots 8 --context 1024 \
        --concurrency 1,2,4,8 --methods greedy,fixed,default --requests 16 --soak 0 --name serve_bench_smollm2

A chat model is sent held-out chats (`jaxspec.real_prompts`, split heldout) on /chat/completions.
Method `default` sends no method: the server runs `--method auto` (a drafted setting whose slots
pick drafted or plain steps per chunk, `jaxspec.serving.step_modes`); its answers must equal
greedy's. Method `fixed` names the drafted setting `auto` chose, always drafted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, command_line, interleaved, write_result  # noqa: E402
from benchmarks.harness.cases import code_prompts  # noqa: E402


def build_requests(model, count: int, budgets: tuple[int, ...], seed: int = 0) -> list[dict]:
    """Mixed requests: held-out code prompts for a plain model, held-out chats (MT-Bench and
    HumanEval, shuffled) for a chat model, each with a budget drawn from `budgets`."""
    rng = random.Random(seed)
    if model.tokenizer is None or model.tokenizer.chat_template is None:
        return [{"prompt": p["text"], "max_tokens": rng.choice(budgets)} for p in code_prompts(count)]
    from jaxspec.real_prompts import chat_prompts

    chats = chat_prompts("heldout")
    return [{"messages": c["messages"], "max_tokens": rng.choice(budgets)}
            for c in rng.sample(chats, min(count, len(chats)))]


def _prompt(model, request: dict):
    if "messages" in request:
        from jaxspec.chat import chat_prompt

        return chat_prompt(model, request["messages"])
    return request["prompt"]


def _body(request: dict, method: str, fixed: tuple[str, dict]) -> dict:
    """A request's body for `method`: `default` names none, `fixed` names the setting `auto` chose."""
    if method == "default":
        return dict(request)
    if method == "fixed":
        return {**request, "method": fixed[0], "method_options": fixed[1]}
    return {**request, "method": method}


def one_at_a_time(model, requests: list[dict], method: str, stop_ids: tuple[int, ...], options=None
                  ) -> tuple[list, dict]:
    """Each request decoded alone (the first two once before, untimed: the common shapes compile there):
    the tokens per request, and the baseline's decode time and rates."""
    run = lambda r: jaxspec.generate(model, _prompt(model, r), max_new_tokens=r["max_tokens"],  # noqa: E731
                                     method=method, stop_ids=stop_ids, **(options or {}))
    [run(r) for r in requests[:2]]
    outs = [run(r) for r in requests]
    seconds, n = sum(o.seconds for o in outs), sum(len(o.tokens) for o in outs)
    return [o.tokens for o in outs], {"seconds": round(seconds, 3), "output_tokens": n,
                                      "requests_per_second": round(len(requests) / seconds, 3),
                                      "output_tokens_per_second": round(n / seconds, 2)}


def start_server(model_name: str, slots: int, context: int, chunk_steps: int, method: str = "greedy"
                 ) -> tuple[subprocess.Popen, str, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "jaxspec", "serve", "--model", model_name, "--port", "0",
                             "--slots", str(slots), "--context", str(context), "--chunk-steps", str(chunk_steps),
                             "--method", method], stderr=subprocess.PIPE, text=True)
    said = []  # what the server said: its start-up, then the step modes' lines (`jaxspec.runtime.step_modes`)
    for line in proc.stderr:
        print(line, end="", file=sys.stderr)
        said.append(line.rstrip())
        if " serving " in line:
            def drain():  # (never block the server on a full pipe)
                said.extend(x.rstrip() for x in proc.stderr if "a drafted step costs" in x)
            threading.Thread(target=drain, daemon=True).start()
            return proc, line.split(" at ")[1].split()[0], said
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


async def stream_one(client: httpx.AsyncClient, url: str, body: dict, hang_up_after: float | None = None) -> dict:
    """One streamed completion: timings, token ids, or how it ended."""
    t0, first, final = time.perf_counter(), None, None
    route = "/chat/completions" if "messages" in body else "/completions"
    async with client.stream("POST", url + route, json={**body, "stream": True}) as r:
        if r.status_code != 200:
            await r.aread()
            return {"status": r.status_code, "error": r.json().get("error", {})}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return {"status": 500, "error": chunk["error"]}
            choice = chunk["choices"][0] if chunk["choices"] else {}
            if first is None and (choice.get("text") or (choice.get("delta") or {}).get("content")):
                first = time.perf_counter()
            if hang_up_after is not None and time.perf_counter() - t0 >= hang_up_after:
                return {"status": 200, "hung_up": True}
            if "jaxspec" in chunk:
                final = chunk
    end = time.perf_counter()
    ids = final["jaxspec"]["token_ids"]
    first = first or end
    return {"status": 200, "token_ids": ids, "ttft": first - t0, "seconds": end - t0,
            "tpot": (end - first) / max(len(ids) - 1, 1), "steps": final["jaxspec"]["steps"],
            "plain_steps": final["jaxspec"].get("plain_steps", 0)}


async def closed_loop(url: str, model_id: str, requests: list[dict], refs: list, method: str, clients: int,
                      fixed: tuple[str, dict] = ("", {})) -> dict:
    """Every request streamed by `clients` closed-loop clients: the run's rates, latencies and checks."""
    queue, results = list(enumerate(requests)), [None] * len(requests)

    async def worker(client):
        while queue:
            i, r = queue.pop(0)
            results[i] = await stream_one(client, url, {"model": model_id, **_body(r, method, fixed), "temperature": 0})

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
    wall = time.perf_counter() - t0
    ok = [r for r in results if r and r.get("status") == 200 and "token_ids" in r]
    tokens = sum(len(r["token_ids"]) for r in ok)
    pct = lambda key, q: float(np.percentile([r[key] for r in ok], q)) if ok else float("nan")  # noqa: E731
    return {"requests": len(results), "completed": len(ok), "lost": len(results) - len(ok),
            "wrong": sum(r["token_ids"] != ref for r, ref in zip(results, refs) if r in ok),
            "seconds": round(wall, 3), "requests_per_second": round(len(ok) / wall, 3),
            "output_tokens_per_second": round(tokens / wall, 2),
            **{f"{key}_p{q}_ms": round(1e3 * pct(key, q), digits) for key, digits in (("ttft", 1), ("tpot", 2))
               for q in (50, 99)},
            "compression": round(tokens / max(sum(r["steps"] for r in ok), 1), 3),
            "plain_step_share": round(sum(r["plain_steps"] for r in ok) / max(sum(r["steps"] for r in ok), 1), 3)}


BAD_BODIES = [b"{oops", b'{"model": 3}', {"model": "nope", "prompt": "x"}, {"prompt": "x"},
              {"prompt": "x", "max_tokens": -2}, {"prompt": "x", "temperature": "hot"},
              {"prompt": "x", "method": "telepathy"}, {"prompt": "x", "n": 3}, {"prompt": "x " * 5000},
              {"prompt": "x", "method": "lookahead", "method_options": {"window": 0}}]


async def soak(url: str, model_id: str, requests: list[dict], refs: dict, methods: list[str], total: int,
               clients: int, seed: int = 1, fixed: tuple[str, dict] = ("", {})) -> dict:
    rng = random.Random(seed)
    plan = [("bad" if u < 0.1 else "disconnect" if u < 0.2 else "good", rng.randrange(len(requests)),
             rng.choice(methods), rng.random()) for u in (rng.random() for _ in range(total))]
    counts = {**dict.fromkeys(("good", "good_ok", "wrong", "lost", "bad", "bad_4xx", "disconnect"), 0), "other": []}

    async def worker(client):
        while plan:
            kind, i, method, u = plan.pop()
            counts[kind] += 1
            if kind == "bad":
                body = BAD_BODIES[int(u * len(BAD_BODIES))]
                if isinstance(body, dict) and "model" not in body and body is not BAD_BODIES[3]:
                    body = {"model": model_id, **body}
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                resp = await client.post(url + "/completions", content=content,
                                         headers={"Content-Type": "application/json"})
                counts["bad_4xx"] += 400 <= resp.status_code < 500 and "error" in resp.json()
                continue
            body = {"model": model_id, **_body(requests[i], method, fixed), "temperature": 0}
            try:
                out = await stream_one(client, url, body, hang_up_after=u * 0.5 if kind == "disconnect" else None)
            except httpx.HTTPError as e:
                counts["other"].append(repr(e))
                continue
            if kind == "good":
                ids = out.get("token_ids")
                counts["lost" if ids is None else "good_ok" if ids == refs[method][i] else "wrong"] += 1

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        wall = time.perf_counter() - t0
        await asyncio.sleep(1.0)  # hung-up requests are freed at the next chunk
        health = (await client.get(url.removesuffix("/v1") + "/health")).json()
        body = {"model": model_id, **_body(requests[0], methods[0], fixed), "temperature": 0}
        after = await stream_one(client, url, body)
    counts["other"] = counts["other"][:5]
    return {"requests": total, "clients": clients, "seconds": round(wall, 2), **counts, "health_after": health,
            "answers_after": after.get("token_ids") == refs[methods[0]][0]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="pycode-5M")
    p.add_argument("--methods", default=None, help="comma-separated; `default` (none named: the server's "
                   "auto) and `fixed` (the drafted setting auto chose) besides method names "
                   "(default: autoregressive,lookahead,speculative)")
    p.add_argument("--concurrency", default="1,4,16,32")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--budgets", default="32,64,128", help="max_tokens values the requests draw from")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--chunk-steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1, help="timed rounds over every (clients, method); "
                   "ratios over their summed tokens and seconds, each round's beside them")
    p.add_argument("--soak", type=int, default=500, help="requests in the soak (0: none)")
    p.add_argument("--smoke", action="store_true", help="a few requests, N = 1 and 4, a 40-request soak")
    p.add_argument("--store", type=Path, default=None,
                   help="auto's measurement store (default: a new one, nothing stored: what a first server learns)")
    p.add_argument("--name", default=None)
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    args = p.parse_args(argv)
    store = args.store or Path(tempfile.mkdtemp(prefix="serve_bench")) / "auto.json"
    os.environ["JAXSPEC_AUTO_CACHE"] = str(store)  # (this process's and the server's)
    if args.smoke:
        args.requests, args.concurrency, args.soak, args.budgets = 4, "1,4", 40, "16,24"
        args.methods = args.methods or "autoregressive,lookahead"
    name = args.name or ("serve_bench_smoke" if args.smoke else "serve_bench")
    methods = (args.methods or "autoregressive,lookahead,speculative").split(",")
    concurrency = [int(c) for c in args.concurrency.split(",")]

    model = jaxspec.load(args.model)
    from jaxspec.runtime import auto
    from jaxspec.chat import stop_ids

    requests = build_requests(model, args.requests, tuple(int(b) for b in args.budgets.split(",")))
    # `fixed`: the drafted setting `auto` chooses for the server (the same ledgers the server reads)
    choice, _ = auto.serve_choice(model, args.slots, sampled=False)
    fixed = (choice.method, dict(choice.options))
    refs, base = {}, {}
    for m in methods:
        same = next((k for k in refs if {k, m} <= {"default", "greedy", "autoregressive"}), None)
        if same is not None:  # (the default's answers are greedy's: one baseline for both)
            refs[m], base[m] = refs[same], base[same]
            continue
        method, options = (fixed if m == "fixed" else ("greedy" if m == "default" else m, {}))
        refs[m], base[m] = one_at_a_time(model, requests, method, stop_ids(model), options)
        print(f"{m}: one at a time {base[m]['output_tokens_per_second']} tok/s", file=sys.stderr)
    # (lossless alone: a difference here is a near-tie at float rounding, counted, not hidden)
    alone_differs = sum(a != b for a, b in zip(refs.get("fixed", []), refs.get("greedy", [])))
    proc, url, said = start_server(args.model, args.slots, args.context, args.chunk_steps,
                                   "auto" if "default" in methods else "greedy")
    loop = lambda m, n, some=requests: asyncio.run(  # noqa: E731
        closed_loop(url, args.model, some, refs[m][:len(some)], m, n, fixed))
    runs = []
    health = lambda: httpx.get(url.removesuffix("/v1") + "/health", timeout=60).json()  # noqa: E731
    try:
        # Warm-up, untimed: every method's group and the (rows, cache length) tiers its requests reach
        # compile here (in the server's background, which a chunk never waits for: it runs a larger
        # compiled program meanwhile), not inside a timed run; outputs checked.
        for m in methods:
            for n in (max(concurrency), *concurrency):
                warm = loop(m, n, requests if n == max(concurrency) else requests[:n])
                print(f"warm-up {m} N={n}: {warm['completed']} done, {warm['wrong']} wrong", file=sys.stderr)
                while health()["compiling"]:  # the background worker's programs: not during a timed run
                    time.sleep(2)
        for r in range(args.rounds):
            for k, n in enumerate(concurrency):
                for m in interleaved(methods, k + r):  # no method always first
                    runs.append({"method": m, "clients": n, "round": r, **loop(m, n)})
                    print(f"round {r} {m} N={n}: {runs[-1]['output_tokens_per_second']} tok/s, wrong "
                          f"{runs[-1]['wrong']}, lost {runs[-1]['lost']}, plain steps "
                          f"{runs[-1]['plain_step_share']}", file=sys.stderr)
        modes = health().get("step_modes")
        soak_result = asyncio.run(soak(url, args.model, requests, refs, methods, args.soak, 16,
                                               fixed=fixed)) if args.soak else None
        if soak_result:
            print(f"soak: {json.dumps({k: v for k, v in soak_result.items() if k != 'health_after'})}",
                  file=sys.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        exit_code = proc.wait(120)
    speedups, per_round = {}, {}
    for n in concurrency:
        # (a rate over the rounds' summed tokens and seconds; each round's ratio kept to show the spread)
        rate = {m: sum(r["output_tokens_per_second"] * r["seconds"] for r in runs if (r["clients"], r["method"]) == (n, m))
                / sum(r["seconds"] for r in runs if (r["clients"], r["method"]) == (n, m)) for m in methods}
        greedy = rate.get("greedy") or rate.get("autoregressive")
        if greedy:
            speedups[str(n)] = {m: round(v / greedy, 3) for m, v in rate.items()}
            base_of = "greedy" if "greedy" in rate else "autoregressive"
            each = {(r["round"], r["method"]): r["output_tokens_per_second"] for r in runs if r["clients"] == n}
            per_round[str(n)] = {m: [round(each[(k, m)] / each[(k, base_of)], 3) for k in range(args.rounds)]
                                 for m in methods}
    auto_line = next((line for line in said if "--method auto chose" in line), None)
    result = {"benchmark": "serve_bench", "title": "jaxspec serve under load", "command": command_line(__file__, argv),
              "model": args.model, "slots": args.slots, "context": args.context, "chunk_steps": args.chunk_steps,
              "requests": requests, "one_at_a_time": base, "runs": runs, "rounds": args.rounds,
              "speedup_over_greedy": speedups, "speedup_each_round": per_round,
              "fixed": {"method": fixed[0], "options": fixed[1]}, "fixed_alone_differs_from_greedy": alone_differs,
              "auto": auto_line, "step_modes": modes, "auto_store": "given" if args.store else "new",
              "step_mode_lines": [line for line in said if "a drafted step costs" in line],
              "soak": soak_result, "server_exit_code": exit_code}
    write_result(result, args.out, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
