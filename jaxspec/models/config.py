"""Model configuration: one frozen dataclass for every supported LLaMA-family architecture.

`ModelConfig.from_hf` reads a Hugging Face `config.json` dict (transformers 4 and 5 layouts)
and `to_hf` writes one that transformers loads as-is.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jaxspec.errors import ConfigError

# HF model_type -> (architecture class name, per-head q/k RMSNorm).
ARCHITECTURES: dict[str, tuple[str, bool]] = {
    "llama": ("LlamaForCausalLM", False),
    "mistral": ("MistralForCausalLM", False),
    "qwen2": ("Qwen2ForCausalLM", False),
    "qwen3": ("Qwen3ForCausalLM", True),
    "gemma2": ("Gemma2ForCausalLM", False),
    "gemma3_text": ("Gemma3ForCausalLM", True),
}
# Gemma's differences from the LLaMA layout (`ModelConfig.gemma`): token embeddings scaled by
# sqrt(hidden), RMSNorm weights applied as (1 + w), a norm after attention and after the MLP
# besides the ones before, GeGLU (tanh GELU) instead of SwiGLU, attention scaled by
# query_pre_attn_scalar**-0.5, and a `layer_types` pattern of sliding-window ("local") and
# full ("global") attention layers, each kind with its own RoPE base (Gemma 3; Gemma 2 has one
# RoPE, soft-caps attention scores and final logits, and no q/k norms).
GEMMA_TYPES = ("gemma2", "gemma3_text")
LAYER_TYPES = ("full_attention", "sliding_attention")
# The layer pattern where a checkpoint does not list it (GGUF files; older HF configs): every
# sixth layer global in Gemma 3, every second in Gemma 2, as llama.cpp and transformers assume.
GEMMA_PATTERNS = {"gemma2": 2, "gemma3_text": 6}

ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters (HF `rope_parameters` / legacy `rope_theta` + `rope_scaling`)."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def inverse_frequencies(self, head_dim: int) -> np.ndarray:
        """Per-pair inverse frequencies [head_dim/2] (float64, folded into the graph as a constant)."""
        inv_freq = 1.0 / (self.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
        if self.rope_type == "linear":
            return inv_freq / self.factor
        if self.rope_type == "llama3":
            # Llama 3.1 scaling: long wavelengths are divided by `factor`, short ones kept,
            # a smooth interpolation in between (same formula as transformers' _compute_llama3_parameters).
            low_wavelen = self.original_max_position_embeddings / self.low_freq_factor
            high_wavelen = self.original_max_position_embeddings / self.high_freq_factor
            wavelen = 2 * math.pi / inv_freq
            scaled = np.where(wavelen > low_wavelen, inv_freq / self.factor, inv_freq)
            smooth = (self.original_max_position_embeddings / wavelen - self.low_freq_factor) / (
                self.high_freq_factor - self.low_freq_factor
            )
            smoothed = (1 - smooth) * scaled / self.factor + smooth * scaled
            is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
            return np.where(is_medium, smoothed, scaled)
        return inv_freq


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only LLaMA-family model. Hashable: safe as a jit static."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = RopeConfig()
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    # Per layer "full_attention" | "sliding_attention" (Gemma 3); () = every layer alike, windowed
    # by `sliding_window` when that is set (Mistral).
    layer_types: tuple[str, ...] = ()
    local_rope: RopeConfig | None = None  # RoPE of sliding-window layers (None: `rope`)
    query_pre_attn_scalar: float | None = None  # attention scale s**-0.5 (None: head_dim**-0.5)
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)
    attn_logit_softcapping: float | None = None  # attention scores likewise (Gemma 2)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None

    def __post_init__(self):
        if self.model_type not in ARCHITECTURES:
            raise ConfigError(
                f"unknown model_type {self.model_type!r}; supported: {', '.join(ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"config field {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for rope in (self.rope, self.local_rope or self.rope):
            if rope.rope_type not in ROPE_TYPES:
                raise ConfigError(
                    f"unsupported rope type {rope.rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
                )
        if self.layer_types:
            if len(self.layer_types) != self.num_layers or set(self.layer_types) - set(LAYER_TYPES):
                raise ConfigError(
                    f"layer_types must name one of {', '.join(LAYER_TYPES)} for each of the "
                    f"{self.num_layers} layers, got {list(self.layer_types)!r}")
            if "sliding_attention" in self.layer_types and not self.sliding_window:
                raise ConfigError("layer_types has sliding_attention layers but sliding_window is not set")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int) or self.sliding_window < 1):
            raise ConfigError(f"sliding_window must be a positive integer or null, got {self.sliding_window!r}")

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.model_type][0]

    @property
    def gemma(self) -> bool:
        """Gemma's layout (see GEMMA_TYPES)."""
        return self.model_type in GEMMA_TYPES

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of `layer` (keys at positions in (p - window, p] are visible to a
        query at p), or None for full attention."""
        if self.layer_types:
            return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None
        return self.sliding_window

    def layer_rope(self, layer: int) -> RopeConfig:
        if self.local_rope is not None and self.layer_window(layer) is not None:
            return self.local_rope
        return self.rope

    @property
    def max_window(self) -> int | None:
        """The widest attention span of any layer (None: some layer sees the whole context)."""
        windows = [self.layer_window(i) for i in range(self.num_layers)]
        return None if None in windows else max(windows)

    @property
    def num_params(self) -> int:
        d, f, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        layer = d * (q + 2 * kv) + q * d + 3 * d * f + 2 * d
        layer += (q + 2 * kv) * self.qkv_bias + d * self.o_bias + (2 * f + d) * self.mlp_bias
        layer += 2 * self.head_dim * self.qk_norm + 2 * d * self.gemma
        return v * d * (1 if self.tie_word_embeddings else 2) + self.num_layers * layer + d

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Parse a Hugging Face `config.json` dict; unsupported features are a ConfigError."""
        hf, model_type = _text_config(hf)
        qk_norm = ARCHITECTURES[model_type][1]
        gemma = model_type in GEMMA_TYPES
        _check_activation(hf, model_type)
        num_heads = _need(hf, "num_attention_heads")
        hidden = _need(hf, "hidden_size")
        head_dim = hf.get("head_dim") or hidden // num_heads
        sliding, layer_types = _attention_windows(hf, model_type)
        qkv_bias, o_bias, mlp_bias = _bias_layout(hf, model_type)

        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            model_type=model_type,
            vocab_size=_need(hf, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_need(hf, "intermediate_size"),
            num_layers=_need(hf, "num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope=_rope_from_hf(hf, "full_attention" if model_type == "gemma3_text" else None),
            local_rope=_rope_from_hf(hf, "sliding_attention") if model_type == "gemma3_text" else None,
            layer_types=layer_types,
            query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)) if gemma else None,
            final_logit_softcapping=(None if hf.get("final_logit_softcapping") is None
                                     else float(hf["final_logit_softcapping"])),
            attn_logit_softcapping=(None if not gemma or hf.get("attn_logit_softcapping") is None
                                    else float(hf["attn_logit_softcapping"])),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
            qk_norm=qk_norm,
            sliding_window=sliding,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos_ids),
            pad_token_id=hf.get("pad_token_id"),
        )

    def to_hf(self) -> dict[str, Any]:
        """A `config.json` dict that transformers loads as the matching *ForCausalLM."""
        rope = _rope_to_hf(self.rope)
        hf: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "gelu_pytorch_tanh" if self.gemma else "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": rope,
            # transformers 4.x reads these two; 5.x reads rope_parameters.
            "rope_theta": self.rope.theta,
            "rope_scaling": None if self.rope.rope_type == "default" else rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": (list(self.eos_token_ids) if len(self.eos_token_ids) > 1
                             else (self.eos_token_ids[0] if self.eos_token_ids else None)),
            "pad_token_id": self.pad_token_id,
            "torch_dtype": "float32",
        }
        if self.model_type in ("llama", "qwen3"):
            hf["attention_bias"] = self.qkv_bias
        if self.model_type == "llama":
            hf["mlp_bias"] = self.mlp_bias
        if self.model_type == "mistral":
            hf["sliding_window"] = self.sliding_window
        if self.model_type in ("qwen2", "qwen3"):
            hf["use_sliding_window"] = False
        if self.gemma:
            hf.update(
                hidden_activation="gelu_pytorch_tanh",
                sliding_window=self.sliding_window,
                layer_types=list(self.layer_types) or ["full_attention"] * self.num_layers,
                query_pre_attn_scalar=_int_if_whole(self.query_pre_attn_scalar or self.head_dim),
                final_logit_softcapping=self.final_logit_softcapping,
                attn_logit_softcapping=self.attn_logit_softcapping,
                attention_bias=False,
            )
        if self.model_type == "gemma3_text":
            local = _rope_to_hf(self.local_rope or self.rope)
            hf.update(rope_parameters={"full_attention": rope, "sliding_attention": local},
                      rope_local_base_freq=local["rope_theta"])  # (4.x)
        return hf


