"""GGUF checkpoints (llama.cpp's format): metadata -> `ModelConfig`, tensors -> HF-named arrays.

Read with the `gguf` package (llama.cpp's own reader); every quantized tensor is dequantized
by `gguf.quants.dequantize`, one tensor at a time, when the model asks for it, so host
memory peaks at about one float32 tensor beyond the loaded model. A tensor-parallel load
asks for slices: quantized data is blocked along each row (an HF [out, in] weight's input
dimension), every block independent, so a slice dequantizes only its rows and the blocks
that cover its columns.

llama.cpp's converter permutes the rows of q_proj/k_proj for llama-architecture files (its
rotary embedding pairs adjacent features, HF's pairs the two halves); `unpermute` undoes
it as transformers' GGUF loader does (applied lazily as a row order, `RowPermuted`, so a
slice of heads reads only those heads' rows). qwen2/qwen3 files are written unpermuted.

Gemma 2 and 3 files (`gemma2`, `gemma3`) differ: llama.cpp's converter stores every RMSNorm weight as 1 + w
(its norm multiplies by the weight alone), so one is subtracted back (`Shifted`), as
transformers' loader does; the layer pattern (every sixth layer global in Gemma 3, every second in Gemma 2) and Gemma 3's
local RoPE base (10000) are not in the file: llama.cpp's own constants for the architecture are used.
"""

from __future__ import annotations

import functools
import mmap
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxspec.checkpoint.params import Index, RowPermuted, full_index
from jaxspec.models.config import ARCHITECTURES, GEMMA_PATTERNS, ModelConfig, RopeConfig
from jaxspec.errors import CheckpointError

# general.architecture -> ModelConfig.model_type
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                      "gemma2": "gemma2", "gemma3": "gemma3_text"}

# llama.cpp tensor names -> HF names ({i} is the layer index).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma's four norms per layer (`jaxspec.models.model.DecoderLayer`).
_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
# Tensors llama.cpp writes that hold no weights of ours: `rope_freqs` is read into the config.
_NOT_WEIGHTS = ("rope_freqs.weight",)


@functools.cache
def _reader_class():
    import gguf

    class Reader(gguf.GGUFReader):
        """`gguf.GGUFReader` reading through a plain array view of its memory map: the reader
        slices the file once per metadata value (a 262,144-token vocabulary is ~800k slices),
        and a `np.memmap` slice costs several times a plain one (`__array_finalize__`): Gemma 3
        270M's metadata 8.6 -> 2.7 s on this project's CPU, the same fields and tensors. The
        view keeps the map open."""

        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray)
            self.map = getattr(value, "_mmap", None)  # (`release`)

        def release(self) -> None:
            """Drop the file's pages from this process's resident memory once the weights are read
            (SmolLM2's 110 MB): the map stays open for what still views it (metadata arrays), a page
            touched again is read again (`madvise(MADV_DONTNEED)` on a read-only file map)."""
            advice = getattr(mmap, "MADV_DONTNEED", None)
            if self.map is not None and advice is not None:
                try:
                    self.map.madvise(advice)
                except (OSError, ValueError):  # (a closed map, a platform without it: only memory is at stake)
                    pass

    return Reader


def open_gguf(path: Path):
    """A `gguf.GGUFReader` over the memory-mapped file; any read failure is one CheckpointError."""
    path = Path(path)
    try:
        return _reader_class()(path)
    except Exception as e:  # the reader raises ValueError, struct/index errors, etc. on bad files
        reason = str(e) or type(e).__name__
        if path.stat().st_size < 24:
            reason = f"{path.stat().st_size} bytes, shorter than a GGUF header"
        raise CheckpointError(f"{path} is not a readable GGUF file ({reason}); re-download or re-convert it") from None


