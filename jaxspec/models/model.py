"""LLaMA-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3) and Gemma 2 / 3 as Flax NNX modules.

Parameter names follow Hugging Face's (`layers[i].self_attn.q_proj.kernel` is
`model.layers.i.self_attn.q_proj.weight` transposed) so checkpoint I/O is one rule.

The single entry point is `Transformer.__call__(tokens, positions, block_mask, cache)`:
a block of T query tokens at explicit positions, an arbitrary attention relation inside
the block (a dense mask or a `jaxspec.models.masks` spec), the committed cache visible to every
query. It returns float32 logits (or only their argmax, see `head`) and the block's K/V
(`BlockKV`) for the caller to `commit`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jaxtyping import Array, Bool, Float, Int

from jaxspec.models.attention import get_attention
from jaxspec.models.batch_invariant import HEAD_CHUNK, INVARIANT, Numerics, fixed_rows, plain
from jaxspec.models.config import ModelConfig
from jaxspec.models.kv_cache import BlockKV, KVCache
from jaxspec.models.masks import BlockMask
from jaxspec.models.quantize import QUANTIZED, chunked_matmul, piece_channels


class RMSNorm(nnx.Module):
    """RMSNorm; `gemma`: the weight applies as (1 + w), in float32 (Gemma's checkpoints store w so)."""

    def __init__(self, dim: int, eps: float, *, dtype, gemma: bool = False, rngs: nnx.Rngs | None = None):
        self.weight = nnx.Param((jnp.zeros if gemma else jnp.ones)((dim,), dtype))
        self.eps = eps
        self.gemma = gemma

    def __call__(self, x, mean=None):
        # mean: of the last axis, keepdims (`Numerics.mean`; None: jnp.mean's)
        x32 = x.astype(jnp.float32)
        squares = x32 * x32
        mean_square = jnp.mean(squares, axis=-1, keepdims=True) if mean is None else mean(squares)
        x32 = x32 * jax.lax.rsqrt(mean_square + self.eps)
        if self.gemma:
            return (x32 * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return self.weight[...] * x32.astype(x.dtype)


def _linear(n_in, n_out, bias, dtype, rngs):
    return nnx.Linear(n_in, n_out, use_bias=bias, dtype=dtype, param_dtype=dtype, rngs=rngs,
                      kernel_init=nnx.initializers.normal(0.02))


def apply_rope(x: Float[Array, "b t h d"], positions: Int[Array, "b t"], inv_freq: np.ndarray):
    """Rotate-half RoPE (HF layout); angles computed in float32 from integer positions."""
    angles = positions[..., None].astype(jnp.float32) * jnp.asarray(inv_freq, jnp.float32)
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = _linear(d, cfg.num_heads * hd, cfg.qkv_bias, dtype, rngs)
        self.k_proj = _linear(d, cfg.num_kv_heads * hd, cfg.qkv_bias, dtype, rngs)
        self.v_proj = _linear(d, cfg.num_kv_heads * hd, cfg.qkv_bias, dtype, rngs)
        self.o_proj = _linear(cfg.num_heads * hd, d, cfg.o_bias, dtype, rngs)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=dtype, gemma=cfg.gemma)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype=dtype, gemma=cfg.gemma)
        self.cfg = cfg
        self.layer = layer

    def __call__(self, x, positions, block_mask, k_cache, v_cache, cache_lengths, numerics: Numerics):
        cfg, linear = self.cfg, numerics.linear
        b, t, _ = x.shape
        q = linear(self.q_proj, x).reshape(b, t, cfg.num_heads, cfg.head_dim)
        k = linear(self.k_proj, x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        v = linear(self.v_proj, x).reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q, k = self.q_norm(q, numerics.mean), self.k_norm(k, numerics.mean)
        inv_freq = cfg.layer_rope(self.layer).inverse_frequencies(cfg.head_dim)
        q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
        if cfg.query_pre_attn_scalar is not None and cfg.query_pre_attn_scalar != cfg.head_dim:
            # Every backend scales scores by head_dim**-0.5: fold the rest into q.
            q = q * jnp.asarray(math.sqrt(cfg.head_dim / cfg.query_pre_attn_scalar), q.dtype)
        capped = {} if cfg.attn_logit_softcapping is None else {"softcap": cfg.attn_logit_softcapping}
        out = numerics.attention(q, k_cache, v_cache, cache_lengths, k, v, block_mask, positions,
                           sliding_window=cfg.layer_window(self.layer), **capped)
        return linear(self.o_proj, out.reshape(b, t, cfg.num_heads * cfg.head_dim)), k, v


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, dtype, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _linear(d, f, cfg.mlp_bias, dtype, rngs)
        self.up_proj = _linear(d, f, cfg.mlp_bias, dtype, rngs)
        self.down_proj = _linear(f, d, cfg.mlp_bias, dtype, rngs)
        self.gelu = cfg.gemma  # GeGLU with tanh GELU (Gemma) instead of SwiGLU

    def __call__(self, x, linear):
        gate = linear(self.gate_proj, x)
        gate = jax.nn.gelu(gate, approximate=True) if self.gelu else jax.nn.silu(gate)
        return linear(self.down_proj, gate * linear(self.up_proj, x))


class DecoderLayer(nnx.Module):
    """Pre-norm block. HF names: in LLaMA `post_attention_layernorm` is the MLP's input norm; in
    Gemma it normalises the attention output, `pre_feedforward_layernorm` is the MLP's input norm and
    `post_feedforward_layernorm` normalises the MLP output."""

    def __init__(self, cfg: ModelConfig, layer: int, *, dtype, rngs: nnx.Rngs):
        def norm():
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, gemma=cfg.gemma)

        self.input_layernorm = norm()
        self.self_attn = Attention(cfg, layer, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = norm()
        if cfg.gemma:
            self.pre_feedforward_layernorm = norm()
            self.post_feedforward_layernorm = norm()
        self.mlp = MLP(cfg, dtype=dtype, rngs=rngs)
        self.gemma = cfg.gemma

    def __call__(self, x, positions, block_mask, k_cache, v_cache, cache_lengths, numerics: Numerics):
        mean, linear = numerics.mean, numerics.linear
        attn, k, v = self.self_attn(self.input_layernorm(x, mean), positions, block_mask,
                                    k_cache, v_cache, cache_lengths, numerics)
        if self.gemma:
            x = x + self.post_attention_layernorm(attn, mean)
            x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x, mean), linear), mean)
        else:
            x = x + attn
            x = x + self.mlp(self.post_attention_layernorm(x, mean), linear)
        return x, k, v


