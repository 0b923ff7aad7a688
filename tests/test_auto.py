"""`method="auto"` / `window="auto"` (`jaxspec.runtime.auto`): greedy unless another setting is measured
faster, the same tokens whatever is chosen, and the S table fitted from the benchmark results."""

from __future__ import annotations

import gc
import json
import math
import re
import time
import tomllib
import weakref

import pytest

import jaxspec
from jaxspec.runtime import auto
from jaxspec.runtime import auto_store
from jaxspec.runtime.background import Background
from test_cli import assert_one_line_error, run_cli
from tools import fit_auto


@pytest.fixture(scope="module")
def pycode():
    return jaxspec.load("pycode-5M")


def _summary(rows: dict) -> dict:
    return {"summary": {label: {"S": s} for label, s in rows.items()}}


def test_the_fit_writes_the_table_of_its_results_and_checks_it(tmp_path, capsys):
    """tools/fit_auto.py on results it is given: lookahead's slope through S(1) = 1 (exact here, so
    no error), prompt lookup and speculative S as measured, [default] the smallest; the table is
    what `auto` reads; --check passes on it and fails, one line per line, on an edited one.
    (configs/auto.toml against the committed results: `python tools/fit_auto.py --check`, in .ci/run.)"""
    results = tmp_path / "results"
    results.mkdir()
    law = lambda slope, t: 1 + slope * math.log(t)  # noqa: E731
    (results / "lookahead_bench.json").write_text(json.dumps({"summary": {
        "greedy": {"S_per_category": {"held-out": 1.0}},
        "lookahead (4,3,4)": {"S_per_category": {"held-out": law(0.2, 16)}},  # 16 block tokens
        "lookahead W=15 N=5 G=15": {"S_per_category": {"held-out": law(0.2, 120)}},  # the earlier label
        "lookahead (15,5,15) no prompt pool": {"S_per_category": {"held-out": 9.0}},  # not a candidate
        "prompt lookup (N=5,G=15)": {"S_per_category": {"held-out": 1.4}}}}))
    code = _summary({"greedy": 1.0, "lookahead (15,5,15)": law(0.4, 120), "prompt lookup (N=4,G=8)": 2.3456,
                     "speculative TI (K=4)": 9.0})
    code["summary"]["speculative TD (K=4)"] = {"S_total": 3.0}  # the earlier layout
    (results / "code_bench.json").write_text(json.dumps(code))
    (results / "real_bench.json").write_text(json.dumps(_summary(
        {"greedy": 1.0, "lookahead (7,4,7)": law(0.25, 42), "prompt lookup (N=4,G=8)": 1.5,
         "transformers prompt lookup (10 tokens)": 9.0})))
    (results / "real_bench_drafter.json").write_text(json.dumps(_summary(
        {"greedy": 1.0, "speculative TD (K=4)": 1.265, "speculative TD (K=4) + lookup (N=5,G=1)": 1.3,
         "lookahead (15,5,15)": 9.0})))  # (only the drafter's rows count from this file)
    (results / "real_bench_routed.json").write_text(json.dumps(_summary(  # a later file's row replaces an earlier's
        {"greedy": 1.0, "speculative TD (K=4) + lookup (N=5,G=1)": 1.35, "speculative TD (K=4) or lookup (N=5,G=4)": 1.4,
         "lookahead (15,5,15)": 9.0})))
    (results / "real_bench_alternatives.json").write_text(json.dumps(_summary(  # the runner-up first draft beside
        {"greedy": 1.0, "speculative TD (K=4) or lookup (N=5,G=4) + 1 alt": 1.5,
         "speculative TD (K=2) + 2 alt": 1.2})))
    out = tmp_path / "auto.toml"
    assert fit_auto.main(["--results", str(results), "--out", str(out)]) == 0
    assert tomllib.loads(out.read_text()) == {
        "default": {"lookahead_slope": 0.2, "prompt_lookup_4_8": 1.4},
        "models": {
            "stories260K": {"lookahead_slope": 0.2, "lookahead_points": 2, "lookahead_max_error": 0.0,
                            "prompt_lookup_5_15": 1.4},
            "pycode-5M": {"lookahead_slope": 0.4, "lookahead_points": 1, "lookahead_max_error": 0.0,
                          "prompt_lookup_4_8": 2.346, "speculative_4": 3.0},
            "smollm2-135m-instruct": {"lookahead_slope": 0.25, "lookahead_points": 1, "lookahead_max_error": 0.0,
                                      "prompt_lookup_4_8": 1.5, "speculative_4": 1.265,
                                      "speculative_4_lookup_5_1": 1.35, "speculative_4_routed_5_4": 1.4,
                                      "speculative_4_routed_5_4_alt_1": 1.5, "speculative_2_alt_2": 1.2}}}
    assert auto.expectations("pycode-5M", out)["speculative_4"] == 3.0
    assert auto.expectations(None, out) == {"lookahead_slope": 0.2, "prompt_lookup_4_8": 1.4}
    capsys.readouterr()

    check = ["--check", "--results", str(results), "--out", str(out)]
    assert fit_auto.main(check) == 0 and capsys.readouterr().out == f"{out} is the fit of {results}\n"
    out.write_text(out.read_text().replace("speculative_4 = 3.0", "speculative_4 = 3.5"))
    assert fit_auto.main(check) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{out} has 'speculative_4 = 3.5', which the fit of {results} does not write (rerun python tools/fit_auto.py)",
        f"{out} lacks 'speculative_4 = 3.0', which the fit of {results} writes (rerun python tools/fit_auto.py)"]


