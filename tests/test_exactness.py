"""`jaxspec.exactness`: where two outputs part, the logit gap there, and the near-tie rule;
the CLI's "identical to greedy" line that uses them."""

from __future__ import annotations

import numpy as np
import pytest

import jaxspec
from jaxspec import exactness
from jaxspec.cli.reporting import identical_to_greedy
from test_decoding import tiny_model


def test_first_difference():
    assert exactness.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert exactness.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert exactness.first_difference([1, 2, 3], [1, 2]) == 2
    assert exactness.first_difference([], [4]) == 0


def test_near_tie_tolerance_is_four_ulps_of_the_largest_logit():
    logits = np.array([-3.0, 16.5, 2.0])  # largest |logit| in [16, 32): ulp = eps * 16
    assert exactness.near_tie_tolerance("float32", logits) == pytest.approx(4 * 2.0**-23 * 16)
    assert exactness.near_tie_tolerance("bfloat16", logits) == pytest.approx(4 * 2.0**-7 * 16)
    assert exactness.near_tie_tolerance("bfloat16", -logits) == pytest.approx(0.5)


@pytest.fixture(scope="module")
def model() -> jaxspec.Model:
    return tiny_model()


def test_compare_reports_the_gap_at_the_first_difference(model):
    prompt = [1, 5, 9]
    greedy = jaxspec.generate(model, prompt, max_new_tokens=6).tokens
    assert exactness.compare(model, prompt, greedy, greedy) is None
    logits = exactness.next_logits(model, prompt + greedy[:3])
    assert int(np.argmax(logits)) == greedy[3]  # the prefill path agrees with the decoding loop
    runner_up = int(np.argsort(logits)[-2])
    other = greedy[:3] + [runner_up, 0, 0]
    d = exactness.compare(model, prompt, greedy, other)
    assert (d.index, d.expected, d.got) == (3, greedy[3], runner_up)
    assert d.logit_gap == pytest.approx(logits[greedy[3]] - logits[runner_up]) and d.logit_gap > 0
    # the tiny model's greedy margins are far above float32 rounding: not a near-tie
    assert d.tolerance < 1e-5 and d.near_tie is (d.logit_gap <= d.tolerance)
    shorter = exactness.compare(model, prompt, greedy, greedy[:4])
    assert shorter.index == 4 and shorter.logit_gap is None and not shorter.near_tie


def test_cli_line_says_identical_or_where_and_whether_a_near_tie(model):
    prompt = [1, 5, 9]
    greedy = jaxspec.generate(model, prompt, max_new_tokens=4).tokens
    assert identical_to_greedy(model, prompt, greedy, greedy) == "identical to greedy: yes"
    logits = exactness.next_logits(model, prompt)
    other = [int(np.argsort(logits)[-2])] + greedy[1:]
    line = identical_to_greedy(model, prompt, other, greedy)
    assert line.startswith("identical to greedy: NO, first difference at token 0 ")
    assert "NOT a near-tie at float32 resolution" in line
    # a difference within the tolerance reads as a near-tie
    tie = exactness.Difference(index=2, expected=7, got=8, logit_gap=3e-7, tolerance=1e-6)
    assert tie.near_tie and "a near-tie at float32 resolution" in tie.describe("float32")
