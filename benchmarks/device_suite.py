"""The accelerator suite: step cost c(T), wall-clock speed-ups of every lossless method, attention kernels.

One command, made for a short loan of one GPU (or TPU) chip, that writes one result file:

    python benchmarks/device_suite.py --out DIR      # ~7 minutes on one H200; DIR/device_suite.{json,md}
    python benchmarks/device_suite.py --smoke --out DIR   # tiny shapes on CPU, same layout (~1 minute)

Parts (each can be chosen with --parts):

1. `step_cost`: c(T) = seconds of one decode-step forward of T block tokens (a chain under a
   `TreeMask`, the greedy head) at batch 1 over a filled KV cache / the same for T = 1, for
   T in {1, 8, 16, 32, 64, 128, 256}, on random-weight bfloat16 Llama-3.2-1B- and
   Llama-3.1-8B-shaped models (`step_cost.synthetic_model`, built on the device), with the
   "xla" and the "pallas" attention backends. Each program runs the forward `inner` times
   over different tokens (so dispatch does not count); min and median over `repeats` calls,
   compile and warm-up excluded.
2. `decoding`: greedy vs lookahead (15,5,15) and (7,4,7) vs prompt lookup vs speculative
   decoding (the shipped PARD-2 drafter) on pycode-5M and its held-out code prompts
   (frozen in benchmarks/device_suite_prompts.json, so another Python's stdlib changes
   nothing), and greedy / lookahead / prompt lookup (xla, and pallas attention) on the 1B-shaped
   random model with prompts that repeat a segment. Every output is compared with greedy's
   (a difference is reported with its logit gap and whether it is a near-tie at the dtype's
   resolution: `jaxspec.exactness.compare`); S, tokens/s and the speed-up over greedy come from
   runs interleaved per prompt (method order rotated), after one untimed warm-up per program.
3. `attention`: `attention_bench.decode_rows` / `pard_rows` at their default 7B-like shapes,
   one cache length at a time.

Time: a global deadline (--deadline, default 420 s from the start of the process) is split
into cumulative part deadlines (unused time passes to the next part). Before each item
(one (model, backend, T) forward, one prompt round, one cache length) the suite estimates its
time from the items before it and skips what does not fit, recording it under `skipped`. A
watchdog thread writes whatever has been measured and ends the process `--grace` seconds
after the deadline, whatever is running (a compile that never returns cannot hold the run).
Each item's exception is recorded under `errors` and the suite goes on.

Exit status: 0 done (skips allowed), 1 an output differs from greedy by more than a near-tie,
2 an item raised, 3 the watchdog ended the run.
"""

from __future__ import annotations

import time

START = time.monotonic()  # the deadline counts from here: imports included

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
for _p in (str(BENCH), str(ROOT)):  # a bare checkout (jaxspec not installed) imports from the tree
    if _p not in sys.path:
        sys.path.insert(0, _p)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxspec  # noqa: E402
from jaxspec.kv_cache import KVCache  # noqa: E402
from jaxspec.masks import TreeMask  # noqa: E402

import attention_bench  # noqa: E402
import report  # noqa: E402  (JSON -> markdown, shared with benchmarks/report.py)
import step_cost  # noqa: E402
from machine import machine_info, repo_relative  # noqa: E402

RESULTS = BENCH / "results"
PROMPTS_FILE = BENCH / "device_suite_prompts.json"
PARTS = ("step_cost", "decoding", "attention")

# Synthetic stand-ins for the 1B / 8B slots of the smoke run: 2 layers, hidden 256.
TINY_1B = dict(hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
               vocab_size=2048, tie_word_embeddings=True)
TINY_8B = dict(hidden_size=256, intermediate_size=640, num_layers=2, num_heads=8, num_kv_heads=2, vocab_size=4096)