def test_candidates_follow_the_fitted_table(pycode):
    expect = auto.expectations("pycode-5M")
    found = {c.label: c for c in auto.candidates(pycode)}
    assert list(found)[0] == "autoregressive" and found["autoregressive"].expected_s == 1.0
    la = found["lookahead (15,5,15)"]
    assert la.block_tokens == 120
    assert la.expected_s == pytest.approx(1 + expect["lookahead_slope"] * math.log(120))
    assert found["prompt-lookup (4,8)"].expected_s == expect["prompt_lookup_4_8"]
    assert found["speculative (8)"].drafter_tokens == 9
    # A model without results: the default (smallest) slope, no speculative candidate.
    assert auto.expectations(None)["lookahead_slope"] == min(
        auto.expectations(k)["lookahead_slope"] for k in ("pycode-5M", "stories260K", "smollm2-135m-instruct"))
    assert all(c.method != "speculative" for c in auto.candidates(pycode, lookahead_only=True))


def test_the_drafter_beside_prompt_lookup_is_a_candidate(pycode, monkeypatch):
    """A `speculative_K_lookup_N_G` row is the drafter's chain beside G prompt-lookup candidates:
    its target block is the root, K drafts and G (N-1)-grams; its drafter forward K + 1 tokens."""
    monkeypatch.setattr(auto, "expectations", lambda key: {"lookahead_slope": 0.2, "speculative_4_lookup_5_2": 2.1})
    found = {c.label: c for c in auto.candidates(pycode)}
    combined = found["speculative (4,5,2)"]
    assert combined.options == {"draft_len": 4, "lookup_ngram": 5, "lookup_guesses": 2}
    assert (combined.block_tokens, combined.drafter_tokens, combined.expected_s) == (1 + 4 + 2 * 4, 5, 2.1)
    out = jaxspec.generate(pycode, "def f(x):", max_new_tokens=12, method=combined.method, **combined.options)
    assert out.tokens == jaxspec.generate(pycode, "def f(x):", max_new_tokens=12).tokens


