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

A draft vocabulary (FR-Spec, Zhao et al. 2025) restricts the drafter's head to V' token ids
(`draft_vocab`, the most frequent target tokens of its training data): it drafts only those,
the target still verifies over its full vocabulary, so outputs are unchanged (when sampling,
the drafter's q is zero outside V', which speculative sampling handles exactly).

On disk: an HF folder (config.json with a `"pard"` entry, model.safetensors, tokenizer)
that any LLaMA loader reads, plus `projection.safetensors` (tensor `projection`,
[len(target_layers) * target_hidden_size, hidden_size]) stored apart. A drafter whose token
embeddings are the target's (`shared_embeddings`, trained frozen) stores neither them nor a
tokenizer: `draft.safetensors` holds the mask token's embedding row (and `draft_vocab`), and
`load_drafter(folder, target=model)` takes the rest from the target.

The authors' own drafter folders (AMD-AGI/PARD: `amd/PARD-*`, `amd/PARD2-*`, a plain HF model
whose config.json has `pard_token` / `spd_type`) load through the same `load_drafter`, mapped
onto this format at load time, and `Drafter.save(folder, format="pard")` writes that layout
(`jaxspec.checkpoint.pard_format`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from jaxspec.checkpoint.hf import DRAFT_FILE, EMBED_NAME, WEIGHTS, read_config, read_draft_vocab, save_hf_folder
from jaxspec.checkpoint.pard_format import export_pard, is_amd_folder, read_amd_drafter
from jaxspec.checkpoint.params import full_index, model_from_tensors
from jaxspec.checkpoint.safetensors_io import read_safetensors, write_safetensors
from jaxspec.models.config import ModelConfig
from jaxspec.errors import CheckpointError, GenerationError
from jaxspec.checkpoint.loading import DTYPES, Model, load
from jaxspec.models.extended_embed import ExtendedEmbed
from jaxspec.models.quantize import float_table

PROJECTION_FILE = "projection.safetensors"


@dataclasses.dataclass(eq=False)
class Drafter:
    model: Model
    mask_token_id: int
    target_vocab_size: int
    # target layer indices (jaxspec `hidden_layers` convention: i = output of layer i; the
    # target's num_layers = its final norm's output, HF's hidden_states[-1])
    target_layers: tuple[int, ...]
    target_hidden_size: int
    feature_scale: float = 0.02
    draft_len: int = 8  # K the drafter was trained with (the default at decode time)
    projection: Float[Array, "f d"] | None = None  # None: target-independent use only
    draft_vocab: Int[Array, " v"] | None = None  # the token ids the head covers (None: the whole vocabulary)
    shared_embeddings: bool = False  # token embeddings are the target's (stored once, in the target)

    @property
    def draft_vocab_size(self) -> int:
        return self.target_vocab_size if self.draft_vocab is None else int(self.draft_vocab.shape[0])

    def draft_head(self) -> Float[Array, "v d"] | None:
        """The head's rows for the draft vocabulary (None: the full head is used), computed once."""
        if self.draft_vocab is None:
            return None
        if getattr(self, "_head", None) is None:
            module = self.model.module
            if isinstance(module.embed_tokens, ExtendedEmbed):  # (the target's table: its rows, as a lookup reads them)
                self._head = module.embed_tokens(self.draft_vocab)
                return self._head
            table, tied = _head_table(module)
            # One jitted gather: eagerly, the rows cost each process ~0.17 s of compiling (SmolLM2's
            # drafter); jitted, once `compile_cache.enable()` is on, JAX's persistent cache holds it.
            self._head = _head_rows_jit(table, self.draft_vocab, tied=tied)
        return self._head

    @property
    def feature_size(self) -> int:
        return len(self.target_layers) * self.target_hidden_size

    def pard_config(self) -> dict:
        return {"mask_token_id": self.mask_token_id, "target_vocab_size": self.target_vocab_size,
                "target_layers": list(self.target_layers), "target_hidden_size": self.target_hidden_size,
                "feature_scale": self.feature_scale, "draft_len": self.draft_len,
                "draft_vocab_size": self.draft_vocab_size, "shared_embeddings": self.shared_embeddings}

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
        if max(self.target_layers, default=0) > target.num_layers:
            raise GenerationError(
                f"drafter reads target layers {list(self.target_layers)} but the target has only "
                f"{target.num_layers}; use target-independent mode or the matching target")

    def save(self, folder: str | os.PathLike, dtype: str = "float32", format: str = "jaxspec",
             target=None) -> Path:
        """Write the drafter: `format="jaxspec"` (this module's format) or `"pard"`, the authors'
        layout (`jaxspec.checkpoint.pard_format.export_pard`; `target`, the Model it drafts for, names the
        target layers in HF's indexing)."""
        import ml_dtypes

        if format == "pard":
            return export_pard(self, folder, target=target, dtype=dtype)
        if format != "jaxspec":
            raise CheckpointError(f"drafter format must be \"jaxspec\" or \"pard\", got {format!r}")
        np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
        if self.shared_embeddings:  # everything but the target's embedding rows (and its tokenizer)
            folder = save_hf_folder(self.model.module, folder, dtype=dtype)
            tensors = read_safetensors(folder / WEIGHTS)
            embedding = tensors.pop(EMBED_NAME)
            write_safetensors(folder / WEIGHTS, tensors)
            draft = {"mask_embedding": np.asarray(embedding[self.mask_token_id:], np_dtype)}
        else:
            folder = self.model.save(folder, dtype=dtype)
            draft = {}
        if self.draft_vocab is not None:
            draft["draft_vocab"] = np.asarray(self.draft_vocab, np.int32)
        if draft:
            write_safetensors(folder / DRAFT_FILE, draft)
        cfg_path = folder / "config.json"
        hf = json.loads(cfg_path.read_text())
        hf["pard"] = self.pard_config()
        cfg_path.write_text(json.dumps(hf, indent=2) + "\n")
        if self.projection is not None:
            write_safetensors(folder / PROJECTION_FILE, {"projection": np.asarray(self.projection, np_dtype)})
        return folder


def head_rows(module, vocab: Int[Array, " v"]) -> Float[Array, "v d"]:
    """The LM head's rows for the ids `vocab` (the tied embedding's rows, or the untied head's
    columns): the head of a draft vocabulary, in training and at decode time."""
    table, tied = _head_table(module)
    return _head_rows(table, vocab, tied=tied)


def _head_table(module) -> tuple[Array, bool]:
    """The LM head's weights as stored (the tied embedding [v, d] or the head's kernel [d, v]),
    and whether they are tied."""
    tied = module.config.tie_word_embeddings
    return (module.embed_tokens.embedding[...] if tied else module.lm_head.kernel[...]), tied


def _head_rows(table, vocab, *, tied: bool):
    return table[vocab] if tied else table.T[vocab]


_head_rows_jit = jax.jit(_head_rows, static_argnames="tied")


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


def _pard_entry(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())["pard"]
    except (OSError, KeyError, json.JSONDecodeError, TypeError):
        raise CheckpointError(f"{folder} is not a PARD drafter (config.json has neither a \"pard\" entry nor "
                              "the authors' \"pard_token\"); train one with `jaxspec train-drafter`") from None


def _load_shared(folder: Path, target: Model | None, dtype: str, attention: str, share: bool) -> Model:
    """A drafter stored without its token embeddings: the target's rows + its own mask row; with
    `share` (and a float32 drafter), the target's embedding module itself (`ExtendedEmbed`: no copy
    of its table), else one table of both (a copy, dequantized from a kept-quantized target: what
    training updates)."""
    if target is None:
        raise CheckpointError(f"{folder} shares its token embeddings with its target; load it with "
                              "load_drafter(folder, target=model) (generate(..., drafter=folder) does)")
    cfg = read_config(folder)
    tensors = read_safetensors(folder / WEIGHTS)
    mask_row = np.asarray(read_safetensors(folder / DRAFT_FILE)["mask_embedding"], np.float32)
    base = target.module.embed_tokens
    if base.features != mask_row.shape[1] or base.num_embeddings + len(mask_row) != cfg.vocab_size:
        raise CheckpointError(f"{folder}: the target's embeddings {(base.num_embeddings, base.features)} do not fit "
                              f"this drafter (vocabulary {cfg.vocab_size}, hidden {mask_row.shape[1]}); use the "
                              "drafter's own target")
    # (a drafter without a draft vocabulary reads its tied table whole as its head: that one keeps a table)
    share = share and dtype == "float32" and read_draft_vocab(folder) is not None
    if not share:
        tensors[EMBED_NAME] = np.concatenate([float_table(base), mask_row])  # (an int8 or blocks target's: dequantized)
        module = model_from_tensors(cfg, tensors, dtype=DTYPES[dtype], attention=attention, source=str(folder))
        return Model.from_module(module, tokenizer=target.tokenizer, dtype=dtype, source=str(folder))
    # (a table never read: the module is built around an empty one, replaced by the target's)
    tensors[EMBED_NAME] = np.broadcast_to(np.float32(0), (cfg.vocab_size, cfg.hidden_size))

    def place(path, shape, read):
        if str(path[0]) == "embed_tokens":
            return jnp.zeros((0, shape[1]), jnp.float32)
        return jax.device_put(read(full_index(shape)))

    module = model_from_tensors(cfg, tensors, dtype=DTYPES[dtype], attention=attention, source=str(folder),
                                place=place)
    module.embed_tokens = ExtendedEmbed(base, mask_row)
    return Model.from_module(module, tokenizer=target.tokenizer, dtype=dtype, source=str(folder))


def load_drafter(path: str | os.PathLike, *, dtype: str = "float32", attention: str = "xla",
                 target_independent: bool = False, target: Model | None = None, share: bool = False) -> Drafter:
    """A drafter folder (see the module docstring) or an authors'-format PARD / PARD-2 folder
    (`jaxspec.checkpoint.pard_format`); `target_independent` skips the projection; `target`: the model it
    drafts for (needed when the drafter shares the target's embeddings, and to place an
    authors' PARD-2 drafter's target layers); `share`: a drafter stored with shared embeddings holds
    the target's embedding arrays, not a copy (decoding; training updates its own copy)."""
    folder = Path(path)
    if is_amd_folder(folder):
        return Drafter(**read_amd_drafter(folder, target=target, target_independent=target_independent, dtype=dtype,
                                          attention=attention))
    pard = _pard_entry(folder)
    if pard.get("shared_embeddings"):
        model = _load_shared(folder, target, dtype, attention, share)
    else:
        model = load(path, dtype=dtype, attention=attention)
        folder = Path(model.source)
    draft_vocab = None if (ids := read_draft_vocab(folder)) is None else jnp.asarray(ids)
    projection = None
    if not target_independent and (folder / PROJECTION_FILE).exists():
        projection = jnp.asarray(read_safetensors(folder / PROJECTION_FILE)["projection"], jnp.float32)
    drafter = Drafter(model=model, mask_token_id=int(pard["mask_token_id"]),
                      target_vocab_size=int(pard["target_vocab_size"]),
                      target_layers=tuple(int(i) for i in pard["target_layers"]),
                      target_hidden_size=int(pard["target_hidden_size"]),
                      feature_scale=float(pard.get("feature_scale", 0.02)),
                      draft_len=int(pard.get("draft_len", 8)), projection=projection, draft_vocab=draft_vocab,
                      shared_embeddings=bool(pard.get("shared_embeddings", False)))
    if draft_vocab is not None and (draft_vocab.shape[0] != int(pard.get("draft_vocab_size", -1))
                                    or int(draft_vocab.max()) >= drafter.target_vocab_size):
        raise CheckpointError(f"{folder / DRAFT_FILE}: draft_vocab does not match the config's draft_vocab_size "
                              f"or holds ids outside the {drafter.target_vocab_size}-token vocabulary")
    if projection is not None and projection.shape != (drafter.feature_size, model.config.hidden_size):
        raise CheckpointError(f"{folder / PROJECTION_FILE} has shape {projection.shape}, expected "
                              f"{(drafter.feature_size, model.config.hidden_size)}; re-export the drafter")
    if model.config.vocab_size != drafter.target_vocab_size + 1 or drafter.mask_token_id != drafter.target_vocab_size:
        raise CheckpointError(f"{folder}: a drafter's vocabulary is the target's plus one mask token "
                              f"(mask id = {drafter.target_vocab_size}); got vocab {model.config.vocab_size}, "
                              f"mask id {drafter.mask_token_id}")
    return drafter
