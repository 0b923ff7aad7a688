"""Attention relations inside a forward block, as the model uses them.

The model's attention (`jaxspec.models.attention`) takes the relation among the block's T
tokens as `block_mask`: a dense `Bool[b, t, t]` array or a compact spec (`TreeMask`, every
decoding step; `PardMask`, PARD drafter training). The specs and relations are the Pallas
kernels' inputs, so they are defined in `pallas_kernels.masks` (the definitions, the PARD
mask's included, are documented there; `pallas_kernels` imports nothing from jaxspec) and
re-exported here. jaxspec's own additions: `dense_block_mask` raises jaxspec's `ConfigError`,
and `pard_layout` builds the full PARD training layout.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int

from jaxspec.errors import ConfigError, reraised
from pallas_kernels import masks as kernel_masks
from pallas_kernels.errors import KernelConfigError
from pallas_kernels.masks import BlockMask, PardMask, TreeMask, pard_mask, pard_relation, tree_relation

__all__ = ["BlockMask", "PardMask", "TreeMask", "dense_block_mask", "pard_layout", "pard_mask", "pard_relation",
           "tree_relation"]

# `block_mask` (a dense array or a spec) as the dense `[b, t, t]` relation; a `TreeMask` of
# the wrong size is a `ConfigError`.
dense_block_mask = reraised(kernel_masks.dense_block_mask, KernelConfigError, ConfigError)


def pard_layout(seq_len: int, num_blocks: int) -> tuple[Int[Array, " n"], Int[Array, " n"]]:
    """Block ids and position ids of the full PARD layout: K blocks of L tokens, n = K * L.

    Block j holds tokens j*L .. (j+1)*L - 1, all with positions 0..L-1 (block 0 = the real
    tokens, blocks 1..K-1 = mask tokens). Batch it with `jnp.broadcast_to`.
    """
    if seq_len < 1 or num_blocks < 1:
        raise ConfigError(f"PARD layout needs seq_len >= 1 and num_blocks >= 1, got {seq_len}, {num_blocks}")
    block, pos = np.divmod(np.arange(seq_len * num_blocks, dtype=np.int32), seq_len)
    return jnp.asarray(block), jnp.asarray(pos)