def test_alternative_first_drafts_add_one_token_each_to_the_block(pycode, monkeypatch):
    """A row ending `_alt_A` is its setting with the drafter's A runner-up first drafts beside:
    A more target tokens a step, the same drafter forward."""
    monkeypatch.setattr(auto, "expectations", lambda key: {
        "lookahead_slope": 0.2, "speculative_4_routed_5_4_alt_1": 2.1, "speculative_3_alt_2": 1.9})
    found = {c.label: c for c in auto.candidates(pycode)}
    routed, alone = found["speculative (4,5,4,True,1)"], found["speculative (3,2)"]
    assert routed.options == {"draft_len": 4, "lookup_ngram": 5, "lookup_guesses": 4, "lookup_route": True,
                              "first_alternatives": 1}
    assert (routed.block_tokens, routed.drafter_tokens, routed.expected_s) == (1 + 4 + 1, 5, 2.1)
    assert alone.options == {"draft_len": 3, "first_alternatives": 2} and alone.block_tokens == 1 + 3 + 2
    out = jaxspec.generate(pycode, "def f(x):", max_new_tokens=12, method=routed.method, **routed.options)
    assert out.tokens == jaxspec.generate(pycode, "def f(x):", max_new_tokens=12).tokens


@pytest.fixture
def fresh(monkeypatch):
    """Ledgers of this test alone (the store is off in the suite: `conftest.py`)."""
    monkeypatch.setattr(auto.Ledger, "_OPEN", {})


def _learned(model, rates: dict, runs: int = auto.EXPLORE_RUNS, **shape):
    """Decodes of 100 tokens in 50 steps at the given tokens/s, `runs` per setting, into the ledger."""
    for label, rate in rates.items():
        for _ in range(runs):
            auto.record(model, 1, label, 50, 100, 100 / rate, **shape)


def test_with_nothing_measured_auto_answers_greedy_at_once(pycode, fresh):
    """The first request decodes greedily: nothing is timed before an answer (no forward, no race)."""
    choice = auto.choose(pycode, 1, ready=lambda c: pytest.fail("asked for a try with nothing measured"))
    assert (choice.method, choice.trying) == ("autoregressive", False)
    assert choice.reason.startswith("greedy: nothing measured here yet")
    assert not hasattr(auto, "WORTH_TIMING") and not hasattr(auto, "RETIME_BAND")
    assert not hasattr(auto, "decode_seconds") and not hasattr(auto, "forwards_seconds")


def test_the_fastest_measured_setting_is_chosen_only_by_the_margin(pycode, fresh, monkeypatch):
    _learned(pycode, {"autoregressive": 100.0, "speculative (4)": 120.0})
    choice = auto.choose(pycode, 1, tries=False)  # (the ledger's pick alone: no revisit of the runner-up)
    assert (choice.method, choice.options, choice.trying) == ("speculative", {"draft_len": 4}, False)
    assert "measured 1.20x greedy here" in choice.reason
    rows = {r["label"]: r for r in choice.candidates}
    assert rows["speculative (4)"]["speedup"] == 1.2 and rows["speculative (4)"]["S"] == 2.0
    assert rows["speculative (4)"]["runs"] == auto.EXPLORE_RUNS and "runs" not in rows["lookahead (4,3,4)"]
    # once every contender is judged, one decode in REVISIT runs the runner-up (here greedy) again
    others = [c.label for c in auto._contenders(auto.candidates(pycode), False) if c.label != "speculative (4)"]
    _learned(pycode, dict.fromkeys(others, 60.0))
    while sum(r.get("runs", 0) for r in auto.choose(pycode, 1, tries=False).candidates) % auto.REVISIT:
        _learned(pycode, {"autoregressive": 100.0}, runs=1)
    again = auto.choose(pycode, 1)
    assert again.trying and again.method == "autoregressive" and "run again (one decode in 8)" in again.reason
    _learned(pycode, {"autoregressive": 100.0}, runs=1)
    assert not auto.choose(pycode, 1).trying  # (the other decodes: the ledger's pick)
    monkeypatch.setattr(auto.Ledger, "_OPEN", {})
    _learned(pycode, {"autoregressive": 100.0, "speculative (4)": 103.0})  # under MARGIN (1.05)
    choice = auto.choose(pycode, 1, tries=False)
    assert choice.method == "autoregressive" and "measured 1.03x greedy here, under 1.05x" in choice.reason
    # another shape (batch 2, or sampled) has its own ledger
    assert auto.choose(pycode, 2).reason.startswith("greedy: nothing measured")
    assert auto.choose(pycode, 1, sampled=True).reason.startswith("greedy: nothing measured")


