"""The accelerator suite, for a short loan of one GPU (or TPU) chip: one result, DIR/device_suite.{json,md}.

    python -m benchmarks.device_suite --out DIR            # ~7 minutes on one H200
    python -m benchmarks.device_suite --smoke --out DIR    # tiny shapes on CPU, same layout (~1 minute)

Parts (--parts): 1. `step_cost`: c(T) = seconds of one decode-step forward of T chained block tokens (greedy
head, batch 1, a filled KV cache) / the same at T = 1, random-weight bfloat16 Llama-3.2-1B / 3.1-8B shapes,
attention "xla" and "pallas" (`inner` forwards a program; min and median of `repeats` interleaved rounds).
2. `decoding`: greedy, lookahead (15,5,15) and (7,4,7), prompt lookup and speculative decoding (the shipped
PARD-2 drafter) on pycode-5M's held-out code prompts (frozen in device_suite_prompts.json), and greedy /
lookahead / prompt lookup (xla and pallas) on the 1B shape with prompts repeating a segment, by `run_decode`
one round at a time; an output unlike greedy's is reported with its logit gap and whether it is a near-tie.
3. `attention`: `attention_bench`'s groups.

A deadline (--deadline, default 420 s from the start) is split into cumulative part deadlines; an item that
does not fit is recorded under `skipped`, an exception under `errors`; a watchdog writes what was measured and
ends the process `--grace` s after the deadline. Exit status: 0 done (skips allowed), 1 an output differs
from greedy beyond a near-tie, 2 an item raised, 3 the watchdog.
"""

from __future__ import annotations

import time

START = time.monotonic()  # the deadline counts from here: imports included

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(ROOT))  # (on a bare checkout, jaxspec too comes from the tree)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks import attention_bench  # noqa: E402
import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, command_line, machine_info, now, repo_relative, time_programs, write_result  # noqa: E402
from benchmarks.harness.decode import Case, DecodeBench, Setting, decode, differences, run_decode, summarize  # noqa: E402
from jaxspec import Model, ModelConfig, Transformer  # noqa: E402
from jaxspec.models.kv_cache import KVCache  # noqa: E402
from jaxspec.models.masks import TreeMask  # noqa: E402

PROMPTS_FILE = ROOT / "benchmarks" / "device_suite_prompts.json"
PARTS = ("step_cost", "decoding", "attention")

FULL = dict(
    deadline=420.0, shares={"step_cost": 0.50, "decoding": 0.36, "attention": 0.14},  # of the whole, cumulated
    models={"1b": ("llama3-1b", dict(hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                                     num_kv_heads=8, vocab_size=128256, tie_word_embeddings=True)),
            "8b": ("llama3-8b", dict(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                                     num_kv_heads=8, vocab_size=128256))},
    dtype="bfloat16", block_tokens=(1, 64, 256, 16, 128, 8, 32),  # compiled in this order (T = 1 first)
    cache_len=2048, cache_filled=1792, repeats=10, inner=10,
    pycode=dict(prompts=10, prompt_tokens=64, new_tokens=128, rounds=3, methods=None),  # None: every method
    synthetic=dict(prompts=4, prompt_tokens=64, period=16, new_tokens=128, rounds=3, methods=None,
                   pallas=("greedy", "lookahead (15,5,15)")),  # also run with pallas attention
    attention=dict(cfg=attention_bench.FULL, rounds=20, inner=10),
    first_item_estimate=15.0,  # seconds assumed for an item nothing has been measured like yet
    timing_seconds_per_T=1.5,  # (repeats + 1) x inner forwards: ~1 s for the 8B at T = 256
)
SMOKE = dict(  # stand-ins for the 1B / 8B slots (2 layers, hidden 256); one program per code path
    deadline=240.0, shares=FULL["shares"],
    models={"1b": ("tiny-1b-slot", dict(hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                                        num_kv_heads=2, vocab_size=2048, tie_word_embeddings=True)),
            "8b": ("tiny-8b-slot", dict(hidden_size=256, intermediate_size=640, num_layers=2, num_heads=8,
                                        num_kv_heads=2, vocab_size=4096))},
    dtype="float32", block_tokens=(1, 32), cache_len=96, cache_filled=64, repeats=2, inner=2,
    pycode=dict(prompts=2, prompt_tokens=64, new_tokens=16, rounds=1,
                methods=("greedy", "lookahead (7,4,7)", "prompt-lookup (N=4,G=8)", "speculative TD")),
    synthetic=dict(prompts=2, prompt_tokens=32, period=8, new_tokens=12, rounds=1,
                   methods=("greedy", "lookahead (7,4,7) [pallas]"), pallas=("lookahead (7,4,7)",)),
    attention=dict(cfg=attention_bench.SMOKE, rounds=1, inner=1), first_item_estimate=3.0, timing_seconds_per_T=0.2,
)
DRAFT_FREE = [Setting("greedy"), Setting("lookahead (15,5,15)", "lookahead", {"window": 15, "ngram": 5, "guesses": 15}),
              Setting("lookahead (7,4,7)", "lookahead", {"window": 7, "ngram": 4, "guesses": 7}),
              Setting("prompt-lookup (N=4,G=8)", "prompt-lookup", {"ngram": 4, "guesses": 8})]


