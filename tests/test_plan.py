"""One plan and one bucketing rule for every caller (jaxspec/runtime/plan.py): `generate` and
the server build the same engine for the same request, and a prompt's padded length is the
same everywhere."""

from __future__ import annotations

import jaxspec
from jaxspec.runtime.plan import plan_decode, prompt_bucket
from jaxspec.serving.requests import Requests, ServeSettings


def test_prompt_buckets_hold_the_prompt_waste_at_most_half_and_are_two_per_doubling():
    buckets = sorted({prompt_bucket(n) for n in range(1, 4097)})
    assert buckets[:6] == [16, 24, 32, 48, 64, 96]
    for n in range(1, 4097):
        b = prompt_bucket(n)
        assert b >= n and (n <= 16 or b <= 1.5 * n), n
        assert prompt_bucket(b) == b  # a bucket is its own bucket (a padded prompt reuses its program)
    assert all(prompt_bucket(n) <= prompt_bucket(n + 1) for n in range(1, 4096))
    assert len([b for b in buckets if 256 < b <= 512]) == 2


def test_generate_and_the_server_plan_the_same_engine():
    model = jaxspec.load("pycode-5M")
    eos = tuple(model.config.eos_token_ids)
    served = Requests(model, ServeSettings(model_id="m", slots=2, context=256), eos).plan(
        "lookahead", {"window": 4, "ngram": 3, "guesses": 4}, True, False)
    alone = plan_decode(model, "lookahead", {"window": 4, "ngram": 3, "guesses": 4}, greedy=True, batch=1,
                        prompt_len=16, max_new_tokens=32, eos_ids=eos)
    assert served.engine == alone.engine and served.key == alone.key and served.name == alone.name == "lookahead"
    assert served.options == alone.options and not served.bound
    # a drafter's graph travels with the target's in both
    spec = plan_decode(model, "speculative", {"draft_len": 3}, greedy=True, batch=1, prompt_len=16, max_new_tokens=8)
    assert spec.bound and spec.options.draft_len == 3