def read_metadata(reader) -> dict[str, Any]:
    """Every metadata field as a Python value (strings, numbers, lists)."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = field.contents()
        except Exception as e:  # a field cut off by truncation
            raise CheckpointError(f"GGUF metadata field {key!r} cannot be read ({e}); the file is damaged") from None
    return out


def hf_tensor_name(gguf_name: str, gemma: bool = False) -> str | None:
    """The HF name of a llama.cpp tensor name (None for a name we do not know)."""
    m = _LAYER.match(gguf_name)
    if m:
        layer, part, kind = m.groups()
        names = _GEMMA_LAYER_NAMES if gemma else _LAYER_NAMES
        return f"model.layers.{layer}.{names[part]}.{kind}" if part in names else None
    stem, _, kind = gguf_name.rpartition(".")
    return f"{_GLOBAL_NAMES[stem]}.{kind}" if stem in _GLOBAL_NAMES else None


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: within each head, rows (0, d/2, 1, d/2+1, ...) -> (0..d)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def config_from_gguf(meta: Mapping[str, Any], tensors: Mapping[str, Any], source: str) -> ModelConfig:
    """The ModelConfig a GGUF file describes (`tensors`: its tensor infos by name)."""
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"{source}: GGUF architecture {arch!r} is not supported; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    model_type = GGUF_ARCHITECTURES[arch]

    def need(key):
        full = f"{arch}.{key}"
        if full not in meta:
            raise CheckpointError(f"{source}: GGUF metadata has no {full!r}; the file is incomplete")
        return meta[full]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length")
                   or meta.get(f"{arch}.rope.dimension_count") or hidden // heads)
    if "token_embd.weight" not in tensors:
        raise CheckpointError(f"{source}: GGUF file has no token_embd.weight tensor")
    vocab = int(meta.get(f"{arch}.vocab_size") or tensors["token_embd.weight"].shape[-1])

    def has(part: str, kind: str) -> bool:
        return f"blk.0.{part}.{kind}" in tensors

    eos = meta.get("tokenizer.ggml.eos_token_id")
    stops = [eos, meta.get("tokenizer.ggml.eot_token_id"), meta.get("tokenizer.ggml.eom_token_id")]
    eos_ids = tuple(dict.fromkeys(int(t) for t in stops if t is not None))
    bos, pad = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.padding_token_id")
    gemma: dict[str, Any] = {}
    if model_type in GEMMA_PATTERNS:
        layers, pattern = int(need("block_count")), GEMMA_PATTERNS[model_type]
        caps = {key: None if meta.get(f"{arch}.{key}") is None else float(meta[f"{arch}.{key}"])
                for key in ("final_logit_softcapping", "attn_logit_softcapping")}
        gemma = dict(
            layer_types=tuple("full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                              for i in range(layers)),
            # llama.cpp: 1/sqrt(head_dim), except the 27B models (Gemma 2: 46 layers, Gemma 3: 62):
            # 1/sqrt(hidden / heads).
            query_pre_attn_scalar=float(hidden // heads if layers in (46, 62) else head_dim),
            **caps,
        )
        if model_type == "gemma3_text":
            gemma["local_rope"] = RopeConfig(theta=10000.0)
    sliding = meta.get(f"{arch}.attention.sliding_window") if model_type in ("mistral", *GEMMA_PATTERNS) else None
    return ModelConfig(
        model_type=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=int(meta.get(f"{arch}.context_length", 2048)),
        rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope=_rope(meta, arch, tensors, head_dim, source),
        tie_word_embeddings="output.weight" not in tensors,
        qkv_bias=has("attn_q", "bias"),
        o_bias=has("attn_output", "bias"),
        mlp_bias=has("ffn_up", "bias"),
        qk_norm=ARCHITECTURES[model_type][1],
        sliding_window=None if sliding is None else int(sliding),
        **gemma,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos_ids,
        pad_token_id=None if pad is None else int(pad),
    )


def _rope(meta: Mapping[str, Any], arch: str, tensors: Mapping[str, Any], head_dim: int, source: str) -> RopeConfig:
    theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        return RopeConfig(theta=theta, rope_type="linear", factor=float(meta[f"{arch}.rope.scaling.factor"]))
    if scaling not in ("none", None):
        raise CheckpointError(f"{source}: GGUF rope scaling {scaling!r} is not supported (only linear and llama3)")
    if "rope_freqs.weight" not in tensors:
        return RopeConfig(theta=theta)
    # Llama 3.1+ long-context rope: llama.cpp stores the per-frequency divisors, not the formula's
    # parameters. Recover them (low/high frequency factors 1 and 4, as every Llama 3.x release
    # uses): `factor` is the largest divisor; the original context length follows from any
    # divisor in the smooth band; then the formula must give back every divisor.
    factors = _dequantize(tensors["rope_freqs.weight"]).reshape(-1).astype(np.float64)
    base = RopeConfig(theta=theta).inverse_frequencies(head_dim)
    factor, low, high = float(factors.max()), 1.0, 4.0
    wavelen = 2 * np.pi / base
    smooth_band = (factors > 1 + 1e-6) & (factors < factor * (1 - 1e-6)) if factors.shape == base.shape else []
    if np.any(smooth_band):
        i = int(np.argmax(smooth_band))
        smooth = (1 / factors[i] - 1 / factor) / (1 - 1 / factor)
        original = float(wavelen[i] * (low + smooth * (high - low)))
    else:  # no frequency in the band: any length between the two regimes gives these divisors
        original = float(wavelen[factors >= factor * (1 - 1e-6)].min()) * low if factors.shape == base.shape else 0.0
    if factor > 1 and original >= 1:
        cand = RopeConfig(theta=theta, rope_type="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
                          original_max_position_embeddings=int(round(original)))
        if np.allclose(base / cand.inverse_frequencies(head_dim), factors, rtol=1e-3):
            return cand
    raise CheckpointError(f"{source}: the file's rope_freqs do not follow the llama3 rope formula; not supported")


def _dequantize(tensor) -> np.ndarray:
    return _dequantize_part(tensor, full_index(tensor.shape))


def _dequantize_part(tensor, index: Index) -> np.ndarray:
    """float32 `W[index]` of a GGUF tensor W (HF layout), dequantizing only what `index` covers:
    its rows (slices or row ids) and, along the last dimension, the quantization blocks that
    hold its columns (each block carries its own scales: alone, it dequantizes to the same floats)."""
    import gguf

    index = tuple(index) + (slice(None),) * (len(tensor.shape) - len(index))
    data, cut = tensor.data, slice(None)
    if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        data = data[index]
    else:  # the last dimension is bytes: `type_size` of them per block of `block` values
        block, type_size = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
        columns = int(tensor.shape[0])
        start, stop, step = index[-1].indices(columns) if isinstance(index[-1], slice) else (0, columns, 1)
        first, last = start // block * block, max(start, -(-stop // block) * block)
        data = data[(*index[:-1], slice(first // block * type_size, last // block * type_size))]
        cut = slice(start - first, stop - first, step) if isinstance(index[-1], slice) else index[-1]
    try:
        array = gguf.quants.dequantize(np.ascontiguousarray(data), tensor.tensor_type)
    except NotImplementedError:
        raise CheckpointError(
            f"GGUF tensor {tensor.name!r} has quantization type {tensor.tensor_type.name}, which the gguf "
            "package cannot dequantize; re-quantize the model (e.g. Q8_0, Q4_K_M) or use F16"
        ) from None
    return np.asarray(array, np.float32).reshape(*data.shape[:-1], -1)[..., cut]


def _block_formats():
    """The block formats `dtype="blocks"` keeps: one float16 scale d (and offset m) at the start of every
    block of 32 values, the values q * d (+ m) (ggml's Q8_0, Q4_0, Q5_0; Q4_1, Q5_1 with m)."""
    import gguf

    q = gguf.GGMLQuantizationType
    return {q.Q8_0: False, q.Q4_0: False, q.Q5_0: False, q.Q4_1: True, q.Q5_1: True}


class GGUFTensor:
    """One GGUF tensor in HF layout: `.shape` without reading; `.read(index)` dequantizes that part."""

    def __init__(self, info):
        self.info, self.shape = info, tuple(int(d) for d in reversed(info.shape))

    def read(self, index: Index) -> np.ndarray:
        return _dequantize_part(self.info, index)

    def block_scales(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(scale, offset), float32 [rows, columns / 32]: each block's d and m (0 where the format has
        none), for a 2-D tensor in one of `_block_formats`; None for any other tensor."""
        import gguf

        with_offset = _block_formats().get(self.info.tensor_type)
        if with_offset is None or len(self.shape) != 2:
            return None
        block, type_size = gguf.GGML_QUANT_SIZES[self.info.tensor_type]
        data = np.asarray(self.info.data).reshape(self.shape[0], self.shape[1] // block, type_size)
        scale = np.ascontiguousarray(data[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
        offset = (np.ascontiguousarray(data[..., 2:4]).view(np.float16)[..., 0].astype(np.float32) if with_offset
                  else np.zeros_like(scale))
        return scale, offset

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.read(full_index(self.shape)), dtype)


class Shifted:
    """`base + shift` (Gemma's norm weights, stored by llama.cpp as 1 + w)."""

    def __init__(self, base, shift: float):
        self.base, self.shift, self.shape = base, shift, tuple(base.shape)

    def read(self, index: Index) -> np.ndarray:
        return self.base.read(index) + np.float32(self.shift)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.read(full_index(self.shape)), dtype)


def _unpermuted_rows(rows: int, heads: int) -> np.ndarray:
    """The row order `unpermute` gives: row i of the HF tensor is row `order[i]` of llama.cpp's."""
    return unpermute(np.arange(rows), heads)


class GGUFTensors(Mapping):
    """HF-named float32 tensors in HF layout (`GGUFTensor`, `RowPermuted` for llama q/k),
    dequantized when read: whole (`np.asarray`, one at a time) or a slice (`.read(index)`)."""

    def __init__(self, reader, config: ModelConfig, source: str):
        import gguf

        supported = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, *gguf.quants._type_traits}
        self._config, self._reader = config, reader
        self._by_hf: dict[str, Any] = {}
        for t in reader.tensors:
            if t.name in _NOT_WEIGHTS:
                continue
            name = hf_tensor_name(t.name, config.gemma)
            if name is None:
                raise CheckpointError(f"{source}: unexpected GGUF tensor {t.name!r} for a {config.model_type} model")
            if t.tensor_type not in supported:  # fail before dequantizing anything
                raise CheckpointError(
                    f"{source}: GGUF tensor {t.name!r} has quantization type {t.tensor_type.name}, which the "
                    "gguf package cannot dequantize; re-quantize the model (e.g. Q8_0, Q4_K_M) or use F16")
            self._by_hf[name] = t
        self._permuted = config.model_type in ("llama", "mistral")

    def __getitem__(self, name: str):
        tensor = GGUFTensor(self._by_hf[name])
        if self._config.gemma and name.endswith("norm.weight"):
            return Shifted(tensor, -1.0)
        if self._permuted and name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
            cfg = self._config
            heads = cfg.num_heads if ".q_proj." in name else cfg.num_kv_heads
            return RowPermuted(tensor, _unpermuted_rows(tensor.shape[0], heads))
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_hf)

    def __len__(self) -> int:
        return len(self._by_hf)

    def release(self) -> None:
        """The weights are read: the file's pages leave this process's memory (`Reader.release`)."""
        self._reader.release()


def read_gguf(path: Path) -> tuple[ModelConfig, GGUFTensors, dict[str, Any]]:
    """(config, lazily dequantized HF-named tensors, metadata) of a GGUF file."""
    source = str(path)
    reader = open_gguf(path)
    meta = read_metadata(reader)
    infos = {t.name: t for t in reader.tensors}
    config = config_from_gguf(meta, infos, source)
    return config, GGUFTensors(reader, config, source), meta