class Suite:
    """The results being built, the clock and the files: one lock guards them, so the watchdog can
    write a consistent snapshot while the main thread measures."""

    def __init__(self, args, cfg: dict):
        self.args, self.cfg, self.lock, self.current, self.models = args, cfg, threading.RLock(), "start-up", {}
        self.deadline = START + cfg["deadline"]
        shares = np.cumsum([cfg["shares"][p] for p in PARTS]) / sum(cfg["shares"].values())
        self.part_end = {p: START + float(s) * cfg["deadline"] for p, s in zip(PARTS, shares)}
        self.data = {
            "benchmark": "device_suite", "title": "Device suite" + (
                " (smoke: tiny shapes on CPU; says nothing about speed)" if args.smoke else ""),
            "smoke": args.smoke, "date": now(), "command": command_line(__file__, args.argv), "machine": {},
            "deadline_seconds": cfg["deadline"], "grace_seconds": args.grace,
            "part_deadlines_seconds": {p: round(self.part_end[p] - START, 1) for p in PARTS},
            "parts": {p: {"status": "not run", "skipped": [], "errors": []} for p in PARTS},
            "completed": False, "total_seconds": None}

    def now(self) -> float:
        return time.monotonic() - START

    def left(self, until: float) -> float:
        return min(until, self.deadline) - time.monotonic()

    def fits(self, part: str, item, estimate: float, until: float) -> bool:
        """Whether `estimate` seconds are left before `until`; if not, `item` is recorded as skipped."""
        if self.left(until) >= estimate:
            return True
        self.skip(part, item, f"deadline: needs ~{estimate:.0f} s, {max(self.left(until), 0):.0f} s left")
        return False

    def log(self, msg: str) -> None:
        print(f"[{self.now():6.1f}s] {msg}", flush=True)

    def skip(self, part: str, item, reason: str) -> None:
        with self.lock:
            self.part(part)["skipped"].append({"item": item, "reason": reason, "at_seconds": round(self.now(), 1)})
        self.log(f"SKIP {part} {item}: {reason}")

    def error(self, part: str, item, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        with self.lock:
            self.part(part)["errors"].append({"item": item, "error": f"{type(exc).__name__}: {exc}"[:2000],
                                              "traceback": tb[-4000:]})
        self.log(f"ERROR {part} {item}: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def attempt(self, part: str, item, doing: str = ""):
        """Runs the block as `item` of `part`: an exception is recorded under `errors`, not raised."""
        self.current = f"{part}: {doing} {item}".replace("  ", " ")
        try:
            yield
        except Exception as e:  # noqa: BLE001
            self.error(part, item, e)

    def part(self, name: str) -> dict:
        return self.data["parts"][name]

    def write(self) -> None:
        with self.lock:  # (the watchdog and the main thread never write at once)
            stem = "device_suite_smoke" if self.args.smoke and self.args.out == RESULTS else "device_suite"
            write_result(json.loads(json.dumps(self.data, default=str)), self.args.out, stem, quiet=True)

    def compile_all(self, part: str, jobs: dict, until: float) -> dict:
        """{name: (item, fn)} run on `--compile-threads` threads (XLA compiles release the GIL) ->
        {name: fn()} of those that finished before `until`; the others recorded as skipped / errors."""
        pool = concurrent.futures.ThreadPoolExecutor(max(1, self.args.compile_threads))
        futures, done = {name: pool.submit(fn) for name, (_, fn) in jobs.items()}, {}
        for name, future in futures.items():
            self.current = f"{part}: compiling {jobs[name][0]}"
            try:
                done[name] = future.result(timeout=max(self.left(until), 0.1))
            except concurrent.futures.TimeoutError:
                self.skip(part, jobs[name][0], "deadline: its compile had not finished")
            except Exception as e:  # noqa: BLE001
                self.error(part, jobs[name][0], e)
        pool.shutdown(wait=False, cancel_futures=True)
        return done


def watchdog(suite: Suite, at: float) -> None:
    while time.monotonic() < at:
        time.sleep(0.25)
    suite.lock.acquire(timeout=10)  # (kept: the process ends here)
    try:
        suite.data.update(completed=False, total_seconds=round(suite.now(), 1), interrupted={
            "at_seconds": round(suite.now(), 1), "while": suite.current,
            "why": f"the watchdog ended the run {suite.args.grace:g} s after the deadline"})
        for p in PARTS:
            if suite.part(p)["status"] == "running":
                suite.part(p)["status"] = "interrupted"
        suite.write()
        suite.log(f"WATCHDOG: wrote partial results to {suite.args.out}; exiting")
    finally:
        os._exit(3)


def device_info() -> dict:
    dev = jax.devices()[0]
    info = {**machine_info(), "device_kind": dev.device_kind, "device_count": jax.device_count(),
            "device_platform": dev.platform, "xla_flags": os.environ.get("XLA_FLAGS", "")}
    with contextlib.suppress(Exception):
        info["jaxlib"] = __import__("jaxlib").__version__
        info["device_memory_bytes"] = int((dev.memory_stats() or {})["bytes_limit"])
    if dev.platform == "gpu":
        with contextlib.suppress(Exception):
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=15).stdout.strip()
    return info


def with_attention(model: Model, attention: str) -> Model:
    """The same weights (no copy) with another attention backend, and its own compiled programs."""
    if model.attention == attention:
        return model
    module = model.module
    module.attention = attention
    graphdef, params = nnx.split(module)
    return dataclasses.replace(model, graphdef=graphdef, params=params, attention=attention, compiled={},
                               drafters={}, memory_estimates={}, lp_layouts={})


def build_synthetic(suite: Suite, slot: str, part: str) -> Model | None:
    """The random-weight Llama of a slot ("1b" / "8b"), built on the device by one compiled init, once."""
    if slot in suite.models:
        return suite.models[slot]
    (name, shape), t0, suite.models[slot] = suite.cfg["models"][slot], time.perf_counter(), None
    with suite.attempt(part, f"build {name}"):
        cfg = ModelConfig(model_type="llama", head_dim=shape["hidden_size"] // shape["num_heads"],
                          max_position_embeddings=4096, bos_token_id=1, eos_token_ids=(2,), **shape)
        dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[suite.cfg["dtype"]]
        module = nnx.jit(lambda: Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(0)))()
        model = Model.from_module(module, dtype=suite.cfg["dtype"], source=f"synthetic-{name}")
        jax.block_until_ready(model.params)
        suite.models[slot] = model
        suite.log(f"built {name}: {cfg.num_params / 1e9:.3f}B params in {time.perf_counter() - t0:.1f}s")
    return suite.models[slot]


