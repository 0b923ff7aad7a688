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
  and weighted values are products of the queries' rows (G query heads per KV head, padded to at
  least 2) against KEY_CHUNK keys and values: where the block's tokens sit at distinct positions
  (greedy, a chain, a prefill chunk) all the rows in one product against the keys in place; in a
  tree the scores from the rows against the cached keys and against the block's keys padded to
  KEY_CHUNK, the weighted values one product per query. Measured on these shapes (head sizes 8
  and 64): a row's score is the same whatever the rows (2 to 64) and whichever of 128 columns its
  key sits in, and differs against 5 or 42 keys; a values product batched over the queries
  rounded otherwise, so a tree loops over its queries;
* **sums** (`ordered_sum`: softmax sums, RMSNorm's mean): chains of elementwise adds, one IEEE
  operation each. XLA:CPU's own reduction orders its adds by the shape of the axes it keeps
  (measured: a [.., 12, 128] sum's rows differ from the same rows summed as [.., 1, 128] in 6 of
  96, and a sum over a non-minor axis changed with the block size too);
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

    Where a row's block tokens sit at distinct positions (one token, a chain, a prefill chunk),
    every query sees the same key and value at a position: a chunk's are gathered once, in place,
    and all the queries' rows go through one product against them (scores, then weighted values).
    In a tree (siblings share a position) a query's scores come from two shared products, its rows
    against the chunk's cached keys and (once) against the block's keys, each over KEY_CHUNK keys,
    its score at a position taken from one or the other; its weighted values are one product a
    query against the values it sees, in place (`_query_by_query`). Every path computes a query's
    numbers in the same products (measured: a row's score is the same whichever of 128 columns its
    key sits in and whatever the rows), so they give the same bits (tests/test_batch_invariant.py).
    Which runs is decided at trace time where the relation is static (one token; a decoding tree's
    numpy layout), else by the positions (`lax.cond`)."""
    t = q.shape[1]
    attend = functools.partial(_attention_by_position, q, k_cache, v_cache, cache_lengths, k_new, v_new,
                               dense_block_mask(block_mask, q_positions), q_positions, sliding_window, softcap)
    shared = _distinct_positions_statically(block_mask, t)
    if shared is not None:
        return attend(shared)
    distinct = jnp.all(jnp.sum(q_positions[:, :, None] == q_positions[:, None, :], axis=-1) == 1)
    return jax.lax.cond(distinct, lambda: attend(True), lambda: attend(False))


def _distinct_positions_statically(block_mask: BlockMask, t: int) -> bool | None:
    """Whether a row's block tokens sit at distinct positions, where the relation says so at trace
    time: one token, or a decoding tree's numpy layout (a chain: distinct; a branching tree: not).
    None: decided by the positions when the program runs."""
    if t == 1:
        return True
    if isinstance(block_mask, TreeMask) and all(isinstance(a, np.ndarray) for a in (block_mask.pre, block_mask.end)):
        return bool(np.all(block_mask.pre == np.arange(t)) and np.all(block_mask.end == t - 1))
    return None


def _attention_by_position(q, k_cache, v_cache, cache_lengths, k_new, v_new, mask, q_positions, sliding_window,
                           softcap, shared: bool):
    """The online softmax over chunks of KEY_CHUNK key positions; `shared`: the block's tokens sit
    at distinct positions (a chunk's values are the same for every query)."""
    b, t, h, d = q.shape
    kv, s = k_cache.shape[1], k_cache.shape[2]
    g = h // kv
    rows = max(g, 2)  # query heads per KV head, padded: a one-row product takes another kernel path
    chunk = KEY_CHUNK
    qg = q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4).astype(jnp.float32) * (d ** -0.5)  # [b, kv, g, t, d]
    qg = jnp.pad(qg, ((0, 0), (0, 0), (0, rows - g), (0, 0), (0, 0)))
    kn = k_new.transpose(0, 2, 1, 3).astype(jnp.float32)  # [b, kv, t, d]
    vn = v_new.transpose(0, 2, 1, 3).astype(jnp.float32)
    take = jax.vmap(lambda x, idx: x[:, idx])  # x [kv, t, d], idx [...] -> [kv, ..., d]
    if not shared:
        # A tree's queries see different keys at a position; their scores against the block's keys
        # are one product too, over the block padded to whole chunks: a product over another number
        # of keys rounds its scores otherwise (measured: 42 and 5 keys against 128).
        width = -(-t // chunk) * chunk
        block_scores = jnp.einsum("bkgtd,bkjd->bkgtj", qg, jnp.pad(kn, ((0, 0), (0, 0), (0, width - t), (0, 0))),
                                  preferred_element_type=jnp.float32)  # [b, kv, g, t, width]
    offsets = jnp.arange(chunk, dtype=jnp.int32)
    # Chunks up to the last query position (the rest would add nothing: they only cost).
    count = jnp.minimum(jnp.max(q_positions) // chunk + 1, -(-(s + t) // chunk))

    def step(c, carry):
        m, l, acc = carry  # running max [b,kv,g,t], sum [b,kv,g,t], weighted values [b,kv,g,t,d]
        pos = c * chunk + offsets  # [C] absolute key positions
        cached = pos[None, :] < cache_lengths[:, None]  # [b, C]
        at = jnp.minimum(pos, s - 1)
        kc = jnp.take(k_cache, at, axis=2).astype(jnp.float32)  # [b, kv, C, d]
        vc = jnp.take(v_cache, at, axis=2).astype(jnp.float32)
        if shared:  # position p's key and value: the cache's, or the one block token at p
            here = q_positions[:, :, None] == pos  # [b, t(j), C]
            j = jnp.argmax(here, axis=1)  # [b, C]
            keys = jnp.where(cached[:, None, :, None], kc, take(kn, j))  # [b, kv, C, d]
            values = jnp.where(cached[:, None, :, None], vc, take(vn, j))
            seen = jnp.any(here, axis=1)[:, None, :] & jnp.take_along_axis(
                mask, jnp.broadcast_to(j[:, None, :], (*mask.shape[:2], chunk)), axis=2)  # [b, t, C]
            scores = jnp.einsum("bkgtd,bkcd->bkgtc", qg, keys, preferred_element_type=jnp.float32)
        else:  # each query's own: the cache's, or the block token it sees at p
            match = mask[:, :, :, None] & (q_positions[:, None, :, None] == pos)  # [b, t(i), t(j), C]
            seen = jnp.any(match, axis=2)  # [b, t, C]
            j = jnp.argmax(match, axis=2)  # [b, t, C]
            values = jnp.where(cached[:, None, None, :, None], vc[:, :, None], take(vn, j))  # [b, kv, t, C, d]
            scores = jnp.einsum("bkgtd,bkcd->bkgtc", qg, kc, preferred_element_type=jnp.float32)
            from_block = jnp.take_along_axis(block_scores, jnp.broadcast_to(j[:, None, None], scores.shape), axis=-1)
            scores = jnp.where(cached[:, None, None, None], scores, from_block)
        visible = cached[:, None, :] | seen  # [b, t, C]
        if sliding_window is not None:
            visible = visible & (q_positions[:, :, None] - pos < sliding_window)
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
