"""PARD / PARD-2 parallel drafters: the drafter model, its target-feature projection, and
their on-disk format (`../shared/docs/pard2.md`).

A drafter is a LLaMA-family `Model` that shares the target's tokenizer plus one reserved
mask token: its vocabulary is the target's with the mask appended (mask id = target vocab
size), so no real token can collide with it. Drafts are the argmax over the first
`target_vocab_size` logits. In target-dependent mode (PARD-2) the input embedding at
position t gets `feature_scale * features[t] @ projection` added, where `features[t]` is
the concatenation of the target's hidden states at `target_layers` for token t-1 (zeros
at t = 0). For the input `[x_<n, m_1..m_j]` every mask gets the last real token's feature
h_{n-2} (x_{n-1} is the bonus token, which the target has not run on yet); training uses
the same alignment (`jaxspec.train.pard_batch.feature_index`). The projection has no bias,
so target-independent use is exactly "features = 0", and needs only the drafter.

On disk: an HF folder (config.json with a `"pard"` entry, model.safetensors, tokenizer)
that any LLaMA loader reads, plus `projection.safetensors` (tensor `projection`,
[len(target_layers) * target_hidden_size, hidden_size]) stored apart.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from jaxspec.checkpoint.safetensors_io import read_safetensors, write_safetensors
from jaxspec.config import ModelConfig
from jaxspec.errors import CheckpointError, GenerationError
from jaxspec.loading import Model, load

PROJECTION_FILE = "projection.safetensors"


@dataclasses.dataclass(eq=False)
class Drafter:
    model: Model
    mask_token_id: int
    target_vocab_size: int
    target_layers: tuple[int, ...]  # target layer indices (jaxspec `hidden_layers` convention)
    target_hidden_size: int
    feature_scale: float = 0.02
    draft_len: int = 8  # K the drafter was trained with (the default at decode time)
    projection: Float[Array, "f d"] | None = None  # None: target-independent use only

    @property
    def feature_size(self) -> int:
        return len(self.target_layers) * self.target_hidden_size

    def pard_config(self) -> dict:
        return {"mask_token_id": self.mask_token_id, "target_vocab_size": self.target_vocab_size,
                "target_layers": list(self.target_layers), "target_hidden_size": self.target_hidden_size,
                "feature_scale": self.feature_scale, "draft_len": self.draft_len}

    def check_compatible(self, target: ModelConfig) -> None:
        """A clear error unless this drafter can draft for `target` (same tokenizer/vocabulary)."""
        if self.target_vocab_size != target.vocab_size:
            raise GenerationError(
                f"drafter was trained for a {self.target_vocab_size}-token vocabulary but the target has "
                f"{target.vocab_size}; use a drafter trained with the target's tokenizer")
        if self.projection is not None and self.target_hidden_size != target.hidden_size:
            raise GenerationError(
                f"drafter projection expects target hidden size {self.target_hidden_size}, the target has "
                f"{target.hidden_size}; use target-independent mode or the matching target")
        if max(self.target_layers, default=0) >= target.num_layers:
            raise GenerationError(
                f"drafter reads target layers {list(self.target_layers)} but the target has only "
                f"{target.num_layers}; use target-independent mode or the matching target")

    def save(self, folder: str | os.PathLike, dtype: str = "float32") -> Path:
        folder = self.model.save(folder, dtype=dtype)
        cfg_path = folder / "config.json"
        hf = json.loads(cfg_path.read_text())
        hf["pard"] = self.pard_config()
        cfg_path.write_text(json.dumps(hf, indent=2) + "\n")
        if self.projection is not None:
            import ml_dtypes

            np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
            write_safetensors(folder / PROJECTION_FILE, {"projection": np.asarray(self.projection, np_dtype)})
        return folder


# The paper's target layers in HF `hidden_states` indexing (index 0 = the embeddings, -1 =
# the last layer's output).
PAPER_TARGET_LAYERS = (-1, -8, -16, -24)


def default_target_layers(num_layers: int) -> tuple[int, ...]:
    """The paper's [-1, -8, -16, -24] in jaxspec's `hidden_layers` convention (index i = output
    of layer i): HF index -k is the output of layer num_layers - k. Indices below 0 (a target
    shallower than 24 layers) are clipped to layer 0, then duplicates dropped, ascending:
    a 6-layer target reads layers (0, 5), a 32-layer one (8, 16, 24, 31). (HF's -1 is after
    the final norm; ours is its input — the same information up to a per-channel scale.)"""
    return tuple(sorted({max(num_layers - k, 0) for k in (-i for i in PAPER_TARGET_LAYERS)}))


def embed_offset(projection: Float[Array, "f d"], features: Float[Array, "b t f"], scale: float
                 ) -> Float[Array, "b t d"]:
    """What target-dependent mode adds to the drafter's input embeddings."""
    return scale * jnp.einsum("btf,fd->btd", features.astype(jnp.float32), projection.astype(jnp.float32))


def load_drafter(path: str | os.PathLike, *, dtype: str = "float32", attention: str = "xla",
                 target_independent: bool = False) -> Drafter:
    """A drafter folder (see the module docstring); `target_independent` skips the projection."""
    model = load(path, dtype=dtype, attention=attention)
    folder = Path(model.source)
    try:
        pard = json.loads((folder / "config.json").read_text())["pard"]
    except (OSError, KeyError, json.JSONDecodeError):
        raise CheckpointError(f"{folder} is not a PARD drafter (config.json has no \"pard\" entry); "
                              "train one with `jaxspec train-drafter`") from None
    projection = None
    if not target_independent and (folder / PROJECTION_FILE).exists():
        projection = jnp.asarray(read_safetensors(folder / PROJECTION_FILE)["projection"], jnp.float32)
    drafter = Drafter(model=model, mask_token_id=int(pard["mask_token_id"]),
                      target_vocab_size=int(pard["target_vocab_size"]),
                      target_layers=tuple(int(i) for i in pard["target_layers"]),
                      target_hidden_size=int(pard["target_hidden_size"]),
                      feature_scale=float(pard.get("feature_scale", 0.02)),
                      draft_len=int(pard.get("draft_len", 8)), projection=projection)
    if projection is not None and projection.shape != (drafter.feature_size, model.config.hidden_size):
        raise CheckpointError(f"{folder / PROJECTION_FILE} has shape {projection.shape}, expected "
                              f"{(drafter.feature_size, model.config.hidden_size)}; re-export the drafter")
    if model.config.vocab_size != drafter.target_vocab_size + 1 or drafter.mask_token_id != drafter.target_vocab_size:
        raise CheckpointError(f"{folder}: a drafter's vocabulary is the target's plus one mask token "
                              f"(mask id = {drafter.target_vocab_size}); got vocab {model.config.vocab_size}, "
                              f"mask id {drafter.mask_token_id}")
    return drafter
