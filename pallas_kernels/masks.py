"""Attention relations inside a forward block: dense masks and compact mask specs.

Every attention here (the kernels and their XLA reference, `pallas_kernels.reference`) takes
the relation among the block's T tokens ("query i sees block key j") as `block_mask`, which is
either

* a dense `Bool[b, t, t]` array: any relation (prefill's causal mask, autoregressive,
  tests), or
* a compact spec that says which relation it is without materialising it:
  - `TreeMask`: every decoding step (`jaxspec.decoding.engine`): the block is a token tree
    rooted at the last committed token and each token sees itself and its ancestors; two
    int32 numbers per token (its DFS interval) describe the whole relation;
  - `PardMask`: the PARD drafter-training relation, from each token's block id (the
    token positions are the forward's position ids).

Every backend accepts both: `dense_block_mask` turns a spec into the dense array (the XLA
reference does exactly that), while the Pallas kernels evaluate the spec's relation on
block indices inside the kernel, so no `t x t` mask is ever read from memory. The
relations are written once, as elementwise functions of index arrays (`tree_relation`,
`pard_relation`), and used by both.

The specs live here, with the kernels whose inputs they are, because `pallas_kernels`
imports nothing from `jaxspec`; `jaxspec.models.masks` re-exports them for the model (and
adds what only jaxspec uses: `pard_layout`).

## PARD training mask (`../shared/docs/pard2.md`)
A training sequence of L real tokens is extended with K-1 blocks of mask tokens: token n
has a block id `block[n]` (0 = real token, j = mask block j, -1 = padding) and a position
id `pos[n]` (0..L-1; every block reuses the real tokens' positions). Query (block j,
position t) sees key (block j', position t') iff

    j' == 0  and 0 <= j  and t' <= t - j            (the real tokens x_0 .. x_{t-j})
    1 <= j' <= j          and t' - j' == t - j      (mask block j' at position t-(j-j'))

Block 0 is therefore plain causal attention, a mask row sees itself, and padding
(block -1) sees nothing and is seen by nobody. The row (j, t) sees exactly what the
inference input `[x_<n, m_1 .. m_j]` with n = t-j+1 sees, and predicts x_{t+1}. The
definition reads only (block, position) pairs, so it holds for any token order and for
conditional drop (COD), which keeps a subset of each mask block: `jaxspec.models.masks.pard_layout`
builds the full layout (block j = tokens j*L .. (j+1)*L - 1), a COD layout is any subset of it.
"""

from __future__ import annotations

from typing import Union

import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Int

from pallas_kernels.errors import KernelConfigError


def tree_relation(q_pre, k_pre, k_end):
    """Whether a query sees a key in a token tree: the key is the query or one of its ancestors.

    With each token's DFS preorder number `pre` and the last preorder number of its subtree
    `end`, "key is an ancestor-or-self of query" is `k_pre <= q_pre <= k_end`. Elementwise
    over broadcastable int32 arrays (numpy, jax, or values inside a kernel).
    """
    return (k_pre <= q_pre) & (q_pre <= k_end)


def pard_relation(q_block, q_pos, k_block, k_pos):
    """Whether query (block, position) sees key (block, position) under the PARD mask.

    Elementwise over broadcastable int32 arrays; see the module docstring.
    """
    real = (k_block == 0) & (q_block >= 0) & (k_pos <= q_pos - q_block)
    chain = (k_block >= 1) & (k_block <= q_block) & (k_pos - k_block == q_pos - q_block)
    return real | chain


@struct.dataclass
class TreeMask:
    """A block whose tokens form a tree (`jaxspec.decoding.tree.TokenTree`): query i sees block
    token j iff j is i or an ancestor of i. O(T) metadata per row, evaluated by
    `tree_relation`: token i's DFS preorder number `pre[b, i]` and the last preorder number in
    its subtree `end[b, i]`. A token with `end == pre` and a preorder number outside every other
    token's interval is isolated (padding: it sees itself only and nobody sees it).
    """

    pre: Int[Array, "b t"]
    end: Int[Array, "b t"]

    @property
    def size(self) -> int:
        return self.pre.shape[-1]

    def dense(self) -> Bool[Array, "b t t"]:
        return tree_relation(self.pre[..., :, None], self.pre[..., None, :], self.end[..., None, :])


@struct.dataclass
class PardMask:
    """The PARD training relation over a block whose token n is in block `block_ids[b, n]`
    (0 real, j >= 1 mask block j, -1 padding); positions are the forward's position ids."""

    block_ids: Int[Array, "b t"]


def pard_mask(block_ids: Int[Array, "*b n"], positions: Int[Array, "*b n"]) -> Bool[Array, "*b n n"]:
    """The dense PARD training mask `[..., query n, key n]` (module docstring): the
    reference for the Pallas kernel and the mask of the XLA training path."""
    block_ids, positions = jnp.asarray(block_ids), jnp.asarray(positions)
    return pard_relation(block_ids[..., :, None], positions[..., :, None],
                         block_ids[..., None, :], positions[..., None, :])


BlockMask = Union[Bool[Array, "b t t"], TreeMask, PardMask]


def dense_block_mask(block_mask: BlockMask, q_positions: Int[Array, "b t"]) -> Bool[Array, "b t t"]:
    """`block_mask` (a dense array or a spec) as the dense `[b, t, t]` relation."""
    b, t = q_positions.shape
    if isinstance(block_mask, TreeMask):
        if block_mask.size != t:
            raise KernelConfigError(f"TreeMask describes a block of {block_mask.size} tokens, the forward has {t}")
        return jnp.broadcast_to(block_mask.dense(), (b, t, t))
    if isinstance(block_mask, PardMask):
        return pard_mask(block_mask.block_ids, q_positions)
    return jnp.broadcast_to(block_mask, (b, t, t))