def test_revisits_run_greedy_and_the_runner_up_in_turn(pycode, fresh):
    """Once every contender is judged, the one-in-REVISIT decode alternates between greedy (every
    pick's baseline: nothing else refreshes its rate) and the runner-up, here a drafted setting."""
    contenders = [c.label for c in auto._contenders(auto.candidates(pycode), False)]
    assert len(contenders) == 2
    best, runner_up = contenders
    _learned(pycode, {"autoregressive": 100.0, best: 150.0, runner_up: 130.0})
    revisited = []
    for _ in range(4 * auto.REVISIT):
        choice = auto.choose(pycode, 1, ready=lambda c: True)
        if choice.trying:
            revisited.append(choice.label)
        _learned(pycode, {choice.label: {"autoregressive": 100.0, best: 150.0, runner_up: 130.0}[choice.label]},
                 runs=1)
    assert len(revisited) == 4 and set(revisited[0::2]) ^ set(revisited[1::2]) == {"autoregressive", runner_up}
    # window="auto" asked for lookahead: its revisits never run greedy
    windows = [c.label for c in auto.candidates(pycode, lookahead_only=True)[1:]]
    _learned(pycode, {w: 100.0 + i for i, w in enumerate(windows)})
    picked = set()
    for _ in range(4 * auto.REVISIT):
        choice = auto.choose(pycode, 1, lookahead_only=True, ready=lambda c: True)
        picked.add(choice.method)
        _learned(pycode, {choice.label: 100.0}, runs=1)
    assert picked == {"lookahead"}


def test_a_decode_beside_a_background_compile_teaches_nothing(pycode, fresh):
    """A compile in the background takes cores from the decode beside it: that decode's rate is not
    the setting's, so the ledger leaves it out; the next quiet decode counts."""
    import threading

    release = threading.Event()
    worker = pycode.background = pycode.background or Background()
    worker.submit(("test", "busy"), release.wait)
    tally = lambda: auto.Ledger.of(pycode, 1, "generate", False).tally("autoregressive").runs  # noqa: E731
    try:
        jaxspec.generate(pycode, [1, 5, 9], max_new_tokens=4)
        assert worker.busy() and tally() == 0
    finally:
        release.set()
    assert worker.wait(10)
    jaxspec.generate(pycode, [1, 5, 9], max_new_tokens=4)
    assert tally() == 1


def test_the_ledger_follows_what_the_device_does_now(pycode, fresh):
    """A setting's rate weighs its recent decodes most (`HALF_LIFE`): a setting that got slower (another
    program layout, a busier machine) is outvoted within a few half-lives, not by its whole history."""
    _learned(pycode, {"autoregressive": 100.0, "speculative (4)": 150.0}, runs=200)
    assert auto.choose(pycode, 1, tries=False).method == "speculative"
    _learned(pycode, {"speculative (4)": 60.0}, runs=3 * auto.HALF_LIFE)
    rate = auto.Ledger.of(pycode, 1, "generate", False).tally("speculative (4)").rate
    assert 60.0 < rate < 70.0  # (an all-time sum would still say 134)
    assert auto.choose(pycode, 1, tries=False).method == "autoregressive"