class LayerStack(nnx.Module):
    """Decoder layers of one structure held as ONE layer whose parameters carry a leading layer
    axis, run by `lax.scan`: XLA compiles one layer's program instead of L unrolled copies.

    On this project's CPU (SmolLM2-135M, 30 layers; docs/performance.md, "Layer scan") a decode
    program then compiles in a fraction of the time and holds a fraction of the memory (an XLA:CPU
    executable keeps ~3 KB per HLO instruction), and every row's numerics are the unrolled stack's
    (the same ops per layer, bit for bit). A float weight is copied out of the stack once per layer
    and step (XLA:CPU cannot feed a dot from a dynamic slice), which costs a one-row step on float
    weights; a kept-quantized weight is converted there anyway. Built by `stack_layers`."""

    def __init__(self, layers):
        graphdef = nnx.graphdef(layers[0])
        states = [nnx.state(layer) for layer in layers]
        self.layer = nnx.merge(graphdef, jax.tree.map(lambda *a: jnp.stack(a), *states))
        self.count = len(layers)

    def __call__(self, x, positions, block_mask, cache: KVCache, numerics: Numerics, keep_hidden: bool):
        """x after every layer; the layers' block K/V ([L, b, t, kv, d] each) and, when
        `keep_hidden`, every layer's output ([L, b, t, d]; else None)."""
        graphdef, stacked = nnx.split(self.layer)

        def one(x, xs):
            state, k_cache, v_cache = xs
            x, k, v = nnx.merge(graphdef, state)(x, positions, block_mask, k_cache, v_cache, cache.lengths,
                                                 numerics)
            return x, (k, v, x if keep_hidden else None)

        x, (ks, vs, hidden) = jax.lax.scan(one, x, (stacked, cache.k, cache.v))
        return x, ks, vs, hidden

    def unstacked(self) -> list:
        """The layers one by one (copies of their slices), as the unrolled stack holds them."""
        graphdef, stacked = nnx.split(self.layer)
        layers = []
        for i in range(self.count):
            layer = nnx.merge(graphdef, jax.tree.map(lambda a: a[i], stacked))
            layer.self_attn.layer = i
            layers.append(layer)
        return layers


