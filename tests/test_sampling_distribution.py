"""Sampling is lossless: every method draws from exactly the autoregressive distribution.

The check is statistical and can fail. On a tiny model (vocabulary 8) the EXACT joint
distribution of the 3 generated tokens (8**3 = 512 outcomes) is enumerated from uncached
causal forwards and `target_probs` (the one warping function: temperature, top-k, top-p),
and compared with ROWS = 20 000 rows drawn by ONE batched `generate` call per (method, warping):

* no draw of an outcome whose exact probability is 0 (top-k / top-p cut it);
* chi-square goodness of fit (the outcomes with expected count < 5 merged into one bin):
  p-value > P_MIN = 1e-3;
* total-variation distance TV = 1/2 sum |empirical - exact| < a bound computed for this
  distribution and sample size: E[TV] of a correct sampler (Monte Carlo over multinomial
  draws from the exact joint; roughly sqrt(K_eff/N)/2, 0.01-0.03 here) plus McDiarmid's
  margin sqrt(ln(1/DELTA) / 2N), DELTA = 1e-4 (one of the N draws changes TV by <= 1/N, so
  P(TV >= E[TV] + t) <= exp(-2 N t^2)); the margin is 0.015 at N = 20 000.

A negative control runs the same harness with a deliberately wrong verifier (the real
`verify_sampled` with one line changed) and asserts that the check rejects it. On stories260K,
the per-token log-likelihood of lookahead samples is compared with autoregressive ones, and each
sampler's calibration E[log p(x_t) + H(p_t)] = 0 is checked. Temperature 0 and top-k = 1 must
reproduce greedy decoding exactly, and the seed must determine the output.

Compile count: all sampled programs share batch ROWS and budget BUDGET, and SamplingParams are
dynamic arrays, so the 5 (method, options) programs compile once and serve every warping, the
seeds and the top-k = 1 check. NOTE: jax caches traces by decode function and shapes, not by
`Model` object, so a monkeypatched verifier is only traced into a program whose (shapes,
statics) were never compiled before in this process: a fresh Model alone is not enough. The
mutants therefore get batch sizes of their own, and the test asserts the mutant was traced.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

import jaxspec
import jaxspec.decoding.verify as verify_module
from jaxspec.models.kv_cache import KVCache
from stories import needs_stories
from jaxspec.models.model import causal_mask
from jaxspec.decoding.sampling import SamplingParams, target_probs

VOCAB = 8
TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
    num_kv_heads=1, head_dim=8, max_position_embeddings=64, bos_token_id=1,
)
SEED = 1
WEIGHT_SCALE = 20.0  # x the default init std 0.02: entropy ~1.2 nats/token, top token ~0.6, ~3 tokens > 0.05
# A sample of the model itself (temperature 1 from [1]), picked among 300 for drafts that get
# accepted: its n-grams (the pool) and its tokens (the initial window / Jacobi guess) recur in
# the continuations, so most rows verify drafts at their first step.
PROMPT = [1, 2, 2, 2, 5, 4, 3, 5, 3, 2, 3, 3]
ROWS = 20_000
BUDGET = 3  # new tokens per row: the joint of all of them is checked
P_MIN = 1e-3  # chi-square p-value threshold
DELTA = 1e-4  # TV bound: P(a correct sampler exceeds it) <= DELTA

METHODS = {
    "autoregressive": ("autoregressive", {}),
    "lookahead": ("lookahead", dict(window=3, ngram=3, guesses=4)),
    "lookahead-pool-only": ("lookahead", dict(window=3, ngram=3, guesses=4, verify_window=False)),
    "prompt-lookup": ("prompt-lookup", dict(ngram=3, guesses=4)),
    "jacobi": ("jacobi", dict(window=3)),
}
WARPINGS = {
    "T1.0": dict(temperature=1.0),
    "T0.7": dict(temperature=0.7),
    "top_k3": dict(temperature=1.0, top_k=3),
    "top_p0.8": dict(temperature=1.0, top_p=0.8),
}
SEEDS = {warping: i for i, warping in enumerate(WARPINGS)}  # independent draws across warpings
# (method, warping) pairs checked (each run ~1.5 s, each new program ~8 s on 2 busy cores):
# autoregressive and lookahead at every warping; prompt-lookup and jacobi at T1.0 and at the
# warpings that zero tokens (top-k, top-p: drafts with p(x) = 0, residuals with zeros), where
# T0.7 would only repeat T1.0's code path; the pool-only lookahead config at T1.0 (with BUDGET
# 3 its candidates are prompt-lookup's but for the window's n-grams).
SKIP_WARPINGS = {
    "prompt-lookup": {"T0.7"},
    "jacobi": {"T0.7"},
    "lookahead-pool-only": {"T0.7", "top_k3", "top_p0.8"},
}
CASES = [(name, warping) for name in METHODS for warping in WARPINGS
         if warping not in SKIP_WARPINGS.get(name, ())]
# Lower bound on the mean compression S (new tokens / forwards; 1.0 = autoregressive) of the
# speculative methods: drafts must really be accepted, or the check says nothing about the
# verifier. (S = 3 / forwards here: 1.5 when the first step accepts a draft, else 1.0.)
MIN_COMPRESSION = 1.05

# Lookahead (15, 5, 15) on stories260K costs ~8 ms per row per step on 2 CPU cores (a 120-token
# block through 5 layers), and a sampled batch always runs STORIES_NEW steps (some row accepts
# nothing): 24 rows x 48 tokens is ~10 s; 256 rows would be ~100 s.
STORIES_ROWS = 24
STORIES_NEW = 48
STORIES_LOOKAHEAD = dict(window=15, ngram=5, guesses=15)


@pytest.fixture(scope="module")
def tiny() -> jaxspec.Model:
    model = jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(SEED)))
    params = jax.tree.map(lambda x: x * WEIGHT_SCALE if x.ndim == 2 else x, model.params)
    return dataclasses.replace(model, params=params, compiled={})


@functools.partial(jax.jit, static_argnums=0)
def _causal_logits(graphdef, params, tokens):
    module = nnx.merge(graphdef, params)
    b, t = tokens.shape
    cfg = module.config
    out = module(tokens, jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t)),
                 causal_mask(jnp.full((b,), t, jnp.int32), t),
                 KVCache.zeros(cfg.num_layers, b, 1, cfg.num_kv_heads, cfg.head_dim))
    return out.logits


def full_logits(model: jaxspec.Model, sequences) -> np.ndarray:
    """Logits at every position: one causal forward over whole sequences, no KV cache, no
    decoding loop (the reference the decoders are compared with). Right padding is harmless:
    position i only sees positions <= i."""
    return np.asarray(_causal_logits(model.graphdef, model.params, jnp.asarray(sequences, jnp.int32)))


def exact_joint(model: jaxspec.Model, prompt: list[int], warping: dict, length: int = BUDGET) -> np.ndarray:
    """P(the first `length` new tokens = x) for every x: `[V] * length`, float64, by enumeration.

    One forward over prompt + every (length-1)-token tail; the logits after position i give the
    distribution of new token i given the tail's first i tokens, warped by `target_probs`.
    """
    v = model.config.vocab_size
    tails = np.indices([v] * (length - 1)).reshape(length - 1, -1).T  # lexicographic order
    seqs = np.concatenate([np.tile(prompt, (len(tails), 1)), tails], axis=1)
    logits = full_logits(model, seqs)[:, len(prompt) - 1:]  # [V^(length-1), length, V]
    params = SamplingParams.create(**warping)
    probs = np.asarray(target_probs(jnp.asarray(logits), params), np.float64)
    # No knife edges: the same support (top-k / top-p cut) under a 1e-4 logit perturbation, so
    # the decoders' slightly different float round-off cannot change which tokens are allowed.
    noise = np.random.default_rng(0).uniform(-1e-4, 1e-4, logits.shape).astype(np.float32)
    support = np.asarray(target_probs(jnp.asarray(logits + noise), params)) > 0
    assert (support == (probs > 0)).all(), f"warping {warping} is on a knife edge for this model"
    probs = (probs / probs.sum(-1, keepdims=True)).reshape([v] * (length - 1) + [length, v])
    joint = np.ones(())
    for i in range(length):  # new token i depends on the tail's first i tokens only
        conditional = probs[(slice(None),) * i + (0,) * (length - 1 - i) + (i,)]  # [V]*i + [V]
        joint = joint[..., None] * conditional
    return joint / joint.sum()


@dataclasses.dataclass
class Fit:
    chi2_p: float
    chi2: float
    dof: int
    tv: float
    tv_expected: float  # E[TV] of a correct sampler with this many draws
    tv_bound: float
    impossible: int  # draws of outcomes whose exact probability is 0

    @property
    def passes(self) -> bool:
        return self.impossible == 0 and self.chi2_p > P_MIN and self.tv < self.tv_bound

    def __str__(self) -> str:
        return (f"TV {self.tv:.4f} (correct sampler: E {self.tv_expected:.4f}, bound {self.tv_bound:.4f})  "
                f"chi2 {self.chi2:.1f}/{self.dof} dof, p {self.chi2_p:.3g}  impossible {self.impossible}")


def goodness_of_fit(samples: np.ndarray, joint: np.ndarray) -> Fit:
    """Empirical joint of `samples` [n, length] against the exact `joint`."""
    n, length = samples.shape
    v = joint.shape[0]
    index = samples @ (v ** np.arange(length - 1, -1, -1))
    observed = np.bincount(index, minlength=v ** length).astype(np.float64)
    p = joint.ravel()
    possible = p > 0
    impossible = int(observed[~possible].sum())
    order = np.argsort(p[possible], kind="stable")
    expected, counts = n * p[possible][order], observed[possible][order]
    # The outcomes with expected count < 5 (the smallest) form one bin, grown until it reaches 5.
    k = int(np.sum(expected < 5))
    while 0 < k < len(expected) and expected[:k].sum() < 5:
        k += 1
    if k:
        expected = np.concatenate([[expected[:k].sum()], expected[k:]])
        counts = np.concatenate([[counts[:k].sum()], counts[k:]])
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    dof = len(expected) - 1
    tv = 0.5 * float(np.abs(observed / n - p).sum())
    draws = np.random.default_rng(0).multinomial(n, p, size=200)
    tv_expected = float(0.5 * np.abs(draws / n - p).sum(axis=1).mean())
    tv_bound = tv_expected + math.sqrt(math.log(1 / DELTA) / (2 * n))
    return Fit(chi2_p=float(stats.chi2.sf(chi2, dof)), chi2=chi2, dof=dof, tv=tv, tv_expected=tv_expected,
               tv_bound=tv_bound, impossible=impossible)


_drawn: dict = {}  # (name, warping, seed) -> tokens, for reuse by the seed test


def draw(model: jaxspec.Model, name: str, warping: dict, seed: int, rows: int = ROWS):
    """`rows` samples of BUDGET new tokens (one batched generate) and the mean compression."""
    method, options = METHODS[name]
    out = jaxspec.generate(model, [PROMPT] * rows, max_new_tokens=BUDGET, method=method, seed=seed,
                           stop_at_eos=False, **warping, **options)
    tokens = np.asarray(out.tokens, np.int64)
    assert tokens.shape == (rows, BUDGET)
    return tokens, float(np.mean(out.compression))


@pytest.fixture(scope="module")
def exact(tiny):
    cache = {}

    def get(warping: str) -> np.ndarray:
        if warping not in cache:
            cache[warping] = exact_joint(tiny, PROMPT, WARPINGS[warping])
        return cache[warping]

    return get


def reference_greedy(model: jaxspec.Model, prompts: list[list[int]], n: int, width: int = 32) -> list[list[int]]:
    """Greedy continuations by re-running the whole sequence each step (no cache, no loop)."""
    seqs = [list(p) for p in prompts]
    for _ in range(n):
        logits = full_logits(model, [s + [0] * (width - len(s)) for s in seqs])
        for s, row in zip(seqs, logits):
            s.append(int(np.argmax(row[len(s) - 1])))
    return [s[len(p):] for s, p in zip(seqs, prompts)]


# ----------------------------------------------------------------------------- preconditions


def test_tiny_model_is_peaked_but_not_one_hot(tiny, exact):
    """The harness is only meaningful if the distributions have real entropy."""
    logits = full_logits(tiny, [PROMPT])[0]
    probs = np.asarray(jax.nn.softmax(logits, axis=-1), np.float64)
    entropy = -(probs * np.log(probs)).sum(-1)
    print(f"\nper-position entropy {entropy.mean():.2f} nats, top prob {probs.max(-1).mean():.2f}, "
          f"tokens with p > 0.05: {(probs > 0.05).sum(-1).mean():.1f}")
    assert (probs > 0.05).sum(-1).mean() > 2.5 and (probs[-1] > 0.05).sum() >= 3  # incl. the first new token
    assert probs.max(-1).mean() < 0.9 and entropy.mean() > 0.7
    assert (exact("T1.0") > 5 / ROWS).sum() >= 30  # many outcomes with a well-populated expected count


def test_tv_bound_is_tight_enough_to_matter(exact):
    """A correct sampler at N = 20 000 has E[TV] ~ sqrt(K_eff / N) / 2; the bounds stay small."""
    for warping in WARPINGS:
        p = exact(warping).ravel()
        closed_form = 0.5 * np.sum(np.sqrt(2 * p * (1 - p) / (np.pi * ROWS)))  # E|p_hat - p|, normal approx
        fit = goodness_of_fit(np.zeros((ROWS, BUDGET), np.int64), exact(warping))  # only for its bound
        k_eff = math.exp(-np.sum(p[p > 0] * np.log(p[p > 0])))
        print(f"\n{warping:9s} K_eff {k_eff:5.1f}  E[TV] {fit.tv_expected:.4f} (normal approx {closed_form:.4f}, "
              f"sqrt(K_eff/N)/2 {math.sqrt(k_eff / ROWS) / 2:.4f})  bound {fit.tv_bound:.4f}")
        assert fit.tv_expected <= closed_form * 1.05
        assert fit.tv_bound < 0.05


# ----------------------------------------------------------------------------- losslessness


@pytest.mark.parametrize("name, warping", CASES, ids=[f"{n}-{w}" for n, w in CASES])
def test_samples_follow_the_exact_joint_distribution(tiny, exact, name, warping):
    tokens, compression = draw(tiny, name, WARPINGS[warping], seed=SEEDS[warping])
    _drawn[name, warping, SEEDS[warping]] = tokens
    fit = goodness_of_fit(tokens, exact(warping))
    print(f"\n{name:20s} {warping:9s} S {compression:.3f}  {fit}")
    assert fit.impossible == 0, "sampled a continuation the warped target gives probability 0"
    assert fit.chi2_p > P_MIN, str(fit)
    assert fit.tv < fit.tv_bound, str(fit)
    if name == "autoregressive":
        assert compression == 1.0
    else:  # drafts were accepted: the verifier, not just the bonus token, produced these samples
        assert compression > MIN_COMPRESSION, compression


# ----------------------------------------------------------------------------- negative control

ACCEPT_LINE = "accept = first & (u * (1.0 - rejected_before) < px)"
MUTANTS = {
    # Accepts the k-th distinct draft with p(x) instead of p(x) / (mass not yet rejected): a
    # subtle bug (exact with one draft per position). Each mutant costs a compile (~8 s), so
    # the grosser one, `accept = first & (px > 0)` (TV 0.89, chi2 ~2.8e5 / 166), is left out.
    "no-renormalization-after-rejection": (ACCEPT_LINE, "accept = first & (u < px)"),
}


def mutant_verifier(original: str, mutated: str, traced: list):
    """The real `verify_sampled` with one line changed (compiled from its own source)."""
    source = textwrap.dedent(inspect.getsource(verify_module.verify_sampled))
    assert source.count(original) == 1, f"verify_sampled no longer contains {original!r}; update MUTANTS"
    namespace = dict(vars(verify_module))
    exec(compile(source.replace(original, mutated), "<mutant verify_sampled>", "exec"), namespace)
    mutant = namespace["verify_sampled"]

    def traced_mutant(*args, **kwargs):
        traced.append(True)
        return mutant(*args, **kwargs)

    return traced_mutant


@pytest.mark.parametrize("mutant", MUTANTS)
def test_negative_control_wrong_verifier_fails_the_same_check(tiny, exact, monkeypatch, mutant):
    traced: list = []
    monkeypatch.setattr(verify_module, "verify_sampled", mutant_verifier(*MUTANTS[mutant], traced))
    # A fresh Model (empty `compiled`) AND a batch size no other test uses: jax's own trace cache
    # is keyed by the decode function and the shapes, not by Model, and would otherwise reuse a
    # correct program (or leak this mutant into a later test).
    rows = ROWS + 1 + list(MUTANTS).index(mutant)
    fresh = dataclasses.replace(tiny, compiled={})
    tokens, compression = draw(fresh, "lookahead", WARPINGS["T1.0"], seed=SEEDS["T1.0"], rows=rows)
    monkeypatch.undo()
    assert traced, "the mutant verifier was not traced into the program"
    assert compression > MIN_COMPRESSION  # drafts were present for the mutant to misjudge
    fit = goodness_of_fit(tokens, exact("T1.0"))
    print(f"\nNEGATIVE CONTROL {mutant}: S {compression:.3f}  {fit}")
    assert not fit.passes
    assert fit.chi2_p < 1e-6, "the chi-square test lacks power against this mutant"


# ----------------------------------------------------------------------------- greedy limits

GREEDY_PROMPTS = [PROMPT, [1], [1, 4, 2, 4, 3, 5]]
GREEDY_NEW = 12
GREEDY_METHODS = [name for name in METHODS if name != "lookahead-pool-only"]  # one config per method


@pytest.fixture(scope="module")
def greedy_rows(tiny) -> list[list[int]]:
    return reference_greedy(tiny, GREEDY_PROMPTS, GREEDY_NEW)


@pytest.mark.parametrize("name", GREEDY_METHODS)
def test_temperature_zero_is_exactly_greedy(tiny, greedy_rows, name):
    """temperature 0 takes the static greedy path whatever the other knobs say."""
    method, options = METHODS[name]
    out = jaxspec.generate(tiny, GREEDY_PROMPTS, max_new_tokens=GREEDY_NEW, method=method, temperature=0.0,
                           top_k=3, top_p=0.5, seed=7, stop_at_eos=False, **options)
    print(f"\n{name:20s} greedy S {[round(c, 2) for c in out.compression]}")
    assert out.tokens == greedy_rows
    if name != "autoregressive":
        assert max(out.compression) > 1.0


@pytest.mark.parametrize("name", GREEDY_METHODS)
def test_top_k_one_is_greedy_in_every_row(tiny, greedy_rows, name):
    """top_k = 1 at temperature 1: the target is one-hot, so every sampled row is the greedy row."""
    tokens, compression = draw(tiny, name, dict(temperature=1.0, top_k=1), seed=11)
    assert (tokens == np.asarray(greedy_rows[0][:BUDGET])).all()
    if name != "autoregressive":  # one-hot target: a draft equal to the argmax is always accepted
        assert compression > 1.0


# ----------------------------------------------------------------------------- seeds


def test_lookahead_sampling_seed_determines_the_output(tiny, exact):
    warping = "T1.0"
    seed = SEEDS[warping]
    first = _drawn.get(("lookahead", warping, seed))
    if first is None:
        first, _ = draw(tiny, "lookahead", WARPINGS[warping], seed=seed)
    again, _ = draw(tiny, "lookahead", WARPINGS[warping], seed=seed)
    other, _ = draw(tiny, "lookahead", WARPINGS[warping], seed=seed + 100)
    np.testing.assert_array_equal(first, again)
    differ = (first != other).any(axis=1).mean()
    distinct = len(np.unique(first, axis=0))
    collide = float((exact(warping) ** 2).sum())  # P(two independent draws are equal)
    print(f"\nseed {seed} vs {seed + 100}: {differ:.1%} of rows differ (independent draws: {1 - collide:.1%}); "
          f"{distinct} distinct rows in one call")
    assert differ > 1 - collide - 0.02  # the standard error is ~0.0015 at 20 000 rows
    assert distinct > 100  # the rows of one call are independent draws, not copies


# ----------------------------------------------------------------------------- stories260K


def mean_loglik_and_entropy(model: jaxspec.Model, prompt: list[int], rows: list[list[int]]):
    """Per row: mean log p(token | prefix) over the generated tokens (temperature 1, no warping),
    and the mean entropy of p(. | prefix) at the same positions."""
    seqs = np.asarray([prompt + r for r in rows])
    logp = np.asarray(jax.nn.log_softmax(full_logits(model, seqs).astype(np.float64), axis=-1))
    logp = logp[:, len(prompt) - 1:-1]  # predictions of the generated tokens
    taken = np.take_along_axis(logp, seqs[:, len(prompt):, None], axis=-1)[..., 0]
    entropy = -(np.exp(logp) * logp).sum(-1)
    return taken.mean(-1), entropy.mean(-1)


@needs_stories
def test_stories260k_lookahead_samples_have_the_autoregressive_likelihood():
    model = jaxspec.load("stories260K")
    prompts = [[1]] * STORIES_ROWS
    kw = dict(max_new_tokens=STORIES_NEW, temperature=1.0, stop_at_eos=False)
    ar = jaxspec.generate(model, prompts, method="autoregressive", seed=0, **kw)
    la = jaxspec.generate(model, prompts, method="lookahead", seed=1, **kw, **STORIES_LOOKAHEAD)
    greedy = jaxspec.generate(model, [1], max_new_tokens=STORIES_NEW, method="lookahead", temperature=0.0,
                              stop_at_eos=False, **STORIES_LOOKAHEAD)
    s_sampled, s_greedy = float(np.mean(la.compression)), greedy.compression
    ll_ar, h_ar = mean_loglik_and_entropy(model, [1], ar.tokens)
    ll_la, h_la = mean_loglik_and_entropy(model, [1], la.tokens)
    n = STORIES_ROWS
    diff = ll_la.mean() - ll_ar.mean()
    se = math.sqrt(ll_la.var(ddof=1) / n + ll_ar.var(ddof=1) / n)
    print(f"\nstories260K, {n} rows x {STORIES_NEW} tokens at T=1: mean log-likelihood/token "
          f"autoregressive {ll_ar.mean():.4f}, lookahead {ll_la.mean():.4f}, difference {diff:+.4f} "
          f"= {diff / se:+.2f} SE (SE {se:.4f})")
    # Calibration of each sampler on its own: E[log p(x_t) + H(p_t)] = 0 at every position.
    for name, ll, h in (("autoregressive", ll_ar, h_ar), ("lookahead", ll_la, h_la)):
        gap = ll + h
        z = gap.mean() / (gap.std(ddof=1) / math.sqrt(n))
        print(f"  {name:14s} log p(x) + H(p): {gap.mean():+.4f} nats/token = {z:+.2f} SE")
        assert abs(z) < 4, name
    print(f"  lookahead {tuple(STORIES_LOOKAHEAD.values())} compression S: T=1.0 {s_sampled:.3f} "
          f"(rows {min(la.compression):.2f}..{max(la.compression):.2f}), T=0 {s_greedy:.3f}")
    assert abs(diff) < 4 * se
    assert s_sampled >= 1.0