def test_a_contender_is_tried_only_once_its_program_is_ready(pycode, fresh):
    """After greedy's first decode the best contender by the prior is the one to compile; it is
    tried (EXPLORE_RUNS times) only once `ready` says its program is compiled, then judged."""
    _learned(pycode, {"autoregressive": 100.0}, runs=1)
    first = auto.to_try(pycode, 1)
    expected = max(auto.candidates(pycode)[1:], key=lambda c: c.prior_speedup())
    assert first is not None and first.label == expected.label
    waiting = auto.choose(pycode, 1, ready=lambda c: False)
    assert waiting.method == "autoregressive" and "compiling in the background" in waiting.reason
    trying = auto.choose(pycode, 1, ready=lambda c: c.label == first.label)
    assert trying.trying and trying.label == first.label and f"trying it (1 of {auto.EXPLORE_RUNS})" in trying.reason
    assert auto.to_try(pycode, 1, ready=lambda c: c.label == first.label).label != first.label  # the next one
    _learned(pycode, {first.label: 50.0}, runs=auto.EXPLORE_RUNS)  # measured slower: judged, not tried again
    judged = auto.choose(pycode, 1, ready=lambda c: c.label == first.label)
    assert not judged.trying and judged.method == "autoregressive"


def test_what_was_learned_outlives_the_process_and_a_new_drafter_starts_over(pycode, fresh, monkeypatch, tmp_path):
    store = tmp_path / "auto.json"
    monkeypatch.setenv("JAXSPEC_AUTO_CACHE", str(store))
    _learned(pycode, {"autoregressive": 100.0, "speculative (4)": 150.0})
    assert store.exists()
    auto.Ledger.forget()  # as a later process
    again = auto.choose(pycode, 1, tries=False)
    assert again.method == "speculative" and again.recalled.startswith(f"{store}, stored 20")
    assert f"learned from {2 * auto.EXPLORE_RUNS} decodes, {store}" in again.reason
    auto.Ledger.forget()
    monkeypatch.setattr(auto, "drafter_identity", lambda model: "another drafter's bytes")
    assert auto.choose(pycode, 1).reason.startswith("greedy: nothing measured here yet")
    store.write_text("{not json")  # a broken store: a warning, then rewritten
    auto.Ledger.forget()
    with pytest.warns(UserWarning, match="ignoring the auto measurement store"):
        assert auto.choose(pycode, 1).method == "autoregressive"


def test_generate_auto_learns_while_decoding_and_keeps_greedy_tokens(pycode, fresh):
    """greedy, then (compiled in the background meanwhile) the contenders, their tries alternating
    over later requests, then the fastest as measured, and one decode in REVISIT the runner-up
    again: greedy's tokens every time."""
    model = jaxspec.load("pycode-5M")  # its own background worker and programs
    prompt = [1, 5, 9, 20, 7]
    greedy = jaxspec.generate(model, prompt, max_new_tokens=12)
    seen = []
    for _ in range(2 + auto.EXPLORE_RUNS * auto.CONTENDERS + auto.REVISIT):
        out = jaxspec.generate(model, prompt, max_new_tokens=12, method="auto")
        assert out.tokens == greedy.tokens and out.auto["method"] == out.method
        seen.append((out.auto["label"], out.auto["trying"], out.auto["reason"]))
        assert model.background.wait(300) and not model.background.failed
    tries = [label for label, trying, reason in seen if trying and "trying it" in reason]
    contenders = sorted(set(tries))
    assert len(contenders) == auto.CONTENDERS and all(tries.count(c) == auto.EXPLORE_RUNS for c in contenders)
    assert tries[:2] == [tries[0], tries[1]] and tries[0] != tries[1]  # alternating, once both were ready
    judged = seen[len(seen) - auto.REVISIT:]  # every contender judged: the pick, and one revisit in REVISIT
    assert sum("run again" in reason for _, _, reason in judged) == 1, judged
    # the pick is the best measured rate; each decode refreshes the rate it ran at, so on a shared
    # machine the pick may swap with the runner-up (two speculative settings run within noise of
    # each other), never to a setting that was not judged
    picks = {label for label, trying, _ in judged if not trying}
    assert 1 <= len(picks) <= 2 and picks <= set(contenders) | {"autoregressive"}, judged
    window = jaxspec.generate(model, prompt, max_new_tokens=12, method="lookahead", window="auto")
    assert window.method == "lookahead" and window.tokens == greedy.tokens
    assert (window.options["window"], window.options["ngram"], window.options["guesses"]) in auto.LOOKAHEAD_GRID
    assert jaxspec.generate(model, prompt, max_new_tokens=12).auto is None


