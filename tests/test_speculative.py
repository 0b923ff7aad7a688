"""Speculative decoding with PARD drafters, and the hybrid with Lookahead, are lossless.

Greedy: token-identical to plain greedy decoding in float32, with RANDOM drafters (a bad
drafter may only cost speed) and with a drafter that copies the target's weights (drafts
often right, so multi-token acceptance, the commit of long runs and the bonus after a fully
accepted proposal are exercised), in target-dependent and target-independent mode, with
rows finishing at different steps; on stories260K against the independent references.
Sampling: the exact-joint harness of `test_sampling_distribution` (chi-square + TV bound),
with a negative control (a verifier whose residual ignores q) that the same check rejects.

Every distinct (method, K, batch, budget, EOS) is a new compile (a few seconds on CPU), so
the cases share shapes where they can.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
import jaxspec.decoding.verify as verify_module
import test_sampling_distribution as harness
from jaxspec.cli import main
from jaxspec.checkpoint.drafter_files import Drafter
from jaxspec.errors import GenerationError
from stories import CASES, CHECKPOINT, needs_stories

EOS = (12, 23, 43)
TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=256, bos_token_id=1, eos_token_ids=EOS,
)
WEIGHT_SCALE = 5.0  # as in test_lookahead: loop-prone logits with clear argmax margins
PAIR = [[1], [1, 50, 8, 8, 43, 47, 50, 37, 49, 36, 5]]
EOS_PROMPTS = [  # with EOS stopping the rows stop after different numbers of tokens (test_lookahead)
    [1],
    [1, 17, 42, 9, 33, 35, 12, 12, 12, 30, 36, 1, 20],
    [1, 50, 8, 8, 43, 47, 50, 37, 49, 36, 5, 50, 48, 48],
]
BUDGET = 29
K = 4
HYBRID = dict(window=4, ngram=3, guesses=4)


def scaled(model: jaxspec.Model, scale: float) -> jaxspec.Model:
    params = jax.tree.map(lambda x: x * scale if x.ndim == 2 else x, model.params)
    return dataclasses.replace(model, params=params, compiled={})


def random_drafter(target_cfg: jaxspec.ModelConfig, seed: int, *, layers=(0, -1), scale: float = 1.0,
                   num_layers: int = 1, draft_len: int = K) -> Drafter:
    """A random PARD drafter for this target: vocabulary + 1 mask, a random projection."""
    cfg = dataclasses.replace(target_cfg, vocab_size=target_cfg.vocab_size + 1, num_layers=num_layers,
                              eos_token_ids=())
    model = scaled(jaxspec.Model.from_module(jaxspec.Transformer(cfg, rngs=nnx.Rngs(seed))), scale)
    projection = jax.random.normal(jax.random.key(seed), (len(layers) * target_cfg.hidden_size, cfg.hidden_size))
    return Drafter(model=model, mask_token_id=target_cfg.vocab_size, target_vocab_size=target_cfg.vocab_size,
                   target_layers=tuple(layers), target_hidden_size=target_cfg.hidden_size,
                   projection=projection, draft_len=draft_len)


def copy_drafter(target: jaxspec.Model, seed: int = 0) -> Drafter:
    """The target's own weights plus a zero mask row: its first draft is the target's argmax."""
    d = random_drafter(target.config, seed, num_layers=target.config.num_layers)
    params = jax.tree.map(
        lambda dp, tp: jnp.pad(tp, [(0, a - b) for a, b in zip(dp.shape, tp.shape)]), d.model.params, target.params)
    return dataclasses.replace(d, model=dataclasses.replace(d.model, params=params, compiled={}),
                               projection=0.1 * d.projection)


@pytest.fixture(scope="module")
def tiny() -> jaxspec.Model:
    return scaled(jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0))), WEIGHT_SCALE)


@pytest.fixture(scope="module")
def drafters(tiny) -> dict:
    return {"random": random_drafter(TINY, 1, num_layers=TINY.num_layers), "copy": copy_drafter(tiny)}


_greedy: dict = {}


def greedy(model, prompts, n, stop_at_eos=False):
    key = (id(model), tuple(map(tuple, prompts)), n, stop_at_eos)
    if key not in _greedy:
        _greedy[key] = jaxspec.generate(model, prompts, max_new_tokens=n, method="greedy",
                                        stop_at_eos=stop_at_eos).tokens
    return _greedy[key]


def check_stats(out: jaxspec.GenerateOutput, draft_len: int) -> None:
    """Steps, accept histogram, per-position acceptance and accept_length agree with the tokens."""
    hist = np.asarray(out.extras["accept_histogram"])
    accepts = np.asarray(out.extras["draft_accepts"])
    for h, a, s, row, length in zip(hist, accepts, out.steps, out.tokens, out.extras["accept_length"]):
        assert h[0] == 0 and h.sum() + 1 == s  # decoding steps + the prefill forward
        assert (np.arange(len(h)) * h).sum() + 1 == len(row)
        assert a.shape == (draft_len,) and (np.diff(a) <= 0).all() and a[0] <= s - 1  # a prefix is accepted
        assert 1.0 <= length <= draft_len + 1 if s > 1 else length == 0.0  # 0: no decoding step


# ----------------------------------------------------------------------------- greedy exactness

# (method, target_features, bonus_in_context): each is one program; both drafters share it
# (same structure, weights are arguments). The stories test runs the hybrid with the bonus.
GREEDY_CASES = [("speculative", True, True), ("speculative", False, True), ("speculative", True, False),
                ("hybrid", True, False), ("speculative+lookup", True, True), ("speculative+routed", True, True),
                ("speculative+routed-short", False, False), ("speculative+alternatives", True, True),
                ("speculative+routed-alternatives", True, False), ("hybrid+alternatives", True, True)]
LOOKUP = {"lookup_guesses": 2, "lookup_ngram": 3}  # prompt-lookup candidates beside the drafter's chain
# One chain a step, a candidate's or the drafter's: longer candidates than K (the drafter's chain
# padded), then shorter (the candidate padded).
OPTIONS = {"hybrid": HYBRID, "speculative+lookup": LOOKUP,
           "speculative+routed": {"lookup_guesses": 3, "lookup_ngram": K + 2, "lookup_route": True},
           "speculative+routed-short": {"lookup_guesses": 1, "lookup_ngram": 3, "lookup_route": True},
           # the drafter's runner-up first drafts, one token each beside the chain
           "speculative+alternatives": {"first_alternatives": 2},
           "hybrid+alternatives": {**HYBRID, "first_alternatives": 1},
           "speculative+routed-alternatives": {"lookup_guesses": 3, "lookup_ngram": K + 2, "lookup_route": True,
                                               "first_alternatives": 1}}


@pytest.mark.parametrize("method, target_features, bonus_in_context", GREEDY_CASES,
                         ids=[f"{m}-{'dependent' if f else 'independent'}-{'bonus' if b else 'verified'}"
                              for m, f, b in GREEDY_CASES])
def test_greedy_equals_plain_greedy_and_rows_finish_apart(tiny, drafters, method, target_features,
                                                          bonus_in_context):
    """EOS_PROMPTS stop after 1, 2 and ~30 tokens: rows finish at different steps (row 0 at its
    prefill token), and the long row runs many multi-token steps."""
    options = OPTIONS.get(method, {})
    routed = method.startswith("speculative+routed")
    method = method.split("+")[0]
    solo = [greedy(tiny, [p], 40, stop_at_eos=True)[0] for p in EOS_PROMPTS]
    assert all(row[-1] in EOS for row in solo) and len({len(r) for r in solo}) == 3  # the data's premise
    for kind, drafter in drafters.items():
        out = jaxspec.generate(tiny, EOS_PROMPTS, max_new_tokens=40, method=method, drafter=drafter,
                               draft_len=K, target_features=target_features, bonus_in_context=bonus_in_context,
                               stop_at_eos=True, **options)
        print(f"\n{method} {kind} features={target_features} bonus={bonus_in_context}: steps {out.steps}, "
              f"accept_length {[round(x, 2) for x in out.extras['accept_length']]}, "
              f"per position {out.extras['draft_accepts']}")
        assert out.tokens == solo, kind
        check_stats(out, K)
        if "first_alternatives" in options:
            hits, steps = np.asarray(out.extras["alternative_accepts"]), np.asarray(out.steps) - 1
            print(f"alternative_accepts {hits.tolist()}")
            assert (hits <= steps).all()
        if routed:  # chains from both: lookup where the random drafter is unsure, the copy drafter's own
            lookup_steps, steps = np.asarray(out.extras["lookup_steps"]), np.asarray(out.steps) - 1
            assert (lookup_steps <= steps).all() and lookup_steps.sum() > 0 and (lookup_steps < steps).any(), kind
        assert out.options["target_features"] is target_features and out.options["draft_len"] == K
        assert out.steps[0] == 1 and len(set(out.steps)) == 3
        if kind == "copy" and (bonus_in_context or method == "hybrid"):  # drafts really accepted
            assert out.compression[2] > 1.5, out.compression
        if kind == "copy" and bonus_in_context:  # all K at least once
            assert np.asarray(out.extras["draft_accepts"])[2, K - 1] > 0


@pytest.mark.parametrize("method, batch", [("hybrid", 5), ("speculative", 6)])
def test_target_dependent_methods_prefill_once(tiny, drafters, monkeypatch, method, batch):
    """The one prefill serves the target and the drafter's features: tracing runs the target twice
    (the prefill, the loop body's verification forward) and the drafter twice (its prefill, its
    draft forward). The prefill (`begin`, a jitted function) is traced once, for the memory
    estimate, and reused by the decode program. A batch size of its own: a fresh trace."""
    calls = []
    original = jaxspec.Transformer.__call__

    def counting(self, tokens, *args, **kwargs):
        calls.append((self.config.vocab_size, tokens.shape[1], kwargs.get("hidden_layers", ())))
        return original(self, tokens, *args, **kwargs)

    fresh = dataclasses.replace(tiny, compiled={}, memory_estimates={})
    args = dict(max_new_tokens=6, method=method, drafter=drafters["random"], draft_len=K, target_features=True,
                stop_at_eos=False, **(HYBRID if method == "hybrid" else {}))
    monkeypatch.setattr(jaxspec.Transformer, "__call__", counting)
    out = jaxspec.generate(fresh, [[1, 50, 8]] * batch, **args)
    monkeypatch.undo()
    assert out.options["target_features"] is True
    target = [c for c in calls if c[0] == TINY.vocab_size]
    drafter = [c for c in calls if c[0] == TINY.vocab_size + 1]
    assert len(target) == 2 and len(drafter) == 2, calls
    assert target[0][1] == 16 and target[0][2] == (0, -1)  # the prompt bucket, with the drafter's features
    assert out.tokens == greedy(tiny, [[1, 50, 8]] * batch, 6)


@needs_stories
def test_stories260k_references_with_a_random_drafter():
    """Hybrid, target-dependent, 3 rows; the CLI test below runs speculative, target-independent."""
    model = jaxspec.load("stories260K")
    drafter = random_drafter(model.config, 7, layers=(1, -1), num_layers=2, draft_len=5)
    n = 48
    out = jaxspec.generate(model, [case["prompt"] for case in CASES[:3]], max_new_tokens=n, method="hybrid",
                           drafter=drafter, stop_at_eos=False, window=8, ngram=4, guesses=8)
    assert out.options["target_features"] is True
    assert out.tokens == [case["greedy"][:n] for case in CASES[:3]]


# ----------------------------------------------------------------------------- errors


def test_incompatible_drafter_is_a_clear_error(tiny, drafters):
    wrong = random_drafter(dataclasses.replace(TINY, vocab_size=40), 2)
    with pytest.raises(GenerationError, match="vocabulary"):
        jaxspec.generate(tiny, [1], max_new_tokens=4, method="speculative", drafter=wrong)
    with pytest.raises(GenerationError, match="projection"):
        jaxspec.generate(tiny, [1], max_new_tokens=4, method="speculative", target_features=True,
                         drafter=dataclasses.replace(drafters["random"], projection=None))
    with pytest.raises(GenerationError, match="drafter"):  # not the default model: no default drafter
        jaxspec.generate(tiny, [1], max_new_tokens=4, method="speculative")
    with pytest.raises(GenerationError, match="draft_len"):
        jaxspec.generate(tiny, [1], max_new_tokens=4, method="speculative", drafter=drafters["random"], draft_len=0)


@needs_stories
def test_cli_incompatible_drafter_is_one_line(tmp_path, capsys):
    folder = random_drafter(dataclasses.replace(TINY, vocab_size=40), 2).save(tmp_path / "drafter")
    base = ["generate", "--model", str(CHECKPOINT), "--prompt-ids", "1", "--method", "speculative"]
    for extra, needle in ((["--drafter", str(folder)], "vocabulary"), ([], "--drafter"),
                          (["--drafter", str(tmp_path / "missing")], "does not exist")):
        code = main(base + extra)
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err
        assert "Traceback" not in err


@needs_stories
def test_cli_json_reports_acceptance(tmp_path, capsys):
    import json

    model = jaxspec.load("stories260K")
    folder = random_drafter(model.config, 3, layers=(1, -1), num_layers=1, draft_len=3).save(tmp_path / "d")
    n = 40  # --draft-len 1: no mask tokens at all (the edge of the drafter block)
    code = main(["generate", "--model", str(CHECKPOINT), "--prompt-ids", ",".join(map(str, CASES[1]["prompt"])),
                 "--method", "speculative", "--drafter", str(folder), "--max-new-tokens", str(n), "--no-eos-stop",
                 "--json", "--target-independent", "--draft-len", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["tokens"] == CASES[1]["greedy"][:n]
    config = result["config"]
    assert config["draft_len"] == 1 and config["target_features"] is False and config["drafter"] == str(folder)
    assert 1.0 <= config["accept_length"] <= 2 and len(config["draft_accepts"]) == 1
    code = main(["generate", "--model", str(CHECKPOINT), "--prompt-ids", ",".join(map(str, CASES[1]["prompt"])),
                 "--method", "speculative", "--drafter", str(folder), "--max-new-tokens", str(n), "--no-eos-stop",
                 "--json", "--lookup-guesses", "2", "--lookup-ngram", "4", "--lookup-route",
                 "--first-alternatives", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    assert result["tokens"] == CASES[1]["greedy"][:n]
    assert result["config"]["lookup_route"] is True and 0 <= result["config"]["lookup_steps"] < n
    assert result["config"]["first_alternatives"] == 2 and 0 <= result["config"]["alternative_accepts"] < n


# ----------------------------------------------------------------------------- sampling


SAMPLED = {  # name -> (method, options)
    "speculative": ("speculative", dict(draft_len=3)),
    "hybrid": ("hybrid", dict(draft_len=3, window=3, ngram=3, guesses=4)),
    "speculative+lookup": ("speculative", dict(draft_len=3, lookup_guesses=2, lookup_ngram=3)),
    "speculative+routed": ("speculative", dict(draft_len=3, lookup_guesses=2, lookup_ngram=3, lookup_route=True)),
    "speculative+alternatives": ("speculative", dict(draft_len=3, first_alternatives=2)),
    "speculative+routed-alternatives": ("speculative", dict(draft_len=3, lookup_guesses=2, lookup_ngram=3,
                                                            lookup_route=True, first_alternatives=1)),
}
SAMPLED_CASES = [("speculative", "T1.0"), ("speculative", "top_k3"), ("speculative", "top_p0.8"),
                 ("hybrid", "T1.0"), ("speculative+lookup", "T1.0"), ("speculative+routed", "T1.0"),
                 ("speculative+alternatives", "top_p0.8"), ("speculative+routed-alternatives", "T1.0")]


@pytest.fixture(scope="module")
def sampling_tiny() -> jaxspec.Model:
    return scaled(jaxspec.Model.from_module(jaxspec.Transformer(harness.TINY, rngs=nnx.Rngs(harness.SEED))),
                  harness.WEIGHT_SCALE)


@pytest.fixture(scope="module")
def sampling_drafter(sampling_tiny) -> Drafter:
    """A random drafter (entropy near the target's), in target-dependent mode."""
    return random_drafter(harness.TINY, 5, layers=(0,), scale=harness.WEIGHT_SCALE / 2, draft_len=3)


@pytest.fixture(scope="module")
def exact(sampling_tiny):
    cache = {}

    def get(warping):
        if warping not in cache:
            cache[warping] = harness.exact_joint(sampling_tiny, harness.PROMPT, harness.WARPINGS[warping])
        return cache[warping]

    return get


def draw(model, drafter, name, warping: dict, seed, rows=harness.ROWS):
    method, options = SAMPLED[name]
    out = jaxspec.generate(model, [harness.PROMPT] * rows, max_new_tokens=harness.BUDGET, method=method,
                           seed=seed, stop_at_eos=False, drafter=drafter, **warping, **options)
    return np.asarray(out.tokens, np.int64), float(np.mean(out.compression))


@pytest.mark.parametrize("name, warping", SAMPLED_CASES, ids=[f"{n}-{w}" for n, w in SAMPLED_CASES])
def test_samples_follow_the_exact_joint_distribution(sampling_tiny, sampling_drafter, exact, name, warping):
    tokens, compression = draw(sampling_tiny, sampling_drafter, name, harness.WARPINGS[warping],
                               seed=harness.SEEDS[warping])
    fit = harness.goodness_of_fit(tokens, exact(warping))
    print(f"\n{name:12s} {warping:9s} S {compression:.3f}  {fit}")
    assert fit.impossible == 0 and fit.chi2_p > harness.P_MIN and fit.tv < fit.tv_bound, str(fit)
    assert compression > harness.MIN_COMPRESSION  # drafts were accepted: the verifier made these samples


def test_a_draft_vocabulary_keeps_sampling_exact(sampling_tiny, sampling_drafter, exact):
    """FR-Spec: the drafter drafts only from half the ids (q = 0 elsewhere); tokens outside V'
    come from the residual, so the samples still follow the target's joint distribution."""
    vocab = harness.TINY.vocab_size
    half = dataclasses.replace(sampling_drafter, draft_vocab=jnp.arange(0, vocab, 2, dtype=jnp.int32))
    tokens, compression = draw(sampling_tiny, half, "speculative", harness.WARPINGS["T1.0"],
                               seed=harness.SEEDS["T1.0"])
    fit = harness.goodness_of_fit(tokens, exact("T1.0"))
    assert fit.impossible == 0 and fit.chi2_p > harness.P_MIN and fit.tv < fit.tv_bound, str(fit)
    assert compression > harness.MIN_COMPRESSION
    assert (tokens % 2 == 1).any()  # odd ids, which the drafter cannot propose, were emitted


RESIDUAL_LINE = "residual = jnp.maximum(p - q_padded, 0.0)"


def test_negative_control_residual_without_q_fails(sampling_tiny, sampling_drafter, exact, monkeypatch):
    """The real `verify_speculative` with its residual replaced by p (a classic bug) is rejected."""
    source = textwrap.dedent(inspect.getsource(verify_module.verify_speculative))
    assert source.count(RESIDUAL_LINE) == 1, "verify_speculative changed; update RESIDUAL_LINE"
    namespace = dict(vars(verify_module))
    exec(compile(source.replace(RESIDUAL_LINE, "residual = p"), "<mutant>", "exec"), namespace)
    traced = []

    def mutant(*args, **kwargs):
        traced.append(True)
        return namespace["verify_speculative"](*args, **kwargs)

    monkeypatch.setattr(verify_module, "verify_speculative", mutant)
    fresh = dataclasses.replace(sampling_tiny, compiled={})
    tokens, compression = draw(fresh, sampling_drafter, "speculative", harness.WARPINGS["T1.0"],
                               seed=harness.SEEDS["T1.0"],
                               rows=harness.ROWS + 7)  # a batch size of its own: a fresh trace
    monkeypatch.undo()
    assert traced and compression > harness.MIN_COMPRESSION
    fit = harness.goodness_of_fit(tokens, exact("T1.0"))
    print(f"\nNEGATIVE CONTROL residual = p: S {compression:.3f}  {fit}")
    assert not fit.passes and fit.chi2_p < 1e-6


def test_top_k_one_sampling_is_greedy(sampling_tiny, sampling_drafter):
    """top_k = 1: p and q are one-hot; every row is the greedy row (the T1.0 program, reused)."""
    joint = harness.exact_joint(sampling_tiny, harness.PROMPT, dict(temperature=1.0, top_k=1))
    assert joint.max() == 1.0
    reference = np.unravel_index(np.argmax(joint), joint.shape)
    tokens, _ = draw(sampling_tiny, sampling_drafter, "speculative", dict(temperature=1.0, top_k=1), seed=3)
    assert (tokens == np.asarray(reference)).all()


def test_routing_verifies_the_candidate_the_drafter_agrees_with_or_is_unsure_against():
    """`choose`: the valid candidate the drafter rates highest, verified when the drafter gives its
    first token >= agree x its own top probability, or is itself unsure; else the drafter's chain."""
    from jaxspec.decoding.sources.routed import choose

    score = jnp.asarray([[0.1, 0.8, 0.9],   # agrees (0.8 = p1), the 0.9 one is not a valid candidate
                         [0.05, 0.1, 0.0],  # the drafter is sure (p1 0.9) of another token
                         [0.0, 0.05, 0.0],  # the drafter is unsure (p1 0.2): copy
                         [0.9, 0.9, 0.9],   # no valid candidate
                         [0.3, 0.27, 0.0]])  # 0.3 >= 0.3 x 0.9
    valid = jnp.asarray([[True, True, False], [True, True, True], [True, True, False], [False] * 3, [True] * 3])
    p1 = jnp.asarray([0.8, 0.9, 0.2, 0.5, 0.9])
    best, from_lookup = choose(score, valid, p1, agree=0.3, unsure=0.3)
    assert np.asarray(best)[[0, 1, 2, 4]].tolist() == [1, 1, 1, 0]
    assert np.asarray(from_lookup).tolist() == [True, False, True, False, True]
    with pytest.raises(GenerationError, match="lookup_guesses"):
        jaxspec.generate(scaled(jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0))), 1.0), [1],
                         max_new_tokens=2, method="speculative", drafter=random_drafter(TINY, 1), lookup_route=True)


