"""The memory guard: a request too large for the device is refused, in one line, before
anything is compiled; the estimate is reported and bounds what XLA actually allocates."""

from __future__ import annotations

import json

import pytest

import jaxspec
from jaxspec.runtime import memory
from jaxspec.errors import MemoryLimitError
from test_cli import assert_one_line_error, run_cli
from test_decoding import tiny_model


@pytest.fixture(scope="module")
def model() -> jaxspec.Model:
    return tiny_model()


def test_huge_guesses_are_refused_before_compiling(model):
    # pool b x vocab x G x (N-1) int32 = 8 * 64 * 1e9 * 4 * 4 bytes: no machine has that
    with pytest.raises(MemoryLimitError, match=r"^lookahead \(window=4, ngram=5, guesses=1000000000\) at batch 8, "
                                               r"max_new_tokens 8 needs about [0-9,.]+ TB \(state .*free; lower"):
        jaxspec.generate(model, [[1, 2, 3]] * 8, max_new_tokens=8, method="lookahead", window=4, ngram=5,
                         guesses=10**9)
    assert model.compiled == {}  # refused before compiling
    with pytest.raises(MemoryLimitError):
        jaxspec.stream(model, [1, 2, 3], max_new_tokens=8, method="jacobi", window=10**8)


@pytest.mark.parametrize("method, temperature, options", [
    ("autoregressive", 0.0, {}),
    ("lookahead", 0.0, dict(window=6, ngram=4, guesses=6)),
    ("lookahead", 1.0, dict(window=6, ngram=4, guesses=6)),
    ("jacobi", 0.0, dict(window=8)),
])
def test_estimate_bounds_what_xla_allocates(model, method, temperature, options):
    """The estimate (state + largest step) is at least what the compiled program allocates on
    top of its arguments (temporaries + outputs) and not wildly more (a factor 4)."""
    out = jaxspec.generate(model, [[1, 2, 3], [1, 5]], max_new_tokens=12, method=method, temperature=temperature,
                           **options)
    mem, compiled = out.memory, out.memory["compiled"]
    assert mem["weights_bytes"] == memory.tree_bytes(model.params) > 0
    assert mem["need_bytes"] == mem["state_bytes"] + mem["step_bytes"]
    allocated = compiled["temp_bytes"] + compiled["output_bytes"]
    assert allocated <= mem["need_bytes"] <= 4 * allocated, (mem, compiled)
    assert mem["free_bytes"] > 0 and mem["free_source"] in ("MemAvailable", "sysconf", "memory_stats")


def test_refusal_compares_against_the_free_memory(model, monkeypatch):
    """The same request passes or fails with the free memory the device reports (None: unknown,
    never refused); the free memory is read at each request, the estimate only once."""
    prompts, opts = [[1, 2, 3]], dict(max_new_tokens=8, method="lookahead", window=4, ngram=3, guesses=4)
    need = jaxspec.generate(model, prompts, **opts).memory["need_bytes"]
    monkeypatch.setattr(memory, "free_memory", lambda device: (need - 1, "test"))
    with pytest.raises(MemoryLimitError, match=r"has [0-9.]+ MB free"):
        jaxspec.generate(model, prompts, **opts)
    monkeypatch.setattr(memory, "free_memory", lambda device: (None, "unknown"))
    assert jaxspec.generate(model, prompts, **opts).memory["free_bytes"] is None
    monkeypatch.setattr(memory, "free_memory", lambda device: (need, "test"))
    assert jaxspec.generate(model, prompts, **opts).memory["free_source"] == "test"


def test_estimate_covers_a_drafter_and_its_state():
    """Speculative decoding: the drafter's weights travel with the target's and are counted."""
    target = jaxspec.load("pycode-5M")
    out = jaxspec.generate(target, [1, 5, 9], max_new_tokens=6, method="speculative")
    assert out.memory["weights_bytes"] > memory.tree_bytes(target.params)


