"""The serving loop: requests wait in a queue, enter free decode slots, leave when done.

One thread owns the device work. Each turn it admits waiting jobs into free slots (prefill +
insert, `jaxspec.serving.slots`), then advances every busy slot group by one chunk of steps
and hands each job the tokens its row produced: text, stop strings and stop ids are checked on
the host, and a job that is finished, stopped or cancelled (its client went away) frees its
slot at once. Jobs that decode with different engines (method, greedy or sampled, stop at EOS
or not) live in different slot groups, each one compiled program; idle groups make room for
new ones when there are more than `max_groups`.

Nothing compiles on the scheduler's thread while it serves: a new group is built, and the
programs a job needs are compiled, by a background worker (`jaxspec.runtime.background`) while
that job waits in the queue and the others go on streaming; a chunk runs the smallest compiled
program that covers its rows (`SlotGroup.advance`). The group of a plan with `step_modes` (the
server's `auto`) picks drafted or plain steps per chunk (`jaxspec.runtime.step_modes`).
"""

from __future__ import annotations

import collections
import dataclasses
import secrets
import sys
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np

from jaxspec import stop_strings
from jaxspec.decoding.sampling import SamplingParams
from jaxspec.runtime.background import Background
from jaxspec.runtime.plan import DecodePlan
from jaxspec.serving.slots import SlotGroup
from jaxspec.runtime.step_modes import MODES, StepModes


@dataclasses.dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: tuple | None = None  # a plan with logprobs: (chosen [n], top ids [n, k], top [n, k]) of token_ids


@dataclasses.dataclass
class Finish:
    reason: str  # "stop" (end of turn, EOS, a stop string or id) | "length"
    text: str
    token_ids: list[int]
    stats: dict
    logprobs: tuple | None = None  # as Delta's, of every token in token_ids


@dataclasses.dataclass
class Failure:
    message: str


class QueueFull(RuntimeError):
    """The scheduler's queue holds `max_waiting` choices: a new request is refused (503), not queued."""


@dataclasses.dataclass(eq=False)
class Job:
    """One request in the scheduler. `deliver` is called from the scheduler thread with
    `Delta`s, then one `Finish` or `Failure` (it must be thread-safe)."""

    prompt: list[int]
    limit: int  # max new tokens
    seed: int
    sampling: SamplingParams
    plan: DecodePlan
    deliver: Callable[[Any], None]
    stop_strings: tuple[str, ...] = ()
    stop_ids: frozenset = frozenset()
    cancelled: bool = False  # set by the client's side: the job is dropped or its slot freed
    created: float = dataclasses.field(default_factory=time.perf_counter)
    # host-side progress
    admitted_at: float | None = None  # when it took a slot (its prefill began)
    first_token_at: float | None = None
    sent_text: int = 0
    sent_tokens: int = 0
    finished: bool = False


class Detokenizer:
    """Text of a job's tokens so far, cut at its stops; what may be sent without a later token
    changing it (no half character, no possible start of a stop string: `stop_strings.settled`,
    the rule `jaxspec.stream` follows too)."""

    def __init__(self, tokenizer, eos_ids: tuple[int, ...]):
        self.tokenizer, self.eos_ids = tokenizer, frozenset(eos_ids)

    def decode(self, ids: list[int]) -> str:
        return "" if self.tokenizer is None else self.tokenizer.decode(ids)

    def progress(self, job: Job, ids: list[int], done: bool) -> tuple[list[int], str, str | None]:
        """(token ids kept, text that may be sent, finish reason or None while going on)."""
        reason = None
        for i, t in enumerate(ids):
            if t in job.stop_ids:
                ids, reason = ids[:i + 1], "stop"
                break
        if reason is None and done:
            reason = "stop" if ids and ids[-1] in self.eos_ids else "length"
        body = ids[:-1] if ids and (ids[-1] in self.eos_ids or ids[-1] in job.stop_ids) and reason == "stop" else ids
        kept, text, stopped = stop_strings.settled(self.decode, body, job.stop_strings, reason is not None)
        if stopped:
            ids, reason = kept, "stop"
        return ids, text, reason