def test_alternatives_are_the_likeliest_first_drafts_other_than_the_chains_first_token():
    """`first_alternatives`: q1's next most likely ids after the chain's first token, in order of
    likelihood, through the draft vocabulary's ids; the layout gives each its own one-token path."""
    from jaxspec.decoding.sources.drafter import first_alternatives, with_alternatives
    from jaxspec.decoding.tree import chain

    logits = jnp.asarray([[0.0, 3.0, 1.0, 2.0, -1.0],    # order 1, 3, 2, 0, 4
                          [5.0, 4.0, 3.0, 2.0, 1.0]])    # order 0, 1, 2, 3, 4
    first = jnp.asarray([1, 2])  # row 0: the argmax (a drafter chain); row 1: q1's third (a lookup chain)
    assert np.asarray(first_alternatives(logits, None, first, 2)).tolist() == [[3, 2], [0, 1]]
    head = {"ids": jnp.asarray([10, 11, 12, 13, 14])}  # column i drafts id 10 + i
    assert np.asarray(first_alternatives(logits, head, jnp.asarray([11, 99]), 1)).tolist() == [[13], [10]]
    layout = with_alternatives(chain(3), 2)
    assert layout.parents == (-1, 0, 1, -1, -1) and layout.paths == ((0, 1, 2), (3,), (4,))
    assert with_alternatives(chain(3), 0) == chain(3)
    with pytest.raises(GenerationError, match="first_alternatives"):
        jaxspec.generate(scaled(jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0))), 1.0), [1],
                         max_new_tokens=2, method="speculative", drafter=random_drafter(TINY, 1), first_alternatives=-1)