def test_large_vocabulary_step_is_priced_by_the_head():
    """At a large vocabulary a large greedy block is priced with the chunked head, sampling with
    the block's full float32 logits (the formula in the module docstring); a one-row step's
    logits fit the budget, and its head is whole."""
    cfg = jaxspec.ModelConfig(
        model_type="llama", vocab_size=200_000, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=8, max_position_embeddings=128, bos_token_id=1)
    batch, block, keys = 8, 120, 300
    chunk = jaxspec.models.model.argmax_chunk(cfg.vocab_size, batch * block)
    greedy = memory.forward_bytes(cfg, 4, batch, block, keys, chunk)
    sampled = memory.forward_bytes(cfg, 4, batch, block, keys, cfg.vocab_size)
    # sampling: the block's full logits; greedy: one chunk of logits and the chunk of the weight it slices
    assert sampled - greedy == batch * block * (cfg.vocab_size - chunk) * 4 - chunk * cfg.hidden_size * 4
    assert batch * block * 4 * (chunk - 127) <= jaxspec.models.model.ARGMAX_LOGITS_BYTES < batch * block * 4 * cfg.vocab_size
    assert jaxspec.models.model.argmax_chunk(cfg.vocab_size, 1) == cfg.vocab_size


def test_cli_refuses_in_one_line_and_reports_the_estimate(capsys):
    code, out, err = run_cli(["generate", "--prompt-ids", "1,5,9", "--method", "lookahead", "--guesses", "1000000000",
                              "--max-new-tokens", "4"], capsys)
    assert_one_line_error(code, out, err, ["needs about", "free"])
    code, out, err = run_cli(["generate", "--prompt-ids", "1,5,9", "--max-new-tokens", "4", "--json"], capsys)
    assert code == 0
    report = json.loads(out)["memory"]
    assert report["need_bytes"] > 0 and report["compiled"]["temp_bytes"] > 0


@pytest.mark.parametrize("method, options", [
    ("autoregressive", {}), ("lookahead", dict(window=5, ngram=4, guesses=3)),
    ("lookahead", dict(window=3, ngram=2, guesses=0, verify_window=False)), ("prompt-lookup", dict(ngram=3, guesses=7)),
    ("jacobi", dict(window=6)), ("speculative", {}), ("hybrid", dict(window=4, ngram=3, guesses=2)),
])
def test_block_tokens_without_the_tree_equal_the_tree(method, options):
    """The first check prices the block from the options (`Engine.block_tokens`) before the
    tree exists: it must be the tree's real size."""
    from jaxspec.checkpoint.method_defaults import FileDefaults
    from jaxspec.decoding.methods import resolve_method

    target = jaxspec.load("pycode-5M")
    _, spec, opts = resolve_method(method, target.config, options, FileDefaults(drafters=target.drafters))
    for greedy in (True, False):
        engine = spec.engine(opts, greedy)
        assert engine.block_tokens == engine.tree.size


def test_repeated_calls_count_the_weights_and_read_xla_once(monkeypatch):
    """The per-call bookkeeping is cached: the weights' bytes once per parameter tree, XLA's
    memory analysis once per program (each cost milliseconds at every call, more than a small
    model's decode); a reassigned parameter tree is counted afresh."""
    import jax
    import jax.numpy as jnp

    fresh = tiny_model()
    counts = {"tree_bytes": 0, "memory_analysis": 0}
    tree_bytes, analysis = memory.tree_bytes, jax.stages.Compiled.memory_analysis

    def counted_tree_bytes(tree):
        counts["tree_bytes"] += 1
        return tree_bytes(tree)

    def counted_analysis(self):
        counts["memory_analysis"] += 1
        return analysis(self)

    monkeypatch.setattr(memory, "tree_bytes", counted_tree_bytes)
    monkeypatch.setattr(jax.stages.Compiled, "memory_analysis", counted_analysis)
    first = jaxspec.generate(fresh, [1, 2, 3], max_new_tokens=4, method="jacobi", window=3)
    after_one = dict(counts)
    assert after_one["memory_analysis"] == 1 and after_one["tree_bytes"] >= 1
    again = [jaxspec.generate(fresh, [1, 2, 3], max_new_tokens=4, method="jacobi", window=3) for _ in range(2)]
    assert counts == after_one
    fixed = lambda m: {k: v for k, v in m.items() if not k.startswith("free")}  # noqa: E731  (free: read each call)
    assert all(fixed(o.memory) == fixed(first.memory) and o.tokens == first.tokens for o in again)
    fresh.params = jax.tree.map(jnp.copy, fresh.params)
    reassigned = jaxspec.generate(fresh, [1, 2, 3], max_new_tokens=4, method="jacobi", window=3)
    assert counts["tree_bytes"] == after_one["tree_bytes"] + 1 and counts["memory_analysis"] == 1
    held = [v for k, v in fresh.memory_estimates.items() if k[0] == "weights"]
    assert len(held) == 1 and held[0][0] is fresh.params
    assert reassigned.memory["weights_bytes"] == first.memory["weights_bytes"]
