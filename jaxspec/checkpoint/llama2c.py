"""llama2.c legacy (v0) `.bin` checkpoints, e.g. Karpathy's TinyStories models.

Layout: 7 int32 header fields, then float32 arrays (see shared/models/stories260K/README.md).
llama2.c applies RoPE to interleaved pairs; the q/k rows are permuted here into HF's
rotate-half layout so one model implementation serves both (as a row order, `RowPermuted`:
every tensor stays a view of the memory map until a slice of it is read).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxspec.checkpoint.params import RowPermuted
from jaxspec.models.config import ModelConfig, RopeConfig
from jaxspec.errors import CheckpointError

HEADER_FIELDS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")


def interleaved_to_rotate_half(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder each head's output rows from pairs (2i, 2i+1) to halves (i, i + d/2)."""
    out, inp = w.shape
    head_dim = out // n_heads
    return w.reshape(n_heads, head_dim // 2, 2, inp).transpose(0, 2, 1, 3).reshape(out, inp)


def _rotate_half_rows(w: np.ndarray, n_heads: int) -> RowPermuted:
    """`interleaved_to_rotate_half(w, n_heads)`, not materialised."""
    return RowPermuted(w, interleaved_to_rotate_half(np.arange(w.shape[0])[:, None], n_heads)[:, 0])


def read_llama2c(path: Path) -> tuple[ModelConfig, dict[str, np.ndarray | RowPermuted]]:
    path = Path(path)
    size = path.stat().st_size
    if size < 28:
        raise CheckpointError(f"{path} is truncated ({size} bytes, a llama2.c header alone is 28); re-download it")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    header = dict(zip(HEADER_FIELDS, np.frombuffer(raw[:28].tobytes(), dtype="<i4").tolist()))
    if any(header[k] <= 0 for k in HEADER_FIELDS if k != "vocab_size") or header["vocab_size"] == 0:
        raise CheckpointError(f"{path} is not a llama2.c legacy checkpoint (header {header})")
    shared_classifier = header["vocab_size"] > 0
    vocab = abs(header["vocab_size"])
    dim, hidden, layers = header["dim"], header["hidden_dim"], header["n_layers"]
    n_heads, n_kv = header["n_heads"], header["n_kv_heads"]
    if dim % n_heads or n_heads % n_kv:
        raise CheckpointError(f"{path}: inconsistent header (dim={dim}, n_heads={n_heads}, n_kv_heads={n_kv})")
    head_dim = dim // n_heads
    kv_dim = n_kv * head_dim
    shapes = [
        ("embed", (vocab, dim)), ("rms_att", (layers, dim)), ("wq", (layers, dim, dim)),
        ("wk", (layers, kv_dim, dim)), ("wv", (layers, kv_dim, dim)), ("wo", (layers, dim, dim)),
        ("rms_ffn", (layers, dim)), ("w1", (layers, hidden, dim)), ("w2", (layers, dim, hidden)),
        ("w3", (layers, hidden, dim)), ("rms_final", (dim,)),
        ("freq_cis_real", (header["seq_len"], head_dim // 2)), ("freq_cis_imag", (header["seq_len"], head_dim // 2)),
    ]
    if not shared_classifier:
        shapes.append(("wcls", (vocab, dim)))
    needed = 28 + 4 * sum(int(np.prod(s)) for _, s in shapes)
    if raw.size < needed:
        raise CheckpointError(
            f"{path} is truncated: the header describes {needed} bytes, the file has {raw.size}; re-download it"
        )
    arrays, offset = {}, 28
    for name, shape in shapes:
        count = int(np.prod(shape))
        arrays[name] = np.frombuffer(raw, dtype="<f4", count=count, offset=offset).reshape(shape)
        offset += 4 * count

    cfg = ModelConfig(
        model_type="llama", vocab_size=vocab, hidden_size=dim, intermediate_size=hidden,
        num_layers=layers, num_heads=n_heads, num_kv_heads=n_kv, head_dim=head_dim,
        max_position_embeddings=header["seq_len"], rms_norm_eps=1e-5, rope=RopeConfig(theta=10000.0),
        tie_word_embeddings=shared_classifier, bos_token_id=1, eos_token_ids=(2,),
    )
    tensors = {"model.embed_tokens.weight": arrays["embed"], "model.norm.weight": arrays["rms_final"]}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": arrays["rms_att"][i],
            p + "self_attn.q_proj.weight": _rotate_half_rows(arrays["wq"][i], n_heads),
            p + "self_attn.k_proj.weight": _rotate_half_rows(arrays["wk"][i], n_kv),
            p + "self_attn.v_proj.weight": arrays["wv"][i],
            p + "self_attn.o_proj.weight": arrays["wo"][i],
            p + "post_attention_layernorm.weight": arrays["rms_ffn"][i],
            p + "mlp.gate_proj.weight": arrays["w1"][i],
            p + "mlp.down_proj.weight": arrays["w2"][i],
            p + "mlp.up_proj.weight": arrays["w3"][i],
        })
    if not shared_classifier:
        tensors["lm_head.weight"] = arrays["wcls"]
    return cfg, tensors
