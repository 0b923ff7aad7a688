"""`GET /metrics`: the server's counters in Prometheus' text format (`prometheus_client`).

Names follow vLLM's where vLLM has the metric (`vllm:num_requests_running` ->
`jaxspec:num_requests_running`, ...), with the prefix `jaxspec:`. Those metrics are also served
under vLLM's own names and labels (`VLLM_NAMES`: `vllm:` and a `model_name` label, summed over the
labels vLLM does not have), so a dashboard or a scraper written for vLLM reads jaxspec unchanged.
Each `Server` has its own `CollectorRegistry`, so several servers in one process (tests,
notebooks) do not share counts.

What a request adds is recorded once it is answered: its HTTP status (every request), and for an
answered completion its prompt and completion tokens (the numbers of its `usage`), each choice's
finish reason and timings, and each choice's decoding work (the model steps and the engine's
accept histogram, the `jaxspec` extension's `steps` and `accept_histogram`). The slots' state is
read from the scheduler at each scrape.
"""

from __future__ import annotations

import threading

import numpy as np

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
except ImportError as e:  # pragma: no cover  (the CLI turns this into one line)
    raise ImportError("jaxspec serve needs prometheus_client: pip install 'jaxspec[serve]'") from e

PREFIX = "jaxspec:"
VLLM_PREFIX = "vllm:"
# jaxspec metric -> the labels vLLM's metric of that name has (besides model_name); the others are summed
VLLM_NAMES = {"num_requests_running": (), "num_requests_waiting": (), "prompt_tokens": (), "generation_tokens": (),
              "request_success": ("finished_reason",), "request_prompt_tokens": (), "request_generation_tokens": (),
              "time_to_first_token_seconds": (), "time_per_output_token_seconds": (),
              "e2e_request_latency_seconds": (), "request_queue_time_seconds": (), "spec_decode_num_drafts": (),
              "spec_decode_num_draft_tokens": (), "spec_decode_num_accepted_tokens": (),
              "spec_decode_num_accepted_tokens_per_pos": ("position",)}
CONTENT_TYPE = CONTENT_TYPE_LATEST
# seconds (as vLLM's buckets: a first token in milliseconds to a long request in minutes)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)