def scannable(module: "Transformer") -> str | None:
    """Why `module`'s layers cannot be one `LayerStack` (None: they can): every layer must compute
    alike (one RoPE and one attention window) and hold parameters of one structure and shape."""
    cfg = module.config
    if isinstance(module.layers, LayerStack):
        return None
    if len({(cfg.layer_rope(i), cfg.layer_window(i)) for i in range(cfg.num_layers)}) > 1:
        return "its layers differ in RoPE or attention window"
    first = nnx.graphdef(module.layers[0])
    shapes = jax.tree.map(lambda a: (a.shape, a.dtype), nnx.state(module.layers[0]))
    for i, layer in enumerate(module.layers):
        index, layer.self_attn.layer = layer.self_attn.layer, 0  # (one RoPE and window: the index is unused)
        same = nnx.graphdef(layer) == first and jax.tree.map(lambda a: (a.shape, a.dtype), nnx.state(layer)) == shapes
        layer.self_attn.layer = index
        if not same:
            return f"layer {i} holds parameters of another structure or format than layer 0"
    return None


def stack_layers(module: "Transformer") -> "Transformer":
    """`module` with its layers as one `LayerStack`, in place; returned. Raises ValueError where they
    cannot be (`scannable`)."""
    why = scannable(module)
    if why is not None:
        raise ValueError(f"the layers cannot be scanned: {why}")
    if not isinstance(module.layers, LayerStack):
        module.layers = LayerStack(list(module.layers))
    return module


def unstack_layers(module: "Transformer") -> "Transformer":
    """`module` with its layers one by one again (`LayerStack.unstacked`), in place; returned: what
    is saved, trained or laid out on a mesh."""
    if isinstance(module.layers, LayerStack):
        module.layers = nnx.List(module.layers.unstacked())
    return module


# When only the argmax is wanted, the LM head runs over vocabulary chunks if the forward's float32
# logits would take more than this many bytes ([b, t, vocab]: 490 MB at b 8, t 120, vocab 128256),
# each chunk's logits at most this. Only then: every chunk slices (copies) its rows of the head's
# weight, a copy of the whole head per forward, which costs more than small logits do (SmolLM2-135M's
# greedy step on this project's CPU: 45.8 ms in three chunks, 34.9 ms with its head whole;
# benchmarks/results/vocab_memory.md).
ARGMAX_LOGITS_BYTES = 64 << 20
HEADS = ("logits", "argmax", "none")


@struct.dataclass
class ForwardOutput:
    logits: Float[Array, "b t vocab"] | None  # float32; head="logits" only
    preds: Int[Array, "b t"] | None  # the logits' argmax; head="argmax" only
    final: Float[Array, "b t d"]  # the last norm's output: `Transformer.head_logits` maps it to logits
    block_kv: BlockKV
    # outputs of the layers named in `hidden_layers` (index -1 = last norm input; index
    # num_layers = the final norm's output, HF's hidden_states[-1])
    hidden_states: tuple


