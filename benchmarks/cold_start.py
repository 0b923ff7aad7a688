"""What a user waits for before the first token: `jaxspec chat`, `generate` and `serve`, cold and stored.

Each command runs as a new process, as a user starts it: "cold" with an empty compile cache and an
empty `auto` store (fresh `JAXSPEC_COMPILE_CACHE` / `JAXSPEC_AUTO_CACHE` folders), then "stored"
with what the cold run left there. Measured from the process's start:

* chat: three questions typed one after the other (each as soon as the prompt shows); the first
  text of each reply, in seconds after the process started (first reply) and after its question;
  its resident memory (RSS): the peak while it runs and once the third reply is done;
* generate: `jaxspec generate --prompt Q --max-new-tokens N` to its output and to its exit;
* serve: `jaxspec serve --slots 8` to "serving at" (ready), then one streamed chat request's time to
  its first text and to its end.

With `--against REV` each scenario also runs on git revision REV (a worktree in a temporary folder,
run from there with this interpreter), the two interleaved scenario by scenario.

    python -m benchmarks.cold_start                            # SmolLM2-135M-Instruct
    python -m benchmarks.cold_start --against 864d08c          # and the revision before `auto` learned
    python -m benchmarks.cold_start --model pycode-5M --only generate --name cold_start_smoke   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import RESULTS, command_line, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ("What is the capital of France?", "Name three rivers in Europe.", "Write a haiku about the sea.")
SCENARIOS = ("chat", "generate", "serve")


class Output:
    """A child's stdout and stderr, byte by byte, with the time each byte came."""

    def __init__(self, proc: subprocess.Popen, t0: float):
        self.events: list[tuple[float, str, bytes]] = []
        self.t0 = t0
        self.threads = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                        for s, n in ((proc.stdout, "out"), (proc.stderr, "err"))]
        for t in self.threads:
            t.start()

    def _read(self, stream, name: str) -> None:
        while b := stream.read(1):
            self.events.append((time.perf_counter() - self.t0, name, b))

    def text(self, name: str) -> str:
        return b"".join(e[2] for e in list(self.events) if e[1] == name).decode(errors="replace")

    def first_after(self, name: str, after: float) -> float | None:
        return next((e[0] for e in list(self.events) if e[1] == name and e[0] > after), None)

    def wait_for(self, predicate, timeout: float) -> bool:
        end = time.perf_counter() + timeout
        while time.perf_counter() < end:
            if predicate():
                return True
            time.sleep(0.02)
        return False


def _spawn(tree: Path, env: dict, argv: list[str], stdin=None) -> tuple[subprocess.Popen, Output]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "jaxspec", *argv], cwd=tree, env=env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    return proc, Output(proc, t0)


def chat(tree: Path, env: dict, model: str, timeout: float) -> dict:
    from benchmarks.serve_memory import Peak, rss_mb

    proc, out = _spawn(tree, env, ["chat", "--model", model], stdin=subprocess.PIPE)
    peak = Peak(proc.pid)  # (the chat's resident memory: background compiles included)
    asked, first = [], []
    for i, question in enumerate(QUESTIONS):
        if not out.wait_for(lambda: out.text("out").count("> ") >= i + 1, timeout):
            proc.kill()
            raise SystemExit(f"chat: no prompt for question {i + 1}:\n{out.text('err')[-2000:]}")
        asked.append(time.perf_counter() - out.t0)
        proc.stdin.write((question + "\n").encode())
        proc.stdin.flush()
        out.wait_for(lambda: out.first_after("out", asked[-1]) is not None, timeout)
        first.append(out.first_after("out", asked[-1]))
    out.wait_for(lambda: out.text("out").count("> ") >= len(QUESTIONS) + 1, timeout)
    after = rss_mb(proc.pid)
    peak_mb = max(peak.stop(), after)
    proc.stdin.write(b"\n")
    proc.stdin.flush()
    code = proc.wait(timeout)
    return {"first_text_after_start": round(first[0], 2),
            "first_text_after_question": [round(f - a, 2) for f, a in zip(first, asked)],
            "rss_peak_mb": round(peak_mb), "rss_after_replies_mb": round(after), "exit_code": code,
            "stderr": out.text("err")[-4000:], "replies": out.text("out")[-2000:]}


def generate(tree: Path, env: dict, model: str, timeout: float, new_tokens: int) -> dict:
    proc, out = _spawn(tree, env, ["generate", "--model", model, "--prompt", QUESTIONS[0], "--max-new-tokens",
                                   str(new_tokens), "--no-compare"])
    code = proc.wait(timeout)
    for t in out.threads:
        t.join(5)
    exited = time.perf_counter() - out.t0
    return {"output_after_start": round(out.first_after("out", 0.0) or exited, 2), "exit_after_start": round(exited, 2),
            "exit_code": code, "stderr": out.text("err")[-4000:]}


