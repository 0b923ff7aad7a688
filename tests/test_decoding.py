"""Semantics of the autoregressive decoding loop and of logits warping, on tiny random models.

The models are built in the test (no checkpoint): a 2-layer GQA LLaMA with a 64-token
vocabulary. With the default init (std 0.02) its logits are nearly uniform (high entropy,
good for sampling tests) while greedy argmax still has margins far above float error.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.models.kv_cache import KVCache
from jaxspec.runtime import compile_cache
from jaxspec.models.model import causal_mask
from jaxspec.decoding.sampling import SamplingParams, target_probs, warp_logits

CFG = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=1,
)
PROMPTS = [[1, 5, 9], [1, 30], [1, 12, 40, 7, 3]]  # different lengths, one 16-token bucket
BUDGET = 16


def tiny_model(eos: tuple[int, ...] = ()) -> jaxspec.Model:
    module = jaxspec.Transformer(dataclasses.replace(CFG, eos_token_ids=eos), rngs=nnx.Rngs(0))
    return jaxspec.Model.from_module(module)


def reference_greedy(model: jaxspec.Model, prompt: list[int], n: int, width: int = 32) -> list[int]:
    """Greedy by re-running the full sequence each step: no KV cache, no decoding loop."""

    @jax.jit
    def last_logits(params, tokens, length):
        out = nnx.merge(model.graphdef, params)(
            tokens, jnp.arange(width)[None], causal_mask(length[None], width),
            KVCache.zeros(CFG.num_layers, 1, 8, CFG.num_kv_heads, CFG.head_dim))
        return out.logits[0, length - 1]

    seq = list(prompt)
    for _ in range(n):
        tokens = jnp.asarray([seq + [0] * (width - len(seq))], jnp.int32)
        seq.append(int(jnp.argmax(last_logits(model.params, tokens, jnp.int32(len(seq))))))
    return seq[len(prompt):]


@pytest.fixture(scope="module")
def free_run() -> list[list[int]]:
    """Greedy continuations of PROMPTS with no EOS in the config."""
    out = jaxspec.generate(tiny_model(), PROMPTS, max_new_tokens=BUDGET)
    assert [len(r) for r in out.tokens] == [BUDGET] * len(PROMPTS)
    return out.tokens


def cut_at_eos(row: list[int], eos: tuple[int, ...]) -> list[int]:
    hits = [i for i, t in enumerate(row) if t in eos]
    return row[: hits[0] + 1] if hits else row  # EOS kept as the last token


@pytest.fixture(scope="module")
def eos_ids(free_run) -> tuple[int, int]:
    """Two EOS ids that stop the rows at three different steps, one of them right after prefill."""
    for r, row in enumerate(free_run):
        for t in range(CFG.vocab_size):
            eos = (t, row[0])
            lengths = [len(cut_at_eos(other, eos)) for other in free_run]
            if t != row[0] and len(set(lengths)) == len(free_run) and min(lengths) == 1 and max(lengths) > 2:
                return eos
    pytest.fail(f"no EOS pair stops the rows at different steps in {free_run}; change PROMPTS")


def test_greedy_loop_matches_uncached_reference(free_run):
    model = tiny_model()
    assert free_run[0] == reference_greedy(model, PROMPTS[0], BUDGET)


def test_eos_stops_rows_at_different_steps(free_run, eos_ids):
    model = tiny_model(eos=eos_ids)
    out = jaxspec.generate(model, PROMPTS, max_new_tokens=BUDGET)
    for row, steps, free in zip(out.tokens, out.steps, free_run):
        assert row == cut_at_eos(free, eos_ids)
        assert not set(row[:-1]) & set(eos_ids)  # stops at the first EOS...
        assert row[-1] in eos_ids or len(row) == BUDGET  # ...and keeps it, unless the budget ran out first
        assert steps == len(row)  # forwards while the row was active, prefill included
    assert 1 in out.steps  # a row whose first (prefill) token is EOS takes no decoding step
    assert len(set(out.steps)) == len(PROMPTS)

    no_stop = jaxspec.generate(model, PROMPTS, max_new_tokens=BUDGET, stop_at_eos=False)
    assert no_stop.tokens == free_run and no_stop.steps == [BUDGET] * len(PROMPTS)


def test_batched_generate_equals_per_row_generate(eos_ids):
    model = tiny_model(eos=eos_ids)
    batched = jaxspec.generate(model, PROMPTS, max_new_tokens=BUDGET)
    for i, prompt in enumerate(PROMPTS):
        single = jaxspec.generate(model, prompt, max_new_tokens=BUDGET)
        assert single.tokens == batched.tokens[i]
        assert single.steps == batched.steps[i]


def test_sampling_is_reproducible_per_seed_and_differs_across_seeds():
    model = tiny_model()
    a = jaxspec.generate(model, PROMPTS[0], max_new_tokens=BUDGET, temperature=1.0, seed=0)
    b = jaxspec.generate(model, PROMPTS[0], max_new_tokens=BUDGET, temperature=1.0, seed=0)
    c = jaxspec.generate(model, PROMPTS[0], max_new_tokens=BUDGET, temperature=1.0, seed=1)
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens  # near-uniform over 64 tokens: equal by chance with p ~ 64**-16
    assert all(0 <= t < CFG.vocab_size for t in a.tokens + c.tokens)


def test_temperature_zero_is_greedy_whatever_the_other_knobs(free_run):
    model = tiny_model()
    out = jaxspec.generate(model, PROMPTS[0], max_new_tokens=BUDGET, temperature=0.0, top_k=5, top_p=0.3,
                           seed=7)
    assert out.tokens == free_run[0]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_top_k_one_is_greedy_at_any_temperature(free_run, temperature):
    model = tiny_model()
    out = jaxspec.generate(model, PROMPTS[0], max_new_tokens=BUDGET, temperature=temperature, top_k=1,
                           seed=3)
    assert out.tokens == free_run[0]


def test_loop_is_one_compiled_program_reused_across_prompts_of_one_bucket():
    model = tiny_model()
    first = jaxspec.generate(model, [1, 2, 3], max_new_tokens=BUDGET)
    assert len(model.compiled) == 1
    executable = next(iter(model.compiled.values()))
    assert "while" in executable.as_text()  # the decoding loop is inside the program, not in Python
    second = jaxspec.generate(model, [1, 20, 30, 40, 50, 60, 7], max_new_tokens=BUDGET)  # same 16-token bucket
    assert len(model.compiled) == 1 and second.compile_seconds == 0.0
    assert first.compile_seconds > 0
    jaxspec.generate(model, list(range(1, 21)), max_new_tokens=BUDGET)  # 20 tokens: the 32-token bucket
    assert len(model.compiled) == 2


def test_the_decoding_loop_updates_its_cache_in_place(monkeypatch):
    """A step's attention reads the KV cache, then its commit writes the accepted K/V into it.
    XLA:CPU's copy insertion copies a buffer read and then updated like that (the whole cache,
    every step) unless it runs region analysis, which every program compiled through
    `compile_cache` asks for on CPU (`CPU_COMPILER_OPTIONS`). The loop then holds no copy of a
    cache-shaped array; with XLA's defaults the same program does."""
    from benchmarks.hlo import cache_copies

    if jax.default_backend() != "cpu":
        pytest.skip("XLA:CPU's copy insertion option: on another backend the program's copies are another compiler's")

    def loop_copies(method: str) -> int:
        model = tiny_model()
        jaxspec.generate(model, [1, 2, 3], max_new_tokens=BUDGET, method=method)
        return cache_copies(next(iter(model.compiled.values())).as_text(), CFG.num_kv_heads, CFG.head_dim,
                            CFG.num_layers)

    assert compile_cache.CPU_COMPILER_OPTIONS
    assert loop_copies("autoregressive") == 0 and loop_copies("lookahead") == 0
    monkeypatch.setattr(compile_cache, "CPU_COMPILER_OPTIONS", {})
    assert loop_copies("autoregressive") > 0


