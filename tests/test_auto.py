"""`method="auto"` / `window="auto"` (`jaxspec.runtime.auto`): greedy unless another setting is measured
faster, the same tokens whatever is chosen, and the S table fitted from the benchmark results."""

from __future__ import annotations

import json
import math
import re
import tomllib

import pytest

import jaxspec
from jaxspec.runtime import auto
from jaxspec.runtime import auto_store
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


def _fake_costs(monkeypatch, per_token: float):
    """An accelerator-like forward: seconds = 1 + per_token * T (flat at small T)."""
    monkeypatch.setattr(auto, "_MEASURED", {})
    monkeypatch.setattr(auto, "forwards_seconds",
                        lambda batch, cache_len, forwards, repeats=3: [1 + per_token * t for _, t, _ in forwards])


def _timed(timed: dict):
    """A race whose (seconds, steps) per method are `timed`'s."""
    return lambda model, prompt, n, settings, generation, generate, warm=True: [timed[m] for m, _ in settings]


def test_a_fast_candidate_is_chosen_only_once_timed_faster(pycode, monkeypatch):
    _fake_costs(monkeypatch, 0.001)  # c(120) = 1.12: every lookahead setting is predicted well ahead
    timed = {"lookahead": (1.0, 10), "autoregressive": (2.0, 20)}
    monkeypatch.setattr(auto, "decode_seconds", _timed(timed))
    choice = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    assert choice.method == "lookahead" and choice.options == dict(window=15, ngram=5, guesses=15)
    assert "measured 2.00x greedy" in choice.reason
    timed["lookahead"] = (2.1, 10)  # timing says slower: greedy, however good the prediction
    monkeypatch.setattr(auto, "_MEASURED", {})
    choice = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    assert choice.method == "autoregressive" and "under 1.1x" in choice.reason


def test_a_race_for_greedy_or_too_close_to_call_is_timed_once_more(pycode, monkeypatch):
    _fake_costs(monkeypatch, 0.001)
    races = []

    def race(times: list[float]):  # the candidate's seconds in each timing; greedy's are always 2.0
        def decode_seconds(model, prompt, n, settings, generation, generate, warm=True):
            races.append(warm)
            return [(times[len(races) - 1], 10), (2.0, 20)]
        monkeypatch.setattr(auto, "decode_seconds", decode_seconds)
        monkeypatch.setattr(auto, "_MEASURED", {})
        races.clear()
        return auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)

    choice = race([1.9, 1.6])  # 1.05x, under MARGIN x RETIME_BAND: timed again, 1.25x counts
    assert races == [True, False]  # the second timing reuses the programs the first warmed
    assert choice.method == "lookahead" and "measured 1.25x greedy" in choice.reason
    choice = race([1.6, 2.2])  # 1.25x, still too close: the second, slower timing does not undo it
    assert races == [True, False] and choice.method == "lookahead"
    choice = race([1.4])  # 1.43x: clear, timed once
    assert races == [True] and choice.method == "lookahead"
    choice = race([2.0, 1.95])  # 1.00x, then 1.03x: greedy
    assert races == [True, False] and choice.method == "autoregressive" and "measured 1.03x" in choice.reason
    choice = race([2.5, 1.0])  # 0.80x (a stall), then 2.00x: the faster timing decides
    assert races == [True, False] and choice.method == "lookahead" and "measured 2.00x" in choice.reason


def test_a_slow_forward_is_never_timed(pycode, monkeypatch):
    _fake_costs(monkeypatch, 1.0)  # CPU-like: c(T) ~ T
    monkeypatch.setattr(auto, "decode_seconds", lambda *a, **k: pytest.fail("timed a setting predicted slower"))
    choice = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    assert choice.method == "autoregressive" and f"no setting is predicted {auto.WORTH_TIMING:g}x faster" in choice.reason
    window = auto.choose(pycode, [1, 5, 9], 1, 3, 16, lookahead_only=True, generate=jaxspec.generate)
    assert window.method == "lookahead" and window.options == dict(window=4, ngram=3, guesses=4)  # the cheapest