class Scheduler:
    def __init__(self, model, *, slots: int, context: int, chunk_steps: int, max_groups: int = 4,
                 max_waiting: int = 256):
        self.model, self.slots, self.context, self.chunk_steps = model, slots, context, chunk_steps
        self.max_groups, self.max_waiting = max_groups, max_waiting
        self.groups: collections.OrderedDict[tuple, SlotGroup] = collections.OrderedDict()
        self.jobs: dict[tuple, list[Job | None]] = {}  # per group: the job in each slot
        self.waiting: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition()
        self.stopping = False
        self.detokenizers: dict[tuple, Detokenizer] = {}
        self.counters = collections.Counter()
        self.thread = threading.Thread(target=self._run, name="jaxspec-scheduler", daemon=True)
        self.compiler = Background(on_done=self._wake)  # groups and programs, off this thread
        self.building: dict[tuple, SlotGroup | None] = {}  # plan key -> the group once built (None: building)
        self._woken = False

    # ----------------------------------------------------------------------------- client side
    def start(self) -> None:
        self.thread.start()

    def submit(self, *jobs: Job) -> None:
        """Queue a request's jobs (one per choice), all or none: QueueFull when `max_waiting` would
        be passed (a client told to come back beats a queue whose last request waits for minutes)."""
        with self.cond:
            if self.stopping:
                raise RuntimeError("the server is shutting down")
            if len(self.waiting) + len(jobs) > self.max_waiting:
                self.counters["refused"] += len(jobs)
                raise QueueFull(f"the server is busy: {len(self.waiting)} choices wait for a slot (at most "
                                f"{self.max_waiting}, --max-waiting); retry later")
            self.waiting.extend(jobs)
            self.counters["submitted"] += len(jobs)
            self.cond.notify()

    def cancel(self, job: Job) -> None:
        job.cancelled = True
        self._wake()

    def _wake(self) -> None:
        with self.cond:
            self._woken = True
            self.cond.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Finish what is waiting and in flight, then end the thread."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout)
        for group in list(self.groups.values()):
            if group.modes is not None:  # what the chunks taught, for the next server
                group.modes.save()

    def status(self) -> dict:
        with self.cond:
            busy = sum(j is not None for jobs in self.jobs.values() for j in jobs)
            modes = [g.modes.as_dict() for g in self.groups.values() if g.modes is not None]
            return {"waiting": len(self.waiting), "running": busy, "slots": self.slots, "groups": len(self.groups),
                    "compiling": int(self.compiler.busy()),
                    "stalls": sum(g.stalls for g in self.groups.values()),
                    # drafted or plain chunks (groups with step modes): chunks and tokens per mode, the last one's
                    "step_modes": {m: {"chunks": sum(x["chunks"][m] for x in modes),
                                       "tokens": sum(x["tokens"][m] for x in modes),
                                       "current": sum(x["current"] == m for x in modes)} for m in MODES},
                    # the same per tier of rows (the program's), with the seconds a step of each mode measured there
                    "step_mode_tiers": _merged_tiers([x["tiers"] for x in modes]),
                    **self.counters}

    def group(self, plan: DecodePlan, wait: bool = False) -> SlotGroup | None:
        """The plan's slot group; idle groups beyond `max_groups` go. A group not built yet is
        built by the background worker (`wait`: here, now; `Server.warm` builds the default
        group's so), and None is returned meanwhile, as while `max_groups` groups are all busy:
        the job waits."""
        if plan.key in self.building and self.building[plan.key] is not None:  # built: in service from now
            self._add(plan, self.building.pop(plan.key))
        if plan.key in self.groups:
            self.groups.move_to_end(plan.key)
            return self.groups[plan.key]
        if plan.key in self.building:
            return None
        idle = [k for k, jobs in self.jobs.items() if all(j is None for j in jobs)]
        while len(self.groups) + len(self.building) >= self.max_groups and idle:
            key = idle.pop(0)
            del self.groups[key], self.jobs[key], self.detokenizers[key]
        if len(self.groups) + len(self.building) >= self.max_groups:
            return None

        def build() -> SlotGroup:
            group = SlotGroup(self.model, plan, slots=self.slots, context=self.context, chunk_steps=self.chunk_steps,
                              compiler=self.compiler,
                              modes=StepModes(self.model, plan.label) if plan.step_modes else None)
            group.warm(tiers=1)  # the rest queued behind it
            return group

        if wait:
            self._add(plan, build())
            return self.groups[plan.key]
        self.building[plan.key] = None

        def build_off_thread() -> None:
            self.building[plan.key] = build()

        self.compiler.submit(("group", plan.key), build_off_thread)
        return None

    def _add(self, plan: DecodePlan, group: SlotGroup) -> None:
        self.groups[plan.key], self.jobs[plan.key] = group, [None] * self.slots
        self.detokenizers[plan.key] = Detokenizer(self.model.tokenizer, plan.eos_ids)

    # ----------------------------------------------------------------------------- scheduler thread
    def _run(self) -> None:
        while True:
            with self.cond:
                while not (self.waiting or self._busy() or self.stopping):
                    self.cond.wait()
                if self.stopping and not self.waiting and not self._busy():
                    return
                waiting = list(self.waiting)
                self._woken = False
            admitted = self._admit(waiting)
            busy = [k for k in self.groups if any(j is not None for j in self.jobs[k])]
            for key in busy:
                self._guarded(key, lambda g=self.groups[key], k=key: self._advance(k, g))
            if not admitted and not busy:  # jobs wait for programs compiling: until one is done
                with self.cond:
                    if not self._woken:
                        self.cond.wait(1.0)

    def _busy(self) -> bool:
        return any(j is not None for jobs in self.jobs.values() for j in jobs)

    def _guarded(self, key, work) -> None:
        """Run group work; a failure fails that group's jobs and drops the group, the server goes on."""
        try:
            work()
        except Exception:  # noqa: BLE001  (a bug must not take the server down)
            ident = _logged("decoding failed")
            for job in self.jobs.pop(key, []):
                if job is not None and not job.finished:
                    job.finished = True
                    job.deliver(Failure(f"decoding failed: error {ident} (the server's log has it)"))
            self.groups.pop(key, None)
            self.counters["failed"] += 1

    def _admit(self, waiting: list[Job]) -> int:
        """Put waiting jobs whose programs are ready into free slots; how many took one."""
        taken = 0
        for job in waiting:
            admitted = dropped = job.cancelled  # dropped: cancelled before it had a slot
            if not job.cancelled:
                failed = self.compiler.failed.get(("group", job.plan.key))
                try:
                    if failed is not None:
                        self.building.pop(job.plan.key, None)
                        raise RuntimeError(failed)
                    group = self.group(job.plan)
                except Exception:  # noqa: BLE001
                    ident = _logged("building a decoding program failed")
                    job.finished = admitted = True
                    job.deliver(Failure(f"could not build the decoding program: error {ident} (the server's log "
                                        "has it)"))
                    group = None
                if group is not None and not admitted:
                    jobs = self.jobs[job.plan.key]
                    if None in jobs and group.admits(jobs.index(None), len(job.prompt), job.limit):
                        slot = jobs.index(None)
                        jobs[slot] = job
                        admitted = True
                        taken += 1
                        self._guarded(job.plan.key, lambda: self._insert(group, slot, job))
            if admitted:
                with self.cond:
                    self.waiting.remove(job)
                if dropped:  # (a job cancelled once in its slot is counted where its slot is freed)
                    self.counters["cancelled"] += 1
        return taken

    def _insert(self, group: SlotGroup, slot: int, job: Job) -> None:
        job.admitted_at = time.perf_counter()
        group.insert(slot, job.prompt, job.limit, job.seed, job.sampling)
        self.counters["admitted"] += 1
        self._progress(job.plan.key, group, group.read())

    def _advance(self, key, group: SlotGroup) -> None:
        self._progress(key, group, group.advance())
        self._compact(key, group)

    def _compact(self, key, group: SlotGroup) -> None:
        """Busy slots first: the last busy one moves into the first free one (so `advance` runs
        the smallest tier of rows)."""
        jobs = self.jobs[key]
        while None in jobs:
            hole, last = jobs.index(None), max((i for i, j in enumerate(jobs) if j is not None), default=-1)
            if last < hole:
                return
            group.move(last, hole)
            jobs[hole], jobs[last] = jobs[last], None

    def _progress(self, key, group: SlotGroup, views) -> None:
        detok = self.detokenizers[key]
        jobs = self.jobs[key]
        for slot, job in enumerate(jobs):
            if job is None:
                continue
            if job.cancelled:
                jobs[slot] = None
                group.release(slot)
                self.counters["cancelled"] += 1
                continue
            view = views[slot]
            ids, text, reason = detok.progress(job, view.tokens.tolist(), view.done)
            if ids and job.first_token_at is None:
                job.first_token_at = time.perf_counter()
            if reason is not None:
                jobs[slot] = None
                group.release(slot)
                job.finished = True
                self.counters["completed"] += 1
                stats = {"steps": view.steps, "compression": round(len(ids) / max(view.steps, 1), 4),
                         "seconds": time.perf_counter() - job.created,
                         "time_to_first_token": (job.first_token_at or time.perf_counter()) - job.created,
                         # the engine's: decoding steps (after the prefill) that emitted k tokens
                         "accept_histogram": [] if view.accept_histogram is None
                         else [int(x) for x in view.accept_histogram],
                         "plain_steps": view.plain_steps}  # of the decoding steps, those without drafts
                if len(text) > job.sent_text or len(ids) > job.sent_tokens:
                    job.deliver(Delta(text[job.sent_text:], ids[job.sent_tokens:],
                                      _logprobs(view, job.sent_tokens, len(ids))))
                job.deliver(Finish(reason=reason, text=text, token_ids=ids, stats=stats,
                                   logprobs=_logprobs(view, 0, len(ids))))
            elif len(text) > job.sent_text:
                job.deliver(Delta(text[job.sent_text:], ids[job.sent_tokens:],
                                  _logprobs(view, job.sent_tokens, len(ids))))
                job.sent_text, job.sent_tokens = len(text), len(ids)


def _logprobs(view, start: int, stop: int) -> tuple | None:
    return None if view.logprobs is None else tuple(x[start:stop] for x in view.logprobs)


def _logged(what: str) -> str:
    """The exception being handled, on stderr under a new id; the id (what a client is told)."""
    ident = secrets.token_hex(6)
    print(f"jaxspec: {what}, error {ident}:", file=sys.stderr)
    traceback.print_exc(file=sys.stderr)
    return ident


def random_seed() -> int:
    return int(np.random.default_rng().integers(0, 2**32))


def _merged_tiers(groups: list[dict]) -> dict:
    """Step modes' tiers of several groups: chunks and tokens summed; a step's seconds, the group's
    that ran the most chunks there (groups of one model share a plan's ledger: the same figure)."""
    out: dict = {}
    for tiers in groups:
        for rows, by_mode in tiers.items():
            for mode, row in by_mode.items():
                have = out.setdefault(str(rows), {}).get(mode)
                if have is None:
                    out[str(rows)][mode] = dict(row)
                    continue
                if row["chunks"] > have["chunks"]:
                    have["step_seconds"] = row["step_seconds"]
                have["chunks"] += row["chunks"]
                have["tokens"] += row["tokens"]
    return out