def test_backend_options_join_the_callers_own():
    """The backend's compiler options are added to a caller's jit options, and the caller's own win."""
    options = compile_cache.backend_jit_options({"donate_argnums": 0})
    assert options["donate_argnums"] == 0
    if jax.default_backend() == "cpu":
        assert options["compiler_options"] == compile_cache.CPU_COMPILER_OPTIONS
        mine = compile_cache.backend_jit_options({"compiler_options": {"xla_cpu_copy_insertion_use_region_analysis": False}})
        assert mine["compiler_options"] == {"xla_cpu_copy_insertion_use_region_analysis": False}


def test_a_compile_key_hashes_each_graph_definition_once_and_equal_definitions_share_it(monkeypatch):
    """A speculative request's key holds the target's and the drafter's graph definitions, whose
    own hash walks the whole graph: it is taken once per object, not at each of a call's lookups.
    An equal copy still finds the same program."""
    import copy
    import importlib

    G = importlib.import_module("jaxspec.generate")
    model = jaxspec.load("pycode-5M")
    request = G.prepare(model, [1, 5, 9], 8, "speculative", draft_len=4)
    assert request.program.plan.bound
    target, (drafter,) = request.args[0]
    hashed = []
    graph_type = type(target)
    original = graph_type.__hash__
    monkeypatch.setattr(graph_type, "__hash__", lambda self: hashed.append(id(self)) or original(self))
    compile_cache.forget_graph_hashes()
    table = {request.compile_key("decode"): "program"}
    for _ in range(5):
        assert table[request.compile_key("decode")] == "program"
    assert sorted(hashed) == sorted({id(target), id(drafter)})  # once each
    plan = dataclasses.replace(request.program.plan, graphdef=(copy.deepcopy(target), (copy.deepcopy(drafter),)))
    twin = dataclasses.replace(request, program=dataclasses.replace(request.program, plan=plan))
    assert plan.graphdef[0] is not target and table[twin.compile_key("decode")] == "program"

