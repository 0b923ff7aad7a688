"""Batch-invariant numerics: a row's logits depend on its tokens and positions, never on the shape
of the forward that computed them.

A lossless method verifies drafts in a block of T tokens where greedy runs one token at a time, a
server runs B requests in one step, and the cache is padded to a bucket. In plain XLA every one of
these changes the order in which a row's reductions are summed, so the block's logits differ from
greedy's in the last bits: in float32 a near-tie now and then flips a token (stories260K's lookahead
sweep: 10-25 in 459 runs), in bfloat16 most outputs part (SmolLM2: 49 of 112 identical). With
`jaxspec.load(..., batch_invariant=True)` the forward computes every reduction in one order:

* **matmuls** (`fixed_rows`): XLA:CPU sends a dot of 2 to 32 rows to one GEMM kernel whose rows are
  computed alike whatever their number and place, a 1-row dot to its own matrix-vector code, and
  a dot of more rows through a kernel that splits its work by their number (measured on SmolLM2's
  shapes: row r of an M-row product equals row r of a 2-row product for 2 <= M <= 32, f32 and bf16,
  and differs for M = 1 and, at K = 576, for every M >= 33). So every matmul runs on tiles of
  ROW_TILE rows (a 1-row product padded to 2, a longer one as a loop of ROW_TILE-row products);
* **attention** (`invariant_attention`): an online softmax over key positions in absolute order,
  KEY_CHUNK positions a step of one loop, a query's key at a position taken from the committed
  cache below the row's length, above it from the block token the query sees there (its own
  ancestor). A draft token at position p therefore sees exactly the keys greedy's cache holds at
  positions 0..p, in the same chunks, with the same code (one loop body); chunks past a row's
  positions add exact zeros, so the padded cache length does not count either. A chunk's scores
  and weighted values are products of a query's rows (G query heads per KV head, padded to at
  least 2) against the chunk's KEY_CHUNK keys and values: all the queries' rows in one product
  where the block's tokens sit at distinct positions (every query then sees the same key at a
  position: greedy, a chain, a prefill chunk), one product per query in a tree. Measured on
  these shapes (K = 64 or 128): a row's result is the same in a product of 1 to 64 rows, and a
  product batched over the queries rounded otherwise, so a tree loops over its queries;
* **sums** (`ordered_sum`: softmax sums, RMSNorm's mean): chains of elementwise adds, one IEEE operation each. XLA:CPU's own reduction orders its
  adds by the shape of the axes it keeps (measured: a [.., 12, 128] sum's rows differ from the same
  rows summed as [.., 1, 128] in 6 of 96, and a sum over a non-minor axis changed with the block
  size too);
* RoPE, the embedding and the LM head's argmax are per row already (the head's matmul goes
  through `fixed_rows` over the whole vocabulary, or a vocabulary chunk that does not depend on
  the rows where it is chunked: tensor parallelism, quantized heads).

What it costs on this project's CPU (docs/performance.md, "Batch invariance"): greedy's one-row
matmuls leave XLA's matrix-vector code for a 2-row GEMM that is slower on f32 weights; blocks of
2 or more rows (every drafted method, batched greedy) already took the GEMM.

Greedy at batch 8 then equals greedy at batch 1, and every method equals greedy bit for bit in
every dtype this backend computes. The claims about the kernels are measurements of this CPU's XLA
(one-off scripts; the counts above are theirs), held by tests (`tests/test_batch_invariant.py`), not a property of XLA everywhere: a GPU or TPU
needs kernels with tiles fixed independently of T and B (not written yet: the switch refuses
the Pallas backend).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxspec.models.masks import BlockMask, TreeMask, dense_block_mask

# Rows per matmul: XLA:CPU computes a row of a 2..32-row product alike whatever the rows' number.
ROW_TILE = 32
# Columns of `ordered_sum`.
LANES = 8
# Key positions per step of the attention loop: fewer steps cost less loop overhead, more cost more
# padded keys at short contexts.
KEY_CHUNK = 128
# The vocabulary chunk of the LM head's argmax in batch-invariant mode (fixed: the chunk must not
# follow the rows).
HEAD_CHUNK = 16384


def _chain(x: Array, axis: int) -> Array:
    """x's slices along `axis` added first to last: elementwise adds, one IEEE operation each, which
    XLA neither reorders nor fuses into multiply-adds (no fast math)."""
    out = jax.lax.index_in_dim(x, 0, axis, keepdims=False)
    for i in range(1, x.shape[axis]):
        out = out + jax.lax.index_in_dim(x, i, axis, keepdims=False)
    return out


def ordered_sum(x: Array, axis: int = -1) -> Array:
    """The sum over `axis` in one order whatever x's other axes are, by construction: the axis cut
    into rows of LANES, the rows added first to last, then the LANES lanes (zero padding adds
    nothing). XLA's own reduction would order its adds by the shape of the axes it keeps."""
    x = jnp.moveaxis(x, axis, -1)
    n = x.shape[-1]
    width = -(-n // LANES) * LANES
    if width != n:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - n)])
    return _chain(_chain(x.reshape(*x.shape[:-1], width // LANES, LANES), -2), -1)


def ordered_mean(x: Array) -> Array:
    """The mean over the last axis (kept), by `ordered_sum`."""
    return (ordered_sum(x, -1) / x.shape[-1])[..., None]


def fixed_rows(fn, x: Float[Array, "... k"]) -> Float[Array, "... n"]:
    """`fn(x)` for a row-wise `fn` (a matmul over x's last axis), computed on products of 2 to
    ROW_TILE rows only: a single row is padded with a zero row, more than ROW_TILE rows run as a
    loop of ROW_TILE-row products (a loop, because XLA fuses a batched product into one)."""
    lead, k = x.shape[:-1], x.shape[-1]
    m = math.prod(lead)
    rows = x.reshape(m, k)
    if m == 1:
        out = fn(jnp.pad(rows, ((0, 1), (0, 0))))[:1]
    elif m <= ROW_TILE:
        out = fn(rows)
    else:
        tiles = -(-m // ROW_TILE)
        padded = jnp.pad(rows, ((0, tiles * ROW_TILE - m), (0, 0))).reshape(tiles, ROW_TILE, k)
        out = jax.lax.map(fn, padded)
        out = out.reshape(tiles * ROW_TILE, *out.shape[2:])[:m]
    return out.reshape(*lead, *out.shape[1:])


def invariant_attention(
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
    """Attention whose every query sums its keys by absolute position, in chunks of KEY_CHUNK
    positions (an online softmax, one loop body for every chunk). Query i's key at position p is
    the cache's where p < its row's length, else the block token j it sees (`block_mask[b, i, j]`)
    at position p: a query sees at most one token per position (a tree's ancestors, a causal
    block), as every decoding relation has it. Same interface as `xla_attention`.

    Where a row's block tokens sit at distinct positions (one token, a causal block, a prefill
    chunk, a chain), every query sees the same key at a position, so a chunk's keys and values are
    gathered once and shared (`_shared_keys`); a tree's siblings share a position, so there each
    query gathers its own (`_own_keys`). Both run the same products, a query's row against a
    chunk's 128 keys and its weights against their values, so both give the same bits (held by
    tests/test_batch_invariant.py). Which one runs is decided at trace time where the relation is
    static (one token; a decoding tree's numpy layout), else by the positions (`lax.cond`)."""
    mask = dense_block_mask(block_mask, q_positions)  # [b, t, t]: query i sees block token j
    t = q.shape[1]
    attend = functools.partial(_attention_by_position, q, k_cache, v_cache, cache_lengths, k_new, v_new, mask,
                               q_positions, sliding_window, softcap)
    shared = _distinct_positions_statically(block_mask, t)
    if shared is not None:
        return attend(_shared_keys if shared else _own_keys)
    distinct = jnp.all(jnp.sum(q_positions[:, :, None] == q_positions[:, None, :], axis=-1) == 1)
    return jax.lax.cond(distinct, lambda: attend(_shared_keys), lambda: attend(_own_keys))


def _distinct_positions_statically(block_mask: BlockMask, t: int) -> bool | None:
    """Whether a row's block tokens sit at distinct positions, where the relation says so at trace
    time: one token, or a decoding tree's numpy layout (a chain: distinct; a branching tree: not).
    None: decided by the positions when the program runs."""
    if t == 1:
        return True
    if isinstance(block_mask, TreeMask) and all(isinstance(a, np.ndarray) for a in (block_mask.pre, block_mask.end)):
        return bool(np.all(block_mask.pre == np.arange(t)) and np.all(block_mask.end == t - 1))
    return None


def _shared_keys(mask, q_positions, kc, vc, kn, vn, cached, pos):
    """A chunk's keys and values, one per position for every query ([b, kv, C, d]), and what each
    query sees ([b, t, C]): block tokens at distinct positions, so position p holds the cache's
    key or the one block token at p."""
    match = q_positions[:, :, None] == pos  # [b, t(j), C]
    j = jnp.argmax(match, axis=1)  # [b, C]
    here = jnp.any(match, axis=1)
    take = jax.vmap(lambda x, idx: x[:, idx])  # x [kv, t, d], idx [C] -> [kv, C, d]
    keys = jnp.where(cached[:, None, :, None], kc, take(kn, j))
    values = jnp.where(cached[:, None, :, None], vc, take(vn, j))
    seen = here[:, None, :] & jnp.take_along_axis(mask, jnp.broadcast_to(j[:, None, :], mask.shape[:2] + j.shape[1:]),
                                                   axis=2)
    return keys, values, cached[:, None, :] | seen


def _own_keys(mask, q_positions, kc, vc, kn, vn, cached, pos):
    """A chunk's keys and values as each query sees them ([b, kv, t, C, d]) and what each sees
    ([b, t, C]): the cache's below its row's length, above it the block token it sees there."""
    match = mask[:, :, :, None] & (q_positions[:, None, :, None] == pos)  # [b, t(i), t(j), C]
    seen = jnp.any(match, axis=2)  # [b, t, C]
    j = jnp.argmax(match, axis=2)  # [b, t, C]
    take = jax.vmap(lambda x, idx: x[:, idx])  # x [kv, t, d], idx [t, C] -> [kv, t, C, d]
    from_cache = cached[:, None, None, :, None]  # [b, 1, 1(t), C, 1]
    keys = jnp.where(from_cache, kc[:, :, None], take(kn, j))
    values = jnp.where(from_cache, vc[:, :, None], take(vn, j))
    return keys, values, cached[:, None, :] | seen


def _attention_by_position(q, k_cache, v_cache, cache_lengths, k_new, v_new, mask, q_positions, sliding_window,
                           softcap, keys_of):
    """The online softmax over chunks of KEY_CHUNK key positions, each chunk's keys from `keys_of`
    (`_shared_keys` or `_own_keys`)."""
    b, t, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    g = h // kv
    rows = max(g, 2)  # query heads per KV head, padded: a one-row product takes another kernel path
    chunk = KEY_CHUNK
    qg = q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4).astype(jnp.float32) * (d ** -0.5)  # [b, kv, g, t, d]
    qg = jnp.pad(qg, ((0, 0), (0, 0), (0, rows - g), (0, 0), (0, 0)))
    kn = k_new.transpose(0, 2, 1, 3).astype(jnp.float32)  # [b, kv, t, d]
    vn = v_new.transpose(0, 2, 1, 3).astype(jnp.float32)
    offsets = jnp.arange(chunk, dtype=jnp.int32)
    # Chunks up to the last query position (the rest would add nothing: they only cost).
    count = jnp.minimum(jnp.max(q_positions) // chunk + 1, -(-(s + t) // chunk))
    # The products: the queries' rows against the chunk's keys ([.., d] x [d, C]), their weights
    # against the values ([.., C] x [C, d]); all the queries' rows in one product when the keys are
    # shared, else one product per query.
    shared = keys_of is _shared_keys

    def step(c, carry):
        m, l, acc = carry  # running max [b,kv,g,t], sum [b,kv,g,t], weighted values [b,kv,g,t,d]
        pos = c * chunk + offsets  # [C] absolute key positions
        cached = pos[None, :] < cache_lengths[:, None]  # [b, C]
        at = jnp.minimum(pos, s - 1)
        kc = jnp.take(k_cache, at, axis=2).astype(jnp.float32)  # [b, kv, C, d]
        vc = jnp.take(v_cache, at, axis=2).astype(jnp.float32)
        keys, values, visible = keys_of(mask, q_positions, kc, vc, kn, vn, cached, pos)
        if sliding_window is not None:
            visible = visible & (q_positions[:, :, None] - pos < sliding_window)
        scores = (jnp.einsum("bkgtd,bkcd->bkgtc", qg, keys, preferred_element_type=jnp.float32) if shared else
                  _query_by_query("bkgd,bkcd->bkgc", qg, keys))
        if softcap is not None:
            scores = softcap * jnp.tanh(scores / softcap)
        visible = visible[:, None, None]  # [b, 1, 1, t, C]
        scores = jnp.where(visible, scores, -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        p = jnp.where(visible, jnp.exp(scores - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)  # a chunk that adds nothing: exp(0) = 1
        weighted = (jnp.einsum("bkgtc,bkcd->bkgtd", p, values, preferred_element_type=jnp.float32) if shared else
                    _query_by_query("bkgc,bkcd->bkgd", p, values))
        return m_new, l * alpha + ordered_sum(p, -1), acc * alpha[..., None] + weighted

    # A finite floor for the running max: the first visible chunk scales the empty state by 0,
    # where -inf - -inf would be NaN.
    init = (jnp.full((b, kv, rows, t), -1e30, jnp.float32), jnp.zeros((b, kv, rows, t), jnp.float32),
            jnp.zeros((b, kv, rows, t, d), jnp.float32))
    _, l, acc = jax.lax.fori_loop(0, count, step, init)
    out = acc[:, :, :g] / jnp.maximum(l[:, :, :g], jnp.finfo(jnp.float32).tiny)[..., None]  # (padding: l may be 0)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(q.dtype)


def _query_by_query(spec: str, x: Float[Array, "b kv g t n"], y: Float[Array, "b kv t c d"]) -> Array:
    """`einsum(spec)` of each query's slice of x (axis 3) and of y (axis 2), one product a query:
    the shared product's one-query case, which rounds every row as that product does (one product
    batched over the queries too rounded otherwise: measured, a tree's tokens parted from greedy)."""
    out = jax.lax.map(lambda xy: jnp.einsum(spec, *xy, preferred_element_type=jnp.float32),
                      (jnp.moveaxis(x, 3, 0), jnp.moveaxis(y, 2, 0)))
    return jnp.moveaxis(out, 0, 3)


@dataclasses.dataclass(frozen=True)
class Numerics:
    """How a forward computes its reductions: `linear(layer, x)` applies a linear layer, `mean(x)` is
    RMSNorm's mean over the last axis (kept; None: `jnp.mean`), `attention` the attention function."""

    linear: Callable
    attention: Callable
    mean: Callable | None = None


def _apply(layer, x):
    return layer(x)


def plain(attention: Callable) -> Numerics:
    """XLA's own orders (the fastest): the given attention backend."""
    return Numerics(linear=_apply, attention=attention)


INVARIANT = Numerics(linear=fixed_rows, attention=invariant_attention, mean=ordered_mean)
