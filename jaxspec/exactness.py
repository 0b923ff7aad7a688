"""What "identical to greedy" means at a dtype's resolution: where two outputs first differ,
how far apart the model's logits of the two disputed tokens are, and whether that gap is
within the dtype's rounding (a near-tie).

A lossless method's block forward and greedy's one-token forward compute the same logits in
different shapes, so they round differently: by ~1e-6 in float32, by ~0.1 in bfloat16 (8
mantissa bits). Where the two best tokens are closer than that, either may win, and the
outputs part there. `near_tie_tolerance` is the rule used to call a difference a near-tie:
4 units in the last place of the largest |logit|, in the model's dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.decoding.prefill import prefill
from jaxspec.models.kv_cache import KVCache
from jaxspec.models.quantize import activation_dtype, module_dtype

NEAR_TIE_ULPS = 4


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where the two token lists differ (the shorter one's end counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def near_tie_tolerance(dtype: str, logits: np.ndarray) -> float:
    """NEAR_TIE_ULPS units in the last place of the largest |logit|, in `dtype`."""
    eps = float(jnp.finfo(activation_dtype(dtype)).eps)  # (int8 weights: float32 activations)
    scale = float(np.max(np.abs(logits)))
    ulp = eps * 2.0 ** float(np.floor(np.log2(scale))) if scale > 0 else eps
    return float(NEAR_TIE_ULPS * ulp)


@jax.jit
def _last_logits(graphdef, params, ids, length):
    module = nnx.merge(graphdef, params)
    cfg = module.config
    cache = KVCache.zeros(cfg.num_layers, 1, ids.shape[1], cfg.num_kv_heads, cfg.head_dim,
                          module_dtype(module))
    return prefill(module, ids, length, cache)[0][0]


def next_logits(model, context: Sequence[int]) -> np.ndarray:
    """The model's float32 logits after `context`, from one causal forward (the prefill path)."""
    width = -(-len(context) // 16) * 16
    ids = np.zeros((1, width), np.int32)
    ids[0, : len(context)] = context
    return np.asarray(_last_logits(model.graphdef, model.params, ids, np.asarray([len(context)], np.int32)),
                      np.float64)


@dataclasses.dataclass(frozen=True)
class Difference:
    index: int  # position in the generated tokens
    expected: int | None  # greedy's token there (None: greedy's output ended)
    got: int | None  # the method's (None: its output ended)
    logit_gap: float | None = None  # logit(expected) - logit(got) after the common prefix
    tolerance: float | None = None  # `near_tie_tolerance` of those logits

    @property
    def near_tie(self) -> bool:
        return bool(self.logit_gap is not None and abs(self.logit_gap) <= self.tolerance)

    def describe(self, dtype: str) -> str:
        if self.logit_gap is None:
            return f"first difference at token {self.index}: {'greedy' if self.expected is None else 'its'} output ended"
        kind = (f"a near-tie at {dtype} resolution" if self.near_tie else f"NOT a near-tie at {dtype} resolution")
        return (f"first difference at token {self.index} ({self.expected} vs {self.got}): logit gap "
                f"{self.logit_gap:.3g}, {kind} (tolerance {self.tolerance:.2g})")


def compare(model, prompt: Sequence[int], greedy: Sequence[int], other: Sequence[int]) -> Difference | None:
    """None when `other` equals `greedy`; else where and how they part (`Difference`). A length
    difference alone (one stopped earlier) has no disputed token pair: no gap, never a tie."""
    i = first_difference(greedy, other)
    if i is None:
        return None
    if i >= len(greedy) or i >= len(other):
        return Difference(index=i, expected=greedy[i] if i < len(greedy) else None,
                          got=other[i] if i < len(other) else None)
    logits = next_logits(model, [*prompt, *greedy[:i]])
    return Difference(index=i, expected=int(greedy[i]), got=int(other[i]),
                      logit_gap=float(logits[greedy[i]] - logits[other[i]]),
                      tolerance=near_tie_tolerance(model.dtype, logits))