def forward_program(model: Model, t: int, cache_filled: int, inner: int):
    """A jitted program running `inner` decode-step forwards of T chained tokens over a cache holding
    `cache_filled` tokens (the greedy head: argmax only, as greedy verification runs it); the
    tokens change with the iteration so no forward can be hoisted out of the loop."""
    graphdef, vocab = model.graphdef, model.config.vocab_size
    mask = TreeMask(pre=np.arange(t, dtype=np.int32)[None], end=np.full((1, t), t - 1, np.int32))
    positions = cache_filled + jnp.arange(t, dtype=jnp.int32)[None]

    def run(params, cache, tokens):
        module = nnx.merge(graphdef, params)

        def body(i, acc):
            out = module((tokens + i) % vocab, positions, mask, cache, head="argmax")
            return acc + out.preds.sum() + out.block_kv.k[-1, 0, -1, 0, 0].astype(jnp.int32)

        return jax.lax.fori_loop(0, inner, body, jnp.zeros((), jnp.int32))

    return jax.jit(run)


def part_step_cost(suite: Suite) -> None:
    cfg, part = suite.cfg, "step_cost"
    suite.part(part).update(rows=[], config={
        "block_tokens": sorted(cfg["block_tokens"]), "cache_len": cfg["cache_len"], "cache_filled": cfg["cache_filled"],
        "repeats": cfg["repeats"], "inner": cfg["inner"], "dtype": cfg["dtype"], "batch": 1, "mask": "chain TreeMask",
        "head": "argmax"})
    cells = [(slot, backend) for backend in ("xla", "pallas") for slot in ("1b", "8b")]  # (the rows' order)
    for n, (slot, backend) in enumerate(cells):
        cell_end = time.monotonic() + suite.left(suite.part_end[part]) / (len(cells) - n)  # its share of what is left
        cell = {"model": cfg["models"][slot][0], "attention": backend}
        if slot in suite.models or suite.fits(part, cell, cfg["first_item_estimate"], cell_end):
            model = build_synthetic(suite, slot, part)
            if model is not None:
                step_cost_cell(suite, with_attention(model, backend), cell, cell_end)
    suite.models.pop("8b", None)  # 16 GB the other parts do not use