def token_buckets(context: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to the context (a request's prompt or output never exceeds it)."""
    out, scale = [], 1
    while not out or out[-1] < context:
        out += [m * scale for m in (1, 2, 5) if not out or m * scale > out[-1]]
        scale *= 10
    return tuple(b for b in out if b < context) + (context,)


def draft_positions(engine) -> int:
    """Draft tokens one decoding step verifies: the block positions on a verified path of the
    engine's token tree (lookahead's window tokens are not on one; a one-token engine has none)."""
    paths = np.asarray(engine.tree.paths)
    return int(np.unique(paths[paths >= 0]).size)


class _SchedulerCollector:
    """The slots' state, read from the scheduler at each scrape (one lock, one consistent view)."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        s = self.scheduler.status()
        gauges = (("num_requests_running", "choices decoding in a slot (each choice of a request takes one)",
                   s["running"]),
                  ("num_requests_waiting", "choices waiting for a free slot", s["waiting"]),
                  ("slots_in_use", "decode slots holding a request (= num_requests_running)", s["running"]),
                  ("slots_total", "decode slots of the slot groups built (--slots per group)",
                   s["slots"] * s["groups"]),
                  ("slots_per_group", "decode slots of one slot group (--slots / --max-num-seqs)", s["slots"]),
                  ("slot_groups", "slot groups built (one per method setting in use, at most --max-groups)",
                   s["groups"]),
                  ("programs_compiling", "1 while the background worker builds a group or compiles a program "
                   "(the requests that need it wait; the others go on)", s["compiling"]))
        for name, doc, value in gauges:
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
        events = CounterMetricFamily(PREFIX + "scheduler_jobs", "the scheduler's jobs (one per choice) by event: "
                                     "submitted, admitted (took a slot), completed, cancelled, failed",
                                     labels=["event"])
        for event in ("submitted", "admitted", "completed", "cancelled", "failed"):
            events.add_metric([event], s.get(event, 0))
        yield events
        chunks = CounterMetricFamily(PREFIX + "step_mode_chunks", "decode chunks of slot groups that pick drafted "
                                     "or plain steps per chunk (the server's auto), by the mode they ran and the "
                                     "tier of rows (the program's) they ran at", labels=["mode", "rows"])
        tokens = CounterMetricFamily(PREFIX + "step_mode_tokens", "output tokens of those chunks, by mode and tier",
                                     labels=["mode", "rows"])
        seconds = GaugeMetricFamily(PREFIX + "step_mode_step_seconds", "what a step of this mode measured at this "
                                    "tier of rows (recent chunks weigh most): drafting pays while the busy rows "
                                    "commit more tokens per drafted step than drafted / plain", labels=["mode", "rows"])
        for rows, by_mode in s["step_mode_tiers"].items():
            for mode, row in by_mode.items():
                chunks.add_metric([mode, rows], row["chunks"])
                tokens.add_metric([mode, rows], row["tokens"])
                seconds.add_metric([mode, rows], row["step_seconds"])
        current = GaugeMetricFamily(PREFIX + "step_mode_current", "groups whose last chunk ran this mode",
                                    labels=["mode"])
        for mode, row in s["step_modes"].items():
            current.add_metric([mode], row["current"])
        yield chunks
        yield tokens
        yield seconds
        yield current
        yield CounterMetricFamily(PREFIX + "scheduler_stalls", "decode chunks that compiled their program on the "
                                  "scheduler's thread (no compiled program covered them yet: 0 by construction)",
                                  value=s["stalls"])


class _VllmNames:
    """The metrics vLLM also has, under its names (`VLLM_NAMES`) with the served model's
    `model_name` label, read from jaxspec's own at each scrape (one source of truth). Samples that
    differ only in a label vLLM lacks (endpoint, method) are summed; `_created` samples are left
    out (a sum of creation times means nothing)."""

    def __init__(self, sources, model_name: str):
        self.sources, self.model_name = sources, model_name

    def collect(self):
        for source in self.sources:
            for family in source.collect():
                base = family.name.removeprefix(PREFIX)
                if base not in VLLM_NAMES:
                    continue
                kept = VLLM_NAMES[base]
                out = Metric(VLLM_PREFIX + base, family.documentation, family.type)
                sums: dict = {}
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    labels = {"model_name": self.model_name,
                              **{k: v for k, v in sample.labels.items() if k in kept or k == "le"}}
                    key = (VLLM_PREFIX + sample.name.removeprefix(PREFIX), tuple(sorted(labels.items())))
                    sums[key] = sums.get(key, 0.0) + sample.value
                for (name, labels), value in sums.items():
                    out.add_sample(name, dict(labels), value)
                yield out


class Metrics:
    """One server's metrics. `request` records every answered HTTP request; `completion` the
    decoding of an answered completion (each choice's `Finish`)."""

    def __init__(self, scheduler, context: int, model_name: str):
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._drafts: dict = {}  # plan key -> draft positions per step
        self._lengths: dict[str, list[int]] = {}  # method -> [decoding steps, accepted tokens]
        r, p = self.registry, PREFIX
        self.requests = Counter(p + "requests", "HTTP requests answered, by route and HTTP status (a stream: 200 "
                                "when it ended with [DONE], 499 when the client went away, 500 when decoding failed)",
                                ["endpoint", "status"], registry=r)
        self.success = Counter(p + "request_success", "choices of answered completions, by finish reason "
                               "(stop, length)", ["endpoint", "finished_reason"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "prompt tokens of answered completions (usage.prompt_tokens)",
                                     ["endpoint"], registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "completion tokens of answered completions "
                                         "(usage.completion_tokens: all choices)", ["endpoint"], registry=r)
        tokens = token_buckets(context)
        self.request_prompt_tokens = Histogram(p + "request_prompt_tokens", "prompt tokens per answered completion",
                                               ["endpoint"], buckets=tokens, registry=r)
        self.request_generation_tokens = Histogram(p + "request_generation_tokens", "completion tokens per answered "
                                                   "completion (all choices)", ["endpoint"], buckets=tokens, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "seconds from a request's arrival to its first "
                              "token, per choice", ["endpoint"], buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "seconds per output token after the first "
                              "(per choice of 2 tokens or more: its decoding seconds / (tokens - 1))", ["endpoint"],
                              buckets=TPOT_BUCKETS, registry=r)
        self.latency = Histogram(p + "e2e_request_latency_seconds", "seconds from a request's arrival to its last "
                                 "byte (answered completions)", ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Histogram(p + "request_queue_time_seconds", "seconds a choice waited for a slot (from its "
                               "submission to its prefill)", ["endpoint"], buckets=TTFT_BUCKETS, registry=r)
        self.steps = Counter(p + "decode_steps", "decoding steps (target model forwards after the prefill) of the "
                             "finished choices, by method", ["method"], registry=r)
        self.drafts = Counter(p + "spec_decode_num_drafts", "decoding steps that verified draft tokens, by method",
                              ["method"], registry=r)
        self.draft_tokens = Counter(p + "spec_decode_num_draft_tokens", "draft tokens verified (the positions on a "
                                    "verified path of each step's token tree), by method", ["method"], registry=r)
        self.accepted = Counter(p + "spec_decode_num_accepted_tokens", "draft tokens accepted (each step's tokens "
                                "beyond the one the target gives anyway), by method", ["method"], registry=r)
        self.accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos", "steps whose accepted draft "
                                        "reached depth position + 1, by method", ["method", "position"], registry=r)
        self.mean_length = Gauge(p + "mean_accepted_length", "tokens per decoding step, by method: (steps + accepted "
                                 "tokens) / steps over the finished choices (1 for greedy; SGLang's accept length)",
                                 ["method"], registry=r)
        slots = _SchedulerCollector(scheduler)
        r.register(slots)
        ours = [self.prompt_tokens, self.generation_tokens, self.success, self.request_prompt_tokens,
                self.request_generation_tokens, self.ttft, self.tpot, self.latency, self.queue, self.drafts,
                self.draft_tokens, self.accepted, self.accepted_per_pos, slots]
        r.register(_VllmNames(ours, model_name))

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def completion(self, endpoint: str, plan, prompt_tokens: int, finishes: list, jobs: list, arrived: float,
                   answered: float) -> None:
        """An answered completion: `finishes[i]` of `jobs[i]` (its `Finish` and `Job`), the
        request's arrival and last byte (`time.perf_counter`)."""
        completion = sum(len(f.token_ids) for f in finishes)
        self.prompt_tokens.labels(endpoint).inc(prompt_tokens)
        self.generation_tokens.labels(endpoint).inc(completion)
        self.request_prompt_tokens.labels(endpoint).observe(prompt_tokens)
        self.request_generation_tokens.labels(endpoint).observe(completion)
        self.latency.labels(endpoint).observe(max(answered - arrived, 0.0))
        for finish, job in zip(finishes, jobs):
            self.success.labels(endpoint, finish.reason).inc()
            first = job.first_token_at if job.first_token_at is not None else job.created + finish.stats["seconds"]
            self.ttft.labels(endpoint).observe(max(first - arrived, 0.0))
            if len(finish.token_ids) > 1:
                end = job.created + finish.stats["seconds"]
                self.tpot.labels(endpoint).observe(max(end - first, 0.0) / (len(finish.token_ids) - 1))
            if job.admitted_at is not None:
                self.queue.labels(endpoint).observe(max(job.admitted_at - job.created, 0.0))
            self._decoding(plan, finish.stats.get("accept_histogram") or [], finish.stats.get("plain_steps", 0))

    def _decoding(self, plan, histogram: list[int], plain_steps: int = 0) -> None:
        """One choice's decoding work, from the engine's accept histogram (steps that emitted k tokens);
        `plain_steps` of them verified no draft (a group's plain chunks: `jaxspec.runtime.step_modes`)."""
        method = plan.name
        with self._lock:
            if plan.key not in self._drafts:
                self._drafts[plan.key] = draft_positions(plan.engine)
            per_step = self._drafts[plan.key]
            steps = sum(histogram)
            drafted = max(steps - plain_steps, 0)
            accepted = sum(max(k - 1, 0) * n for k, n in enumerate(histogram))
            self.steps.labels(method).inc(steps)
            if per_step:
                self.drafts.labels(method).inc(drafted)
                self.draft_tokens.labels(method).inc(drafted * per_step)
                self.accepted.labels(method).inc(accepted)
                for position in range(max(len(histogram) - 2, 0)):
                    self.accepted_per_pos.labels(method, str(position)).inc(sum(histogram[position + 2:]))
            totals = self._lengths.setdefault(method, [0, 0])
            totals[0] += steps
            totals[1] += accepted
            if totals[0]:
                self.mean_length.labels(method).set((totals[0] + totals[1]) / totals[0])
