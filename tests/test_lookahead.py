"""Lookahead Decoding, prompt lookup and Jacobi decoding are lossless: token-identical to greedy.

Most tests run on a tiny random LLaMA (2 layers, hidden 32, vocab 64) whose weights are scaled
up 5x from the default init: its greedy continuations fall into loops within a few tokens, so
the pool and the Jacobi guesses are right often and multi-token steps really happen (checked
by `test_tiny_model_really_accepts_candidates`), while attention over the context still
changes the argmax (so a wrong position, mask or committed K/V shows up as a wrong token).

Every distinct (method, W, N, G, batch, prompt bucket, budget, EOS) compiles a new program
(a few seconds on CPU), so the property test draws few examples and the explicit edge cases
share shapes with each other where they can.
"""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

import jaxspec
import jaxspec.decoding.engine as engine_module
from jaxspec.decoding.options import LookaheadOptions as LookaheadConfig
from jaxspec.decoding.methods import METHODS as METHODS_REGISTRY
from jaxspec.checkpoint.method_defaults import FileDefaults, lookahead_defaults
from jaxspec.decoding.methods import decode, resolve_method

from cli_runner import run_cli
from stories import CASES, needs_stories
from trees import StepLayout

# EOS ids chosen with the model below: with EOS_PROMPTS the three rows stop after different
# numbers of tokens and steps: row 0 at its first (prefill) token 43, and with lookahead
# (W=4, N=4, G=4) rows 1 and 2 at an EOS emitted in the middle of an accepted run (the tokens
# after it in the same step are cut).
EOS = (12, 23, 43)
TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=1, eos_token_ids=EOS,
)
WEIGHT_SCALE = 5.0  # x the default init std 0.02: peaked, loop-prone logits with clear argmax margins
METHODS = ("lookahead", "prompt-lookup", "jacobi")
BUDGET = 29  # property-test budget: not a multiple of any accepted-run length
EOS_PROMPTS = [
    [1],
    [1, 17, 42, 9, 33, 35, 12, 12, 12, 30, 36, 1, 20],
    [1, 50, 8, 8, 43, 47, 50, 37, 49, 36, 5, 50, 48, 48],
]
PAIR = [[1], [1, 50, 8, 8, 43, 47, 50, 37, 49, 36, 5]]  # a length-1 prompt and a longer one


@pytest.fixture(scope="module")
def tiny() -> jaxspec.Model:
    model = jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0)))
    params = jax.tree.map(lambda x: x * WEIGHT_SCALE if x.ndim == 2 else x, model.params)
    return dataclasses.replace(model, params=params, compiled={})


_greedy_cache: dict = {}


def greedy(model: jaxspec.Model, prompts: list[list[int]], max_new_tokens: int, stop_at_eos: bool = False):
    """Plain greedy (`method="greedy"`) rows for a batch; memoized (the program is cached per shape too)."""
    key = (id(model), tuple(map(tuple, prompts)), max_new_tokens, stop_at_eos)
    if key not in _greedy_cache:
        out = jaxspec.generate(model, prompts, max_new_tokens=max_new_tokens, method="greedy",
                               stop_at_eos=stop_at_eos)
        assert out.steps == [len(r) for r in out.tokens]  # greedy: one forward per token
        _greedy_cache[key] = out.tokens
    return _greedy_cache[key]


def options_for(method: str, window: int, ngram: int, guesses: int, pool_from_prompt: bool = True) -> dict:
    if method == "lookahead":
        return dict(window=window, ngram=ngram, guesses=guesses, pool_from_prompt=pool_from_prompt)
    if method == "prompt-lookup":
        return dict(ngram=ngram, guesses=guesses)
    return dict(window=window)


def check_stats(out: jaxspec.GenerateOutput) -> None:
    """steps/compression agree with the tokens and with accept_histogram[row, k] (steps that emitted k)."""
    hist = np.asarray(out.extras["accept_histogram"])
    steps = out.steps if isinstance(out.steps, list) else [out.steps]
    rows = out.tokens if isinstance(out.tokens[0], list) else [out.tokens]
    assert hist.ndim == 2 and hist.shape[0] == len(rows) and hist.shape[1] >= 2
    for h, s, row in zip(hist, steps, rows):
        assert h[0] == 0  # an active step always emits at least its bonus token
        assert h.sum() + 1 == s  # decoding steps + the prefill forward
        assert (np.arange(len(h)) * h).sum() + 1 == len(row)  # tokens from steps + the prefill token
        assert 1 <= s <= len(row)