def _need(hf: dict[str, Any], key: str):
    """`hf[key]`; a config.json without it is a ConfigError."""
    if key not in hf:
        raise ConfigError(f"config.json has no {key!r}; add it (see the model's HF card)")
    return hf[key]


def _text_config(hf: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(the text model's config, its model_type): a multimodal Gemma 3 config's nested
    text_config; an architecture jaxspec does not know is a ConfigError."""
    model_type = hf.get("model_type")
    if model_type == "gemma3":  # the multimodal checkpoint's config: its text model's is nested
        text = hf.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError("config.json of model_type 'gemma3' has no text_config; fix or re-download it")
        hf = {**text, "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    if model_type not in ARCHITECTURES:
        raise ConfigError(
            f"unknown model_type {model_type!r} in config.json; supported: {', '.join(ARCHITECTURES)}"
        )
    return hf, model_type


def _check_activation(hf: dict[str, Any], model_type: str) -> None:
    """The MLP activation the architecture needs (Gemma: tanh-approximated GELU, the others:
    SiLU), and causal attention (a bidirectional Gemma is an embedding model)."""
    gemma = model_type in GEMMA_TYPES
    act = hf.get("hidden_activation") or hf.get("hidden_act") if gemma else hf.get("hidden_act", "silu")
    want_act = "gelu_pytorch_tanh" if gemma else "silu"
    if act != want_act:
        raise ConfigError(f"unsupported activation {act!r} in config.json; {model_type} needs {want_act!r}")
    if gemma and hf.get("use_bidirectional_attention"):
        raise ConfigError("use_bidirectional_attention (an embedding model) is not supported: jaxspec decodes causally")


def _attention_windows(hf: dict[str, Any], model_type: str) -> tuple[int | None, tuple[str, ...]]:
    """(the sliding window, Mistral's and Gemma's; Gemma's per-layer types, sliding or full
    attention, from `layer_types` or its pattern); Qwen's use_sliding_window is refused."""
    if model_type in ("qwen2", "qwen3") and hf.get("use_sliding_window"):
        raise ConfigError(
            f"{model_type} with use_sliding_window=true is not supported; set it to false "
            "(released Qwen checkpoints do not use it)"
        )
    sliding = hf.get("sliding_window") if model_type in ("mistral", *GEMMA_TYPES) else None
    layer_types: tuple[str, ...] = ()
    if model_type in GEMMA_TYPES:
        types = hf.get("layer_types")
        if types is None:
            pattern = int(hf.get("sliding_window_pattern") or GEMMA_PATTERNS[model_type])
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(_need(hf, "num_hidden_layers"))]
        layer_types = tuple(types)
    return sliding, layer_types


def _bias_layout(hf: dict[str, Any], model_type: str) -> tuple[bool, bool, bool]:
    """(q/k/v bias, o bias, MLP bias) as in transformers: llama/qwen3 put `attention_bias` on q,
    k, v and o; qwen2 always has q/k/v bias and no o bias; mistral has none."""
    attention_bias = bool(hf.get("attention_bias", False))
    qkv_bias = {"llama": attention_bias, "qwen3": attention_bias, "qwen2": True}.get(model_type, False)
    o_bias = attention_bias if model_type in ("llama", "qwen3") else False
    mlp_bias = bool(hf.get("mlp_bias", False)) if model_type == "llama" else False
    return qkv_bias, o_bias, mlp_bias


def _int_if_whole(x: float) -> int | float:
    return int(x) if float(x).is_integer() else x  # (transformers 5's config checks it is an int)


def _rope_to_hf(rope: RopeConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": rope.rope_type, "rope_theta": rope.theta}
    if rope.rope_type in ("linear", "llama3"):
        out["factor"] = rope.factor
    if rope.rope_type == "llama3":
        out.update(low_freq_factor=rope.low_freq_factor, high_freq_factor=rope.high_freq_factor,
                   original_max_position_embeddings=rope.original_max_position_embeddings)
    return out


def _rope_from_hf(hf: dict[str, Any], kind: str | None = None) -> RopeConfig:
    """The RoPE of a config; `kind` ("full_attention" | "sliding_attention") picks one of Gemma 3's
    two: transformers 5 nests them in `rope_parameters` by layer type; 4.x configs have
    `rope_theta` + `rope_scaling` for global layers and `rope_local_base_freq` for local ones."""
    params = dict(hf.get("rope_parameters") or {})
    if kind is not None and set(params) & set(LAYER_TYPES):
        merged = dict(params.get(kind) or {})
        theta = merged.get("rope_theta", 1_000_000.0 if kind == "full_attention" else 10000.0)
    elif kind == "sliding_attention":
        merged, theta = {}, hf.get("rope_local_base_freq", 10000.0)
    else:
        merged = {**(hf.get("rope_scaling") or {}), **params}
        theta = merged.get("rope_theta", hf.get("rope_theta", 1_000_000.0 if kind else 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ConfigError(
            f"unsupported rope type {rope_type!r} in config.json; supported: {', '.join(ROPE_TYPES)}"
        )
    kwargs: dict[str, Any] = {"theta": float(theta), "rope_type": rope_type}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        if key in merged and merged[key] is not None:
            kwargs[key] = float(merged[key])
    if merged.get("original_max_position_embeddings"):
        kwargs["original_max_position_embeddings"] = int(merged["original_max_position_embeddings"])
    return RopeConfig(**kwargs)
