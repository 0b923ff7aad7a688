"""Penalties, min-p and logprobs are the same in every method.

* the definitions (vLLM's / OpenAI's) against a numpy reference written from them;
* greedy with penalties: every method equals a reference that re-runs the whole sequence each
  step (no cache, no loop) and applies the penalties in numpy; the repetition penalty also
  equals Hugging Face transformers' `generate(repetition_penalty=...)`;
* sampling with penalties and min-p: every method draws from the exact joint distribution,
  enumerated with the penalties of each prefix (the harness of test_sampling_distribution);
* logprobs: every method reports, per token, the target's log-softmax at that token's context
  (the reference forward's), and the same top tokens.
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import logsumexp

import jaxspec
import test_sampling_distribution as harness
from jaxspec.decoding.engine import Engine
from jaxspec.decoding.lookahead_parallel import check_greedy as check_lp
from jaxspec.errors import GenerationError
from jaxspec.decoding.sampling import SamplingParams, penalize, target_probs, warp_logits
from test_speculative import EOS_PROMPTS, HYBRID, K, LOOKUP, copy_drafter, tiny  # noqa: F401 (fixture)

PENALTIES = dict(repetition_penalty=1.6, presence_penalty=0.7, frequency_penalty=0.5)
NEW = 30


def reference_penalize(logits: np.ndarray, prompt: list[int], output: list[int], repetition: float,
                       presence: float, frequency: float) -> np.ndarray:
    """vLLM's penalties, one token at a time."""
    logits = np.array(logits, np.float64)
    for token in range(len(logits)):
        count = output.count(token)
        if token in prompt or count:
            logits[token] = logits[token] / repetition if logits[token] > 0 else logits[token] * repetition
        logits[token] -= frequency * count + presence * (count > 0)
    return logits


def test_penalties_follow_their_definitions():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 12).astype(np.float32)
    prompt, output = [1, 3, 3], [3, 5, 5, 5, 7]
    counts = np.bincount(output, minlength=12)
    seen = np.isin(np.arange(12), prompt)
    for values in (PENALTIES, dict(repetition_penalty=0.5, presence_penalty=-1.0, frequency_penalty=2.0)):
        got = penalize(jnp.asarray(logits), jnp.asarray(counts), jnp.asarray(seen),
                       SamplingParams.create(**values))
        want = reference_penalize(logits, prompt, output, *values.values())
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(reference_penalize(logits, prompt, output, **dict(zip(
        ("repetition", "presence", "frequency"), PENALTIES.values()))), logits)


def test_min_p_keeps_the_tokens_within_min_p_of_the_top():
    logits = np.log(np.array([0.5, 0.3, 0.1, 0.06, 0.04], np.float32))
    for min_p, kept in ((0.0, 5), (0.1, 4), (0.2, 3), (0.61, 1), (1.0, 1)):
        probs = np.asarray(target_probs(jnp.asarray(logits), SamplingParams.create(1.0, min_p=min_p)))
        assert (probs > 0).sum() == kept, (min_p, probs)
        np.testing.assert_allclose(probs[:kept], np.exp(logits[:kept]) / np.exp(logits[:kept]).sum(), rtol=1e-5)
    # after top-k (transformers' order): top-k 2 then min-p 0.7 keeps one token
    warped = warp_logits(jnp.asarray(logits), SamplingParams.create(1.0, top_k=2, min_p=0.7))
    assert np.isfinite(np.asarray(warped)).sum() == 1


@pytest.mark.parametrize("bad", [dict(min_p=1.5), dict(repetition_penalty=0.0), dict(presence_penalty=3.0),
                                 dict(frequency_penalty=-2.5), dict(logprobs=21), dict(logprobs=-1)])
def test_out_of_range_values_are_refused(tiny, bad):  # noqa: F811
    with pytest.raises(GenerationError, match=next(iter(bad))):
        jaxspec.generate(tiny, [1, 5], max_new_tokens=2, **bad)