def single_token_steps(method: str, options: dict) -> bool:
    """No candidates at all: prompt lookup / lookahead with G=0 (unless the window verifies its diagonals)."""
    return method != "jacobi" and options["guesses"] == 0 and not options.get("verify_window", False)


# ----------------------------------------------------------------------------- exactness: property


@settings(max_examples=10, deadline=None, derandomize=True, database=None, print_blob=True,
          phases=(Phase.explicit, Phase.generate),  # no shrinking: every new shape is a new compile
          suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(st.lists(st.integers(0, TINY.vocab_size - 1), min_size=1, max_size=20), min_size=2, max_size=2),
    window=st.integers(1, 16), ngram=st.integers(2, 7), guesses=st.integers(0, 16),
    method=st.sampled_from(METHODS), pool_from_prompt=st.booleans(), verify_window=st.booleans(),
)
@example(prompts=[[7, 3, 7, 3, 7, 3, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [5]], window=16, ngram=7,
         guesses=16, method="lookahead", pool_from_prompt=True, verify_window=True)  # the largest step
def test_speculative_methods_equal_greedy(tiny, prompts, window, ngram, guesses, method, pool_from_prompt,
                                          verify_window):
    options = options_for(method, window, ngram, guesses, pool_from_prompt)
    if method == "lookahead" and "verify_window" in METHODS_REGISTRY["lookahead"].option_names:
        options["verify_window"] = verify_window
    event(f"{method} {sorted(options.items())} prompt lengths {[len(p) for p in prompts]}")
    out = jaxspec.generate(tiny, prompts, max_new_tokens=BUDGET, method=method, stop_at_eos=False, **options)
    assert out.tokens == greedy(tiny, prompts, BUDGET)
    assert [len(r) for r in out.tokens] == [BUDGET, BUDGET]
    event(f"compression {min(out.compression):.2f}..{max(out.compression):.2f}")
    check_stats(out)
    if single_token_steps(method, out.options):
        assert out.steps == [BUDGET, BUDGET]  # nothing to verify: one token per forward


# ----------------------------------------------------------------------------- exactness: edge cases


@pytest.mark.parametrize("method, options, budget", [
    ("lookahead", dict(window=1, ngram=3, guesses=3), 13),  # W=1
    ("lookahead", dict(window=4, ngram=2, guesses=4), 7),  # N=2: single-token candidates, 1 level
    ("lookahead", dict(window=4, ngram=3, guesses=0, pool_from_prompt=False), 13),  # G=0: window only
    ("prompt-lookup", dict(ngram=2, guesses=3), 7),
    ("jacobi", dict(window=1), 13),
], ids=["lookahead-W1", "lookahead-N2", "lookahead-G0", "prompt-lookup-N2", "jacobi-W1"])
def test_edge_configs_equal_greedy(tiny, method, options, budget):
    """Budgets 7 and 13 are not multiples of the run lengths; row 0's prompt is one token long."""
    out = jaxspec.generate(tiny, PAIR, max_new_tokens=budget, method=method, stop_at_eos=False, **options)
    reference = [row[:budget] for row in greedy(tiny, PAIR, BUDGET)]  # greedy is prefix-consistent
    assert out.tokens == reference
    check_stats(out)
    if single_token_steps(method, out.options):
        assert out.steps == [budget, budget] and out.compression == [1.0, 1.0]


class _AppendSpy:
    """Records (emitted, count, kept) of every `append` in the lookahead loop (test-only host callback)."""

    def __init__(self):
        self.records: list = []
        self.original = engine_module.append

    def __call__(self, state, new_tokens, count, eos_ids, logprobs=None):
        state, kept = self.original(state, new_tokens, count, eos_ids, logprobs)
        jax.debug.callback(lambda n, c, k: self.records.append((np.asarray(n), np.asarray(c), np.asarray(k))),
                           new_tokens, count, kept, ordered=True)
        return state, kept


@pytest.mark.parametrize("method", METHODS)
def test_eos_inside_accepted_run_and_rows_finishing_at_different_steps(tiny, method, monkeypatch):
    options = options_for(method, 4, 4, 4)
    spy = _AppendSpy()
    if method == "lookahead":
        # This (batch 3, EOS-stopping) lookahead program is traced only here, so the spy is traced in.
        monkeypatch.setattr(engine_module, "append", spy)
    out = jaxspec.generate(tiny, EOS_PROMPTS, max_new_tokens=40, method=method, stop_at_eos=True, **options)
    monkeypatch.undo()
    solo = [greedy(tiny, [p], 40, stop_at_eos=True)[0] for p in EOS_PROMPTS]
    assert out.tokens == solo  # each row equals its own greedy run, EOS kept as the last token
    check_stats(out)
    # Preconditions of this test's data (not of the method): every row stops at an EOS, at
    # different lengths, before the budget.
    assert all(row[-1] in EOS and not set(row[:-1]) & set(EOS) for row in solo)
    assert len({len(row) for row in solo}) == 3 and max(map(len, solo)) < 40
    assert len(solo[0]) == 1 and out.steps[0] == 1  # EOS from prefill: the row never enters the loop
    if method == "lookahead":
        assert len(set(out.steps)) == 3, out.steps  # the rows finish at different steps
        assert spy.records, "the spy was not traced in (a cached program was reused?)"
        cut_inside = [b for b in range(3) for _, count, kept in spy.records
                      if 0 < kept[b] < count[b]]  # the step emitted tokens past the EOS: cut
        assert len(cut_inside) >= 1, "no EOS fell inside an accepted run; pick other EOS ids / prompts"
        for b in cut_inside:
            assert out.tokens[b][-1] in EOS


def test_tiny_model_really_accepts_candidates(tiny):
    """Guards the property test against vacuity: on this model the speculative steps do accept tokens."""
    options = dict(window=8, ngram=4, guesses=8)
    out = jaxspec.generate(tiny, PAIR, max_new_tokens=BUDGET, method="lookahead", stop_at_eos=False, **options)
    assert out.tokens == greedy(tiny, PAIR, BUDGET)
    assert min(out.compression) > 1.2, out.compression
    hist = np.asarray(out.extras["accept_histogram"])
    assert hist[:, 2:].sum() > 0 and hist[:, options["ngram"]].sum() > 0  # multi-token and full-length runs


# ----------------------------------------------------------------------------- one compiled program


def _hlo_custom_calls(text: str) -> list[str]:
    return re.findall(r'custom_call_target="([^"]+)"', text) + re.findall(r"stablehlo\.custom_call @(\w+)", text)


def _assert_no_host_round_trip(text: str) -> None:
    targets = _hlo_custom_calls(text)
    assert not [t for t in targets if "callback" in t.lower() or "host" in t.lower()], targets
    # Only instructions count: source metadata and the stack-frame tables of compiled HLO name
    # Python functions (this test's own name contains "callback").
    instructions = [line for line in text.splitlines() if " = " in line and not line.lstrip().startswith("#loc")]
    lowered = re.sub(r'metadata=\{[^}]*\}|loc\([^)]*\)', "", "\n".join(instructions)).lower()
    for op in ("callback", "outfeed", "infeed", "send(", "recv("):
        assert op not in lowered, op


def test_lookahead_loop_is_one_program_without_host_callbacks(tiny):
    model = dataclasses.replace(tiny, compiled={})
    options = dict(window=4, ngram=2, guesses=4)
    name, spec, resolved = resolve_method("lookahead", model.config, options, FileDefaults())
    statics = dict(engine=spec.engine(resolved, greedy=True), max_new_tokens=7, cache_len=64, eos_ids=())
    args = (model.graphdef, model.params, jnp.zeros((2, 16), jnp.int32), jnp.asarray([1, 11], jnp.int32),
            jax.random.key(0), jaxspec.SamplingParams.create(0.0, 0, 1.0))
    lowered = jax.jit(decode, static_argnames=tuple(statics)).lower(*args, **statics).as_text()
    assert "stablehlo.while" in lowered  # the decoding loop is inside the program, not in Python
    _assert_no_host_round_trip(lowered)

    # The executable `generate` runs (the same program as the lookahead-N2 edge case) is one loop too.
    out = jaxspec.generate(model, PAIR, max_new_tokens=7, method="lookahead", stop_at_eos=False, **options)
    assert len(model.compiled) == 1 and len(out.tokens[0]) == 7
    compiled = next(iter(model.compiled.values())).as_text()
    assert re.search(r"\bwhile\(", compiled)
    _assert_no_host_round_trip(compiled)


def test_host_callback_detection_sees_a_callback():
    """Positive control for the check above: a host callback inside a loop is visible in the HLO text."""

    def loop(x):
        def body(c):
            jax.debug.callback(lambda v: None, c)
            return c + 1
        return jax.lax.while_loop(lambda c: c < 3, body, x)

    text = jax.jit(loop).lower(jnp.int32(0)).as_text()
    with pytest.raises(AssertionError):
        _assert_no_host_round_trip(text)


# ----------------------------------------------------------------------------- StepLayout


def test_step_layout_w2_n3_g1_by_hand():
    layout = StepLayout(window=2, levels=2, guesses=1, cand_len=2)
    # block: 0 = L0C0 (the last token), 1 = L0C1, 2 = L1C0, 3 = L1C1, 4-5 = candidate tokens 0-1
    expected = np.array([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 0, 0, 0, 1, 0],
        [1, 0, 0, 0, 1, 1],
    ], bool)
    assert layout.cand_start == 4 and layout.size == 6
    np.testing.assert_array_equal(layout.attention_relation(), expected)
    np.testing.assert_array_equal(layout.position_offsets(), [0, 1, 1, 2, 1, 2])
    assert layout.position_offsets().dtype == np.int32