def test_large_blocks_are_measured_only_where_one_could_be_worth_timing(pycode, monkeypatch):
    """CPU-like forwards (c(T) = (1 + T) / 2): no block of more than auto.SMALL_SIZES[-1] tokens
    can reach WORTH_TIMING x greedy at that lower bound, so the 128-token forward is not measured and their c is
    reported as the bound; `window="auto"` ranks lookahead settings by exact c, so it measures it."""
    _fake_costs(monkeypatch, 1.0)
    small = auto.SMALL_SIZES[-1]
    sizes = []
    fake = auto.forwards_seconds
    monkeypatch.setattr(auto, "forwards_seconds",
                        lambda *a, **k: sizes.append(sorted(t for _, t, _ in a[2])) or fake(*a, **k))
    monkeypatch.setattr(auto, "decode_seconds", lambda *a, **k: pytest.fail("timed a setting predicted slower"))
    choice = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    assert sizes == [sorted([1, small, 5, 17])]  # the target's 1 and `small`, the drafter's smallest and largest block
    rows = {r["label"]: r for r in choice.candidates}
    assert rows["lookahead (15,5,15)"]["bound"] and rows["lookahead (15,5,15)"]["step_cost"] == (1 + small) / 2
    assert "bound" not in rows["lookahead (4,3,4)"] and "bound" not in rows["speculative (16)"]
    assert choice.method == "autoregressive" and "their own forwards not measured" in choice.reason
    window = auto.choose(pycode, [1, 5, 9], 1, 3, 16, lookahead_only=True, generate=jaxspec.generate)
    assert sizes[1:] == [[1, small], [1, 128]] and not any(r.get("bound") for r in window.candidates)
    assert {r["label"]: r["step_cost"] for r in window.candidates}["lookahead (15,5,15)"] == pytest.approx(
        (1 + 120.0) / 2, abs=1e-3)


def test_a_drafter_whose_settings_cannot_be_worth_timing_is_neither_loaded_nor_measured(pycode, monkeypatch):
    """A drafted step costs at least the target's one-token forward: with every speculative S
    under WORTH_TIMING (1.2; SmolLM2-135M-Instruct's first drafter: S 1.26-1.27 against a bar of 1.5 then),
    no c could make one worth timing, so the drafter is not loaded and its forwards not timed;
    those rows carry the bound c(1) = 1."""
    table = dict(auto.expectations("pycode-5M"), speculative_4=1.1, speculative_8=1.15)
    monkeypatch.setattr(auto, "expectations", lambda key, path=auto.CONFIG: {
        k: v for k, v in table.items() if not k.startswith("speculative_") or k in ("speculative_4", "speculative_8")})
    _fake_costs(monkeypatch, 1.0)
    timed = []
    fake = auto.forwards_seconds
    monkeypatch.setattr(auto, "forwards_seconds", lambda *a, **k: timed.append(a[2]) or fake(*a, **k))
    monkeypatch.setattr(auto, "_default_drafter", lambda model: pytest.fail("loaded a drafter it cannot use"))
    monkeypatch.setattr(auto, "decode_seconds", lambda *a, **k: pytest.fail("timed a setting predicted slower"))
    choice = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    # the target's small forwards, then (c >= 1 leaves lookahead (4,3,4)'s S worth it) its 16-token block
    # beside a fresh one-token yardstick; never a drafter's
    assert [sorted(t for _, t, _ in forwards) for forwards in timed] == [[1, auto.SMALL_SIZES[-1]], [1, 16]]
    assert all(m is pycode for forwards in timed for m, _, _ in forwards)
    rows = {r["label"]: r for r in choice.candidates}
    assert rows["speculative (8)"]["bound"] and rows["speculative (8)"]["step_cost"] == 1.0
    assert rows["speculative (8)"]["predicted_speedup"] == 1.15 and "bound" not in rows["lookahead (4,3,4)"]
    assert choice.method == "autoregressive" and "at most 1.15x (speculative (8))" in choice.reason
    # With S worth timing at c = 1 the drafter is measured as before.
    table.update(speculative_8=2.0)
    monkeypatch.setattr(auto, "_MEASURED", {})
    with pytest.raises(pytest.fail.Exception, match="loaded a drafter"):
        auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)


