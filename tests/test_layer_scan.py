"""`jaxspec.load(..., layer_scan=True)`: the layers held as one stack and run by `lax.scan`.

The claims: the same numerics as the unrolled stack (bit for bit, logits and the hidden states a
PARD drafter reads), references reproduced, a program a fraction of the size, a saved folder
identical to the unrolled model's, and a clear refusal where the layers differ."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.decoding.methods import decode
from jaxspec.errors import ConfigError
from jaxspec.generate import prepare
from jaxspec.models.kv_cache import KVCache
from jaxspec.models.model import LayerStack, Transformer, causal_mask, scannable, stack_layers

from stories import CASES, CHECKPOINT, needs_stories


def _forward(model, tokens, hidden_layers):
    """Logits and hidden states of one causal block over an empty cache (one jitted forward)."""
    cfg = model.config

    @jax.jit
    def run(params, tokens):
        module = nnx.merge(model.graphdef, params)
        b, t = tokens.shape
        cache = KVCache.zeros(cfg.num_layers, b, 64, cfg.num_kv_heads, cfg.head_dim, jnp.float32)
        positions = jnp.broadcast_to(jnp.arange(t), (b, t))
        out = module(tokens, positions, causal_mask(jnp.full((b,), t), t), cache, hidden_layers=hidden_layers)
        return out.logits, out.hidden_states, out.block_kv.k

    return run(model.params, jnp.asarray(tokens, jnp.int32))


@needs_stories
def test_stories260k_scanned_equals_unrolled_bit_for_bit_and_its_references():
    plain, scanned = jaxspec.load(str(CHECKPOINT), layer_scan=False), jaxspec.load(str(CHECKPOINT), layer_scan=True)
    assert scanned.layer_scan and not plain.layer_scan and "layer_scan" in repr(scanned)
    tokens = [CASES[0]["prompt"] + [0] * (12 - len(CASES[0]["prompt"]))]
    for a, b in zip(jax.tree.leaves(_forward(plain, tokens, (0, 2, 4, 5))),
                    jax.tree.leaves(_forward(scanned, tokens, (0, 2, 4, 5)))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for case in CASES:
        for method in ("autoregressive", "lookahead"):
            out = jaxspec.generate(scanned, case["prompt"], max_new_tokens=len(case["greedy"]), method=method,
                                   stop_at_eos=False)
            assert out.tokens == case["greedy"], method


def test_a_scanned_program_is_a_fraction_of_the_unrolled_one():
    plain, scanned = jaxspec.load("pycode-5M", layer_scan=False), jaxspec.load("pycode-5M", layer_scan=True)

    def instructions(model):
        request = prepare(model, list(range(10, 30)), 8, "autoregressive")
        text = jax.jit(decode, static_argnames=tuple(request.statics)).lower(
            *request.args, **request.statics).compile().as_text()
        return text.count("\n")

    layers = plain.config.num_layers
    assert layers >= 4
    # One layer's instructions instead of `layers` copies: well under half at 4+ layers.
    assert instructions(scanned) < 0.5 * instructions(plain)
    out_plain = jaxspec.generate(plain, list(range(10, 30)), 16, method="prompt-lookup")
    out_scanned = jaxspec.generate(scanned, list(range(10, 30)), 16, method="prompt-lookup")
    assert out_scanned.tokens == out_plain.tokens and out_scanned.steps == out_plain.steps


def test_a_scanned_model_saves_the_unrolled_models_folder(tmp_path):
    plain, scanned = jaxspec.load("pycode-5M", layer_scan=False), jaxspec.load("pycode-5M", layer_scan=True)
    a, b = plain.save(tmp_path / "plain"), scanned.save(tmp_path / "scanned")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    again = jaxspec.load(str(b), layer_scan=False)
    for x, y in zip(jax.tree.leaves(again.params), jax.tree.leaves(plain.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_layers_that_differ_are_refused_with_the_reason():
    base = jaxspec.load("pycode-5M").config
    mixed = dataclasses.replace(base, sliding_window=8,
                                layer_types=("sliding_attention", "full_attention") * (base.num_layers // 2)
                                + ("sliding_attention",) * (base.num_layers % 2))
    module = Transformer(mixed, rngs=nnx.Rngs(0))
    assert "RoPE or attention window" in scannable(module)
    with pytest.raises(ValueError, match="cannot be scanned"):
        stack_layers(module)
    assert not isinstance(module.layers, LayerStack)
    with pytest.raises(ConfigError, match="one device"):
        jaxspec.load("pycode-5M", layer_scan=True, tensor_parallel=2)
