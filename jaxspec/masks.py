"""Attention relations inside a forward block: dense masks and compact mask specs.

The model's attention (`jaxspec.attention`) takes the relation among the block's T tokens
("query i sees block key j") as `block_mask`, which is either

* a dense `Bool[b, t, t]` array: any relation (prefill's causal mask, autoregressive,
  tests), or
* a compact spec that says which relation it is without materialising it:
  - `LookaheadMask`: the lookahead / verification step of `jaxspec.decoding.lookahead`
    (static (W, levels, G, candidate length); no arrays at all);
  - `PardMask`: the PARD drafter-training relation, from each token's block id (the
    token positions are the forward's position ids).

Every backend accepts both: `dense_block_mask` turns a spec into the dense array (the XLA
reference does exactly that), while the Pallas kernels evaluate the spec's relation on
block indices inside the kernel, so no `t x t` mask is ever read from memory. The
relations are written once, as elementwise functions of index arrays
(`lookahead_relation`, `pard_relation`), and used by both.

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
conditional drop (COD), which keeps a subset of each mask block: `pard_layout` builds the
full layout (block j = tokens j*L .. (j+1)*L - 1), a COD layout is any subset of it.
"""

from __future__ import annotations

from typing import Union

import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Int

from jaxspec.errors import ConfigError


def _split(x, size: int, count: int, start: int = 0):
    """(group, offset) of index `x` among `count` consecutive groups of `size` from `start`.

    Comparisons and adds only (unrolled over the static `count`): integer vector division
    is not something every Pallas backend lowers.
    """
    group = x * 0  # plain operators: numpy arrays, jax arrays and kernel values alike
    for k in range(1, count):
        group = group + (x >= start + k * size).astype(x.dtype)
    return group, x - start - group * size


def lookahead_relation(i, j, *, window: int, levels: int, guesses: int, cand_len: int):
    """`StepLayout.attention_relation()[i, j]` as an elementwise function of block indices.

    `i` (queries) and `j` (keys) are broadcastable int32 arrays with 0 <= i, j < size; the
    layout is that of `jaxspec.decoding.lookahead.StepLayout` (lade's): `levels` x `window`
    lookahead tokens, level-major, whose level-0 column 0 is the last committed token
    (index 0; without a window index 0 is the last token alone), then `guesses` candidates
    of `cand_len` tokens. Every token sees itself and the last token; a level-l token at
    column c also sees level-0 columns <= c and column c of levels 1..l; a candidate token
    the earlier tokens of its own candidate. The branches never see each other.
    """
    visible = (i == j) | (j == 0)
    in_window = levels * window
    if levels:
        q_level, q_col = _split(i, window, levels)
        k_level, k_col = _split(j, window, levels)
        diagonal = ((k_level == 0) & (k_col <= q_col)) | ((k_level >= 1) & (k_level <= q_level) & (k_col == q_col))
        visible = visible | ((i < in_window) & (j < in_window) & diagonal)
    if guesses and cand_len:
        start = max(in_window, 1)
        q_cand, q_tok = _split(i, cand_len, guesses, start)
        k_cand, k_tok = _split(j, cand_len, guesses, start)
        visible = visible | ((i >= start) & (j >= start) & (q_cand == k_cand) & (k_tok <= q_tok))
    return visible


def pard_relation(q_block, q_pos, k_block, k_pos):
    """Whether query (block, position) sees key (block, position) under the PARD mask.

    Elementwise over broadcastable int32 arrays; see the module docstring.
    """
    real = (k_block == 0) & (q_block >= 0) & (k_pos <= q_pos - q_block)
    chain = (k_block >= 1) & (k_block <= q_block) & (k_pos - k_block == q_pos - q_block)
    return real | chain


@struct.dataclass
class LookaheadMask:
    """The lookahead step's relation (`StepLayout.attention_relation`), as four static ints.

    A pytree without leaves: it is hashable and passes through `jax.jit` unchanged.
    """

    window: int = struct.field(pytree_node=False)
    levels: int = struct.field(pytree_node=False)
    guesses: int = struct.field(pytree_node=False)
    cand_len: int = struct.field(pytree_node=False)

    @classmethod
    def from_layout(cls, layout) -> "LookaheadMask":
        """From a `StepLayout` (anything with window, levels, guesses and cand_len)."""
        return cls(window=layout.window, levels=layout.levels, guesses=layout.guesses,
                   cand_len=layout.cand_len)

    @property
    def size(self) -> int:
        return max(self.levels * self.window, 1) + self.guesses * self.cand_len

    def relation(self, i, j):
        return lookahead_relation(i, j, window=self.window, levels=self.levels, guesses=self.guesses,
                                  cand_len=self.cand_len)

    def dense(self) -> np.ndarray:
        """The `[t, t]` relation as a numpy constant."""
        idx = np.arange(self.size, dtype=np.int32)
        return np.asarray(self.relation(idx[:, None], idx[None, :]))


@struct.dataclass
class PardMask:
    """The PARD training relation over a block whose token n is in block `block_ids[b, n]`
    (0 real, j >= 1 mask block j, -1 padding); positions are the forward's position ids."""

    block_ids: Int[Array, "b t"]


def pard_layout(seq_len: int, num_blocks: int) -> tuple[Int[Array, " n"], Int[Array, " n"]]:
    """Block ids and position ids of the full PARD layout: K blocks of L tokens, n = K * L.

    Block j holds tokens j*L .. (j+1)*L - 1, all with positions 0..L-1 (block 0 = the real
    tokens, blocks 1..K-1 = mask tokens). Batch it with `jnp.broadcast_to`.
    """
    if seq_len < 1 or num_blocks < 1:
        raise ConfigError(f"PARD layout needs seq_len >= 1 and num_blocks >= 1, got {seq_len}, {num_blocks}")
    block, pos = np.divmod(np.arange(seq_len * num_blocks, dtype=np.int32), seq_len)
    return jnp.asarray(block), jnp.asarray(pos)


def pard_mask(block_ids: Int[Array, "*b n"], positions: Int[Array, "*b n"]) -> Bool[Array, "*b n n"]:
    """The dense PARD training mask `[..., query n, key n]` (module docstring): the
    reference for the Pallas kernel and the mask of the XLA training path."""
    block_ids, positions = jnp.asarray(block_ids), jnp.asarray(positions)
    return pard_relation(block_ids[..., :, None], positions[..., :, None],
                         block_ids[..., None, :], positions[..., None, :])


BlockMask = Union[Bool[Array, "b t t"], LookaheadMask, PardMask]


def dense_block_mask(block_mask: BlockMask, q_positions: Int[Array, "b t"]) -> Bool[Array, "b t t"]:
    """`block_mask` (a dense array or a spec) as the dense `[b, t, t]` relation."""
    b, t = q_positions.shape
    if isinstance(block_mask, LookaheadMask):
        if block_mask.size != t:
            raise ConfigError(f"LookaheadMask describes a block of {block_mask.size} tokens, the forward has {t}")
        return jnp.broadcast_to(jnp.asarray(block_mask.dense()), (b, t, t))
    if isinstance(block_mask, PardMask):
        return pard_mask(block_mask.block_ids, q_positions)
    return jnp.broadcast_to(block_mask, (b, t, t))
