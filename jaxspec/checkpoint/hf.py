"""Hugging Face checkpoint folders: `config.json` + `model.safetensors` (or a sharded index)."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from jaxspec.checkpoint.params import tensors_from_model
from jaxspec.checkpoint.safetensors_io import read_safetensors, write_safetensors
from jaxspec.models.config import ModelConfig
from jaxspec.errors import CheckpointError
from jaxspec.models.model import Transformer

INDEX = "model.safetensors.index.json"
WEIGHTS = "model.safetensors"
EMBED_NAME = "model.embed_tokens.weight"
# Beside a drafter's weights (ours, and ours exported in the authors' layout): its draft_vocab ids
# and/or the mask embedding row (a drafter sharing the target's embeddings).
DRAFT_FILE = "draft.safetensors"


def read_draft_vocab(folder: Path) -> np.ndarray | None:
    """A drafter folder's draft_vocab ids (int32), or None when it drafts over every id."""
    path = Path(folder) / DRAFT_FILE
    if not path.exists() or "draft_vocab" not in (draft := read_safetensors(path)):
        return None
    return np.asarray(draft["draft_vocab"], np.int32)


def read_config(folder: Path) -> ModelConfig:
    path = Path(folder) / "config.json"
    if not path.exists():
        raise CheckpointError(f"{folder} has no config.json; pass an HF model folder or a llama2.c .bin file")
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}); fix or re-download it") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start}); "
                              "fix or re-download it") from None
    if not isinstance(hf, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(hf), "null")
        raise CheckpointError(f"{path} holds a JSON {kind}, not an object of model settings "
                              "(e.g. {\"model_type\": \"llama\", ...}); fix or re-download it")
    return ModelConfig.from_hf(hf)


# A multimodal checkpoint (Gemma 3 4B+, `Gemma3ForConditionalGeneration`) nests its language model
# under one of these prefixes (transformers 5, 4.x); its vision tower and projector are not ours.
_TEXT_MODEL_PREFIXES = ("model.language_model.", "language_model.model.")
_NOT_TEXT_MODEL = ("model.vision_tower.", "model.multi_modal_projector.", "vision_tower.", "multi_modal_projector.")


def text_model_tensors(tensors: dict) -> dict:
    """The language model's tensors under their text-only names (`model.layers...`, `lm_head`)."""
    if not any(name.startswith(_TEXT_MODEL_PREFIXES) for name in tensors):
        return tensors
    out = {}
    for name, tensor in tensors.items():
        if name.startswith(_NOT_TEXT_MODEL):
            continue
        for prefix in _TEXT_MODEL_PREFIXES:
            if name.startswith(prefix):
                name = "model." + name[len(prefix):]
        out[name.replace("language_model.lm_head.", "lm_head.")] = tensor
    return out


def read_tensors(folder: Path) -> dict[str, np.ndarray]:
    return text_model_tensors(_read_all_tensors(Path(folder)))


def _read_all_tensors(folder: Path) -> dict[str, np.ndarray]:
    if (folder / INDEX).exists():
        try:
            weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{folder / INDEX} is malformed ({e}); re-download it") from None
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).exists():
                raise CheckpointError(f"{folder}: shard {shard} named in {INDEX} is missing; re-download it")
            tensors.update(read_safetensors(folder / shard))
        return tensors
    if (folder / WEIGHTS).exists():
        return read_safetensors(folder / WEIGHTS)
    raise CheckpointError(
        f"{folder} has no {WEIGHTS} or {INDEX}; only safetensors weights are supported "
        "(convert .bin/.pt weights with transformers' save_pretrained(safe_serialization=True))"
    )


def save_hf_folder(model: Transformer, folder: Path, *, dtype: str = "float32", tokenizer=None) -> Path:
    """Write config.json + model.safetensors that `transformers.AutoModelForCausalLM` loads as-is."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    write_safetensors(folder / WEIGHTS, tensors_from_model(model, np_dtype))
    hf = model.config.to_hf()
    hf["torch_dtype"] = hf["dtype"] = dtype
    (folder / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(folder)
    return folder