def test_step_layout_w3_n4_g2_by_hand():
    layout = StepLayout(window=3, levels=3, guesses=2, cand_len=3)
    assert layout.size == 9 + 6
    np.testing.assert_array_equal(layout.position_offsets(),
                                  [0, 1, 2, 1, 2, 3, 2, 3, 4, 1, 2, 3, 1, 2, 3])
    mask = layout.attention_relation()
    seen = {i: set(np.flatnonzero(mask[i]).tolist()) for i in range(layout.size)}
    assert seen[0] == {0}
    assert seen[2] == {0, 1, 2}  # L0C2
    assert seen[5] == {0, 1, 2, 5}  # L1C2: level 0 up to column 2, then itself
    assert seen[7] == {0, 1, 4, 7}  # L2C1: L0C0, L0C1, L1C1, itself
    assert seen[8] == {0, 1, 2, 5, 8}  # L2C2
    assert seen[9] == {0, 9} and seen[11] == {0, 9, 10, 11}  # candidate 0
    assert seen[12] == {0, 12} and seen[14] == {0, 12, 13, 14}  # candidate 1 never sees candidate 0


def test_prompt_lookup_and_jacobi_layouts_by_hand():
    pl = StepLayout(window=0, levels=0, guesses=2, cand_len=2)  # prompt lookup, N=3, G=2
    assert pl.cand_start == 1 and pl.size == 5
    np.testing.assert_array_equal(pl.position_offsets(), [0, 1, 2, 1, 2])
    np.testing.assert_array_equal(pl.attention_relation(), np.array([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 0, 0, 1, 1],
    ], bool))
    jac = StepLayout(window=0, levels=0, guesses=1, cand_len=3)  # jacobi, W=3: one causal guess
    np.testing.assert_array_equal(jac.position_offsets(), [0, 1, 2, 3])
    np.testing.assert_array_equal(jac.attention_relation(), np.tril(np.ones((4, 4), bool)))