def step_cost_cell(suite: Suite, model: Model, cell: dict, until: float) -> None:
    """c(T) rows of one (model, backend): every T traced, compiled on a few threads, then what
    compiled in time is timed interleaved (no compile's autotuning runs on the chip meanwhile)."""
    cfg, part, c = suite.cfg, "step_cost", model.config
    cache = KVCache.zeros(c.num_layers, 1, cfg["cache_len"], c.num_kv_heads, c.head_dim,
                          model.module.embed_tokens.embedding.dtype)
    cache = dataclasses.replace(cache, lengths=jnp.full((1,), cfg["cache_filled"], jnp.int32))
    rng, args, jobs, times, t0 = np.random.default_rng(0), {}, {}, {}, time.perf_counter()
    for t in cfg["block_tokens"]:
        with suite.attempt(part, {**cell, "T": t}, "tracing"):
            args[t] = (model.params, cache, jnp.asarray(rng.integers(3, c.vocab_size, size=(1, t)), jnp.int32))
            program = forward_program(model, t, cfg["cache_filled"], cfg["inner"])
            jobs[t] = ({**cell, "T": t}, program.lower(*args[t]).compile)
    compiled = suite.compile_all(part, jobs, until - cfg["timing_seconds_per_T"] * len(jobs))  # time left to time
    compile_seconds = time.perf_counter() - t0
    suite.log(f"step_cost {cell}: {len(compiled)} programs traced and compiled in {compile_seconds:.1f}s")
    with suite.attempt(part, cell, "timing"):  # (a cell may overrun its share, not the part; one round at least)
        times = time_programs({t: (program, args[t]) for t, program in compiled.items()}, cfg["repeats"],
                              deadline=time.perf_counter() + suite.left(suite.part_end[part])) if compiled else {}
    rows = []
    for t in sorted(times):
        seconds = [x / cfg["inner"] for x in times[t]]
        rows.append({**cell, "params": c.num_params, "T": t, "seconds_min": min(seconds),
                     "seconds_median": float(np.median(seconds)), "repeats": len(seconds),
                     "cell_compile_seconds": round(compile_seconds, 2)})
        if rows[0]["T"] == 1:
            rows[-1].update(c_min=rows[-1]["seconds_min"] / rows[0]["seconds_min"],
                            c_median=rows[-1]["seconds_median"] / rows[0]["seconds_median"])
        suite.log(f"step_cost {cell} T={t:3d}: {1e3 * rows[-1]['seconds_median']:.3f} ms median "
                  f"({1e3 * rows[-1]['seconds_min']:.3f} min)")
    with suite.lock:
        suite.part(part)["rows"] += rows