class Transformer(nnx.Module):
    """Decoder-only LM. `attention` names the attention backend (see `jaxspec.models.attention`)."""

    def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, attention: str = "xla",
                 rngs: nnx.Rngs, batch_invariant: bool = False):
        self.config = cfg
        self.attention = attention
        # Every row's logits independent of the forward's shape (`jaxspec.models.batch_invariant`).
        self.batch_invariant = batch_invariant
        # The largest L2 norm of a vocabulary entry's head weights (`head_norm_max`), set where the one-row
        # head may take XLA's fast matrix-vector product under batch-invariant numerics (`_argmax_one_row`).
        self.head_norm = None
        # Devices the vocabulary is split over (tensor parallelism sets it: `jaxspec.models.tensor_parallel`);
        # the chunked argmax then chunks within each device's slice (`head_argmax`).
        self.vocab_shards = 1
        self.embed_tokens = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, param_dtype=dtype,
                                      embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, i, dtype=dtype, rngs=rngs) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype=dtype, gemma=cfg.gemma)
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg.hidden_size, cfg.vocab_size, False, dtype, rngs)

    def __call__(
        self,
        tokens: Int[Array, "b t"],
        positions: Int[Array, "b t"],
        block_mask: BlockMask,
        cache: KVCache,
        hidden_layers: tuple[int, ...] = (),
        embed_offset: Float[Array, "b t d"] | None = None,
        head: str = "logits",
    ) -> ForwardOutput:
        """`embed_offset` is added to the token embeddings (PARD-2 drafters add projected
        target features there); `hidden_layers` names layers whose outputs are returned
        (negative: from the last; `num_layers`: the final norm's output, `final`).
        `head`: "logits" (float32 logits), "argmax" (their argmax, `head_argmax`: the logits are
        never materialised) or "none" (only `final`, for a caller that needs a few rows' logits)."""
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        numerics = INVARIANT if self.batch_invariant else plain(get_attention(self.attention))
        x = self.embed_tokens(tokens)
        if self.config.gemma:  # Gemma scales its (tied) embeddings by sqrt(hidden) on the way in
            x = x * jnp.asarray(math.sqrt(self.config.hidden_size), x.dtype)
        if embed_offset is not None:
            x = x + embed_offset.astype(x.dtype)
        n = self.config.num_layers
        if isinstance(self.layers, LayerStack):
            x, ks, vs, stacked = self.layers(x, positions, block_mask, cache, numerics, bool(hidden_layers))
            hidden = {i: stacked[i] for i in range(n)} if hidden_layers else {}
        else:
            ks, vs, hidden = [], [], {}
            for i, layer in enumerate(self.layers):
                x, k, v = layer(x, positions, block_mask, cache.k[i], cache.v[i], cache.lengths, numerics)
                ks.append(k)
                vs.append(v)
                hidden[i] = x
            ks, vs = jnp.stack(ks), jnp.stack(vs)
        x = self.norm(x, numerics.mean)
        return ForwardOutput(
            logits=self.head_logits(x) if head == "logits" else None,
            preds=self.head_argmax(x) if head == "argmax" else None,
            final=x,
            block_kv=BlockKV(k=ks, v=vs),
            hidden_states=tuple(x if i == n else hidden[i % n] for i in hidden_layers),
        )

    def head_logits(self, x: Float[Array, "... d"]) -> Float[Array, "... vocab"]:
        """float32 logits of final states."""
        tied = self.config.tie_word_embeddings
        head = self.embed_tokens if tied else self.lm_head
        w, spec = (head.embedding[...], "...d,vd->...v") if tied else (head.kernel[...], "...d,dv->...v")
        if isinstance(head, QUANTIZED):  # kept quantized (`jaxspec.models.quantize`): converted chunk by chunk
            def product(rows):
                return chunked_matmul(rows, self.config.hidden_size, self.config.vocab_size, head.product(rows))
        else:
            def product(rows):
                return jnp.einsum(spec, rows, w, preferred_element_type=jnp.float32).astype(jnp.float32)
        return self.softcap(fixed_rows(product, x) if self.batch_invariant else product(x))

    def softcap(self, logits):
        """Gemma's final logit soft-capping, cap * tanh(logits / cap), where the config sets it."""
        cap = self.config.final_logit_softcapping
        return logits if cap is None else cap * jnp.tanh(logits / cap)

    def head_argmax(self, x: Float[Array, "... d"], chunk: int | None = None) -> Int[Array, "..."]:
        """`argmax(head_logits(x))`; where the logits of all of `x`'s rows would exceed
        ARGMAX_LOGITS_BYTES, without them: the head runs over vocabulary chunks with a running max.
        Ties go to the lowest id, as `jnp.argmax`'s do (the last chunk is shifted back to end at
        the vocabulary's end; the ids it repeats never win a tie). Chunk size: `argmax_chunk`.

        With the vocabulary split over `vocab_shards` devices (tensor parallelism), the head is
        seen as [vocab_shards, vocab / vocab_shards] and chunked along the second axis, so every
        chunk stays on its device: a chunk that crossed the split would make XLA gather the whole
        head on every device, every step. Each slice's best then meets the others' in one small
        reduction (the first best wins: the lowest id). A head kept quantized (`jaxspec.models.quantize`: int8
        or blocks) is converted chunk by chunk too: chunks are at most `piece_channels` entries. With
        batch-invariant numerics (`jaxspec.models.batch_invariant`) nothing follows the number of rows:
        one device's plain head runs per tile of rows over the whole vocabulary, any other in chunks of
        HEAD_CHUNK entries."""
        vocab, shards = self.config.vocab_size, self.vocab_shards
        part = vocab // shards
        tied = self.config.tie_word_embeddings
        head = self.embed_tokens if tied else self.lm_head
        quantized = isinstance(head, QUANTIZED)
        rows = math.prod(x.shape[:-1])
        w = head.embedding[...] if tied else head.kernel[...]
        if self.batch_invariant and not quantized and shards == 1 and chunk is None:
            if rows == 1 and self.head_norm is not None and w.dtype == jnp.float32:
                return self._argmax_one_row(x, w, tied)
            return self._argmax_by_row_tiles(x, w, tied)
        if self.batch_invariant and chunk is None:  # (a chunk that followed the rows would change the sums)
            chunk = min(HEAD_CHUNK, piece_channels(x.shape[-1])) if quantized else HEAD_CHUNK
        if quantized and chunk is None:
            chunk = min(ARGMAX_LOGITS_BYTES // (4 * max(rows, 1)), piece_channels(x.shape[-1]))
        chunk = argmax_chunk(part, rows, chunk)
        if shards > 1:  # (a quantized model is on one device: `jaxspec.load`)
            w = w.reshape(shards, part, -1) if tied else w.reshape(-1, shards, part)
        # [..., shards, entries]; one device's plain weight is not reshaped (XLA would copy it).
        spec = ("...d,svd->...sv" if tied else "...d,dsv->...sv") if shards > 1 else (
            "...d,vd->...v" if tied else "...d,dv->...v")
        axis = w.ndim - 2 if tied else w.ndim - 1  # the within-slice vocabulary axis

        product = head.product(x) if quantized else None

        def logits(start):
            if quantized and self.batch_invariant:
                out = fixed_rows(lambda rows: head.product(rows)(start, chunk), x)
            elif quantized:
                out = product(start, chunk)
            else:
                piece = w if chunk == part else jax.lax.dynamic_slice_in_dim(w, start, chunk, axis=axis)

                def matmul(rows):
                    return jnp.einsum(spec, rows, piece, preferred_element_type=jnp.float32).astype(jnp.float32)

                out = fixed_rows(matmul, x) if self.batch_invariant else matmul(x)
            # (capped too: tanh is monotone, but logits it saturates to one float tie as the full head's do)
            out = self.softcap(out)
            return out if shards > 1 else out[..., None, :]

        best, best_id = _running_argmax(logits, part, chunk, (*x.shape[:-1], shards))
        if shards == 1:
            return best_id[..., 0]
        winner = jnp.argmax(best, axis=-1)
        return (jnp.take_along_axis(best_id, winner[..., None], axis=-1)[..., 0] + winner * part).astype(jnp.int32)

    def head_norm_max(self) -> float | None:
        """The largest L2 norm of one vocabulary entry's head weights (float32 weights on one device;
        else None), for `_argmax_one_row`'s bound: computed once, from the weights as they are now."""
        tied = self.config.tie_word_embeddings
        head = self.embed_tokens if tied else self.lm_head
        if isinstance(head, QUANTIZED) or self.vocab_shards != 1:
            return None
        w = head.embedding[...] if tied else head.kernel[...]
        if w.dtype != jnp.float32:
            return None
        norms = jnp.sqrt(jnp.sum(jnp.square(w.astype(jnp.float32)), axis=1 if tied else 0))
        return float(jnp.max(norms))

    def _argmax_one_row(self, x: Float[Array, "... d"], w, tied: bool) -> Int[Array, "..."]:
        """Batch-invariant argmax of ONE row on float32 weights, at the speed of XLA's matrix-vector
        product, which is not the tiles' product (`_argmax_by_row_tiles`, the numerics every other
        block shape gets) but differs from it only by rounding: each computes a logit within
        gamma_K * ||x|| * max_v ||w_v|| of the exact one whatever the order of its K adds (the
        standard dot-product bound, gamma_K = K u / (1 - K u); tanh's softcap only shrinks
        differences). Where the top two logits are further apart than both paths' bounds (doubled,
        for the bound's own rounding), the tiles' product has the same unique argmax; otherwise
        (a near-tie, ~2% of SmolLM2's steps) the tiles' product is computed and decides."""
        scores = self._head_scores(x, w, tied)
        best = jnp.argmax(scores, axis=-1).astype(jnp.int32)
        top = jnp.max(scores, axis=-1)
        ids = jax.lax.broadcasted_iota(jnp.int32, scores.shape, scores.ndim - 1)
        second = jnp.max(jnp.where(ids == best[..., None], -jnp.inf, scores), axis=-1)
        k = x.shape[-1]
        u = float(jnp.finfo(jnp.float32).eps) / 2
        gamma = k * u / (1 - k * u)
        norm = jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32)), axis=-1))
        bound = 2 * (2 * gamma * norm * self.head_norm)
        near = ~(top - second > bound)  # (NaN: near)
        return jax.lax.cond(jnp.any(near), lambda: self._argmax_by_row_tiles(x, w, tied), lambda: best)

    def _argmax_by_row_tiles(self, x: Float[Array, "... d"], w, tied: bool) -> Int[Array, "..."]:
        """Batch-invariant numerics, one device, a plain head: tiles of rows over the whole vocabulary.
        No weight copied into chunks, a tile's logits at most ROW_TILE x vocab floats, and nothing
        that follows the number of rows."""
        def tile_argmax(rows):
            return jnp.argmax(self._head_scores(rows, w, tied), axis=-1).astype(jnp.int32)

        return fixed_rows(tile_argmax, x)

    def _head_scores(self, x: Float[Array, "... d"], w, tied: bool) -> Float[Array, "... vocab"]:
        """One device's plain head over the whole vocabulary: float32 logits, capped."""
        return self.softcap(jnp.einsum("...d,vd->...v" if tied else "...d,dv->...v", x, w,
                                       preferred_element_type=jnp.float32).astype(jnp.float32))