FULL = dict(
    deadline=420.0,
    # cumulative part deadlines, as shares of the whole (the step-cost share includes start-up)
    shares={"step_cost": 0.50, "decoding": 0.36, "attention": 0.14},
    models={"1b": ("llama3-1b", step_cost.SYNTHETIC["llama3-1b"]),
            "8b": ("llama3-8b", step_cost.SYNTHETIC["llama3-8b"])},
    dtype="bfloat16", block_tokens=(1, 64, 256, 16, 128, 8, 32),  # measured in this order (T = 1 first)
    cache_len=2048, cache_filled=1792, repeats=10, inner=10,
    pycode=dict(prompts=10, prompt_tokens=64, new_tokens=128, rounds=3, methods=None),  # None: every method
    synthetic=dict(prompts=4, prompt_tokens=64, period=16, new_tokens=128, rounds=3, methods=None),
    attention=dict(cfg=attention_bench.FULL, repeats=20, inner=10),
    first_item_estimate=15.0,  # seconds assumed for an item nothing has been measured like yet
    timing_seconds_per_T=1.5,  # (repeats + 1) x inner forwards: ~1 s for the 8B at T = 256
)
SMOKE = dict(
    deadline=240.0, shares=FULL["shares"],
    models={"1b": ("tiny-1b-slot", TINY_1B), "8b": ("tiny-8b-slot", TINY_8B)},
    dtype="float32", block_tokens=(1, 32), cache_len=96, cache_filled=64, repeats=2, inner=2,
    # one program per code path: each method once (one lookahead config), the pallas backend once
    pycode=dict(prompts=2, prompt_tokens=64, new_tokens=16, rounds=1,
                methods=("greedy", "lookahead (7,4,7)", "prompt-lookup (N=4,G=8)", "speculative TD")),
    synthetic=dict(prompts=2, prompt_tokens=32, period=8, new_tokens=12, rounds=1,
                   methods=("greedy", "lookahead (7,4,7) [pallas]")),
    attention=dict(cfg=attention_bench.SMOKE, repeats=1, inner=1),
    first_item_estimate=3.0, timing_seconds_per_T=0.2,
)

LOOKAHEAD = {"lookahead (15,5,15)": {"window": 15, "ngram": 5, "guesses": 15},
             "lookahead (7,4,7)": {"window": 7, "ngram": 4, "guesses": 7}}
PROMPT_LOOKUP = {"prompt-lookup (N=4,G=8)": {"ngram": 4, "guesses": 8}}


# ----------------------------------------------------------------------------- bookkeeping


class Suite:
    """The results being built, the clock, and the files: one lock guards them, so the watchdog
    can write a consistent snapshot while the main thread measures."""

    def __init__(self, args, cfg: dict):
        self.args, self.cfg = args, cfg
        self.lock = threading.RLock()
        self.deadline = START + cfg["deadline"]
        shares, total, self.part_end = cfg["shares"], sum(cfg["shares"].values()), {}
        at = 0.0
        for part in PARTS:
            at += shares[part] / total
            self.part_end[part] = START + at * cfg["deadline"]
        self.current = "start-up"
        self.models: dict = {}  # the random-weight models built so far, by slot ("1b" / "8b")
        self.data = {
            "benchmark": "device_suite", "smoke": args.smoke,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python benchmarks/device_suite.py" + "".join(f" {a}" for a in args.argv),
            "machine": {}, "deadline_seconds": cfg["deadline"], "grace_seconds": args.grace,
            "part_deadlines_seconds": {p: round(self.part_end[p] - START, 1) for p in PARTS},
            "parts": {p: {"status": "not run", "skipped": [], "errors": []} for p in PARTS},
            "completed": False, "total_seconds": None,
        }

    # -- time
    def now(self) -> float:
        return time.monotonic() - START

    def left(self, until: float) -> float:
        return min(until, self.deadline) - time.monotonic()

    def fits(self, estimate: float, until: float) -> bool:
        return self.left(until) >= estimate

    # -- records
    def part(self, name: str) -> dict:
        return self.data["parts"][name]

    def skip(self, part: str, item, reason: str) -> None:
        with self.lock:
            self.part(part)["skipped"].append({"item": item, "reason": reason, "at_seconds": round(self.now(), 1)})
        print(f"[{self.now():6.1f}s] SKIP {part} {item}: {reason}", flush=True)

    def error(self, part: str, item, exc: BaseException) -> None:
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        with self.lock:
            self.part(part)["errors"].append({"item": item, "error": f"{type(exc).__name__}: {exc}"[:2000],
                                              "traceback": "".join(tb)[-4000:]})
        print(f"[{self.now():6.1f}s] ERROR {part} {item}: {type(exc).__name__}: {exc}", flush=True)

    def log(self, msg: str) -> None:
        print(f"[{self.now():6.1f}s] {msg}", flush=True)

    def skip_reason(self, estimate: float, until: float) -> str:
        return f"deadline: needs ~{estimate:.0f} s, {max(self.left(until), 0):.0f} s left"

    # -- files
    def write(self) -> None:
        with self.lock:  # (the watchdog and the main thread never write at once)
            snapshot = json.loads(json.dumps(self.data, default=str))
            out = self.args.out
            out.mkdir(parents=True, exist_ok=True)
            stem = "device_suite_smoke" if self.args.smoke and self.args.out == RESULTS else "device_suite"
            (out / f"{stem}.json").write_text(json.dumps(snapshot, indent=1) + "\n")
            (out / f"{stem}.md").write_text(markdown(snapshot))


