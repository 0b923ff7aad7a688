"""benchmarks/harness: the order settings run in, decode runs checked against greedy, resume, rendering."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter

import pytest
from flax import nnx

import jaxspec
from benchmarks import report
from benchmarks.harness import Case, DecodeBench, Setting, interleaved, run_decode
from benchmarks.harness.decode import Journal, differences, signature

CFG = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=1)
CASES = [Case("a", (1, 5, 9, 5, 9), "x"), Case("b", (1, 30, 2), "x"), Case("c", (1, 12, 40, 7, 3), "y")]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_interleaved_order_treats_every_setting_alike(n):
    names = list(range(n))
    follows, firsts = Counter(), Counter()
    for k in range(2 * n):  # every rotation, forwards and backwards
        order = interleaved(names, k)
        assert sorted(order) == names
        firsts[order[0]] += 1
        follows.update(zip(order, order[1:]))
    assert all(follows[a, b] == follows[b, a] for a, b in itertools.permutations(names, 2))
    assert set(firsts.values()) == {2}


@pytest.fixture(scope="module")
def model():
    return jaxspec.Model.from_module(jaxspec.Transformer(CFG, rngs=nnx.Rngs(0)))


def bench(model, peer_tokens=None, rounds=2) -> DecodeBench:
    def peer(case, new_tokens):  # an outside decoder: greedy's tokens, or the ones it is given
        out = jaxspec.generate(model, list(case.ids), max_new_tokens=new_tokens, stop_at_eos=False)
        return {"tokens": peer_tokens or out.tokens, "steps": new_tokens, "seconds": 1.0}

    return DecodeBench("tiny", "tiny", model, CASES, [
        Setting("greedy"), Setting("prompt lookup", "prompt-lookup", {"ngram": 2, "guesses": 2}),
        Setting("peer", peer=peer)], new_tokens=8, rounds=rounds)


def test_decode_runs_are_checked_against_greedy_and_rendered(model, tmp_path):
    r = run_decode(bench(model, peer_tokens=[0] * 8), tmp_path / "j.jsonl", progress=False)
    s = r["summary"]
    assert s["greedy"]["S"] == pytest.approx(8 / 8)  # prefill + 7 one-token steps
    # the warm-up's compile time, per setting (the timed runs compile nothing)
    assert all(x["compile_seconds"] >= 0 for x in r["settings"]) and "compile_seconds" not in s["greedy"]
    assert s["prompt lookup"]["identical_to_reference"] == 3 and s["prompt lookup"]["same_every_round"]
    assert s["peer"]["identical_to_reference"] == 0  # a wrong decoder is caught
    assert s["peer"]["tokens_per_second"] == pytest.approx(3 * 8 / 3.0)
    assert set(s["greedy"]["S_per_category"]) == {"x", "y"}
    lo, hi = s["prompt lookup"]["speed_vs_reference_range"]
    assert lo <= s["prompt lookup"]["speed_vs_reference"] <= hi
    table = "\n".join(report.decode(r))
    assert "| peer | 1.00 |" in table and "| 0/3 |" in table and "median of 2 rounds" in table
    found = differences(model, CASES, r["runs"], "greedy")  # the wrong peer's 3, explained; no one else's
    assert [(d["setting"], d["index"]) for d in found] == [("peer", 0)] * 3
    assert all(d["got"] == 0 and d["logit_gap"] is not None and not d["near_tie"] for d in found)
    report.plot(r, tmp_path / "tiny.png")
    assert (tmp_path / "tiny.png").stat().st_size > 1000


def test_an_interrupted_run_resumes_and_says_so(model, tmp_path):
    b = bench(model)
    journal = tmp_path / "j.jsonl"
    whole = run_decode(b, journal, progress=False)
    lines = journal.read_text().splitlines()
    assert len(lines) == 1 + 2 * 3 * 3  # header + rounds x cases x settings
    journal.write_text("\n".join(lines[:8]) + "\n" + lines[8][:20])  # killed mid-write of the 8th run
    resumed = run_decode(b, journal, progress=False)
    assert resumed["resumed_runs"] == 7
    assert len(journal.read_text().splitlines()) == len(lines)  # the cut line was replaced, not appended to
    assert {n: s["S"] for n, s in resumed["summary"].items()} == {n: s["S"] for n, s in whole["summary"].items()}
    assert "Resumed: 7 runs" in "\n".join(report.decode(resumed))
    with pytest.raises(SystemExit, match="another configuration"):
        run_decode(dataclasses.replace(b, new_tokens=4), journal, progress=False)
    assert Journal(journal, signature(dataclasses.replace(b, new_tokens=4)), fresh=True).resumed == 0
    assert json.loads(journal.read_text().splitlines()[0])["signature"] == signature(dataclasses.replace(b, new_tokens=4))


def test_a_recorded_command_names_repository_paths_relative_to_the_root(tmp_path):
    from benchmarks.harness.machine import ROOT
    from benchmarks.harness.result import command_line

    line = command_line("benchmarks/real_bench.py", ["--out", str(ROOT / "benchmarks" / "results"), "--name", "x y",
                                                     "--data", str(tmp_path / "train.npy")])
    assert line == (f"python -m benchmarks.real_bench --out benchmarks/results --name 'x y' "
                    f"--data {tmp_path / 'train.npy'}")  # a path outside the checkout is kept as given


def test_position_rates_count_each_position_over_the_rows_that_drafted_that_far():
    """`auto` may decode one case with K = 3 and another with K = 4: a_4 is over the K = 4 rows only."""
    from benchmarks.harness.decode import _position_rates

    rows = [{"draft_accepts": [6, 3, 1], "target_steps": 10}, {"draft_accepts": [5, 4, 2, 1], "target_steps": 10}]
    assert _position_rates(rows) == [round(x, 4) for x in (11 / 20, 7 / 11, 3 / 7, 1 / 2)]
