"""The model's one attention function, selected by name.

Every forward attends from a block of T query tokens to (a) the committed KV cache, a
length mask per row, and (b) the block's own T keys under an arbitrary boolean relation
`block_mask[b, i, j]` ("query i sees block token j"). Lookahead, verification, drafting
and prefill differ only in that relation and in the position ids. `block_mask` is a dense
array or a compact spec from `jaxspec.models.masks` (`TreeMask`, `PardMask`): a backend may
compute a spec's relation itself (the Pallas kernels do) or call `dense_block_mask`.

`xla` is the reference implementation; `pallas` is the Pallas kernels (`pallas_kernels`);
`BACKENDS` below lists them, and `jaxspec.load(..., attention=NAME)` chooses one.
"""

from __future__ import annotations

import importlib
from typing import Callable, Protocol

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from jaxspec.errors import ConfigError
from jaxspec.models.masks import BlockMask, dense_block_mask

# Large finite negative instead of -inf: a fully masked row (padding) gives a uniform
# distribution over garbage rather than NaN, and padding rows are never read.
_MASKED = -1e30


class AttentionFn(Protocol):
    def __call__(
        self,
        q: Float[Array, "b t h d"],
        k_cache: Float[Array, "b kv s d"],
        v_cache: Float[Array, "b kv s d"],
        cache_lengths: Int[Array, " b"],
        k_new: Float[Array, "b t kv d"],
        v_new: Float[Array, "b t kv d"],
        block_mask: BlockMask,
        q_positions: Int[Array, "b t"],
        sliding_window: int | None,
        softcap: float | None = None,
    ) -> Float[Array, "b t h d"]: ...


def xla_attention(
    q: Float[Array, "b t h d"],
    k_cache: Float[Array, "b kv s d"],
    v_cache: Float[Array, "b kv s d"],
    cache_lengths: Int[Array, " b"],
    k_new: Float[Array, "b t kv d"],
    v_new: Float[Array, "b t kv d"],
    block_mask: BlockMask,
    q_positions: Int[Array, "b t"],
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> Float[Array, "b t h d"]:
    """Reference attention in plain XLA ops: scores and softmax in float32, GQA by grouping.
    `softcap`: scores become softcap * tanh(scores / softcap) before the softmax (Gemma 2)."""
    block_mask = dense_block_mask(block_mask, q_positions)
    b, t, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    g = h // kv
    # Queries grouped per KV head as one [g*t, d] matrix: batched matmuls over (b, kv) that
    # CPU and GPU backends run far faster than a 5-D contraction.
    qg = q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)
    kc, vc = k_cache, v_cache  # heads-major already (`KVCache`)
    kn, vn = k_new.transpose(0, 2, 1, 3), v_new.transpose(0, 2, 1, 3)
    scale = d ** -0.5
    # Two score blocks instead of concatenating K/V: the cache is never copied.
    scores_cache = jnp.einsum("bkqd,bksd->bkqs", qg, kc, preferred_element_type=jnp.float32) * scale
    scores_new = jnp.einsum("bkqd,bksd->bkqs", qg, kn, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        scores_cache, scores_new = (softcap * jnp.tanh(x / softcap) for x in (scores_cache, scores_new))
    cache_visible = jnp.arange(s)[None, None, :] < cache_lengths[:, None, None]  # [b, 1, s]
    new_visible = block_mask  # [b, t, t]
    if sliding_window is not None:
        qpos = q_positions[:, :, None]
        cache_visible = cache_visible & (qpos - jnp.arange(s)[None, None, :] < sliding_window)
        new_visible = new_visible & (qpos - q_positions[:, None, :] < sliding_window)
    visible = jnp.concatenate([jnp.broadcast_to(cache_visible, (b, t, s)), new_visible], axis=-1)
    visible = jnp.tile(visible, (1, g, 1))[:, None]  # [b, 1, g*t, s+t], query index = group*t + i
    scores = jnp.where(visible, jnp.concatenate([scores_cache, scores_new], axis=-1), _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_cache.dtype)
    out = jnp.einsum("bkqs,bksd->bkqd", probs[..., :s], vc, preferred_element_type=jnp.float32)
    out = out + jnp.einsum("bkqs,bksd->bkqd", probs[..., s:], vn, preferred_element_type=jnp.float32)
    out = out.reshape(b, kv, g, t, d).transpose(0, 3, 1, 2, 4)
    return out.reshape(b, t, h, d).astype(q.dtype)


# The one table of attention backends: name -> the function, or "module:function" for one
# imported on first use (the Pallas kernels import `jaxspec.models.masks`, so importing them here
# at module level would make the two packages import each other).
BACKENDS: dict[str, Callable | str] = {
    "xla": xla_attention,
    "pallas": "pallas_kernels.pallas_attention:pallas_attention",
}


def get_attention(name: str) -> Callable:
    if name not in BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; available: {', '.join(available_attention())}")
    backend = BACKENDS[name]
    if isinstance(backend, str):
        module, _, function = backend.partition(":")
        try:
            backend = getattr(importlib.import_module(module), function)
        except ImportError as e:
            raise ConfigError(f"attention backend {name!r} cannot be imported: {e}") from None
    return backend


def available_attention() -> list[str]:
    return sorted(BACKENDS)