LAYOUTS = [StepLayout(w, n - 1, g, n - 1) for w in (1, 2, 5) for n in (2, 3, 5) for g in (0, 1, 3)] + [
    StepLayout(0, 0, g, n - 1) for n in (2, 4) for g in (0, 1, 4)] + [StepLayout(0, 0, 1, w) for w in (1, 6)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"W{lay.window}-lv{lay.levels}-G{lay.guesses}-L{lay.cand_len}")
def test_step_layout_relation_properties(layout):
    mask, pos = layout.attention_relation(), layout.position_offsets()
    t, w, start = layout.size, layout.window, layout.cand_start
    assert mask.shape == (t, t) and mask.dtype == bool and pos.shape == (t,)
    assert mask.diagonal().all()  # each token sees itself
    assert mask[:, 0].all()  # everything sees the last committed token
    assert pos[0] == 0
    window_rows = np.arange(1, start)
    cand_rows = np.arange(start, t)
    assert not mask[np.ix_(window_rows, cand_rows)].any()  # the branches never see each other
    assert not mask[np.ix_(cand_rows, window_rows)].any()
    for level in range(layout.levels):
        for col in range(w):
            q = level * w + col
            expected = set(range(col + 1)) | {lv * w + col for lv in range(1, level + 1)}
            assert set(np.flatnonzero(mask[q]).tolist()) == expected, (level, col)
            assert pos[q] == level + col
    for c in range(layout.guesses):
        for j in range(layout.cand_len):
            q = start + c * layout.cand_len + j
            assert set(np.flatnonzero(mask[q]).tolist()) == {0} | set(range(start + c * layout.cand_len, q + 1))
            assert pos[q] == 1 + j
    # Every token sees a consistent causal context: exactly one token at each position
    # p, p+1, ..., up to its own, so its K/V (and prediction) are those of a real sequence.
    for q in range(t):
        assert sorted(pos[mask[q]].tolist()) == list(range(pos[q] + 1)), q


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"W{lay.window}-lv{lay.levels}-G{lay.guesses}-L{lay.cand_len}")
@pytest.mark.parametrize("verify_window", [False, True])
def test_step_layout_verification_paths_are_causal_chains(layout, verify_window):
    """Each verified path is a chain p+1, p+2, ... whose token k sees exactly the last token and
    the path's tokens before it: accepting its matching prefix is greedy."""
    layout = dataclasses.replace(layout, verify_window=verify_window)
    mask, pos, paths = layout.attention_relation(), layout.position_offsets(), layout.paths()
    assert paths.ndim == 2
    paths = [[int(i) for i in path if i >= 0] for path in paths]
    for path in paths:
        for k, q in enumerate(path):
            assert 0 < q < layout.size
            assert pos[q] == k + 1
            assert set(np.flatnonzero(mask[q]).tolist()) == {0, *path[: k + 1]}
    # every candidate slot is verified as a path; the window only when asked to
    for c in range(layout.guesses):
        start = layout.cand_start + c * layout.cand_len
        assert list(range(start, start + layout.cand_len)) in paths
    in_window = {q for path in paths for q in path if q < layout.cand_start}
    if not (verify_window and layout.levels):
        assert not in_window
    elif layout.window > 1 or layout.levels > 1:
        assert in_window