def watchdog(suite: Suite, at: float) -> None:
    while time.monotonic() < at:
        time.sleep(0.25)
    got = suite.lock.acquire(timeout=10)
    try:
        suite.data["completed"] = False
        suite.data["interrupted"] = {"at_seconds": round(suite.now(), 1), "while": suite.current,
                                     "why": f"the watchdog ended the run {suite.args.grace:g} s after the deadline"}
        suite.data["total_seconds"] = round(suite.now(), 1)
        for p in PARTS:
            if suite.part(p)["status"] == "running":
                suite.part(p)["status"] = "interrupted"
    finally:
        if got:
            suite.lock.release()
    try:
        suite.write()
        print(f"[{suite.now():6.1f}s] WATCHDOG: wrote partial results to {suite.args.out}; exiting", flush=True)
    finally:
        os._exit(3)


def device_info() -> dict:
    dev = jax.devices()[0]
    info = {**machine_info(), "device_kind": dev.device_kind, "device_count": jax.device_count(),
            "device_platform": dev.platform}
    try:
        import jaxlib
        info["jaxlib"] = jaxlib.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        stats = dev.memory_stats() or {}
        if "bytes_limit" in stats:
            info["device_memory_bytes"] = int(stats["bytes_limit"])
    except Exception:  # noqa: BLE001
        pass
    if dev.platform == "gpu" and shutil.which("nvidia-smi"):
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=15).stdout.strip()
        except Exception as e:  # noqa: BLE001
            info["nvidia_smi"] = f"failed: {e}"
    info["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    return info


def with_attention(model: jaxspec.Model, attention: str) -> jaxspec.Model:
    """The same weights (no copy) with another attention backend, and its own compiled programs."""
    if model.attention == attention:
        return model
    module = model.module
    module.attention = attention
    graphdef, params = nnx.split(module)
    return dataclasses.replace(model, graphdef=graphdef, params=params, attention=attention, compiled={},
                               drafters={}, memory_estimates={}, lp_layouts={})


# ----------------------------------------------------------------------------- part 1: c(T)


def chain_mask(t: int) -> TreeMask:
    """T block tokens in a chain (each sees itself and every earlier one), as a step's `TreeMask`."""
    return TreeMask(pre=np.arange(t, dtype=np.int32)[None], end=np.full((1, t), t - 1, np.int32))


def forward_program(model: jaxspec.Model, t: int, cache_filled: int, inner: int):
    """A jitted program running `inner` decode-step forwards of T tokens over a cache holding
    `cache_filled` tokens (the greedy head: argmax only, as greedy verification runs it); the
    tokens change with the iteration so no forward can be hoisted out of the loop."""
    graphdef, vocab = model.graphdef, model.config.vocab_size
    mask = chain_mask(t)
    positions = cache_filled + jnp.arange(t, dtype=jnp.int32)[None]

    def run(params, cache, tokens):
        module = nnx.merge(graphdef, params)

        def body(i, acc):
            out = module((tokens + i) % vocab, positions, mask, cache, head="argmax")
            return acc + out.preds.sum() + out.block_kv.k[-1, 0, -1, 0, 0].astype(jnp.int32)

        return jax.lax.fori_loop(0, inner, body, jnp.zeros((), jnp.int32))

    return jax.jit(run)


def time_program(compiled, args: tuple, repeats: int) -> list[float]:
    jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return times


def build_synthetic(suite: Suite, slot: str, part: str) -> jaxspec.Model | None:
    """The random-weight model of a slot ("1b" / "8b"), built once and kept for the other parts."""
    cache = suite.models
    if slot in cache:
        return cache[slot]
    name, shape = suite.cfg["models"][slot]
    suite.current = f"building {name}"
    t0 = time.perf_counter()
    try:
        model = step_cost.synthetic_model(shape, suite.cfg["dtype"], name=name)
        jax.block_until_ready(model.params)
    except Exception as e:  # noqa: BLE001
        suite.error(part, f"build {name}", e)
        cache[slot] = None
        return None
    seconds = time.perf_counter() - t0
    with suite.lock:
        suite.data.setdefault("models", {})[slot] = {
            "name": name, "shape": {k: v for k, v in shape.items()}, "params": model.config.num_params,
            "dtype": suite.cfg["dtype"], "build_seconds": round(seconds, 2)}
    suite.log(f"built {name}: {model.config.num_params / 1e9:.3f}B params in {seconds:.1f}s")
    cache[slot] = model
    return model


def part_step_cost(suite: Suite) -> None:
    cfg, part = suite.cfg, "step_cost"
    rec = suite.part(part)
    rec.update(config={"block_tokens": sorted(cfg["block_tokens"]), "cache_len": cfg["cache_len"],
                       "cache_filled": cfg["cache_filled"], "repeats": cfg["repeats"], "inner": cfg["inner"],
                       "dtype": cfg["dtype"], "batch": 1, "mask": "chain TreeMask", "head": "argmax"},
               rows=[])
    end = suite.part_end[part]
    cells = [(slot, backend) for backend in ("xla", "pallas") for slot in ("1b", "8b")]
    part_start = time.monotonic()
    for n, (slot, backend) in enumerate(cells):
        # each (model, backend) cell ends by its share of what is left of the part
        cell_end = part_start + (n + 1) * (end - part_start) / len(cells)
        cell_end = max(cell_end, time.monotonic() + (end - time.monotonic()) / (len(cells) - n))
        name = cfg["models"][slot][0]
        if not suite.fits(cfg["first_item_estimate"], cell_end) and slot not in suite.models:
            for t in cfg["block_tokens"]:
                suite.skip(part, {"model": name, "attention": backend, "T": t}, suite.skip_reason(
                    cfg["first_item_estimate"], cell_end))
            continue
        model = build_synthetic(suite, slot, part)
        if model is None:
            continue
        step_cost_cell(suite, with_attention(model, backend), name, backend, cell_end)
    rows = rec["rows"]
    for slot, backend in cells:
        name = cfg["models"][slot][0]
        base = next((r for r in rows if r["model"] == name and r["attention"] == backend and r["T"] == 1), None)
        for r in rows:
            if r["model"] == name and r["attention"] == backend and base is not None:
                r["c_min"] = r["seconds_min"] / base["seconds_min"]
                r["c_median"] = r["seconds_median"] / base["seconds_median"]
    rows.sort(key=lambda r: (r["attention"] != "xla", r["params"], r["T"]))
    suite.models.pop("8b", None)  # 16 GB the other parts do not use


def step_cost_cell(suite: Suite, model: jaxspec.Model, name: str, backend: str, until: float) -> None:
    """c(T) rows of one (model, backend): trace every T here, compile them on a few threads (XLA
    compiles release the GIL), then time them one by one once every compile is done (or abandoned
    at the deadline), so no compile's autotuning runs on the chip while a forward is timed."""
    cfg, part = suite.cfg, "step_cost"
    c = model.config
    cache = KVCache.zeros(c.num_layers, 1, cfg["cache_len"], c.num_kv_heads, c.head_dim,
                          model.module.embed_tokens.embedding.dtype)
    cache = dataclasses.replace(cache, lengths=jnp.full((1,), cfg["cache_filled"], jnp.int32))
    rng = np.random.default_rng(0)
    pool = concurrent.futures.ThreadPoolExecutor(max(1, suite.args.compile_threads))
    futures, args_of, compiled = {}, {}, {}
    t_cell = time.perf_counter()
    for t in cfg["block_tokens"]:
        item = {"model": name, "attention": backend, "T": t}
        if not suite.fits(1.0, until):
            suite.skip(part, item, "deadline: not traced")
            continue
        try:
            tokens = jnp.asarray(rng.integers(3, c.vocab_size, size=(1, t)), jnp.int32)
            args_of[t] = (model.params, cache, tokens)
            suite.current = f"step_cost: tracing {name} {backend} T={t}"
            lowered = forward_program(model, t, cfg["cache_filled"], cfg["inner"]).lower(*args_of[t])
            futures[t] = pool.submit(lowered.compile)
        except Exception as e:  # noqa: BLE001
            suite.error(part, item, e)
    compiles_until = until - cfg["timing_seconds_per_T"] * len(futures)  # time left to time what compiled
    for t, future in futures.items():
        item = {"model": name, "attention": backend, "T": t}
        suite.current = f"step_cost: compiling {name} {backend} T={t}"
        try:
            compiled[t] = future.result(timeout=max(suite.left(compiles_until), 0.1))
        except concurrent.futures.TimeoutError:
            suite.skip(part, item, "deadline: its compile had not finished")
        except Exception as e:  # noqa: BLE001
            suite.error(part, item, e)
    pool.shutdown(wait=False, cancel_futures=True)
    compile_seconds = time.perf_counter() - t_cell
    suite.log(f"step_cost {name} {backend}: {len(compiled)} programs traced and compiled in {compile_seconds:.1f}s")
    for t, program in compiled.items():
        item = {"model": name, "attention": backend, "T": t}
        if not suite.fits(0.0, suite.part_end[part]):  # (a cell may overrun its share, not the part)
            suite.skip(part, item, "deadline: compiled, not timed")
            continue
        suite.current = f"step_cost: timing {name} {backend} T={t}"
        try:
            times = [x / cfg["inner"] for x in time_program(program, args_of[t], cfg["repeats"])]
        except Exception as e:  # noqa: BLE001
            suite.error(part, item, e)
            continue
        row = {"model": name, "attention": backend, "params": model.config.num_params, "T": t,
               "seconds_min": min(times), "seconds_median": statistics.median(times), "repeats": len(times),
               "cell_compile_seconds": round(compile_seconds, 2)}
        with suite.lock:
            suite.part(part)["rows"].append(row)
        suite.log(f"step_cost {name} {backend} T={t:3d}: {1e3 * row['seconds_median']:.3f} ms median "
                  f"({1e3 * row['seconds_min']:.3f} min)")


# ----------------------------------------------------------------------------- part 2: decoding


def frozen_prompts() -> list[dict]:
    if PROMPTS_FILE.exists():
        return json.loads(PROMPTS_FILE.read_text())["prompts"]
    from code_prompts import code_prompts  # this interpreter's stdlib: other prompts on another Python
    return code_prompts(48)


def freeze_prompts(count: int = 12, length: int = 64) -> None:
    """Rewrite benchmarks/device_suite_prompts.json from this interpreter's held-out stdlib files."""
    from code_prompts import code_prompts

    tokenizer = jaxspec.load(jaxspec.loading.DEFAULT_MODEL).tokenizer
    out = []
    for p in code_prompts(4 * count):
        n = len(tokenizer.encode(p["text"]))
        if n >= length:
            out.append({"file": p["file"], "line": p["line"], "tokens": n, "text": p["text"]})
        if len(out) == count:
            break
    PROMPTS_FILE.write_text(json.dumps({
        "about": "Held-out pycode-5M prompts (benchmarks/code_prompts.py: function starts of the standard-library "
                 "files configs/pycode.toml holds out), frozen so that a machine with another Python (another "
                 "stdlib) decodes the same prompts. Regenerate: python benchmarks/device_suite.py --freeze-prompts.",
        "python": platform.python_version(), "stdlib": "python" + platform.python_version(), "prompts": out},
        indent=1) + "\n")


def pycode_setup(suite: Suite):
    """pycode-5M, its methods (the shipped drafter for speculative decoding) and its prompts."""
    from jaxspec.drafter import load_drafter
    from jaxspec.methods import DEFAULT_DRAFTER

    model = jaxspec.load(jaxspec.loading.DEFAULT_MODEL)
    n, length = suite.cfg["pycode"]["prompts"], suite.cfg["pycode"]["prompt_tokens"]
    prompts = []
    for p in frozen_prompts():
        ids = model.tokenizer.encode(p["text"])
        if len(ids) >= length:
            prompts.append({"file": p["file"], "line": p["line"], "ids": ids[-length:]})
        if len(prompts) == n:
            break
    methods = {"greedy": ("autoregressive", {}, model)}
    methods.update({k: ("lookahead", v, model) for k, v in LOOKAHEAD.items()})
    methods.update({k: ("prompt-lookup", v, model) for k, v in PROMPT_LOOKUP.items()})
    shipped = jaxspec.loading.ASSETS / DEFAULT_DRAFTER
    info = {"model": jaxspec.loading.DEFAULT_MODEL, "dtype": model.dtype, "attention": model.attention,
            "params": model.config.num_params}
    if shipped.exists():
        drafter = load_drafter(shipped)
        k = drafter.draft_len
        methods[f"speculative TD (K={k})"] = ("speculative", {"drafter": drafter, "draft_len": k,
                                                              "target_features": drafter.projection is not None}, model)
        info["drafter"] = repo_relative(shipped)
    else:
        suite.skip("decoding", "pycode-5M speculative", f"no shipped drafter at {repo_relative(shipped)}")
    return model, methods, prompts, info


def synthetic_setup(suite: Suite):
    model = build_synthetic(suite, "1b", "decoding")
    if model is None:
        return None
    c = suite.cfg["synthetic"]
    vocab = model.config.vocab_size
    prompts = []
    for i in range(c["prompts"]):  # a random segment repeated: prompt lookup and the n-gram pool find it
        seg = np.random.default_rng(100 + i).integers(3, vocab, size=c["period"]).tolist()
        ids = ([1] + seg * (c["prompt_tokens"] // c["period"] + 1))[:c["prompt_tokens"]]
        prompts.append({"kind": f"segment of {c['period']} random ids repeated", "seed": 100 + i, "ids": ids})
    pallas = with_attention(model, "pallas")
    methods = {"greedy": ("autoregressive", {}, model)}
    methods.update({k: ("lookahead", v, model) for k, v in LOOKAHEAD.items()})
    methods.update({k: ("prompt-lookup", v, model) for k, v in PROMPT_LOOKUP.items()})
    methods["greedy [pallas]"] = ("autoregressive", {}, pallas)
    methods.update({f"{k} [pallas]": ("lookahead", v, pallas) for k, v in LOOKAHEAD.items()})
    name = suite.cfg["models"]["1b"][0]
    info = {"model": f"synthetic {name} (random weights)", "dtype": model.dtype,
            "attention": "xla (pallas where named)", "params": model.config.num_params}
    return model, methods, prompts, info


def part_decoding(suite: Suite) -> None:
    part = "decoding"
    rec = suite.part(part)
    rec["models"] = {}
    end = suite.part_end[part]
    first_end = time.monotonic() + 0.4 * (end - time.monotonic())  # pycode-5M's share; the rest: the 1B
    for key, setup, until, precision in (("pycode-5M", pycode_setup, first_end, "highest"),
                                          ("synthetic-1b", synthetic_setup, end, None)):
        if not suite.fits(2 * suite.cfg["first_item_estimate"], until):
            suite.skip(part, key, suite.skip_reason(2 * suite.cfg["first_item_estimate"], until))
            continue
        suite.current = f"decoding: setting up {key}"
        try:
            got = setup(suite)
        except Exception as e:  # noqa: BLE001
            suite.error(part, f"{key} setup", e)
            continue
        if got is None:
            continue
        decode_model(suite, key, *got, until=until, precision=precision)


def decode_model(suite: Suite, key: str, model, methods: dict, prompts: list, info: dict, *, until: float,
                 precision: str | None) -> None:
    from jaxspec.exactness import compare

    part = "decoding"
    c = suite.cfg["pycode" if key == "pycode-5M" else "synthetic"]
    if c["methods"] is not None:
        methods = {n: m for n, m in methods.items() if n == "greedy" or n in c["methods"] or
                   n.split(" (K=")[0] in c["methods"]}  # (the drafter's K is in the name)
    elif key != "pycode-5M":  # the full run: one pallas lookahead config is enough
        methods.pop("lookahead (7,4,7) [pallas]", None)
    new = c["new_tokens"]
    entry = {**info, "matmul_precision": precision or "default", "new_tokens": new,
             "prompt_tokens": c["prompt_tokens"], "batch": 1,
             "prompts": [{k: v for k, v in p.items() if k != "ids"} for p in prompts],
             "rounds_planned": c["rounds"], "runs": {}, "methods": {}, "mismatches": []}
    with suite.lock:
        suite.part(part)["models"][key] = entry

    def run(name, ids):
        method, options, target = methods[name]
        # float32 as float32: a GPU's default float32 matmul rounds its inputs to TF32 (bf16 is unaffected).
        # Entered here, in the calling thread: JAX's config contexts are per thread, and the warm-up
        # compiles (the program every later call reuses) run on pool threads.
        ctx = jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()
        t0 = time.perf_counter()
        with ctx:
            out = jaxspec.generate(target, ids, max_new_tokens=new, method=method, stop_at_eos=False, **options)
        return out, time.perf_counter() - t0

    # Warm-up: one program per method (every prompt has the same length), compiled on a few threads.
    compile_seconds, ready = {}, []
    pool = concurrent.futures.ThreadPoolExecutor(max(1, suite.args.compile_threads))
    futures = {name: pool.submit(run, name, prompts[0]["ids"]) for name in methods}
    for name, future in futures.items():
        suite.current = f"decoding {key}: compiling {name}"
        try:
            out, wall = future.result(timeout=max(suite.left(until), 0.1))
        except concurrent.futures.TimeoutError:
            suite.skip(part, {"model": key, "method": name}, "deadline: its compile had not finished")
            continue
        except Exception as e:  # noqa: BLE001
            suite.error(part, {"model": key, "method": name}, e)
            continue
        compile_seconds[name] = out.compile_seconds
        ready.append(name)
        suite.log(f"decoding {key}: {name} compiled in {out.compile_seconds:.1f}s")
    pool.shutdown(wait=False, cancel_futures=True)
    if "greedy" not in ready:
        suite.skip(part, {"model": key}, "greedy did not compile: nothing to compare with")
        return
    runs = {name: [] for name in ready}
    entry["runs"] = runs
    greedy_ref: dict[int, list] = {}
    estimate, done_rounds = None, 0
    for r in range(c["rounds"]):
        for i, prompt in enumerate(prompts):
            # greedy first in every rotation's reference sense: the reference is each prompt's first greedy run
            need = estimate if estimate is not None else suite.cfg["first_item_estimate"]
            if not suite.fits(need, until):
                suite.skip(part, {"model": key, "round": r + 1, "prompt": i}, suite.skip_reason(need, until))
                continue
            suite.current = f"decoding {key}: round {r + 1}, prompt {i + 1}/{len(prompts)}"
            t0 = time.perf_counter()
            order = ready[(i + r) % len(ready):] + ready[:(i + r) % len(ready)]
            if i not in greedy_ref:  # the reference must exist before the others compare
                order.remove("greedy")
                order.insert(0, "greedy")
            for name in order:
                try:
                    out, wall = run(name, prompt["ids"])
                except Exception as e:  # noqa: BLE001
                    suite.error(part, {"model": key, "method": name, "prompt": i, "round": r + 1}, e)
                    continue
                if name == "greedy" and i not in greedy_ref:
                    greedy_ref[i] = out.tokens
                if i not in greedy_ref:
                    break  # greedy failed on this prompt (recorded): nothing to compare with
                identical = out.tokens == greedy_ref[i]
                run_rec = {"prompt": i, "round": r + 1, "tokens": len(out.tokens), "steps": out.steps,
                           "seconds": out.seconds, "call_seconds": wall, "identical": identical}
                if "accepted_tokens" in out.extras and "target_steps" in out.extras:
                    run_rec["accept_length"] = out.extras["accepted_tokens"] / max(out.extras["target_steps"], 1)
                if not identical:
                    mm = {"method": name, "prompt": i, "round": r + 1, "near_tie": False}
                    try:  # where and how far apart: the logits of greedy's model after the common prefix
                        with jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
                            diff = compare(methods["greedy"][2], prompt["ids"], greedy_ref[i], out.tokens)
                        mm.update(**dataclasses.asdict(diff), near_tie=diff.near_tie,
                                  describe=diff.describe(model.dtype))
                    except Exception as e:  # noqa: BLE001
                        mm["describe"] = f"differs (the logit comparison failed: {type(e).__name__}: {e})"
                    with suite.lock:
                        entry["mismatches"].append(mm)
                    suite.log(f"MISMATCH {key} {name} prompt {i}: {mm['describe']}")
                with suite.lock:
                    runs[name].append(run_rec)
            estimate = 1.5 * (time.perf_counter() - t0)
        done_rounds = r + 1
    entry["rounds_done"] = done_rounds
    summarize(entry, ready, methods, compile_seconds)
    for name, s in entry["methods"].items():
        suite.log(f"decoding {key}: {name:30s} S {s['S']:.2f}  {s['tokens_per_second']:8.1f} tok/s  "
                  f"{s['speedup_vs_greedy']:.2f}x  identical {s['identical_to_greedy']}/{s['runs']}")


def summarize(entry: dict, names: list, methods: dict, compile_seconds: dict) -> None:
    runs = entry["runs"]
    summary = {}
    for name in names:
        rs = runs[name]
        if not rs:
            continue
        tokens, steps = sum(x["tokens"] for x in rs), sum(x["steps"] for x in rs)
        seconds, call = sum(x["seconds"] for x in rs), sum(x["call_seconds"] for x in rs)
        method, options, _ = methods[name]
        s = {"method": method, "options": {k: v for k, v in options.items() if k != "drafter"},
             "S": tokens / steps, "tokens": tokens, "steps": steps, "seconds": seconds, "call_seconds": call,
             "tokens_per_second": tokens / seconds, "call_tokens_per_second": tokens / call,
             "ms_per_step": 1e3 * seconds / steps, "compile_seconds": compile_seconds.get(name),
             "identical_to_greedy": sum(x["identical"] for x in rs), "runs": len(rs)}
        if any("accept_length" in x for x in rs):
            s["accept_length"] = statistics.mean(x["accept_length"] for x in rs if "accept_length" in x)
        summary[name] = s
    greedy = summary.get("greedy")
    for s in summary.values():
        s["speedup_vs_greedy"] = s["tokens_per_second"] / greedy["tokens_per_second"] if greedy else None
        s["call_speedup_vs_greedy"] = s["call_tokens_per_second"] / greedy["call_tokens_per_second"] if greedy else None
        s["step_cost_vs_greedy"] = s["ms_per_step"] / greedy["ms_per_step"] if greedy else None
    entry["methods"] = summary


# ----------------------------------------------------------------------------- part 3: attention


def part_attention(suite: Suite) -> None:
    part = "attention"
    rec = suite.part(part)
    a = suite.cfg["attention"]
    cfg = dict(a["cfg"])
    interpret = True if jax.default_backend() == "cpu" else None  # Pallas interpret mode on CPU
    rec.update(config=cfg, batch=1, repeats=a["repeats"], inner=a["inner"], interpret=bool(interpret), rows=[])
    end = suite.part_end[part]
    estimate = suite.cfg["first_item_estimate"]
    items = [("decode", length) for length in cfg["cache_lengths"]] + [("pard", None)]
    for kind, length in items:
        item = {"kind": kind, "cache": length} if length else {"kind": kind, "pard": list(cfg["pard"])}
        if not suite.fits(estimate, end):
            suite.skip(part, item, suite.skip_reason(estimate, end))
            continue
        suite.current = f"attention: {item}"
        t0 = time.perf_counter()
        try:
            if kind == "decode":
                rows = attention_bench.decode_rows({**cfg, "cache_lengths": (length,)}, 1, a["repeats"], a["inner"],
                                                   interpret)
            else:
                rows = attention_bench.pard_rows(cfg, 1, a["repeats"], a["inner"], interpret)
        except Exception as e:  # noqa: BLE001
            suite.error(part, item, e)
            continue
        with suite.lock:
            rec["rows"] += rows
        estimate = 1.3 * (time.perf_counter() - t0)


# ----------------------------------------------------------------------------- markdown


def markdown(r: dict) -> str:
    m = r.get("machine", {})
    title = "# Device suite" + (" (smoke: tiny shapes on CPU; says nothing about speed)" if r["smoke"] else "")
    lines = [title, "", f"{m.get('device_kind', '?')} ({m.get('jax_backend', '?')}), JAX {m.get('jax', '?')}, "
             f"{r['date']}, `{r['command']}`.", ""]
    lines += report.device_suite(r)
    lines += ["", "| machine | |", "|---|---|",
              f"| device | {m.get('device', '?')} x {m.get('device_count', '?')} ({m.get('device_kind', '?')}) |",
              f"| host | {m.get('cpu', '?')} ({m.get('cpu_count', '?')} cores), {m.get('platform', '?')} |",
              f"| python / jax / jaxlib / jaxspec | {m.get('python', '?')} / {m.get('jax', '?')} / "
              f"{m.get('jaxlib', '?')} / {m.get('jaxspec', '?')} |"]
    if m.get("nvidia_smi"):
        lines.append(f"| nvidia-smi | {m['nvidia_smi']} |")
    lines += [f"| date | {r['date']} |", f"| command | `{r['command']}` |", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for device_suite.{json,md}")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, CPU (Pallas in interpret mode)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds from the start for the whole suite (default 420; smoke 240)")
    p.add_argument("--grace", type=float, default=None,
                   help="seconds past the deadline after which the watchdog writes and exits (default 40)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--compile-threads", type=int, default=None,
                   help="concurrent compiles (default: 4, or 2 on a CPU backend)")
    p.add_argument("--freeze-prompts", action="store_true",
                   help="rewrite benchmarks/device_suite_prompts.json from this Python's stdlib, then exit")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.freeze_prompts:
        freeze_prompts()
        print(f"wrote {PROMPTS_FILE}")
        return 0
    cfg = dict(SMOKE if args.smoke else FULL)
    if args.deadline is not None:
        cfg["deadline"] = args.deadline
    args.grace = 40.0 if args.grace is None else args.grace
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        sys.exit(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    if args.smoke and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        # tiny programs: LLVM's optimizations cost more compile time than they save (read at backend start)
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    backend = jax.default_backend()
    if backend == "cpu" and not args.smoke:
        sys.exit("no accelerator: the full suite is for a GPU or TPU (1B/8B models); run with --smoke on CPU")
    if args.compile_threads is None:
        args.compile_threads = 1 if backend == "cpu" else 4
    suite = Suite(args, cfg)
    threading.Thread(target=watchdog, args=(suite, suite.deadline + args.grace), daemon=True).start()
    suite.data["machine"] = device_info()
    suite.data["parts_requested"] = parts
    suite.data["compile_threads"] = args.compile_threads
    suite.log(f"{suite.data['machine']['device_kind']} on {backend}, JAX {jax.__version__}; deadline "
              f"{cfg['deadline']:.0f}s (+{args.grace:.0f}s grace), parts {parts}")
    functions = {"step_cost": part_step_cost, "decoding": part_decoding, "attention": part_attention}
    for name in PARTS:
        rec = suite.part(name)
        if name not in parts:
            rec["status"] = "not requested"
            continue
        rec["status"] = "running"
        t0 = time.perf_counter()
        try:
            functions[name](suite)
        except Exception as e:  # noqa: BLE001
            suite.error(name, "part", e)
        with suite.lock:
            rec["seconds"] = round(time.perf_counter() - t0, 1)
            rec["ended_at_seconds"] = round(suite.now(), 1)
            rec["status"] = "error" if rec["errors"] and not _measured(rec) else (
                "partial" if rec["skipped"] or rec["errors"] else "done")
        suite.log(f"part {name}: {rec['status']} in {rec['seconds']:.0f}s "
                  f"({len(rec['skipped'])} skipped, {len(rec['errors'])} errors)")
        suite.write()
    with suite.lock:
        suite.current = "done"
        suite.data["completed"] = True
        suite.data["total_seconds"] = round(suite.now(), 1)
        bad = [mm for p in suite.data["parts"].values() for e in p.get("models", {}).values()
               for mm in e["mismatches"] if not mm["near_tie"]]
        errors = sum(len(p["errors"]) for p in suite.data["parts"].values())
        suite.data["outputs_differ_beyond_near_ties"] = len(bad)
    suite.write()
    suite.log(f"wrote {args.out} ({suite.data['total_seconds']:.0f}s)")
    return 1 if bad else 2 if errors else 0


def _measured(rec: dict) -> bool:
    return bool(rec.get("rows")) or any(e.get("methods") for e in rec.get("models", {}).values())


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # abandoned compile threads (a skipped item) must not hold the exit