def _running_argmax(logits, part: int, chunk: int, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """(best score, its id within the slice) per row and vocabulary slice, `shape`, over the chunks
    of `chunk` ids that cover a slice of `part` ids: `logits(start)` is the float32 scores of ids
    start .. start + chunk - 1 of every slice, [..., slices, chunk]. The last chunk is shifted back
    to end at `part`; a later chunk wins only with a higher score, so ties go to the lowest id."""
    if chunk == part:
        scores = logits(0)
        return jnp.max(scores, axis=-1), jnp.argmax(scores, axis=-1).astype(jnp.int32)

    def body(i, carry):
        best, best_id = carry
        start = jnp.minimum(i * chunk, part - chunk)
        scores = logits(start)
        top = jnp.max(scores, axis=-1)
        better = top > best
        top_id = start + jnp.argmax(scores, axis=-1).astype(jnp.int32)
        return jnp.where(better, top, best), jnp.where(better, top_id, best_id)

    init = (jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.int32))
    return jax.lax.fori_loop(0, _ceil_div(part, chunk), body, init)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def argmax_chunk(vocab: int, rows: int, chunk: int | None = None) -> int:
    """The chunk size `Transformer.head_argmax` uses for `rows` rows: the vocabulary itself where
    `chunk` entries (default: as many as keep the rows' float32 logits within
    ARGMAX_LOGITS_BYTES) cover it, else ceil(vocab / chunk) equal chunks rounded up to a multiple
    of 128 (the last chunk is shifted back and overlaps the one before by less than 128 ids)."""
    if chunk is None:  # (the budget is read at trace time: a benchmark or a test can change it)
        chunk = max(1, ARGMAX_LOGITS_BYTES // (4 * max(rows, 1)))
    if vocab <= chunk:
        return vocab
    align = 128 if chunk >= 128 else 1
    return min(vocab, _ceil_div(_ceil_div(vocab, _ceil_div(vocab, chunk)), align) * align)


def causal_mask(lengths: Int[Array, " b"], t: int) -> Bool[Array, "b t t"]:
    """Causal relation for a right-padded block: token i sees j <= i, padding sees itself only."""
    i = jnp.arange(t)[:, None]
    j = jnp.arange(t)[None, :]
    valid = j[None] < lengths[:, None, None]
    return ((j <= i)[None] & valid) | (i == j)[None]