def test_the_block_a_race_would_time_is_measured_first(pycode, monkeypatch):
    """A CPU-like concave c (steep at a few tokens): the line from c(1) to c(32) puts speculative
    (4)'s 5-token block at 1.57 (S 3.03: 1.9x, worth a race); its own forward, measured before any
    race, says 2.6 (1.16x), and the race is not run (nor one of speculative (8), whose 9-token c,
    interpolated from 5 and 32 tokens, is then 3.0: 1.09x). The drafter's forward is small here."""
    monkeypatch.setattr(auto, "_MEASURED", {})
    sizes = []

    def forwards(batch, cache_len, forwards, repeats=3):
        sizes.append(sorted(t for m, t, _ in forwards if m is pycode))
        return [1 + 0.8 * (t - 1) ** 0.5 if m is pycode else 0.01 for m, t, _ in forwards]

    monkeypatch.setattr(auto, "forwards_seconds", forwards)
    monkeypatch.setattr(auto, "decode_seconds", lambda *a, **k: pytest.fail("raced a setting its own forward rules out"))
    choice = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    # then speculative (4)'s own block, with the one-token forward again as its yardstick; larger ones stay bounded
    assert sizes == [[1, auto.SMALL_SIZES[-1]], [1, 5]]
    rows = {r["label"]: r for r in choice.candidates}
    assert rows["speculative (4)"]["step_cost"] == pytest.approx(2.6 + 0.01, abs=1e-3)
    assert choice.method == "autoregressive" and f"no setting is predicted {auto.WORTH_TIMING:g}x faster" in choice.reason


def test_a_block_the_line_prices_too_high_is_measured_and_raced(pycode, monkeypatch):
    """A convex c (flat to a few tokens, then steep; SmolLM2 with blocks weights on this project's CPU
    in one busy measurement: c(5) 1.3, c(32) 6.6): the line from c(1) to c(32) puts speculative (4)'s
    5-token block at 1.72, and S 1.9 at 1.10x, under WORTH_TIMING. c is at least 1, where S would be
    worth it, so the block's own forward is measured (1.3: 1.46x) and the setting raced."""
    table = {k: v for k, v in auto.expectations("pycode-5M").items() if not k.startswith("speculative_")}
    monkeypatch.setattr(auto, "expectations", lambda key, path=auto.CONFIG: dict(table, speculative_4=1.9))
    monkeypatch.setattr(auto, "_MEASURED", {})
    sizes = []

    def forwards(batch, cache_len, forwards, repeats=3):
        sizes.append(sorted(t for m, t, _ in forwards if m is pycode))
        return [(1.0 if t == 1 else 1.3 if t <= 5 else 1.3 + 5.3 * (t - 5) / 27) if m is pycode else 1e-9
                for m, t, _ in forwards]

    monkeypatch.setattr(auto, "forwards_seconds", forwards)
    monkeypatch.setattr(auto, "decode_seconds", _timed({"speculative": (1.0, 10), "autoregressive": (1.5, 15)}))
    choice = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    assert sizes == [[1, auto.SMALL_SIZES[-1]], [1, 5]]
    assert {r["label"]: r["step_cost"] for r in choice.candidates}["speculative (4)"] == pytest.approx(1.3, abs=1e-3)
    assert choice.method == "speculative" and "measured 1.50x greedy" in choice.reason


