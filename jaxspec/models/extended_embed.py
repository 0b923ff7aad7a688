"""A token embedding made of another table's rows followed by rows of its own.

A PARD drafter's vocabulary is its target's plus one mask token. Stored with shared embeddings,
its table is the target's rows and the mask row; held as one array, the target's table would be
copied (SmolLM2: 113 MB in float32, dequantized from a kept-quantized target). `ExtendedEmbed`
holds the target's embedding module itself (the same arrays, in whatever format it keeps them:
float, int8 or blocks) and the extra rows: a token's embedding is the same float32 row."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int


class ExtendedEmbed(nnx.Module):
    """Rows 0 .. n-1: `base`'s (an `nnx.Embed`, `Int8Embed` or `BlockEmbed`, shared, not copied);
    rows n ..: `extra`'s."""

    def __init__(self, base: nnx.Module, extra: Float[Array, "m d"]):
        self.base = base
        self.extra = nnx.Param(jnp.asarray(extra, jnp.float32))
        self.num_embeddings = int(base.num_embeddings) + int(extra.shape[0])
        self.features = int(base.features)
        self.dtype = jnp.float32

    def __call__(self, ids: Int[Array, "..."]) -> Float[Array, "... d"]:
        n, extra = self.base.num_embeddings, self.extra[...]
        own = jnp.take(extra, jnp.clip(ids - n, 0, extra.shape[0] - 1), axis=0)
        rows = self.base(jnp.minimum(ids, n - 1)).astype(jnp.float32)
        return jnp.where((ids >= n)[..., None], own, rows)