# ----------------------------------------------------------------------------- validation, CLI


@pytest.mark.parametrize("kwargs", [
    dict(window=0), dict(window=-3), dict(ngram=1), dict(ngram=0), dict(guesses=-1),
    dict(window=2.5), dict(ngram="3"), dict(guesses=True), dict(window=None), dict(pool_from_prompt=1),
])
def test_lookahead_config_rejects_bad_values(kwargs):
    with pytest.raises(jaxspec.GenerationError) as info:
        LookaheadConfig(**kwargs)
    assert isinstance(info.value, ValueError)
    assert next(iter(kwargs)) in str(info.value)


def test_lookahead_config_accepts_the_smallest_values():
    cfg = LookaheadConfig(window=1, ngram=2, guesses=0, pool_from_prompt=False)
    assert (cfg.window, cfg.ngram, cfg.guesses, cfg.pool_from_prompt) == (1, 2, 0, False)


def test_defaults_come_from_configs_lookahead_toml(tiny):
    defaults = lookahead_defaults(tiny.config)
    assert (defaults.window, defaults.ngram, defaults.guesses) == (15, 5, 15)  # the "small" entry
    def resolved(method, options):
        return resolve_method(method, tiny.config, options, FileDefaults())[2]

    la = resolved("lookahead", {})
    assert (la.window, la.ngram, la.guesses, la.pool_from_prompt) == (15, 5, 15, True)
    la = resolved("lookahead", dict(window=3, pool_from_prompt=False))
    assert (la.window, la.ngram, la.guesses, la.pool_from_prompt) == (3, 5, 15, False)
    assert resolved("prompt-lookup", {}).as_dict() == dict(ngram=5, guesses=15)
    assert resolved("jacobi", {}).as_dict() == dict(window=15)


