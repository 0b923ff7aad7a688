"""Tiny GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them.

`write_gguf(path, hf_model, quant)` takes a transformers model (random weights), maps its
tensors to llama.cpp's names, permutes q/k rows for the llama architecture (llama.cpp's
rotary layout), quantizes every 2-D weight with `gguf.quants.quantize` to `quant` (norms
and biases stay F32, as llama.cpp keeps them) and writes the metadata llama.cpp writes.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType

_LAYER = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
# Gemma 3 (llama.cpp's Gemma3Model): four norms per layer, stored as 1 + w.
_GEMMA_LAYER = {**_LAYER, "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(hf_name: str, gemma: bool = False) -> str:
    stem, _, kind = hf_name.rpartition(".")
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{kind}"
    _, _, layer, rest = stem.split(".", 3)
    return f"blk.{layer}.{(_GEMMA_LAYER if gemma else _LAYER)[rest]}.{kind}"


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's rotate-half rows -> interleaved pairs, per head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
    """The per-frequency divisors llama.cpp's LlamaModel.generate_extra_tensors writes for
    Llama 3.1 RoPE scaling (its formula, written out here independently of jaxspec's)."""
    base = rope["rope_theta"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def write_gguf(path: Path, hf_model, quant: Q = Q.F32, *, architecture: str | None = None,
               tokenizer: dict | None = None, tensor_types: dict[str, Q] | None = None) -> Path:
    """Write `hf_model` as llama.cpp would. `tokenizer`: extra metadata (tokenizer.ggml.*) to add;
    `tensor_types`: per-GGUF-name overrides of the quantization type (raw bytes are written as is)."""
    cfg = hf_model.config
    arch = architecture or {"gemma3_text": "gemma3"}.get(cfg.model_type, cfg.model_type)
    gemma = arch in ("gemma2", "gemma3")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if arch in ("qwen3", "gemma2", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    rope = getattr(cfg, "rope_parameters", None) or {}
    if gemma:  # global layers' rope; the file has no local base, layer pattern or attention scale
        w.add_sliding_window(cfg.sliding_window)
        rope = rope.get("full_attention", rope)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(int(quant))
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id if isinstance(cfg.eos_token_id, int) else cfg.eos_token_id[0])
    for key, value in (tokenizer or {}).items():
        _add(w, key, value)

    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(rope, head_dim))

    tied = bool(cfg.tie_word_embeddings)
    for name, tensor in hf_model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        array = tensor.detach().float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            array = llama_cpp_permute(array, cfg.num_attention_heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            array = llama_cpp_permute(array, cfg.num_key_value_heads)
        if gemma and name.endswith("norm.weight"):
            array = array + 1
        gname = gguf_name(name, gemma)
        qtype = (tensor_types or {}).get(gname, quant if array.ndim == 2 else Q.F32)
        if qtype == Q.F32:
            w.add_tensor(gname, array.astype(np.float32))
        elif qtype == Q.F16:
            w.add_tensor(gname, array.astype(np.float16))
        elif qtype in gguf.quants._type_traits:
            w.add_tensor(gname, gguf.quants.quantize(array, qtype), raw_dtype=qtype)  # (shape from the bytes)
        else:  # a type the gguf package cannot (de)quantize: zero bytes of the right size
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((array.shape[0], array.shape[1] // block * size), np.uint8)
            w.add_tensor(gname, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _add(w, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        w.add_array(key, list(value))
