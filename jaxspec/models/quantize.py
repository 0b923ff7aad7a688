"""Weights kept quantized, dequantized inside each matmul: int8 weights (`jaxspec.load(..., dtype="int8")`,
`--dtype int8`) and a GGUF's own blocks kept exactly (`dtype="blocks"`, below).

Each weight matrix (the layers' q/k/v/o and MLP projections, the token embeddings, which are the
tied LM head, and an untied LM head) is quantized once, at load, per output channel and
symmetrically: w ~ q * scale with q in [-127, 127] and scale = max|w| / 127 over the channel's
inputs (`quantize_int8`). A matmul computes `(x @ float(q)) * scale`: the scale is applied to the
product's few output values, not to the weight. Activations, norms, biases, the KV cache and the
logits stay float32, so an int8 model is a float32 model with different weights (`activation_dtype`).
Memory: a quarter of float32's for the quantized matrices (plus one float32 per output channel).

The reference for exactness is the quantized model itself: with dtype int8, every decoding method's
output equals int8 greedy decoding's, token for token, except at near-ties of float32 rounding, the
rule float32 has (README, "What lossless means, per dtype"). It is not float32 greedy: quantizing
changes the logits (by `quantize_int8`'s error) and so, at some tokens, the argmax.

How the convert is ordered (measured by `benchmarks/quantized_weights.py` at 1baa28e): XLA:CPU does not fuse an
int8 -> float32 convert into a dot; it writes the converted weight to a temporary buffer first. Its
scheduler then runs every weight's convert before the first dot (they depend on parameters only), so
the temporaries held the whole float32 model at every call (425 MB for SmolLM2-135M's layers, up
to 8x slower than float32). `dequantize_after` ties each convert to the matmul's input, so it runs just
before its dot into a buffer the next convert reuses (a few MB, in cache); a weight whose float32 copy
exceeds DEQUANT_PIECE_BYTES (an LM head: SmolLM2's is 113 MB as float32) is converted in output
chunks inside a loop (`chunked_matmul`), so no program holds a large float32 weight.

Block weights (`dtype="blocks"`, a GGUF file only): a matrix llama.cpp stored in a block format with
one float16 scale d (and offset m) per 32 values (Q8_0, Q4_0, Q5_0: q * d; Q4_1, Q5_1: q * d + m) is kept
as it is stored, its values unpacked to one int8 each, d and m as float32 ([in / 32, out] beside an
[in, out] kernel): 1.25 bytes a weight. `block_factors` finds q from the float32 weights the file
dequantizes to and keeps the matrix only where q * d + m gives them back exactly, in either order of
rounding (q * d is exact: at most 8 bits times float16's 11); `block_dequantize` computes it inside
each matmul, ordered and chunked as int8's convert is. The weights a matmul reads are then the float32
model's bit for bit, so a blocks model is the float32 model (its reference is float32 greedy), at a
third of the memory, and on this project's CPU faster: the dequantizing pass over a block, from
memory, costs less than reading four bytes a weight (docs/performance.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

INT8_MAX = 127
# The largest float32 copy of a weight (or of one chunk of it) a matmul makes: a few MB, so the
# copy stays in cache and its buffer is reused from the allocator, not mapped anew at every call.
DEQUANT_PIECE_BYTES = 4 << 20
DTYPE = "int8"  # the name `jaxspec.load` takes
BLOCKS = "blocks"  # the name `jaxspec.load` takes for a GGUF's block formats kept exactly
BLOCK = 32  # values per scale (and offset) in the block formats kept: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1


def activation_dtype(dtype: str):
    """The dtype of activations, the KV cache and the logits' rounding for a model loaded with
    `dtype`: float32 for int8 or block weights, else the weights' own."""
    return jnp.dtype(jnp.float32 if dtype in (DTYPE, BLOCKS) else dtype)


def module_dtype(module):
    """The dtype of a `jaxspec.Transformer`'s activations and KV cache: its token embeddings' (float32
    where they are int8; an `ExtendedEmbed`'s own rows' dtype)."""
    embed = module.embed_tokens
    dtype = jnp.dtype(embed.embedding.dtype if hasattr(embed, "embedding") else embed.dtype)
    return jnp.dtype(jnp.float32) if dtype == jnp.int8 else dtype