def reference_penalized_greedy(model, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """Greedy with the penalties by re-running the whole sequence each step; the raw logits at
    each generated token's context too (for the logprobs)."""
    seq, raw = list(prompt), []
    for _ in range(n):
        logits = harness.full_logits(model, [seq])[0, len(seq) - 1]
        raw.append(logits)
        out = seq[len(prompt):]
        seq.append(int(np.argmax(reference_penalize(logits, prompt, out, *PENALTIES.values()))))
    return seq[len(prompt):], np.stack(raw)


GREEDY_METHODS = {
    "autoregressive": {},
    "lookahead": dict(window=4, ngram=3, guesses=4),
    "prompt-lookup": dict(ngram=3, guesses=4),
    "jacobi": dict(window=4),
    "speculative": dict(draft_len=K),
    "speculative+lookup": dict(draft_len=K, **LOOKUP),
    "hybrid": dict(HYBRID, draft_len=K),
}


# Penalized output rarely repeats itself: prompt lookup's and Jacobi's drafts are seldom right
# here; the window's n-grams and the copy drafter's are (their trees' penalties are tested).
ACCEPTING = {"lookahead", "speculative", "speculative+lookup", "hybrid"}


@pytest.fixture(scope="module")
def references(tiny):  # noqa: F811
    return [reference_penalized_greedy(tiny, p, NEW) for p in EOS_PROMPTS]


@pytest.mark.parametrize("name", list(GREEDY_METHODS))
def test_penalized_greedy_and_logprobs_are_the_references_in_every_method(tiny, references, name):  # noqa: F811
    options = dict(GREEDY_METHODS[name])
    if "draft_len" in options:
        options["drafter"] = copy_drafter(tiny)  # drafts that the target accepts
    out = jaxspec.generate(tiny, EOS_PROMPTS, max_new_tokens=NEW, method=name.split("+")[0], stop_at_eos=False,
                           logprobs=3, **PENALTIES, **options)
    plain = jaxspec.generate(tiny, EOS_PROMPTS, max_new_tokens=NEW, stop_at_eos=False)
    for row, (tokens, raw), lps, unpenalized in zip(out.tokens, references, out.logprobs, plain.tokens):
        assert row == tokens
        assert row != unpenalized  # the penalties changed the output (else this says nothing)
        logp = raw - logsumexp(raw, axis=-1, keepdims=True)
        np.testing.assert_allclose([t["logprob"] for t in lps], logp[np.arange(NEW), tokens], atol=2e-4)
        for t, ref in zip(lps, logp):
            ids, values = zip(*t["top_logprobs"])
            assert list(ids) == list(np.argsort(-ref, kind="stable")[:3])
            np.testing.assert_allclose(values, np.sort(ref)[::-1][:3], atol=2e-4)
    if name in ACCEPTING:
        assert max(out.compression) > 1.2, out.compression  # drafts were accepted under the penalties


def test_the_repetition_penalty_equals_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                   bos_token_id=1, eos_token_id=2, pad_token_id=0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.25)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = jaxspec.load(tmp_path)
    prompt = [1, 40, 41, 40, 41, 7, 9]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=20, do_sample=False, repetition_penalty=1.8, pad_token_id=0,
                          eos_token_id=None)[0, len(prompt):].tolist()
    plain = jaxspec.generate(model, prompt, max_new_tokens=20, stop_at_eos=False).tokens
    assert ref != plain
    for method, options in (("autoregressive", {}), ("lookahead", dict(window=4, ngram=3, guesses=4))):
        out = jaxspec.generate(model, prompt, max_new_tokens=20, method=method, stop_at_eos=False,
                               repetition_penalty=1.8, **options)
        assert out.tokens == ref, method


# ----------------------------------------------------------------------------- sampling

SAMPLED = dict(temperature=1.0, min_p=0.08, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3)


def exact_penalized_joint(model, prompt: list[int], length: int = harness.BUDGET) -> np.ndarray:
    """P(the first `length` new tokens = x), each position's distribution penalized by its own
    prefix (enumerated with the whole-sequence reference forward)."""
    v = model.config.vocab_size
    joint = np.zeros([v] * length)
    for index in np.ndindex(*[v] * length):
        p, prefix = 1.0, []
        for token in index:
            logits = harness.full_logits(model, [prompt + prefix])[0, -1] if not prefix else cache[tuple(prefix)]
            probs = _probs(logits, prompt, prefix)
            p *= probs[token]
            prefix.append(token)
            if p == 0:
                break
        joint[index] = p
    return joint / joint.sum()