def test_forwards_timed_at_different_moments_are_divided_by_their_own_yardstick(pycode, monkeypatch, tmp_path):
    """c divides one forward's time by another's: a block's forward timed later, under another
    load than the stored small forwards, is timed with a fresh one-token forward and scaled by
    it. c is then what one moment's timing says (here: 3x the load at first, 1x later), and
    never below one forward (a stored one-token forward timed under more load once made a
    5-token block look cheaper than one token)."""
    monkeypatch.setenv(auto_store.ENV, str(tmp_path / "auto.json"))
    monkeypatch.setattr(auto, "decode_seconds", lambda *a, **k: pytest.fail("raced a setting its own forward rules out"))
    load = {"now": 1.0}

    def forwards(batch, cache_len, forwards, repeats=3):
        return [load["now"] * (1 + 0.8 * (t - 1) ** 0.5 if m is pycode else 0.01) for m, t, _ in forwards]

    monkeypatch.setattr(auto, "forwards_seconds", forwards)
    monkeypatch.setattr(auto, "_MEASURED", {})
    steady = {r["label"]: r["step_cost"] for r in auto.choose(pycode, [1, 5, 9], 1, 3, 16,
                                                               generate=jaxspec.generate).candidates}
    assert steady["speculative (4)"] == pytest.approx(2.61, abs=1e-3)
    store = tmp_path / "auto.json"
    entries = json.loads(store.read_text())["entries"]
    small = {k: v for k, v in entries.items() if "[1, 32]" in k}
    assert len(entries) == 2 and len(small) == 1
    for entry in small.values():  # as if an earlier process had timed these under 3x today's load
        entry["values"] = [3 * v for v in entry["values"]]
    store.write_text(json.dumps({"version": auto_store.VERSION, "entries": small}))
    monkeypatch.setattr(auto, "_MEASURED", {})
    again = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    assert again.recalled and {r["label"]: r["step_cost"] for r in again.candidates} == pytest.approx(steady)
    # Unscaled, the 5-token block's c would be 3.4 / 3 = 1.13, not 3.4 / 1.
    load["now"] = 0.2
    store.write_text(json.dumps({"version": auto_store.VERSION, "entries": small}))
    monkeypatch.setattr(auto, "_MEASURED", {})
    assert {r["label"]: r["step_cost"] for r in auto.choose(pycode, [1, 5, 9], 1, 3, 16,
                                                            generate=jaxspec.generate).candidates} == pytest.approx(steady)


def test_measurements_outlive_the_process(pycode, monkeypatch, tmp_path):
    """With a store (JAXSPEC_AUTO_CACHE), a later process (here: the in-process cache emptied)
    makes the same choice from the stored c and timing without measuring, and says so; another
    machine, an unreadable store or `off` measure again."""
    store = tmp_path / "auto.json"
    monkeypatch.setenv(auto_store.ENV, str(store))
    _fake_costs(monkeypatch, 0.001)
    measured = []  # per measuring call, the models whose forwards it timed
    fake = auto.forwards_seconds
    monkeypatch.setattr(auto, "forwards_seconds",
                        lambda *a, **k: measured.append(len({id(m) for m, _, _ in a[2]})) or fake(*a, **k))
    timed = {"lookahead": (1.0, 10), "autoregressive": (2.0, 20)}
    monkeypatch.setattr(auto, "decode_seconds", _timed(timed))
    first = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    # The target's small forwards and the drafter's, together; then the target's large one (here
    # every larger block could be worth timing).
    assert first.recalled is None and first.method == "lookahead" and measured == [2, 1]
    assert len(json.loads(store.read_text())["entries"]) == 3  # those two timings and the timed race

    monkeypatch.setattr(auto, "_MEASURED", {})  # a new process
    monkeypatch.setattr(auto, "decode_seconds", lambda *a, **k: pytest.fail("timed again"))
    again = auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate)
    assert measured == [2, 1] and (again.method, again.options, again.candidates) == (
        first.method, first.options, first.candidates)
    assert again.recalled.startswith(f"{store}, measured 20") and "[measured earlier: " in again.reason

    monkeypatch.setattr(auto, "_MEASURED", {})
    monkeypatch.setattr(auto_store.socket, "gethostname", lambda: "another-machine")
    monkeypatch.setattr(auto, "decode_seconds", _timed(timed))
    assert auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate).recalled is None and measured == [2, 1, 2, 1]

    store.write_text("{not json")
    monkeypatch.setattr(auto, "_MEASURED", {})
    with pytest.warns(UserWarning, match="ignoring the auto measurement store"):
        assert auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate).recalled is None
    assert len(json.loads(store.read_text())["entries"]) == 3  # rewritten whole
    data = json.loads(store.read_text())
    for entry in data["entries"].values():
        entry["values"] = ["x"]  # edited by hand: measured again, replaced
    store.write_text(json.dumps(data))
    monkeypatch.setattr(auto, "_MEASURED", {})
    count = len(measured)
    assert auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate).recalled is None and measured[count:] == [2, 1]
    assert all(e["values"] != ["x"] and all(isinstance(v, float) for v in e["values"])
               for e in json.loads(store.read_text())["entries"].values())

    store.unlink()
    monkeypatch.setenv(auto_store.ENV, "off")
    monkeypatch.setattr(auto, "_MEASURED", {})
    assert auto.choose(pycode, [1, 5, 9], 1, 3, 16, generate=jaxspec.generate).recalled is None and not store.exists()