def serve(tree: Path, env: dict, model: str, timeout: float, new_tokens: int) -> dict:
    import httpx

    proc, out = _spawn(tree, env, ["serve", "--model", model, "--port", "0", "--slots", "8"])
    ok = out.wait_for(lambda: " serving " in out.text("err"), timeout)
    if not ok:
        proc.kill()
        raise SystemExit(f"serve: not ready in {timeout} s:\n{out.text('err')[-2000:]}")
    ready = next(e[0] for e in out.events if e[1] == "err" and " serving " in
                 b"".join(x[2] for x in out.events if x[1] == "err" and x[0] <= e[0]).decode(errors="replace"))
    url = out.text("err").split(" serving ")[1].split(" at ")[1].split()[0]
    t0 = time.perf_counter()
    first = None
    chat_model = model != "pycode-5M"  # (the default model has no chat template: a plain completion)
    body = {"model": model, "max_tokens": new_tokens, "stream": True,
            **({"messages": [{"role": "user", "content": QUESTIONS[0]}]} if chat_model else {"prompt": "def f(x):"})}
    field = '"content": "' if chat_model else '"text": "'
    with httpx.stream("POST", url + ("/chat/completions" if chat_model else "/completions"), json=body,
                      timeout=timeout) as r:
        if r.status_code != 200:
            proc.kill()
            raise SystemExit(f"serve: the request got {r.status_code}: {r.read().decode()[:500]}")
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and field in line and field + '"' not in line:
                first = time.perf_counter() - t0
    done = time.perf_counter() - t0
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout)
    return {"ready_after_start": round(ready, 2), "first_text_after_request": round(first or done, 2),
            "request_seconds": round(done, 2), "exit_code": code, "stderr": out.text("err")[-4000:]}


def portable(text: str) -> str:
    """A child's output without this machine's paths: the checkout as `.`, the virtualenv as `$VENV`,
    the temporary folders (caches, worktrees) as `$TMP`."""
    for path, name in ((sys.prefix, "$VENV"), (str(ROOT), "."), (tempfile.gettempdir(), "$TMP")):
        text = text.replace(path, name)
    return text


def worktree(rev: str) -> tuple[Path, str]:
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix="jaxspec-cold-")) / sha
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True, capture_output=True)
    return tree, sha


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--only", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--against", metavar="REV", help="also run git revision REV, interleaved")
    p.add_argument("--new-tokens", type=int, default=60)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--name", default="cold_start")
    args = p.parse_args(argv)
    revisions = [("this checkout", ROOT)]
    if args.against:
        tree, sha = worktree(args.against)
        revisions.append((sha, tree))
    folders = {label: Path(tempfile.mkdtemp(prefix="jaxspec-cold-caches-")) for label, _ in revisions}
    runs = []
    try:
        for scenario in args.only:
            for state in ("cold", "stored"):
                for label, tree in revisions:
                    caches = folders[label] / scenario
                    if state == "cold":
                        caches.mkdir(parents=True, exist_ok=False)
                    env = dict(os.environ, JAXSPEC_COMPILE_CACHE=str(caches / "xla"),
                               JAXSPEC_AUTO_CACHE=str(caches / "auto.json"), XDG_CACHE_HOME=str(caches / "xdg"),
                               PYTHONPATH=str(tree))
                    print(f"{scenario}, {state}, {label} ...", file=sys.stderr, flush=True)
                    if scenario == "chat":
                        row = chat(tree, env, args.model, args.timeout)
                    elif scenario == "generate":
                        row = generate(tree, env, args.model, args.timeout, args.new_tokens)
                    else:
                        row = serve(tree, env, args.model, args.timeout, args.new_tokens)
                    row = {k: portable(v) if isinstance(v, str) else v for k, v in row.items()}
                    runs.append({"scenario": scenario, "state": state, "revision": label, **row})
                    print(json.dumps({k: v for k, v in runs[-1].items() if k not in ("stderr", "replies")}),
                          file=sys.stderr, flush=True)
    finally:
        for _, tree in revisions[1:]:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    result = {"benchmark": "cold_start", "title": "Time to the first token: chat, generate and serve, cold and stored",
              "command": command_line(__file__, argv if argv is not None else sys.argv[1:]),
              "model": args.model, "questions": list(QUESTIONS), "new_tokens": args.new_tokens,
              "revisions": [label for label, _ in revisions], "runs": runs}
    write_result(result, RESULTS, args.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