# ----------------------------------------------------------------------------- warp_logits


def _params(temperature=1.0, top_k=0, top_p=1.0) -> SamplingParams:
    return SamplingParams.create(temperature, top_k, top_p)


@pytest.mark.parametrize("k", [1, 5, 17, 50])
def test_top_k_keeps_exactly_k_largest(k):
    logits = jax.random.normal(jax.random.key(0), (4, 50)) * 3  # continuous: no ties
    warped = np.asarray(warp_logits(logits, _params(top_k=k)))
    kept = np.isfinite(warped)
    assert (kept.sum(-1) == k).all()
    top = np.argsort(-np.asarray(logits), axis=-1)[:, :k]
    for row in range(4):
        assert set(np.flatnonzero(kept[row])) == set(top[row])
    np.testing.assert_allclose(warped[kept], np.asarray(logits)[kept], rtol=1e-6)


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_minimal_nucleus(top_p):
    logits = jax.random.normal(jax.random.key(1), (4, 40)) * 2
    kept = np.isfinite(np.asarray(warp_logits(logits, _params(top_p=top_p))))
    probs = np.asarray(jax.nn.softmax(logits, axis=-1), np.float64)
    for row in range(4):
        order = np.argsort(-probs[row])
        cumulative = np.cumsum(probs[row][order])
        m = int(np.searchsorted(cumulative, top_p - 1e-6)) + 1  # smallest prefix with mass >= top_p
        assert set(np.flatnonzero(kept[row])) == set(order[:m])
        assert probs[row][order[: m - 1]].sum() < top_p  # one token fewer would not reach top_p


def test_warped_probabilities_hand_computed():
    logits = jnp.log(jnp.asarray([0.4, 0.3, 0.2, 0.1]))
    cases = [
        (dict(), [0.4, 0.3, 0.2, 0.1]),
        (dict(top_p=0.6), [4 / 7, 3 / 7, 0, 0]),  # mass before: 0, .4 < .6, .7 >= .6
        (dict(top_k=3), [4 / 9, 3 / 9, 2 / 9, 0]),
        (dict(temperature=2.0), [math.sqrt(p) / sum(math.sqrt(q) for q in (.4, .3, .2, .1))
                                 for p in (.4, .3, .2, .1)]),
        # temperature first: p^2 = .16 .09 .04 .01 -> .533 .3 .133 .033; then top-p .8 keeps two
        (dict(temperature=0.5, top_p=0.8), [0.64, 0.36, 0, 0]),
        (dict(top_k=2, top_p=0.5), [1, 0, 0, 0]),  # nucleus taken within the top-k renormalized mass
    ]
    for kwargs, expected in cases:
        got = np.asarray(target_probs(logits, _params(**kwargs)))
        np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=str(kwargs))


def test_sampling_params_reject_bad_values():
    for kwargs in (dict(temperature=-1.0), dict(top_k=-1), dict(top_k=1.5), dict(top_p=0.0), dict(top_p=1.5),
                   dict(temperature=float("nan"))):
        with pytest.raises(jaxspec.GenerationError):
            SamplingParams.create(**kwargs)