def _probs(logits, prompt, output) -> np.ndarray:
    penalized = reference_penalize(logits, prompt, output, SAMPLED["repetition_penalty"],
                                   SAMPLED["presence_penalty"], SAMPLED["frequency_penalty"])
    keep = penalized >= penalized.max() + np.log(SAMPLED["min_p"])
    p = np.where(keep, np.exp(penalized - penalized.max()), 0.0)
    return p / p.sum()


cache: dict = {}


@pytest.fixture(scope="module")
def penalized_joint():
    model = jaxspec.Model.from_module(jaxspec.Transformer(harness.TINY, rngs=nnx.Rngs(harness.SEED)))
    model = dataclasses.replace(model, params=jax.tree.map(lambda x: x * harness.WEIGHT_SCALE if x.ndim == 2 else x,
                                                           model.params), compiled={})
    v = model.config.vocab_size
    # every prefix's next-token logits, from one batched whole-sequence forward per length
    for length in range(1, harness.BUDGET):
        prefixes = list(np.ndindex(*[v] * length))
        logits = harness.full_logits(model, [harness.PROMPT + list(p) for p in prefixes])[:, -1]
        cache.update({tuple(map(int, p)): row for p, row in zip(prefixes, logits)})
    return model, exact_penalized_joint(model, harness.PROMPT)


@pytest.mark.parametrize("name", ["autoregressive", "lookahead", "prompt-lookup"])
def test_penalized_min_p_samples_follow_the_exact_joint(penalized_joint, name):
    model, joint = penalized_joint
    method, options = harness.METHODS[name]
    out = jaxspec.generate(model, [harness.PROMPT] * harness.ROWS, max_new_tokens=harness.BUDGET, method=method,
                           seed=11, stop_at_eos=False, **SAMPLED, **options)
    fit = harness.goodness_of_fit(np.asarray(out.tokens, np.int64), joint)
    print(f"\n{name}: S {np.mean(out.compression):.3f}  {fit}")
    assert fit.impossible == 0 and fit.chi2_p > harness.P_MIN and fit.tv < fit.tv_bound, str(fit)
    if name != "autoregressive":
        assert np.mean(out.compression) > harness.MIN_COMPRESSION


def test_the_penalized_joint_differs_from_the_plain_one(penalized_joint):
    """Otherwise the sampling test above would not test the penalties."""
    model, joint = penalized_joint
    plain = harness.exact_joint(model, harness.PROMPT, dict(temperature=1.0))
    assert 0.5 * np.abs(joint - plain).sum() > 0.1


def test_lookahead_parallelism_refuses_penalties_and_logprobs():
    for engine in (Engine(penalties=True), Engine(logprobs=2)):
        with pytest.raises(GenerationError, match="lp_devices=1"):
            check_lp(engine)
    check_lp(dataclasses.replace(Engine(), logprobs=-1))


def test_the_cli_passes_the_penalties_and_reports_logprobs_in_json(capsys):
    from jaxspec.cli import main

    args = ["generate", "--prompt", "def f(x):", "--max-new-tokens", "12", "--method", "lookahead",
            "--repetition-penalty", "1.3", "--frequency-penalty", "0.5", "--json", "--logprobs", "2", "--quiet"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    ref = jaxspec.generate(jaxspec.load("pycode-5M"), "def f(x):", max_new_tokens=12, method="lookahead",
                           repetition_penalty=1.3, frequency_penalty=0.5, logprobs=2)
    assert out["tokens"] == ref.tokens and out["config"]["repetition_penalty"] == 1.3
    assert [t["token"] for t in out["logprobs"]] == ref.tokens and len(out["logprobs"][0]["top_logprobs"]) == 2
    assert main(args[:-4] + ["--logprobs", "2"]) == 2  # without --json: one line, exit 2
    assert capsys.readouterr().err.count("\n") == 1
