"""Plain steps over a drafted engine's state (`engine.plain_step`): chunk by chunk a caller may
step without drafts (greedy's cost) and draft again, over the same state, never compiling for the
switch. Every token equals greedy decoding alone, and the drafter's cache holds exactly what it
holds when it drafted at every step (so its drafts after a plain stretch are as good).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.decoding import methods
from jaxspec.decoding.sampling import SamplingParams
from jaxspec.runtime.plan import plan_decode
from test_speculative import EOS, EOS_PROMPTS, K, LOOKUP, copy_drafter, drafters, greedy, tiny  # noqa: F401

BUDGET = 40
# (plain?, steps) chunk after chunk: plain stretches longer than the drafter's pending run (a
# flush), one of a single step, drafting between and at the end.
SCHEDULE = [(False, 2), (True, 9), (False, 3), (True, 1), (False, 2), (True, 5), (False, BUDGET)]
CASES = {"lookup-bonus": dict(LOOKUP, target_features=True, bonus_in_context=True),
         "verified": dict(target_features=True, bonus_in_context=False),
         "routed-independent": dict(lookup_guesses=1, lookup_ngram=3, lookup_route=True, target_features=False,
                                    bonus_in_context=True)}


def _run(model, plan, prompts, schedule):
    lengths = [len(p) for p in prompts]
    padded = np.zeros((len(prompts), 16), np.int32)
    for i, p in enumerate(prompts):
        padded[i, :len(p)] = p
    sampling = SamplingParams.create()
    statics = dict(engine=plan.engine, max_new_tokens=BUDGET, cache_len=64, eos_ids=plan.eos_ids)
    state = methods.begin(plan.graphdef, plan.params, jnp.asarray(padded), jnp.asarray(lengths, jnp.int32),
                          jax.random.key(0), sampling, **statics)
    step = jax.jit(methods.advance, static_argnames=("engine", "eos_ids", "plain"))
    for plain, steps in schedule:
        state = step(plan.graphdef, plan.params, state, sampling, jnp.int32(steps), engine=plan.engine,
                     eos_ids=plan.eos_ids, plain=plain)
    d = state.decode
    tokens = [np.asarray(d.tokens[i, :int(d.num_generated[i])]).tolist() for i in range(len(prompts))]
    return tokens, state


@pytest.mark.parametrize("case", list(CASES))
def test_plain_and_drafted_steps_over_one_state_equal_greedy(tiny, drafters, case):  # noqa: F811
    plan = plan_decode(tiny, "speculative", dict(drafter=drafters["copy"], draft_len=K, **CASES[case]),
                       greedy=True, batch=len(EOS_PROMPTS), prompt_len=16, max_new_tokens=BUDGET, eos_ids=EOS)
    assert plan.engine.steps_plain
    solo = [greedy(tiny, [p], BUDGET, stop_at_eos=True)[0] for p in EOS_PROMPTS]
    mixed, state = _run(tiny, plan, EOS_PROMPTS, SCHEDULE)
    assert mixed == solo
    drafted, reference = _run(tiny, plan, EOS_PROMPTS, [(False, BUDGET)])
    assert drafted == solo
    # The drafter's cache: the same K/V at every position both runs committed (the long row).
    draft, ref = (s.sources[-1] for s in (state, reference))
    draft, ref = getattr(draft, "draft", draft), getattr(ref, "draft", ref)
    row = 2
    n = int(min(draft.cache.lengths[row], ref.cache.lengths[row]))
    assert n > len(EOS_PROMPTS[row]) + 20
    for a, b in ((draft.cache.k, ref.cache.k), (draft.cache.v, ref.cache.v)):  # [layers, b, kv, s, d]
        np.testing.assert_allclose(np.asarray(a[:, row, :, :n]), np.asarray(b[:, row, :, :n]), atol=2e-5, rtol=1e-5)
    # Plain stretches steps one token each: more steps than drafting all along, the same tokens.
    assert (np.asarray(state.decode.steps) >= np.asarray(reference.decode.steps)).all()


def test_an_engine_that_cannot_step_plain_says_so(tiny):  # noqa: F811
    greedy_plan = plan_decode(tiny, "greedy", {}, greedy=True, batch=1, prompt_len=16, max_new_tokens=8)
    lookahead = plan_decode(tiny, "lookahead", dict(window=3, ngram=3, guesses=2), greedy=True, batch=1,
                            prompt_len=16, max_new_tokens=8)
    assert not greedy_plan.engine.steps_plain and not lookahead.engine.steps_plain
    with pytest.raises(ValueError, match="cannot step without its drafts"):
        _run(tiny, lookahead, [[1, 5]], [(True, 2)])


def test_a_stream_whose_auto_chose_a_drafted_setting_steps_drafted_or_plain_and_stays_greedy(monkeypatch):
    """`jaxspec.stream` with `method="auto"` on a drafted setting that can step plain: the plain
    `advance` compiles in the background (the stream goes on drafted meanwhile), then each chunk
    runs drafted or plain as this device measured (`jaxspec.runtime.step_modes`, ledger kind
    "stream-chunk"); every token is greedy's, and `.result.auto` says which modes ran."""
    from jaxspec.runtime import auto
    from jaxspec.runtime.step_modes import EXPLORE_CHUNKS

    monkeypatch.setattr(auto.Ledger, "_OPEN", {})  # (this test's ledgers alone)
    monkeypatch.setattr(auto, "to_try", lambda *a, **k: None)  # (no other setting compiling beside the chunks)
    model = jaxspec.load()
    prompt, budget = "def fibonacci(n):\n    if n < 2:", 48
    choice = auto.Choice(method="speculative", options={"draft_len": 4, "lookup_guesses": 2}, reason="test",
                         candidates=())
    ref = jaxspec.generate(model, prompt, max_new_tokens=budget, stop_at_eos=False).tokens

    def streamed():
        s = jaxspec.stream(model, prompt, max_new_tokens=budget, method="auto", stop_at_eos=False, chunk_steps=2,
                           _choice=choice)
        return [t for c in s for t in c.tokens], s.result

    first, drafted = streamed()  # drafted only: the plain program compiles meanwhile
    assert first == ref and drafted.tokens == ref and drafted.auto["step_modes"]["chunks"]["plain"] == 0
    model.background.wait(600)
    again, result = streamed()
    modes = result.auto["step_modes"]
    assert again == ref and result.tokens == ref
    assert min(modes["chunks"].values()) >= EXPLORE_CHUNKS and modes["plain_steps"] >= EXPLORE_CHUNKS, modes
    assert result.steps > drafted.steps  # (plain steps give one token each: the same text in more steps)
    tallies = auto.Ledger.of(model, 1, "stream-chunk", False).tallies
    assert {label.rsplit(": ", 1)[1] for label in tallies} == {"drafted", "plain"}
