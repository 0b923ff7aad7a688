"""PARD drafter-training attention as one Pallas kernel: full-sequence attention, no cache.

The relation is the PARD training mask (`pallas_kernels.masks`, `../shared/docs/pard2.md`): token
n carries a block id (0 real, j >= 1 mask block j, -1 padding) and a position id, and
query (j, t) sees key (j', t') iff `j' == 0 and t' <= t - j` or `1 <= j' <= j and
t' - j' == t - j`. The kernel evaluates that on the ids of its query and key tiles
(`pallas_kernels.masks.pard_relation`); no `n x n` mask exists anywhere. The ids are arbitrary per
token, so the full layout (`jaxspec.models.masks.pard_layout`), conditional drop (COD: any subset
of it) and right padding all work. With every block id 0 the relation is causal attention.

Layout: one kernel instance per (batch row, query head, query tile of `block_q`); its KV
head's keys are visited in tiles of `block_k` with an online softmax in float32. Which key
tiles can hold a visible key is worked out per (query tile, key tile) from a few min/max
summaries of the ids (conservative, exact for any layout); each query tile loops over
only those tiles, listed in a small int32 table (SMEM on TPU). In the full layout a query
tile in mask block j visits the causal real-token tiles plus about j diagonal tiles, not
all K blocks.

A query that sees nothing (padding) gets 0 where the XLA reference averages every value;
nothing reads those rows. Gradients: `pard_attention` is a `jax.custom_vjp` whose
backward is the VJP of the XLA reference (`pallas_kernels.reference.xla_attention` under the
dense `pard_mask`), recomputed: exact, but with the reference's O(n^2) memory; a Pallas
backward (saving the log-sum-exp) is the next step for long training sequences.

Backends: see `pallas_kernels.backend` (TPU Mosaic, GPU Triton, CPU interpret). Each
instance holds its KV head's whole K/V in fast memory on TPU (n * d * 2 * dtype size;
~3.6 MB for n = 7000, d = 128, bf16), as the decode kernel does with the cache.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from pallas_kernels.backend import MASKED, compiler_params, next_pow2, pv, qk, resolve, round_up
from pallas_kernels.errors import KernelConfigError
from pallas_kernels.masks import pard_mask, pard_relation
from pallas_kernels.reference import xla_attention

_FAR = 1 << 30  # beyond any position: "no such token in this tile"


def _tile_table(block_ids, positions, block_q: int, block_k: int, width: int):
    """`[b, nq, width]` int32: per query tile, the number of key tiles that may hold a
    visible key, then their indices (ascending). Conservative: a listed tile may still be
    fully masked, an unlisted one never holds a visible key."""
    b, n = block_ids.shape
    qb, qp = block_ids.reshape(b, n // block_q, block_q), positions.reshape(b, n // block_q, block_q)
    kb, kp = block_ids.reshape(b, n // block_k, block_k), positions.reshape(b, n // block_k, block_k)
    # Real keys: needs some key position <= some query's t - j.
    q_lim = jnp.max(jnp.where(qb >= 0, qp - qb, -_FAR), axis=-1)
    k_real = jnp.min(jnp.where(kb == 0, kp, _FAR), axis=-1)
    # Mask keys: needs j' <= j and overlapping diagonals t - j.
    q_mask, k_mask = qb >= 1, kb >= 1
    q_dmin = jnp.min(jnp.where(q_mask, qp - qb, _FAR), axis=-1)
    q_dmax = jnp.max(jnp.where(q_mask, qp - qb, -_FAR), axis=-1)
    q_bmax = jnp.max(qb, axis=-1)
    k_dmin = jnp.min(jnp.where(k_mask, kp - kb, _FAR), axis=-1)
    k_dmax = jnp.max(jnp.where(k_mask, kp - kb, -_FAR), axis=-1)
    k_bmin = jnp.min(jnp.where(k_mask, kb, _FAR), axis=-1)
    needed = (k_real[:, None, :] <= q_lim[:, :, None]) | (
        (k_bmin[:, None, :] <= q_bmax[:, :, None])
        & (k_dmin[:, None, :] <= q_dmax[:, :, None]) & (q_dmin[:, :, None] <= k_dmax[:, None, :]))
    order = jnp.argsort(~needed, axis=-1, stable=True).astype(jnp.int32)  # needed tiles first
    count = jnp.sum(needed, axis=-1, dtype=jnp.int32)
    table = jnp.concatenate([count[..., None], order], axis=-1)
    return jnp.pad(table, ((0, 0), (0, 0), (0, width - table.shape[-1])))


def _kernel(table_ref, qb_ref, qp_ref, q_ref, k_ref, v_ref, kb_ref, kp_ref, o_ref, *,
            block_k: int, scale: float, window: int | None, softcap: float | None, num_q_tiles: int, width: int,
            scalars_whole: bool):
    # TPU: the whole table in SMEM, flattened; elsewhere this instance's row of it.
    base = (pl.program_id(0) * num_q_tiles + pl.program_id(2)) * width if scalars_whole else 0
    q = q_ref[...]
    qb, qp = qb_ref[...], qp_ref[...]  # [bq, 1]
    rows, d = q.shape

    def key_tile(it, carry):
        m, l, acc = carry
        tile = table_ref[base + 1 + it]
        start = pl.multiple_of(tile * block_k, block_k)
        k = k_ref[pl.ds(start, block_k), :]
        v = v_ref[pl.ds(start, block_k), :]
        kb, kp = kb_ref[tile], kp_ref[tile]  # [1, bk]
        visible = pard_relation(qb, qp, kb, kp)
        if window is not None:
            visible = visible & (qp - kp < window)
        scores = jnp.where(visible, qk(q, k, scale, softcap), MASKED)
        m_new = jnp.maximum(m, jnp.max(scores, axis=1, keepdims=True))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(visible, jnp.exp(scores - m_new), 0.0)  # a row may see nothing yet
        return m_new, alpha * l + jnp.sum(p, axis=1, keepdims=True), alpha * acc + pv(p, v)

    carry = (jnp.full((rows, 1), MASKED, jnp.float32), jnp.zeros((rows, 1), jnp.float32),
             jnp.zeros((rows, d), jnp.float32))
    m, l, acc = lax.fori_loop(0, table_ref[base], key_tile, carry)
    o_ref[...] = (acc / jnp.where(l > 0, l, 1.0)).astype(o_ref.dtype)


def _forward(q, k, v, block_ids, positions, scores, block_q, block_k, interpret, platform):
    sliding_window, softcap = scores
    platform, interpret = resolve(platform, interpret)
    for name, size in (("block_q", block_q), ("block_k", block_k)):
        if size < 16 or size & (size - 1):
            raise KernelConfigError(f"{name} must be a power of two >= 16, got {size}")
    b, n, h, d = q.shape
    kv = k.shape[2]
    if h % kv:
        raise KernelConfigError(f"query heads ({h}) must be a multiple of KV heads ({kv})")
    g = h // kv
    tpu = platform == "tpu" and not interpret
    gpu = not interpret and not tpu
    n_pad = round_up(n, max(block_q, block_k))
    if gpu:
        n_pad = next_pow2(n_pad)  # Triton block shapes are powers of two
    nq, nk = n_pad // block_q, n_pad // block_k
    width = 1 + nk if not gpu else next_pow2(1 + nk)

    pad = n_pad - n
    block_ids = jnp.pad(block_ids.astype(jnp.int32), ((0, 0), (0, pad)), constant_values=-1)
    positions = jnp.pad(positions.astype(jnp.int32), ((0, 0), (0, pad)))
    heads_major = lambda x: jnp.pad(x.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, pad), (0, 0)))  # noqa: E731
    qh, kh, vh = heads_major(q), heads_major(k.astype(q.dtype)), heads_major(v.astype(q.dtype))
    table = _tile_table(block_ids, positions, block_q, block_k, width)
    key_ids = lambda x: x.reshape(b, nk, 1, block_k)  # noqa: E731  (row vectors per key tile)

    if tpu:
        from jax.experimental.pallas import tpu as pltpu
        table = table.reshape(-1)
        table_spec = pl.BlockSpec(memory_space=pltpu.SMEM)
    else:
        table = table.reshape(b * nq, width)
        table_spec = pl.BlockSpec((None, width), lambda i, j, qi: (i * nq + qi, 0))
    q_ids = pl.BlockSpec((None, block_q, 1), lambda i, j, qi: (i, qi, 0))
    # lax.div, not //: floor division lowers through `sign`, which Mosaic resolves per TPU generation.
    kv_spec = pl.BlockSpec((None, None, n_pad, d), lambda i, j, qi: (i, lax.div(j, g), 0, 0))
    k_ids = pl.BlockSpec((None, nk, 1, block_k), lambda i, j, qi: (i, 0, 0, 0))
    q_spec = pl.BlockSpec((None, None, block_q, d), lambda i, j, qi: (i, j, qi, 0))
    kernel = functools.partial(_kernel, block_k=block_k, scale=d ** -0.5, window=sliding_window, softcap=softcap,
                               num_q_tiles=nq, width=width, scalars_whole=tpu)
    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((b, h, n_pad, d), q.dtype),
        grid=(b, h, nq),
        in_specs=[table_spec, q_ids, q_ids, q_spec, kv_spec, kv_spec, k_ids, k_ids],
        out_specs=q_spec,
        interpret=interpret,
        compiler_params=compiler_params(platform, interpret, 3),
        name="jaxspec_pard_attention",
    )(table, block_ids[:, :, None], positions[:, :, None], qh, kh, vh, key_ids(block_ids), key_ids(positions))
    return out[:, :, :n].transpose(0, 2, 1, 3)


def pard_reference(
    q: Float[Array, "b n h d"],
    k: Float[Array, "b n kv d"],
    v: Float[Array, "b n kv d"],
    block_ids: Int[Array, "b n"],
    positions: Int[Array, "b n"],
    sliding_window: int | None = None,
    softcap: float | None = None,
) -> Float[Array, "b n h d"]:
    """The XLA path: `xla_attention` with an empty cache under the dense `pard_mask`."""
    b, _, _, d = q.shape
    empty = jnp.zeros((b, k.shape[2], 0, d), k.dtype)  # a heads-major cache of no positions
    return xla_attention(q, empty, empty, jnp.zeros((b,), jnp.int32), k, v, pard_mask(block_ids, positions),
                         positions, sliding_window=sliding_window, softcap=softcap)


# `scores`: (sliding_window, softcap), static.
@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _pard_attention(q, k, v, block_ids, positions, scores, options):
    return _forward(q, k, v, block_ids, positions, scores, *options)


def _pard_fwd(q, k, v, block_ids, positions, scores, options):
    return _forward(q, k, v, block_ids, positions, scores, *options), (q, k, v, block_ids, positions)


def _pard_bwd(scores, options, residuals, cotangent):
    q, k, v, block_ids, positions = residuals
    _, vjp = jax.vjp(lambda q, k, v: pard_reference(q, k, v, block_ids, positions, *scores), q, k, v)
    return (*vjp(cotangent), None, None)


_pard_attention.defvjp(_pard_fwd, _pard_bwd)


def pard_attention(
    q: Float[Array, "b n h d"],
    k: Float[Array, "b n kv d"],
    v: Float[Array, "b n kv d"],
    block_ids: Int[Array, "b n"],
    positions: Int[Array, "b n"],
    sliding_window: int | None = None,
    softcap: float | None = None,
    *,
    block_q: int = 128,
    block_k: int = 128,
    interpret: bool | None = None,
    platform: str | None = None,
) -> Float[Array, "b n h d"]:
    """Attention of a whole training sequence under the PARD mask (no KV cache).

    Equals `pard_reference` (the XLA path) on every row that sees at least one key; rows
    that see nothing (padding) are 0. `block_q` / `block_k` are powers of two >= 16.
    Differentiable (see the module docstring). `platform` / `interpret`: see
    `pallas_kernels.backend`.
    """
    return _pard_attention(q, k, v, block_ids, positions, (sliding_window, softcap),
                           (block_q, block_k, interpret, platform))