def quantize_int8(w, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(q, scale): int8 `q` and float32 `scale` with w ~ q * scale, one scale per output channel,
    symmetric. `axis` is the axis each scale covers (the inputs): 0 for a kernel [in, out], 1 for an
    embedding table [vocab, d]. A channel of zeros gets scale 1 (q = 0)."""
    w = np.asarray(w, np.float32)
    amax = np.max(np.abs(w), axis=axis)
    scale = np.where(amax > 0, amax / INT8_MAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / np.expand_dims(scale, axis)), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


def dequantize_after(q, x):
    """`q`'s values as x.dtype, converted only once `x` is computed (see the module docstring). The
    int8 values pass through a max with -128 (-127 where x's first value is NaN), which leaves every
    value `quantize_int8` makes as it is, but XLA cannot know that: the convert waits for `x`, and
    inside a decoding loop it is not hoisted out of the loop either (XLA:CPU moves a loop-invariant
    convert out, then every step streams the float32 copy: 4x the weights' memory, slower than float32)."""
    floor = jnp.int8(-INT8_MAX - 1) + jnp.isnan(x.reshape(-1)[0]).astype(jnp.int8)
    return jnp.maximum(q, floor).astype(x.dtype)


def piece_channels(n_in: int, piece_bytes: int | None = None) -> int:
    """How many output channels of `n_in` inputs one float32 piece of at most `piece_bytes` (default
    DEQUANT_PIECE_BYTES, read at trace time) holds."""
    return max(1, (DEQUANT_PIECE_BYTES if piece_bytes is None else piece_bytes) // (4 * n_in))


def _chunk(n_out: int, most: int) -> int:
    """n_out if `most` channels cover it, else ceil(n_out / most) equal chunks rounded up to a
    multiple of 128 (the last one is shifted back to end at n_out)."""
    if n_out <= most:
        return n_out
    pieces = -(-n_out // most)
    size = -(-n_out // pieces)
    return min(n_out, -(-size // 128) * 128 if most >= 128 else size)


def chunked_matmul(x, n_in: int, n_out: int, product, piece_bytes: int | None = None):
    """float32 `x @ W` over x's last axis for a kept-quantized W of `n_in` inputs and `n_out` output
    channels, given `product(start, size)`: x times output channels [start, start + size) of W (`size`
    static, `start` traced). Where W's float32 copy exceeds `piece_bytes`, chunk by chunk of output
    channels in a loop, each chunk's product written in place."""
    chunk = _chunk(n_out, piece_channels(n_in, piece_bytes))
    if chunk == n_out:
        return product(0, n_out)

    def body(i, out):
        start = jnp.minimum(i * chunk, n_out - chunk)
        return jax.lax.dynamic_update_slice_in_dim(out, product(start, chunk), start, axis=out.ndim - 1)

    out = jnp.zeros((*x.shape[:-1], n_out), jnp.float32)
    return jax.lax.fori_loop(0, -(-n_out // chunk), body, out)


def _channels(a, start, size: int, n_out: int, axis: int):
    """Output channels [start, start + size) of `a` along `axis` (all of `a` where they are all)."""
    return a if size == n_out else jax.lax.dynamic_slice_in_dim(a, start, size, axis)


def _int8_product(x, q, scale, transposed: bool):
    n_out = q.shape[0] if transposed else q.shape[1]
    spec, axis = ("...i,oi->...o", 0) if transposed else ("...i,io->...o", 1)

    def product(start, size):
        piece = _channels(q, start, size, n_out, axis)
        s = _channels(scale, start, size, n_out, 0)
        return jnp.einsum(spec, x, dequantize_after(piece, x), preferred_element_type=jnp.float32).astype(jnp.float32) * s

    return product


def int8_matmul(x, q, scale, *, transposed: bool = False, piece_bytes: int | None = None):
    """`x @ (q * scale)` over x's last axis, in float32: `q` int8 [in, out] (`transposed`: [out, in],
    an embedding table's layout), `scale` [out]. A weight whose float32 copy exceeds `piece_bytes` is
    converted chunk by chunk of output channels (`chunked_matmul`)."""
    n_out, n_in = q.shape if transposed else q.shape[::-1]
    return chunked_matmul(x, n_in, n_out, _int8_product(x, q, scale, transposed), piece_bytes)


def block_dequantize(q, scale, offset, x, transposed: bool = False):
    """float32 weights `q * scale + offset`, one scale and offset per BLOCK consecutive inputs: `q` int8
    [in, out] with `scale`/`offset` [in / BLOCK, out], or (`transposed`) [out, in] with [out, in / BLOCK].
    Converted once `x` is computed (`dequantize_after`). Exact: every q * scale of a block format is
    a float32 without rounding (`block_factors` checks it), so the one rounding is the offset's sum,
    fused into a multiply-add or not."""
    w = dequantize_after(q, x)
    if transposed:
        n_out, n_in = w.shape
        return (w.reshape(n_out, n_in // BLOCK, BLOCK) * scale[..., None] + offset[..., None]).reshape(n_out, n_in)
    n_in, n_out = w.shape
    return (w.reshape(n_in // BLOCK, BLOCK, n_out) * scale[:, None] + offset[:, None]).reshape(n_in, n_out)


def _block_product(x, q, scale, offset, transposed: bool):
    n_out = q.shape[0] if transposed else q.shape[1]
    spec, axis = ("...i,oi->...o", 0) if transposed else ("...i,io->...o", 1)

    def product(start, size):
        w = block_dequantize(*(_channels(a, start, size, n_out, axis) for a in (q, scale, offset)), x, transposed)
        return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32).astype(jnp.float32)

    return product


class Int8Linear(nnx.Module):
    """`nnx.Linear` with an int8 kernel [in, out] and a float32 scale per output: y = (x @ q) * scale + b."""

    def __init__(self, kernel: jax.Array, scale: jax.Array, bias: jax.Array | None = None):
        self.kernel = nnx.Param(kernel)
        self.scale = nnx.Param(scale)
        self.bias = None if bias is None else nnx.Param(bias)
        self.in_features, self.out_features = (int(d) for d in kernel.shape)
        self.dtype = jnp.float32

    def product(self, x):
        """`product(start, size)` of `chunked_matmul` for this weight."""
        return _int8_product(x, self.kernel[...], self.scale[...], False)

    def __call__(self, x):
        y = chunked_matmul(x, self.in_features, self.out_features, self.product(x)).astype(x.dtype)
        return y if self.bias is None else y + self.bias[...].astype(x.dtype)


class Int8Embed(nnx.Module):
    """`nnx.Embed` with an int8 table [vocab, d] and a float32 scale per row (a row is the tied LM
    head's output channel): a token's embedding is its row's values times its scale."""

    def __init__(self, embedding: jax.Array, scale: jax.Array):
        self.embedding = nnx.Param(embedding)
        self.scale = nnx.Param(scale)
        self.num_embeddings, self.features = (int(d) for d in embedding.shape)
        self.dtype = jnp.float32

    def product(self, x):
        """`product(start, size)` of `chunked_matmul` for this table as the tied LM head."""
        return _int8_product(x, self.embedding[...], self.scale[...], True)

    def __call__(self, ids):
        rows = jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)
        return rows * jnp.take(self.scale[...], ids, axis=0)[..., None]


class BlockLinear(nnx.Module):
    """`nnx.Linear` whose kernel [in, out] is kept in a block format: int8 values, a float32 scale and
    offset per BLOCK inputs and output ([in / BLOCK, out]); y = x @ (q * scale + offset) + b, the
    float32 kernel's values exactly (`block_dequantize`)."""

    def __init__(self, kernel: jax.Array, scale: jax.Array, offset: jax.Array, bias: jax.Array | None = None):
        self.kernel = nnx.Param(kernel)
        self.scale = nnx.Param(scale)
        self.offset = nnx.Param(offset)
        self.bias = None if bias is None else nnx.Param(bias)
        self.in_features, self.out_features = (int(d) for d in kernel.shape)
        self.dtype = jnp.float32

    def product(self, x):
        """`product(start, size)` of `chunked_matmul` for this weight."""
        return _block_product(x, self.kernel[...], self.scale[...], self.offset[...], False)

    def __call__(self, x):
        y = chunked_matmul(x, self.in_features, self.out_features, self.product(x)).astype(x.dtype)
        return y if self.bias is None else y + self.bias[...].astype(x.dtype)


class BlockEmbed(nnx.Module):
    """`nnx.Embed` whose table [vocab, d] is kept in a block format (scale and offset [vocab, d / BLOCK]):
    a token's embedding is its row dequantized, the float32 table's row exactly."""

    def __init__(self, embedding: jax.Array, scale: jax.Array, offset: jax.Array):
        self.embedding = nnx.Param(embedding)
        self.scale = nnx.Param(scale)
        self.offset = nnx.Param(offset)
        self.num_embeddings, self.features = (int(d) for d in embedding.shape)
        self.dtype = jnp.float32

    def product(self, x):
        """`product(start, size)` of `chunked_matmul` for this table as the tied LM head."""
        return _block_product(x, self.embedding[...], self.scale[...], self.offset[...], True)

    def __call__(self, ids):
        take = lambda a: jnp.take(a[...], ids, axis=0)  # noqa: E731
        q, scale, offset = take(self.embedding), take(self.scale), take(self.offset)
        rows = q.astype(jnp.float32).reshape(*q.shape[:-1], -1, BLOCK) * scale[..., None] + offset[..., None]
        return rows.reshape(q.shape)


QUANTIZED = (Int8Linear, Int8Embed, BlockLinear, BlockEmbed)


def _blocks_to_float(q, scale, offset, axis: int) -> np.ndarray:
    """float32 `q * scale + offset` on the host, one scale and offset per BLOCK values along `axis`
    (exact in either order of rounding: `block_factors`)."""
    scale, offset = (np.repeat(np.asarray(a[...], np.float32), BLOCK, axis=axis) for a in (scale, offset))
    return np.asarray(q[...], np.float32) * scale + offset


def float_table(embed) -> np.ndarray:
    """The token embeddings as a float32 numpy table (dequantized from an `Int8Embed` or a `BlockEmbed`)."""
    if isinstance(embed, BlockEmbed):
        return _blocks_to_float(embed.embedding, embed.scale, embed.offset, axis=1)
    table = np.asarray(embed.embedding[...], np.float32)
    return table * np.asarray(embed.scale[...])[:, None] if isinstance(embed, Int8Embed) else table


def quantized_leaf(path) -> int | None:
    """The axis `quantize_int8` reduces for the parameter at this NNX path (a linear's `kernel`: 0, the
    token `embedding`: 1), or None for parameters that stay float32 (norms, biases)."""
    return {"kernel": 0, "embedding": 1}.get(str(path[-1]))


def placement(scales: dict):
    """The `place` hook of `jaxspec.checkpoint.params.model_from_tensors` for an int8 load: each
    matmul weight quantized as it is read (one float32 tensor on the host at a time), its scale kept
    in `scales` by NNX path for `quantize_model`; every other parameter placed as it is."""

    def place(path, shape, read):
        array = read((slice(None),) * len(shape))
        axis = quantized_leaf(path)
        if axis is None:
            return jax.device_put(array)
        q, scales[tuple(path)] = quantize_int8(array, axis)
        return jax.device_put(q)

    return place


def _replace(module, path, new) -> None:
    """Put `new` where `path` (from `nnx.iter_modules`) is in `module`."""
    parent = module
    for key in path[:-1]:
        parent = parent[key] if isinstance(key, int) else getattr(parent, key)
    setattr(parent, path[-1], new)


def quantize_model(module, scales: dict | None = None):
    """`module` (a `jaxspec.Transformer`) with every `nnx.Linear` replaced by an `Int8Linear` and its
    token embeddings by an `Int8Embed`, in place; returned. Weights that are int8 already (loaded
    through `placement`) take their scales from `scales`; float weights are quantized now."""
    scales = {} if scales is None else scales

    def parts(path, weight, axis):
        if weight.dtype == jnp.int8:
            return weight, jnp.asarray(scales[(*path, "kernel" if axis == 0 else "embedding")])
        q, s = quantize_int8(weight, axis)
        return jnp.asarray(q), jnp.asarray(s)

    for path, sub in list(nnx.iter_modules(module)):
        if isinstance(sub, nnx.Linear):
            kernel, scale = parts(path, sub.kernel[...], 0)
            new = Int8Linear(kernel, scale, None if sub.bias is None else sub.bias[...])
        elif isinstance(sub, nnx.Embed):
            new = Int8Embed(*parts(path, sub.embedding[...], 1))
        else:
            continue
        _replace(module, path, new)
    return module


def block_factors(w, scale, offset, rows_at_once: int = 4096) -> np.ndarray | None:
    """int8 `q` with `w == q * scale + offset` exactly, each scale and offset covering BLOCK consecutive
    values of a row (`w` [rows, cols], `scale`/`offset` [rows, cols / BLOCK]), or None where `w` is not
    of that form. Exact means: every q * scale is a float32 without rounding, and the float32 sum
    with the offset, rounded once (a fused multiply-add) or after the product (the same, the product
    being exact), is w's value. So the dequantized weight is w bit for bit (zeros up to their sign)."""
    w = np.asarray(w, np.float32)
    rows, cols = w.shape
    if cols % BLOCK or scale.shape != (rows, cols // BLOCK) or offset.shape != scale.shape:
        return None
    q = np.empty(w.shape, np.int8)
    for first in range(0, rows, rows_at_once):
        part = slice(first, first + rows_at_once)
        s = np.repeat(np.asarray(scale[part], np.float32), BLOCK, axis=1)
        o = np.repeat(np.asarray(offset[part], np.float32), BLOCK, axis=1)
        with np.errstate(all="ignore"):
            levels = np.where(s != 0, np.rint((w[part] - o) / s), 0.0)
        if not np.all((levels >= -128) & (levels <= 127)):
            return None
        q[part] = levels
        product = levels.astype(np.float64) * s
        if not (np.array_equal(product.astype(np.float32), product)
                and np.array_equal((product + o).astype(np.float32), w[part])
                and np.array_equal(levels.astype(np.float32) * s + o, w[part])):
            return None
    return q


def block_placement(block_scales, kept: dict):
    """The `place` hook of `jaxspec.checkpoint.params.model_from_tensors` for a `dtype="blocks"` load:
    each matmul weight whose checkpoint tensor is in a block format (`block_scales(path)`: its
    (scale, offset) [rows, cols / BLOCK] in the checkpoint's HF layout, or None) is kept as its int8
    values (`block_factors`), its scale and offset put in `kept` by NNX path for `blocks_model`;
    every other parameter (and a weight not exactly of that form) placed as float32."""

    def place(path, shape, read):
        array = read((slice(None),) * len(shape))
        factors = block_scales(path) if quantized_leaf(path) is not None else None
        if factors is not None:
            kernel = str(path[-1]) == "kernel"  # NNX [in, out]: the HF tensor [out, in] transposed
            q = block_factors(array.T if kernel else array, *factors)
            if q is not None:
                kept[tuple(path)] = tuple(jax.device_put(np.ascontiguousarray(a.T if kernel else a))
                                          for a in factors)
                return jax.device_put(np.ascontiguousarray(q.T) if kernel else q)
        return jax.device_put(array)

    return place


def float_model(module):
    """`module` with every `BlockLinear` / `BlockEmbed` back as an `nnx.Linear` / `nnx.Embed` of its
    float32 weights (dequantized: exactly the float32 load's), in place; returned. What a blocks
    model is saved or laid out on a mesh as."""
    for path, sub in list(nnx.iter_modules(module)):
        if isinstance(sub, BlockLinear):
            kernel = _blocks_to_float(sub.kernel, sub.scale, sub.offset, axis=0)
            new = nnx.Linear(sub.in_features, sub.out_features, use_bias=sub.bias is not None, dtype=jnp.float32,
                             param_dtype=jnp.float32, rngs=nnx.Rngs(0))
            new.kernel.set_value(jnp.asarray(kernel))
            if sub.bias is not None:
                new.bias.set_value(sub.bias[...])
        elif isinstance(sub, BlockEmbed):
            new = nnx.Embed(sub.num_embeddings, sub.features, dtype=jnp.float32, param_dtype=jnp.float32,
                            rngs=nnx.Rngs(0))
            new.embedding.set_value(jnp.asarray(float_table(sub)))
        else:
            continue
        _replace(module, path, new)
    return module


def blocks_model(module, kept: dict):
    """`module` (a `jaxspec.Transformer` loaded through `block_placement`) with every weight kept in
    blocks held by a `BlockLinear` / `BlockEmbed`, in place; returned. The others stay float32."""
    for path, sub in list(nnx.iter_modules(module)):
        if isinstance(sub, nnx.Linear) and (*path, "kernel") in kept:
            new = BlockLinear(sub.kernel[...], *kept[(*path, "kernel")], None if sub.bias is None else sub.bias[...])
        elif isinstance(sub, nnx.Embed) and (*path, "embedding") in kept:
            new = BlockEmbed(sub.embedding[...], *kept[(*path, "embedding")])
        else:
            continue
        _replace(module, path, new)
    return module
