"""The server's `auto`: a drafted method whose slots run each chunk drafted or plain, whichever
the chunks measured faster for the rows busy (`jaxspec.runtime.step_modes`). Whatever mode each
chunk ran, every answer equals greedy decoding of its request alone; the counters say what ran.
"""

from __future__ import annotations

import concurrent.futures
import re

import httpx
import pytest

import jaxspec
from jaxspec.runtime import auto
from jaxspec.serving import make_server
from jaxspec.serving.app import background
from jaxspec.runtime.step_modes import EXPLORE_CHUNKS, REVISIT, ROW_KEEP, Acceptance, StepModes
from test_serve import PROMPTS, client

MODEL_ID = "pycode-5M"


@pytest.fixture(scope="module")
def model():
    return jaxspec.load()


@pytest.fixture(scope="module")
def server(model):
    auto.Ledger.forget()
    srv = make_server(model, MODEL_ID, method="auto", slots=4, context=256, chunk_steps=3)
    with background(srv) as url:
        srv.url = url
        yield srv
    auto.Ledger.forget()


def _metric(text: str, name: str, **labels) -> float:
    """The sum of `jaxspec:name`'s samples whose labels include `labels`."""
    total = 0.0
    for found, value in re.findall(re.escape(f"jaxspec:{name}") + r"(?:\{([^}]*)\})? ([0-9.e+-]+)\n", text):
        have = dict(re.findall(r'(\w+)="([^"]*)"', found))
        if all(have.get(k) == str(v) for k, v in labels.items()):
            total += float(value)
    return total