@pytest.mark.parametrize("method, options, needle", [
    ("lookahead", dict(ngram=1), "ngram"),
    ("lookahead", dict(window=0), "window"),
    ("prompt-lookup", dict(guesses=-1), "guesses"),
    ("jacobi", dict(window=0), "window"),
    ("jacobi", dict(ngram=3), "ngram"),  # not an option of jacobi
    ("greedy", dict(window=3), "window"),
])
def test_generate_rejects_bad_method_options(tiny, method, options, needle):
    with pytest.raises(jaxspec.GenerationError, match=needle):
        jaxspec.generate(tiny, [1, 2], max_new_tokens=4, method=method, **options)


@pytest.mark.parametrize("method", METHODS)
def test_top_k_1_sampling_equals_greedy(tiny, method):
    """top_k=1 sampling (a one-hot target) through the sampled verifier must reproduce greedy
    exactly, including which path's K/V is committed when the walk stops on a rejection."""
    out = jaxspec.generate(tiny, PAIR, max_new_tokens=13, method=method, stop_at_eos=False, temperature=1.0,
                           top_k=1, seed=3, **options_for(method, 4, 3, 4))
    assert out.tokens == [row[:13] for row in greedy(tiny, PAIR, BUDGET)]


def assert_one_line_error(code, out, err, needles):
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxspec: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@needs_stories
@pytest.mark.parametrize("extra, needles", [
    (["--method", "lookahead", "--ngram", "1"], ["ngram", "in [2, 2147483647]"]),
    (["--method", "lookahead", "--window", "0"], ["window", "in [1, 2147483647]"]),
    (["--method", "greedy", "--window", "3"], ["window"]),
    (["--method", "lookahead", "--guesses", "x"], ["--guesses"]),
])
def test_cli_bad_lookahead_flags_are_one_line(capsys, extra, needles):
    code, out, err = run_cli(["generate", "--model", "stories260K", "--prompt-ids", "1", "--max-new-tokens", "8",
                              *extra], capsys)
    assert_one_line_error(code, out, err, needles)


@needs_stories
def test_cli_lookahead_json_on_stories260k(capsys):
    code, out, err = run_cli(["generate", "--model", "stories260K", "--prompt-ids", "1", "--max-new-tokens", "40",
                              "--method", "lookahead", "--window", "4", "--ngram", "3", "--guesses", "4", "--json"],
                             capsys)
    assert code == 0, err
    result = json.loads(out)
    reference = next(c["greedy"] for c in CASES if c["prompt"] == [1])
    assert result["tokens"] == reference[:40]
    assert result["method"] == "lookahead"
    config = result["config"]
    assert (config["window"], config["ngram"], config["guesses"], config["pool_from_prompt"]) == (4, 3, 4, True)
    hist = np.asarray(config["accept_histogram"])
    assert hist.ndim in (1, 2) and (hist.ndim == 1 or hist.shape[0] == 1)  # one prompt: one row
    hist = hist.reshape(-1)
    assert hist.sum() + 1 == result["steps"] and (np.arange(len(hist)) * hist).sum() + 1 == 40
    assert result["steps"] < 40 and result["compression"] == pytest.approx(40 / result["steps"])


# ----------------------------------------------------------------------------- stories260K


@pytest.fixture(scope="module")
def stories() -> jaxspec.Model:
    return jaxspec.load("stories260K")


@needs_stories
@pytest.mark.parametrize("method, options", [
    ("lookahead", dict(window=15, ngram=5, guesses=15)),
    ("prompt-lookup", dict(ngram=5, guesses=15)),
    ("jacobi", dict(window=15)),
])
def test_stories260k_reference_reproduced(stories, method, options):
    prompts = [c["prompt"] for c in CASES]
    budget = max(len(c["greedy"]) for c in CASES)
    out = jaxspec.generate(stories, prompts, max_new_tokens=budget, method=method, stop_at_eos=False, **options)
    for row, case in zip(out.tokens, CASES):
        assert len(row) == budget
        assert row[: len(case["greedy"])] == case["greedy"]
    check_stats(out)
    if method == "lookahead":
        assert any(s < len(c["greedy"]) for s, c in zip(out.steps, CASES)), out.steps  # it does speed up
        assert all(s < budget for s in out.steps), out.steps