def test_generate_auto_reports_its_choice_and_keeps_greedy_tokens(pycode):
    """On this CPU: measured c; whatever `auto` chooses, and the lookahead setting window="auto"
    picks, gives greedy's tokens."""
    prompt = [1, 5, 9, 20, 7]
    greedy = jaxspec.generate(pycode, prompt, max_new_tokens=12)
    out = jaxspec.generate(pycode, prompt, max_new_tokens=12, method="auto")
    assert out.tokens == greedy.tokens and out.auto["method"] == out.method
    assert {r["label"] for r in out.auto["candidates"]} >= {"autoregressive", "lookahead (15,5,15)", "speculative (8)"}
    rows = {r["label"]: r for r in out.auto["candidates"]}
    small, large = rows["lookahead (4,3,4)"], rows["lookahead (15,5,15)"]  # blocks of 16 and 120 tokens
    assert rows["autoregressive"]["step_cost"] == 1.0 and small["step_cost"] > 1 and "bound" not in small
    # 120 tokens: measured, or (no larger block could be worth timing) c(SMALL_SIZES[-1]) as its bound
    assert large["step_cost"] >= small["step_cost"] if large.get("bound") else large["step_cost"] > small["step_cost"]
    window = jaxspec.generate(pycode, prompt, max_new_tokens=12, method="lookahead", window="auto")
    assert window.method == "lookahead" and window.tokens == greedy.tokens
    assert (window.options["window"], window.options["ngram"], window.options["guesses"]) in auto.LOOKAHEAD_GRID
    assert jaxspec.generate(pycode, prompt, max_new_tokens=12).auto is None


@pytest.mark.parametrize("options, needle", [
    (dict(method="auto", window=4), "method 'auto' chooses the method and its options; it takes none, got window"),
    (dict(method="lookahead", window="auto", ngram=3), "window='auto' chooses ngram and guesses too"),
])
def test_auto_with_options_it_chooses_is_refused(pycode, options, needle):
    with pytest.raises(jaxspec.GenerationError, match=needle):
        jaxspec.generate(pycode, [1, 5], max_new_tokens=2, **options)


def test_cli_defaults_to_auto_and_says_why(capsys):
    """What auto picks depends on this request's timing on a shared CPU (greedy or a setting
    measured >= 1.1x faster); either way the CLI says which and why, and prints greedy's text."""
    argv = ["generate", "--prompt-ids", "1,5,9", "--max-new-tokens", "4"]
    code, greedy, _ = run_cli(argv + ["--method", "greedy"], capsys)
    assert code == 0
    code, out, err = run_cli(argv, capsys)
    reasons = [line for line in err.splitlines() if line.startswith("[auto] ")]
    assert code == 0 and out == greedy and len(reasons) == 1, err
    assert re.match(r"\[auto\] (greedy: (no setting is predicted|the best setting by forward cost)"
                    r"|.+: measured \d+\.\d+x greedy on cpu)", reasons[0]), reasons[0]
    assert reasons[0].startswith("[auto] greedy: ") or "identical to greedy: yes" in err
    code, out, err = run_cli(["generate", "--prompt-ids", "1,5,9", "--max-new-tokens", "4", "--window", "wide"], capsys)
    assert_one_line_error(code, out, err, ["--window must be an integer or auto, got 'wide'"])