def test_auto_serves_a_drafted_method_in_step_modes_and_every_answer_is_greedy(model, server):
    assert server.settings.step_modes and server.settings.method == "speculative"
    server.scheduler.compiler.wait(600)  # both modes' programs: the chunks may pick either
    requests = [(PROMPTS[i % len(PROMPTS)], 40) for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # 4 at a time: the 4-row tier
        busy = list(pool.map(lambda r: _complete(server, *r), requests))
    alone = [_complete(server, p, n) for p, n in requests[:4]]  # one at a time: the 1-row tier
    for (prompt, limit), ext in zip(requests + requests[:4], busy + alone):
        ref = jaxspec.generate(model, prompt, max_new_tokens=limit, method="greedy",
                               stop_ids=server.requests.eos_ids).tokens
        assert ext["token_ids"] == ref, prompt
        assert ext["step_modes"] and ext["method"] == "speculative"
        assert 0 <= ext["plain_steps"] <= ext["steps"] - 1
    status = httpx.get(server.url.removesuffix("/v1") + "/health").json()
    modes = status["step_modes"]
    assert modes["drafted"]["chunks"] >= EXPLORE_CHUNKS and modes["plain"]["chunks"] >= EXPLORE_CHUNKS, modes
    assert sum(e["plain_steps"] for e in busy + alone) > 0
    # What ran is what the ledger measured, per tier of rows.
    for rows in (1, 4):
        tallies = {label.rsplit(": ", 1)[1]: t for label, t in
                   auto.Ledger.of(model, rows, "serve-chunk", False).tallies.items()}
        assert set(tallies) == {"drafted", "plain"} and min(t.runs for t in tallies.values()) >= 1, (rows, tallies)
    # vLLM's counters count the steps that verified drafts: the plain ones are not among them.
    metrics = httpx.get(server.url.removesuffix("/v1") + "/metrics").text
    steps = _metric(metrics, "decode_steps_total", method="speculative")
    drafts = _metric(metrics, "spec_decode_num_drafts_total", method="speculative")
    plain = sum(e["plain_steps"] for e in busy + alone)
    assert steps == sum(e["steps"] - 1 for e in busy + alone) and drafts == steps - plain
    assert _metric(metrics, "step_mode_chunks_total", mode="plain") == modes["plain"]["chunks"]
    # per tier of rows: the chunks each ran, and what a step of each mode measured there
    tiers = status["step_mode_tiers"]
    assert {"1", "4"} <= set(tiers) and sum(t["plain"]["chunks"] for t in tiers.values() if "plain" in t) == \
        modes["plain"]["chunks"]
    for rows in ("1", "4"):
        assert _metric(metrics, "step_mode_chunks_total", mode="drafted", rows=rows) == tiers[rows]["drafted"]["chunks"]
        measured = _metric(metrics, "step_mode_step_seconds", mode="drafted", rows=rows)
        assert measured > 0 and measured == pytest.approx(tiers[rows]["drafted"]["step_seconds"])


def test_a_request_that_names_a_method_keeps_it(model, server):
    ext = _complete(server, PROMPTS[0], 24, method="speculative")
    assert not ext["step_modes"] and ext["plain_steps"] == 0


def _complete(server, prompt: str, limit: int, method: str | None = None) -> dict:
    extra = {"method": method} if method else {}
    r = client(server).completions.create(model=MODEL_ID, prompt=prompt, max_tokens=limit, temperature=0,
                                          extra_body=extra)
    return r.model_extra["jaxspec"]


def test_the_pick_explores_both_then_keeps_the_faster_and_revisits(model):
    auto.Ledger.forget()
    modes = StepModes(model, "test setting")
    picks = []
    for _ in range(2 * EXPLORE_CHUNKS):
        mode = modes.pick(2, {"drafted", "plain"})
        picks.append(mode)
        modes.record(2, mode, steps=4, tokens=8 if mode == "plain" else 4, seconds=1.0)  # plain 2x faster
    assert picks.count("drafted") == picks.count("plain") == EXPLORE_CHUNKS
    later = []
    for _ in range(2 * REVISIT):
        mode = modes.pick(2, {"drafted", "plain"})
        later.append(mode)
        modes.record(2, mode, steps=4, tokens=8 if mode == "plain" else 4, seconds=1.0)
    assert 1 <= later.count("drafted") <= 2 * REVISIT // (REVISIT - 1) and later.count("plain") > REVISIT
    # another tier of rows learns on its own; a mode with no program yet is never picked
    assert modes.pick(4, {"drafted", "plain"}) == "drafted" and modes.pick(4, {"plain"}) == "plain"
    assert modes.pick(4, {"drafted"}) == "drafted"
    auto.Ledger.forget()



def test_the_pick_weighs_the_busy_rows_acceptance_against_a_drafted_steps_cost(model):
    """Measured: a drafted step costs twice a plain one at 2 rows. Rows whose drafts commit 3 tokens a
    step are drafted (3 / 2 > 1), rows that commit 1.5 step plain; a new row counts what every row's
    drafted chunks committed lately, and a row's estimate follows its last chunks (`ROW_KEEP`)."""
    auto.Ledger.forget()
    modes = StepModes(model, "test setting", announce=False)
    for mode, seconds in (("drafted", 2.0), ("plain", 1.0)):
        for _ in range(EXPLORE_CHUNKS):
            modes.record(2, mode, steps=4, tokens=8, seconds=seconds)  # (equal tokens: the rate alone ties)
    assert (EXPLORE_CHUNKS * 2) % REVISIT  # (the picks below are clear of the one-in-REVISIT chunk of the other mode)
    acceptance = Acceptance(2)
    assert acceptance.expected([0, 1]) is None
    for k in range(6):
        acceptance.add(0, 12, 4)
        acceptance.add(1, 6, 4)

    def pick(rows):
        return modes.pick(2, {"drafted", "plain"}, acceptance.expected(rows), len(rows))

    # (each row's own chunks beside PRIOR_STEPS of every row's 2.25: near its own)
    assert 2.5 < acceptance.expected([0]) < 3.0 and pick([0]) == "drafted"
    assert 1.5 < acceptance.expected([1]) < 2.0 and pick([1]) == "plain"
    assert pick([0, 1]) == "drafted"  # together: 4.5 tokens per 2 plain steps' time, against 2
    for _ in range(4):  # row 1 steps plain: its evidence ages, its estimate returns to every row's
        acceptance.aged(1)
    assert acceptance.expected([1]) > 2.0 and pick([1]) == "drafted"
    acceptance.add(1, 4, 4)  # drafted again, and accepted nothing: plain again
    assert pick([1]) == "plain"
    acceptance.add(1, 16, 4)  # the text turned predictable: 16 / 4 weighs over the older chunk
    assert acceptance.expected([1]) > 2.5 and pick([1]) == "drafted"
    acceptance.start(1)  # a new request: every row's recent chunks
    assert acceptance.expected([1]) == pytest.approx(acceptance._tokens / acceptance._steps)
    assert ROW_KEEP < 1
    auto.Ledger.forget()
