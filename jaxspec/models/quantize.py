"""int8 weights (`jaxspec.load(..., dtype="int8")`, `--dtype int8`): every matmul weight kept as int8,
dequantized inside the matmul.

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

How the convert is ordered (measured in `benchmarks/quantized_weights.py`): XLA:CPU does not fuse an
int8 -> float32 convert into a dot; it writes the converted weight to a temporary buffer first. Its
scheduler then runs every weight's convert before the first dot (they depend on parameters only), so
the temporaries held the whole float32 model at every call (425 MB for SmolLM2-135M's layers, up
to 8x slower than float32). `dequantize_after` ties each convert to the matmul's input, so it runs just
before its dot into a buffer the next convert reuses (a few MB, in cache); a weight whose float32 copy
exceeds DEQUANT_PIECE_BYTES (an LM head: SmolLM2's is 113 MB as float32) is converted in output
chunks inside a loop (`int8_matmul`), so no program holds a large float32 weight.
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


def activation_dtype(dtype: str):
    """The dtype of activations, the KV cache and the logits' rounding for a model loaded with
    `dtype`: float32 for int8 weights, else the weights' own."""
    return jnp.dtype(jnp.float32 if dtype == DTYPE else dtype)


def module_dtype(module):
    """The dtype of a `jaxspec.Transformer`'s activations and KV cache: its token embeddings' (float32
    where they are int8)."""
    dtype = jnp.dtype(module.embed_tokens.embedding.dtype)
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


def int8_matmul(x, q, scale, *, transposed: bool = False, piece_bytes: int | None = None):
    """`x @ (q * scale)` over x's last axis, in float32: `q` int8 [in, out] (`transposed`: [out, in],
    an embedding table's layout), `scale` [out]. A weight whose float32 copy exceeds `piece_bytes` is
    converted chunk by chunk of output channels, in a loop, each chunk's product written in place."""
    n_out, n_in = q.shape if transposed else q.shape[::-1]
    spec, axis = ("...i,oi->...o", 0) if transposed else ("...i,io->...o", 1)
    chunk = _chunk(n_out, piece_channels(n_in, piece_bytes))

    def part(start, size):
        piece = q if size == n_out else jax.lax.dynamic_slice_in_dim(q, start, size, axis)
        s = scale if size == n_out else jax.lax.dynamic_slice_in_dim(scale, start, size, 0)
        product = jnp.einsum(spec, x, dequantize_after(piece, x), preferred_element_type=jnp.float32)
        return product.astype(jnp.float32) * s

    if chunk == n_out:
        return part(0, n_out)

    def body(i, out):
        start = jnp.minimum(i * chunk, n_out - chunk)
        return jax.lax.dynamic_update_slice_in_dim(out, part(start, chunk), start, axis=out.ndim - 1)

    out = jnp.zeros((*x.shape[:-1], n_out), jnp.float32)
    return jax.lax.fori_loop(0, -(-n_out // chunk), body, out)


class Int8Linear(nnx.Module):
    """`nnx.Linear` with an int8 kernel [in, out] and a float32 scale per output: y = (x @ q) * scale + b."""

    def __init__(self, kernel: jax.Array, scale: jax.Array, bias: jax.Array | None = None):
        self.kernel = nnx.Param(kernel)
        self.scale = nnx.Param(scale)
        self.bias = None if bias is None else nnx.Param(bias)
        self.in_features, self.out_features = (int(d) for d in kernel.shape)
        self.dtype = jnp.float32

    def __call__(self, x):
        y = int8_matmul(x, self.kernel[...], self.scale[...]).astype(x.dtype)
        return y if self.bias is None else y + self.bias[...].astype(x.dtype)


class Int8Embed(nnx.Module):
    """`nnx.Embed` with an int8 table [vocab, d] and a float32 scale per row (a row is the tied LM
    head's output channel): a token's embedding is its row's values times its scale."""

    def __init__(self, embedding: jax.Array, scale: jax.Array):
        self.embedding = nnx.Param(embedding)
        self.scale = nnx.Param(scale)
        self.num_embeddings, self.features = (int(d) for d in embedding.shape)
        self.dtype = jnp.float32

    def __call__(self, ids):
        rows = jnp.take(self.embedding[...], ids, axis=0).astype(self.dtype)
        return rows * jnp.take(self.scale[...], ids, axis=0)[..., None]


QUANTIZED = (Int8Linear, Int8Embed)


def float_table(embed) -> np.ndarray:
    """The token embeddings as a float32 numpy table (dequantized from an `Int8Embed`)."""
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
        parent = module
        for key in path[:-1]:
            parent = parent[key] if isinstance(key, int) else getattr(parent, key)
        setattr(parent, path[-1], new)
    return module