def test_an_idle_background_worker_keeps_nothing_alive():
    """The worker runs jobs in order, then ends: an idle thread blocked on its queue kept its last
    job, and through it a model and its compiled programs, for the life of the process (the
    suite's workers ran out of memory mappings and aborted inside XLA)."""
    class Model:
        pass

    model, order = Model(), []
    kept = weakref.ref(model)
    worker = Background()
    assert worker.submit("a", lambda model=model: order.append("a")) and worker.submit("b", lambda: order.append("b"))
    assert not worker.submit("a", lambda: None)  # queued or done already: not again
    del model
    assert worker.wait(30) and order == ["a", "b"] and worker.ready == {"a", "b"}
    for _ in range(300):
        if worker._worker is None:
            break
        time.sleep(0.01)
    gc.collect()
    assert worker._worker is None and kept() is None
    assert worker.submit("c", lambda: order.append("c")) and worker.wait(30) and order[-1] == "c"  # a new thread


def test_a_conversation_never_compiles_for_a_new_prompt_length(pycode, fresh):
    """`stream` pads every turn to one buffer per cache rung and prefills it in chunks: prompts
    of 6, 150 and 400 tokens (four chunks) run the programs the first compiled, with `generate`'s tokens."""
    model = jaxspec.load("pycode-5M")
    ids = model.tokenizer.encode("def fibonacci(n):\n    return n\n" * 40)
    for n in (6, 150, 400):
        live = jaxspec.stream(model, ids[:n], max_new_tokens=24)
        chunks = [c.tokens for c in live]
        assert live.result.tokens == jaxspec.generate(model, ids[:n], max_new_tokens=24).tokens
        assert sum(chunks, []) == live.result.tokens
        if n == 6:
            programs = {k for k in model.compiled if k[0] in ("begin", "advance")}
        else:
            assert live.result.compile_seconds == 0 and {k for k in model.compiled if k[0] in ("begin", "advance")} \
                == programs


@pytest.mark.parametrize("options, needle", [
    (dict(method="auto", window=4), "method 'auto' chooses the method and its options; it takes none, got window"),
    (dict(method="lookahead", window="auto", ngram=3), "window='auto' chooses ngram and guesses too"),
])
def test_auto_with_options_it_chooses_is_refused(pycode, options, needle):
    with pytest.raises(jaxspec.GenerationError, match=needle):
        jaxspec.generate(pycode, [1, 5], max_new_tokens=2, **options)


def test_cli_defaults_to_auto_and_says_why(capsys, fresh):
    """The first auto request of a shape answers greedily at once; the CLI says so and why (the
    greedy run before taught greedy's rate; the best contender compiles meanwhile), and prints
    greedy's text."""
    argv = ["generate", "--prompt-ids", "1,5,9", "--max-new-tokens", "4"]
    code, greedy, _ = run_cli(argv + ["--method", "greedy"], capsys)
    assert code == 0
    code, out, err = run_cli(argv, capsys)
    reasons = [line for line in err.splitlines() if line.startswith("[auto] ")]
    assert code == 0 and out == greedy and len(reasons) == 1, err
    assert re.match(r"\[auto\] greedy: measured fastest here \(\d+\.\d tokens/s\); .+ is compiling in the "
                    r"background, to be tried \[learned from 1 decodes\]$", reasons[0]), reasons[0]
    code, out, err = run_cli(["generate", "--prompt-ids", "1,5,9", "--max-new-tokens", "4", "--window", "wide"], capsys)
    assert_one_line_error(code, out, err, ["--window must be an integer or auto, got 'wide'"])