def freeze_prompts(count: int = 12, length: int = 64) -> None:
    """Rewrite benchmarks/device_suite_prompts.json from this interpreter's held-out stdlib files."""
    from benchmarks.harness.cases import code_prompts

    tokenizer = jaxspec.load(jaxspec.checkpoint.loading.DEFAULT_MODEL).tokenizer
    out = [{**p, "tokens": len(tokenizer.encode(p["text"]))} for p in code_prompts(4 * count)]
    PROMPTS_FILE.write_text(json.dumps({
        "about": "Held-out pycode-5M prompts (benchmarks/harness/cases.py: function starts of the standard-library "
                 "files configs/pycode.toml holds out), frozen so that a machine with another Python (another "
                 "stdlib) decodes the same prompts. Regenerate: python -m benchmarks.device_suite --freeze-prompts.",
        "python": sys.version.split()[0], "prompts": [p for p in out if p["tokens"] >= length][:count]},
        indent=1) + "\n")


def pycode_bench(suite: Suite) -> DecodeBench:
    """pycode-5M on its frozen prompts: the draft-free methods and the shipped drafter."""
    from jaxspec.checkpoint.drafter_files import load_drafter
    from jaxspec.checkpoint.method_defaults import DEFAULT_DRAFTER

    c = suite.cfg["pycode"]
    model = jaxspec.load(jaxspec.checkpoint.loading.DEFAULT_MODEL)
    cases = [Case(f"{p['file']}:{p['line']}", tuple(ids[-c["prompt_tokens"]:]))
             for p in json.loads(PROMPTS_FILE.read_text())["prompts"]
             if len(ids := model.tokenizer.encode(p["text"])) >= c["prompt_tokens"]][:c["prompts"]]
    settings, shipped = list(DRAFT_FREE), jaxspec.checkpoint.loading.ASSETS / DEFAULT_DRAFTER
    facts = {"dtype": model.dtype, "params": model.config.num_params, "matmul_precision": "highest"}
    if shipped.exists():
        drafter = load_drafter(shipped)
        settings.append(Setting(f"speculative TD (K={drafter.draft_len})", "speculative", {
            "drafter": drafter, "draft_len": drafter.draft_len, "target_features": drafter.projection is not None}))
        facts["drafter"] = repo_relative(shipped)
    else:
        suite.skip("decoding", "pycode-5M speculative", f"no shipped drafter at {repo_relative(shipped)}")
    return DecodeBench("pycode-5M", f"{jaxspec.checkpoint.loading.DEFAULT_MODEL}, held-out code, attention {model.attention}",
                       model, cases, settings, c["new_tokens"], facts=facts)


def synthetic_bench(suite: Suite) -> DecodeBench | None:
    """The 1B-shaped random model on prompts repeating a random segment (prompt lookup and the
    n-gram pool find it); the [pallas] settings decode the same weights with pallas attention."""
    model = build_synthetic(suite, "1b", "decoding")
    if model is None:
        return None
    c, vocab = suite.cfg["synthetic"], model.config.vocab_size
    segments = [np.random.default_rng(100 + i).integers(3, vocab, size=c["period"]).tolist()
                for i in range(c["prompts"])]
    cases = [Case(f"seed {100 + i}", tuple(([1] + seg * (c["prompt_tokens"] // c["period"] + 1))[:c["prompt_tokens"]]))
             for i, seg in enumerate(segments)]
    pallas = DecodeBench("pallas", "", with_attention(model, "pallas"), (), (), c["new_tokens"])
    settings = DRAFT_FREE + [Setting(f"{s.name} [pallas]", s.method, s.options, peer=lambda case, n, s=s:
                                     decode(pallas, s, case)) for s in DRAFT_FREE if s.name in c["pallas"]]
    return DecodeBench("synthetic-1b", f"synthetic {suite.cfg['models']['1b'][0]}, random weights; prompts repeat a "
                       f"segment of {c['period']} random ids", model, cases, settings, c["new_tokens"],
                       facts={"dtype": model.dtype, "params": model.config.num_params, "matmul_precision": "default"})


def part_decoding(suite: Suite) -> None:
    suite.part("decoding")["models"] = {}
    end = suite.part_end["decoding"]
    first_end = time.monotonic() + 0.4 * (end - time.monotonic())  # pycode-5M's share; the rest: the 1B
    for key, setup, until, precision in (("pycode-5M", pycode_bench, first_end, "highest"),
                                          ("synthetic-1b", synthetic_bench, end, None)):
        if suite.fits("decoding", key, 2 * suite.cfg["first_item_estimate"], until):
            bench = None
            with suite.attempt("decoding", f"{key} setup"):
                bench = setup(suite)
            if bench is not None:
                decode_model(suite, key, bench, until, precision)


def decode_model(suite: Suite, key: str, bench: DecodeBench, until: float, precision: str | None) -> None:
    part, c = "decoding", suite.cfg["pycode" if key == "pycode-5M" else "synthetic"]

    def wanted(name: str) -> bool:  # (the drafter's K is in its name)
        return c["methods"] is None or name == "greedy" or name.split(" (K=")[0] in c["methods"]

    def precise():  # float32 as float32: a GPU's default float32 matmul rounds its inputs to TF32
        return jax.default_matmul_precision(precision)

    def warm(setting):  # one program per setting (the prompts share a length); contexts are per thread
        with precise():
            return decode(bench, setting, bench.cases[0])

    jobs = {s.name: ({"model": key, "method": s.name}, lambda s=s: warm(s)) for s in bench.settings if wanted(s.name)}
    ready = suite.compile_all(part, jobs, until)
    if "greedy" not in ready:
        return suite.skip(part, {"model": key}, "greedy did not compile: nothing to compare with")
    bench = dataclasses.replace(bench, settings=[s for s in bench.settings if s.name in ready])
    rounds, estimate = [], 0.0
    for r in range(1, c["rounds"] + 1):
        t0 = time.perf_counter()
        if suite.fits(part, {"model": key, "round": r}, estimate, until):
            with suite.attempt(part, {"model": key, "round": r}), tempfile.TemporaryDirectory() as tmp, precise():
                rounds.append(run_decode(bench, Path(tmp) / "runs.jsonl", fresh=True, progress=False))
            estimate = 1.3 * (time.perf_counter() - t0)
    if not rounds:
        return
    runs = {n: [rnd["runs"][n][0] for rnd in rounds] for n in ready}
    for rs in runs.values():  # later rounds' tokens are checked against round 0's, not kept
        for k, rnd in enumerate(rs[1:], 1):
            for row, first in zip(rnd, rs[0]):
                row.update(round=k, same_as_round_0=row.pop("tokens") == first["tokens"])
    bench = dataclasses.replace(bench, rounds=len(rounds))
    entry = dict(rounds[0], rounds=len(rounds), rounds_planned=c["rounds"], runs=runs, summary=summarize(bench, runs),
                 mismatches=[])
    for s, setting in zip(entry["settings"], bench.settings):
        s["method"] = setting.method  # (a [pallas] setting runs as a peer)
    with suite.attempt(part, {"model": key}, "comparing logits"), precise():  # where and how far apart
        entry["mismatches"] = differences(bench.model, bench.cases, runs, "greedy")
    for mm in entry["mismatches"]:
        suite.log(f"MISMATCH {key} {mm['setting']} {mm['case']}: {mm['describe']}")
    with suite.lock:
        suite.part(part)["models"][key] = entry
    for name, s in entry["summary"].items():
        suite.log(f"decoding {key}: {name:30s} S {s['S']:.2f}  {s['tokens_per_second']:8.1f} tok/s  "
                  f"{s['speed_vs_reference']:.2f}x  identical {s['identical_to_reference']}/{s['cases']}")


def part_attention(suite: Suite) -> None:
    part, a = "attention", suite.cfg["attention"]
    rec, end, estimate = suite.part(part), suite.part_end[part], suite.cfg["first_item_estimate"]
    interpret = True if jax.default_backend() == "cpu" else None  # Pallas interpret mode on CPU
    rec.update(config=a["cfg"], batch=1, rounds=a["rounds"], inner=a["inner"], interpret=bool(interpret), rows=[])
    for group in attention_bench.groups(a["cfg"], 1, a["inner"], interpret):
        item, t0 = {k: group[0][k] for k in ("block", "cache")}, time.perf_counter()
        if suite.fits(part, item, estimate, end):
            with suite.attempt(part, item):
                rows = attention_bench.measure(group, a["rounds"], a["inner"], time.perf_counter() + suite.left(end))
                with suite.lock:
                    rec["rows"] += rows
            estimate = 1.3 * (time.perf_counter() - t0)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for device_suite.{json,md}")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, CPU (Pallas in interpret mode)")
    p.add_argument("--deadline", type=float, help="seconds from the start for the whole suite (default 420; smoke 240)")
    p.add_argument("--grace", type=float, default=40.0, help="seconds past the deadline before the watchdog exits")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--compile-threads", type=int, help="concurrent compiles (default: 4, or 1 on a CPU backend)")
    p.add_argument("--freeze-prompts", action="store_true",
                   help="rewrite benchmarks/device_suite_prompts.json from this Python's stdlib, then exit")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.freeze_prompts:
        return freeze_prompts() or 0
    cfg = dict(SMOKE if args.smoke else FULL, **({"deadline": args.deadline} if args.deadline else {}))
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        sys.exit(f"unknown parts {sorted(set(parts) - set(PARTS))}; choose from {PARTS}")
    if args.smoke and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        # tiny programs: LLVM's optimizations cost more compile time than they save (read at backend start)
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    backend = jax.default_backend()
    if backend == "cpu" and not args.smoke:
        sys.exit("no accelerator: the full suite is for a GPU or TPU (1B/8B models); run with --smoke on CPU")
    args.compile_threads = args.compile_threads or (1 if backend == "cpu" else 4)
    suite = Suite(args, cfg)
    threading.Thread(target=watchdog, args=(suite, suite.deadline + args.grace), daemon=True).start()
    suite.data.update(machine=device_info(), parts_requested=parts, compile_threads=args.compile_threads)
    suite.log(f"{suite.data['machine']['device_kind']} on {backend}, JAX {jax.__version__}; deadline "
              f"{cfg['deadline']:.0f}s (+{args.grace:.0f}s grace), parts {parts}")
    for name in PARTS:
        rec, t0 = suite.part(name), time.perf_counter()
        rec["status"] = "running" if name in parts else "not requested"
        if name not in parts:
            continue
        with suite.attempt(name, "part"):
            globals()[f"part_{name}"](suite)
        with suite.lock:
            measured = rec.get("rows") or rec.get("models")
            rec.update(seconds=round(time.perf_counter() - t0, 1), ended_at_seconds=round(suite.now(), 1),
                       status="error" if rec["errors"] and not measured else (
                           "partial" if rec["skipped"] or rec["errors"] else "done"))
        suite.log(f"part {name}: {rec['status']} in {rec['seconds']:.0f}s "
                  f"({len(rec['skipped'])} skipped, {len(rec['errors'])} errors)")
        suite.write()
    with suite.lock:
        suite.current = "done"
        bad = [mm for p in suite.data["parts"].values() for e in p.get("models", {}).values()
               for mm in e["mismatches"] if not mm["near_tie"]]
        errors = sum(len(p["errors"]) for p in suite.data["parts"].values())
        suite.data.update(completed=True, total_seconds=round(suite.now(), 1), outputs_differ_beyond_near_ties=len(bad))
    suite.write()
    suite.log(f"wrote {args.out} ({suite.data['total_seconds']:.0f}s)")
    return 1 if bad else 2 if errors else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # abandoned compile threads (a skipped item) must not hold the exit
