"""The authors' PARD / PARD-2 drafter folders (AMD-AGI/PARD; `amd/PARD-*`, `amd/PARD2-*`):
loaded as jaxspec `Drafter`s, and jaxspec drafters exported in that layout.

The format, as the authors' code writes and reads it (github.com/AMD-AGI/PARD: `pard/pard_train.py`,
`pard/pard2_train.py` — `prepare_pard2_infer_config`, `_convert_checkpoint_for_infer_impl` —
and `pard/pard_infer.py`, `pard/pard2_infer.py`; vLLM reads the same `pard_token`):

* A plain HF causal-LM folder (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, ...:
  config.json + model.safetensors, usually a tokenizer) whose config.json carries
  `pard_token`: the mask token id, and `spd_type`: "pard" (PARD) or "pard2" (PARD-2, also
  `"pard2": true`). The mask id is an id INSIDE the drafter's own vocabulary, not one
  appended: the released configs use an unused reserved id (Llama 3: 128020 of 128256;
  Qwen2.5: 151665, Qwen3: 151670 — ids past the tokenizer's last token, in the rows the
  embedding is padded to, 151936). The embedding is the base model's, unchanged in size.
* Drafting: the input `[x_<n, pard_token x (K-1)]` in one causal forward with ordinary
  consecutive positions; the drafts are the argmax of the last K logits over the drafter's
  whole vocabulary (the mask id included); the K-1 mask K/V entries are rolled back and the
  next input is the accepted tokens plus the bonus. This is jaxspec's bonus-in-context
  scheme exactly.
* PARD-2 adds `target_proj`, an `nn.Linear(pard2_target_dim, hidden_size)` (bias only with
  `pard2_proj_bias`, false in the released configs) applied as
  `inputs_embeds = embed(ids) + pard2_scale * target_proj(target_feat)`. Its weight
  `target_proj.weight` ([hidden_size, pard2_target_dim], the Linear's layout) is stored apart
  in `warp_model.bin` (a `torch.save` of a dict) next to config.json; the converter also writes
  the same tensor to `../pard_warp_model/model.safetensors`. `target_feat` is the
  concatenation, in the listed order, of the target's `output_hidden_states` at
  `pard2_target_layers` — HF's indexing: 0 = the embeddings, j = the output of layer j-1,
  -1 = the LAST LAYER'S OUTPUT AFTER THE FINAL NORM (the released drafters use
  [-1, -8, -16, -24]) — shifted one position right (token t gets the target's state at t-1,
  zeros at t = 0); every mask gets the last real token's feature. `pard2_target_dim` =
  len(pard2_target_layers) * the target's hidden size.
* Target-independent mode (`pard2_infer.py` with `--p2`, or any PARD-2 drafter used as a plain
  PARD drafter) drops the warp: the plain model, i.e. features = 0 (no bias).
* The number of drafts K is not stored (the authors decode with K = 12 for PARD and 15 for
  PARD-2, their eval configs' defaults; those are this loader's `draft_len`).

Mapping onto jaxspec (`read_amd_drafter`):

* Vocabulary (jaxspec's invariant: drafter vocabulary = target vocabulary V + 1 mask row,
  mask id = V): converted at load time. Rows 0..V-1 are the drafter's rows 0..V-1 (where the
  drafter has fewer rows, D < V as PARD-Qwen2.5-0.5B (151936) with Qwen2.5-7B (152064), the
  missing rows are zeros and the head is restricted to ids < D through `draft_vocab`, so
  drafts are the argmax over the drafter's own D logits, as the authors'); row V is a copy of
  the `pard_token` row, which is fed as the mask. The `pard_token` row also stays where it
  was: it is a real target id, and the authors' argmax may draft it, so jaxspec's may too
  (it is verified like any draft). Where the drafter's vocabulary is LARGER than the target's
  (D > V) the rows >= V are dropped: the authors' argmax could draft such an id, which their
  target then rejects; jaxspec drafts the best id < V instead (an output-neutral change).
* `pard2_target_layers` -> jaxspec's `hidden_layers` convention (index i = output of layer
  i) for a target of L layers: HF j (j < 0: j + L + 1) in 1..L-1 -> i = j - 1; HF L (i.e.
  -1, after the final norm) -> i = L, the index `Transformer` returns the final norm's output
  for. HF 0 (the embeddings) is not supported. The order is kept (the projection's input
  columns follow it); a layer listed twice has its projection blocks summed (the same
  feature twice). Converting needs the target's depth: `load_drafter(folder, target=model)`
  (`generate(..., drafter=folder)` passes it) unless loading target-independent.
* `projection` = `target_proj.weight.T`, `feature_scale` = `pard2_scale`, `target_hidden_size`
  = `pard2_target_dim / len(pard2_target_layers)`. A non-zero `target_proj.bias` is refused
  (jaxspec's projection has no bias; target-independent loading ignores it).

`warp_model.bin` is read and written without torch: a restricted reader of torch's zip
format that accepts only plain tensors (any other pickled object is an error), and a writer
of the same format (`torch.load(..., weights_only=True)` reads it).

Export (`export_pard`, `Drafter.save(folder, format="pard")`) writes a jaxspec drafter in the
authors' layout: the drafter's HF folder as it is (vocabulary V + 1, so `pard_token` = V, an
appended id: valid for their code, which only feeds it), `pard_token`, `spd_type`, and for a
projection the `pard2_*` keys and `warp_model.bin`. The target layers are written in HF's
indexing, which needs the target's depth (`target=`). jaxspec's own features are pre-norm
outputs, which HF's hidden states hold for every layer but the last: a drafter reading layer
L-1 is written as HF -1 (the authors' code then feeds it the normed state: their drafts in
target-dependent mode differ from jaxspec's there; target-independent drafts agree). A
`"jaxspec"` entry keeps what the authors' keys cannot say exactly (the jaxspec target layers,
K) so that jaxspec reloads an exported drafter exactly; a draft vocabulary travels in
`draft.safetensors` as in jaxspec's own format (the authors' code ignores both and drafts over
the full vocabulary).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxspec.checkpoint.hf import DRAFT_FILE, EMBED_NAME, read_config, read_draft_vocab, read_tensors, save_hf_folder
from jaxspec.checkpoint.params import model_from_tensors
from jaxspec.checkpoint.safetensors_io import read_safetensors, write_safetensors
from jaxspec.models.config import ModelConfig
from jaxspec.errors import CheckpointError, GenerationError

WARP_FILE = "warp_model.bin"  # the authors' target_proj weights (torch.save of a dict)
WARP_SIBLING = Path("..") / "pard_warp_model" / "model.safetensors"  # their converter's second copy
PROJ_WEIGHT, PROJ_BIAS = "target_proj.weight", "target_proj.bias"
JAXSPEC_KEY = "jaxspec"  # what the authors' keys cannot say exactly (written by export_pard)
# K when the folder does not say: the authors' decode defaults (eval configs, `pard_infer.py -k`).
DEFAULT_DRAFT_LEN = {"pard": 12, "pard2": 15}


def is_amd_folder(folder: str | os.PathLike) -> bool:
    """Whether `folder` is an authors'-format drafter: a config.json with `pard_token` and no
    jaxspec `"pard"` entry."""
    try:
        hf = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(hf, dict) and "pard_token" in hf and "pard" not in hf


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _depth(target) -> int | None:
    """The target's number of layers from a Model, a ModelConfig or an int (None: unknown)."""
    if target is None:
        return None
    if _int(target):
        return int(target)
    cfg = target if isinstance(target, ModelConfig) else target.config
    return cfg.num_layers


# ----------------------------------------------------------------------------- layer indices


def hf_to_jaxspec_layers(hf_layers, num_layers: int) -> tuple[int, ...]:
    """HF `output_hidden_states` indices -> jaxspec `hidden_layers` indices for a target of
    `num_layers` layers (HF j -> j - 1; HF num_layers / -1, after the final norm -> num_layers)."""
    out = []
    for j in hf_layers:
        k = j + num_layers + 1 if j < 0 else j
        if not 0 <= k <= num_layers:
            raise GenerationError(f"the drafter reads the target's hidden state {j} (HF indexing) but the target "
                                  f"has only {num_layers} layers; use its own target or target-independent mode "
                                  "(target_features=False)")
        if k == 0:
            raise GenerationError(f"the drafter reads the target's hidden state {j}, its input embeddings, which "
                                  "jaxspec does not expose; use target-independent mode (target_features=False)")
        out.append(k - 1 if k < num_layers else num_layers)
    return tuple(out)


def jaxspec_to_hf_layers(layers, num_layers: int) -> tuple[int, ...]:
    """jaxspec `hidden_layers` indices -> HF indices (negative, as the authors write them): layer
    i < L-1 -> i - L (exact); L-1 and L (the final norm's output) -> -1 (exact only for L: HF has
    no pre-norm state of the last layer)."""
    out = []
    for i in layers:
        k = i + num_layers if i < 0 else i
        if not 0 <= k <= num_layers:
            raise GenerationError(f"target layer {i} is outside a {num_layers}-layer target")
        out.append(-1 if k >= num_layers - 1 else k - num_layers)
    return tuple(out)


# ----------------------------------------------------------------------------- torch's zip format

_STORAGES = {"FloatStorage": np.dtype(np.float32), "HalfStorage": np.dtype(np.float16),
             "BFloat16Storage": np.dtype(ml_dtypes.bfloat16), "DoubleStorage": np.dtype(np.float64)}
_STORAGE_NAMES = {dtype: name for name, dtype in _STORAGES.items()}


def _rebuild_tensor(storage, offset, size, stride, *_):
    size, stride = tuple(int(n) for n in size), tuple(int(s) for s in stride)
    if any(n == 0 for n in size):
        return np.zeros(size, storage.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if offset < 0 or min(stride, default=0) < 0 or last >= storage.shape[0]:
        raise CheckpointError("a tensor reaches outside its storage; the file is damaged")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=tuple(s * storage.itemsize for s in stride))
    return np.array(view)


def _rebuild_parameter(data, *_):
    return data


class _TensorUnpickler(pickle.Unpickler):
    """torch.save's pickle, restricted to dicts of plain tensors (nothing else is constructed)."""

    def __init__(self, data: bytes, read_record):
        super().__init__(io.BytesIO(data))
        self.read_record, self.storages = read_record, {}

    def find_class(self, module, name):
        allowed = {("collections", "OrderedDict"): collections.OrderedDict,
                   ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
                   ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}
        if (module, name) in allowed:
            return allowed[(module, name)]
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        raise CheckpointError(f"the file pickles {module}.{name}; only a dict of tensors is read "
                              "(re-save it as {name: tensor})")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise CheckpointError(f"unexpected storage record {pid!r}")
        _, dtype, key, _, numel = pid
        if key not in self.storages:
            data = self.read_record(f"data/{key}")
            if len(data) != numel * dtype.itemsize:
                raise CheckpointError(f"storage {key} holds {len(data)} bytes, expected {numel} x {dtype.itemsize}")
            self.storages[key] = np.frombuffer(data, dtype)
        return self.storages[key]


def read_torch_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A `torch.save`d dict of tensors (torch's zip format) as numpy arrays, without torch."""
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"{path} is not a torch.save zip archive ({e}); re-save it with torch >= 1.6 "
                              "(torch.save(state_dict, path))") from None
    with archive:
        pickles = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise CheckpointError(f"{path} is not a torch.save archive (no single data.pkl)")
        prefix = pickles[0][:-len("data.pkl")]
        names = set(archive.namelist())
        if prefix + "byteorder" in names and archive.read(prefix + "byteorder").strip() != b"little":
            raise CheckpointError(f"{path} was saved big-endian; re-save it on a little-endian machine")

        def read_record(name):
            if prefix + name not in names:
                raise CheckpointError(f"{path}: record {name} is missing; re-download it")
            return archive.read(prefix + name)

        try:
            state = _TensorUnpickler(archive.read(pickles[0]), read_record).load()
        except CheckpointError as e:
            raise CheckpointError(f"{path}: {e}") from None
        except (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"{path}: unreadable pickle ({e}); re-save it") from None
    if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
        raise CheckpointError(f"{path} does not hold a dict of tensors")
    return dict(state)


def _p_str(s: str) -> bytes:
    raw = s.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def _p_int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])  # BININT1
    if -(1 << 31) <= n < (1 << 31):
        return b"J" + struct.pack("<i", n)  # BININT
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw  # LONG1


def _p_tuple(items) -> bytes:
    return b"(" + b"".join(_p_int(int(i)) for i in items) + b"t" if len(items) else b")"


def write_torch_tensors(path: str | os.PathLike, tensors: dict[str, np.ndarray]) -> Path:
    """Write a dict of (contiguous) tensors as `torch.save` would (zip format, pickle protocol 2),
    without torch: `torch.load(path, weights_only=True)` returns the same dict."""
    path = Path(path)
    pkl = bytearray(b"\x80\x02}(")  # PROTO 2, EMPTY_DICT, MARK
    records = {}
    for key, (name, array) in enumerate(tensors.items()):
        array = np.ascontiguousarray(array)
        if array.dtype not in _STORAGE_NAMES:
            raise CheckpointError(f"tensor {name!r} has dtype {array.dtype}, not float32/16 or bfloat16")
        strides = [s // array.itemsize for s in array.strides]
        pkl += _p_str(name) + b"ctorch._utils\n_rebuild_tensor_v2\n("
        pkl += (b"(" + _p_str("storage") + b"ctorch\n" + _STORAGE_NAMES[array.dtype].encode() + b"\n"
                + _p_str(str(key)) + _p_str("cpu") + _p_int(array.size) + b"tQ")  # TUPLE, BINPERSID
        pkl += _p_int(0) + _p_tuple(array.shape) + _p_tuple(strides)
        pkl += b"\x89ccollections\nOrderedDict\n)Rt" + b"R"  # NEWFALSE, OrderedDict(), TUPLE; REDUCE
        records[f"data/{key}"] = array.tobytes()
    pkl += b"u."  # SETITEMS, STOP
    prefix = path.stem or "archive"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(f"{prefix}/data.pkl", bytes(pkl))
        archive.writestr(f"{prefix}/byteorder", "little")
        for name, data in records.items():
            archive.writestr(f"{prefix}/{name}", data)
        archive.writestr(f"{prefix}/version", "3\n")
    return path


# ----------------------------------------------------------------------------- loading


def _config(folder: Path) -> dict:
    try:
        hf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder / 'config.json'} is unreadable ({e})") from None
    return hf


def _target_proj(folder: Path, in_weights: dict) -> tuple[np.ndarray | None, np.ndarray | None]:
    """target_proj (weight, bias): from the weights file itself, warp_model.bin, or the authors'
    converter's `../pard_warp_model/model.safetensors`, the first that has them."""
    sources = [("model weights", lambda: in_weights)]
    if (folder / WARP_FILE).exists():
        sources.append((WARP_FILE, lambda: read_torch_tensors(folder / WARP_FILE)))
    if (folder / WARP_SIBLING).exists():
        sources.append((str(WARP_SIBLING), lambda: read_safetensors(folder / WARP_SIBLING)))
    for _, read in sources:
        tensors = read()
        if PROJ_WEIGHT in tensors:
            return np.asarray(tensors[PROJ_WEIGHT]), (None if tensors.get(PROJ_BIAS) is None
                                                       else np.asarray(tensors[PROJ_BIAS]))
    return None, None


def _first(hf: dict, *names, default=None):
    """The first of `names` the config has (the authors' readers accept older key names too)."""
    for name in names:
        if name in hf:
            return hf[name]
    return default


def read_amd_drafter(path: str | os.PathLike, *, target=None, target_independent: bool = False,
                     dtype: str = "float32", attention: str = "xla") -> dict:
    """An authors'-format PARD / PARD-2 folder as the fields of a `Drafter`
    (`jaxspec.checkpoint.drafter_files.load_drafter` makes it; mapping: the module docstring).
    `target`: the Model it drafts for (its vocabulary size, depth and tokenizer); without it
    the drafter's own vocabulary is taken as the target's, and a PARD-2 drafter loads only
    target-independent."""
    from jaxspec.checkpoint.loading import DTYPES, Model
    from jaxspec.checkpoint.tokenizer import find_tokenizer

    folder = Path(path)
    hf = _config(folder)
    kind = _drafter_kind(folder, hf)
    cfg = read_config(folder)
    size, token = cfg.vocab_size, hf.get("pard_token")
    if not _int(token) or not 0 <= token < size:
        raise CheckpointError(f"{folder}: pard_token must be a token id of the drafter's {size}-token "
                              f"vocabulary, got {token!r} (-1: trained without unused_tokenids)")
    meta = hf.get(JAXSPEC_KEY) if isinstance(hf.get(JAXSPEC_KEY), dict) else {}
    vocab = int(target.config.vocab_size) if target is not None else int(meta.get("target_vocab_size", size))
    tokenizer = getattr(target, "tokenizer", None)
    if tokenizer is not None and tokenizer.vocab_size > size:  # (the format names no target: a size check)
        raise GenerationError(f"{folder}: the target's tokenizer has {tokenizer.vocab_size} tokens but the drafter's "
                              f"vocabulary only {size}; use a drafter made for the target's tokenizer")
    features = kind == "pard2" and not target_independent
    scale = float(_first(hf, "pard2_scale", "pard_scale", "feat_scale", default=0.02))
    # Feature metadata first (checked before any weight is read).
    layers, hidden = _feature_layers(folder, hf, meta, target) if features else ((), 0)

    tensors = dict(read_tensors(folder))
    in_weights = {name: tensors.pop(name) for name in list(tensors) if name.startswith("target_proj.")}
    projection = None
    if features:
        layers, projection = _projection(folder, in_weights, layers, hidden, cfg.hidden_size)
    _to_target_vocabulary(folder, tensors, cfg, vocab, token)
    module = model_from_tensors(dataclasses.replace(cfg, vocab_size=vocab + 1), tensors, dtype=DTYPES[dtype],
                                attention=attention, source=str(folder))
    tokenizer = tokenizer if tokenizer is not None else find_tokenizer(folder)
    model = Model.from_module(module, tokenizer=tokenizer, dtype=dtype, source=str(folder))
    draft_vocab = _draft_vocab(folder, size, vocab)
    draft_len = meta.get("draft_len", DEFAULT_DRAFT_LEN[kind])
    return dict(model=model, mask_token_id=vocab, target_vocab_size=vocab, target_layers=layers,
                target_hidden_size=hidden, feature_scale=scale, draft_len=int(draft_len), projection=projection,
                draft_vocab=None if draft_vocab is None else jnp.asarray(draft_vocab))


def _drafter_kind(folder: Path, hf: dict) -> str:
    """The drafter's kind, "pard" or "pard2": `spd_type` (or `"pard2": true`); any other type is refused."""
    kind = hf.get("spd_type", "pard2" if hf.get("pard2") is True else "pard")
    if hf.get("pard2") is True:
        kind = "pard2"
    if kind not in ("pard", "pard2"):
        raise CheckpointError(f"{folder}: spd_type {kind!r} is not a parallel drafter (\"pard\" or \"pard2\")")
    return kind


def _feature_layers(folder: Path, hf: dict, meta: dict, target) -> tuple[tuple[int, ...], int]:
    """(the target layers a PARD-2 drafter reads, in jaxspec's indexing; the target's hidden size)
    from config.json: the exact layers a jaxspec export kept, else `pard2_target_layers` mapped
    for the target's depth."""
    hf_layers = _first(hf, "pard2_target_layers", "target_layers")
    if not isinstance(hf_layers, list) or not hf_layers or not all(_int(j) for j in hf_layers):
        raise CheckpointError(f"{folder}: a PARD-2 config.json needs pard2_target_layers (the target's HF "
                              f"hidden-state indices), got {hf_layers!r}; or load it target-independent")
    dim = _first(hf, "pard2_target_dim", "pard_target_dim")
    if not _int(dim) or dim % len(hf_layers):
        raise CheckpointError(f"{folder}: pard2_target_dim {dim!r} is not a multiple of "
                              f"{len(hf_layers)} target layers")
    hidden = dim // len(hf_layers)
    if isinstance(meta.get("target_layers"), list):  # exported by jaxspec: its exact layers
        layers = tuple(int(i) for i in meta["target_layers"])
        if len(layers) != len(hf_layers):
            raise CheckpointError(f"{folder}: the jaxspec target_layers do not match pard2_target_layers")
        return layers, hidden
    if _depth(target) is None:
        raise CheckpointError(f"{folder} is a PARD-2 drafter whose target layers are relative to its target; "
                              "load it with load_drafter(folder, target=model) (generate(..., drafter=folder) "
                              "does) or target_independent=True")
    return hf_to_jaxspec_layers(hf_layers, _depth(target)), hidden


def _projection(folder: Path, in_weights: dict, layers: tuple[int, ...], hidden: int,
                hidden_size: int) -> tuple[tuple[int, ...], jnp.ndarray]:
    """(the target layers, each once; jaxspec's projection [features, hidden_size]) from
    `target_proj.weight`: its transpose, the blocks of a layer listed twice summed."""
    weight, bias = _target_proj(folder, in_weights)
    if weight is None:
        raise CheckpointError(f"{folder} is a PARD-2 drafter without its target_proj weights ({WARP_FILE}); "
                              "restore the file or load it target-independent (target_features=False)")
    if weight.shape != (hidden_size, len(layers) * hidden):
        raise CheckpointError(f"{folder}: target_proj.weight has shape {weight.shape}, expected "
                              f"{(hidden_size, len(layers) * hidden)} (hidden size, pard2_target_dim)")
    if bias is not None and np.any(np.asarray(bias, np.float32)):
        raise CheckpointError(f"{folder}: target_proj has a bias (pard2_proj_bias), which jaxspec's "
                              "projection does not support; load it target-independent")
    blocks = np.asarray(weight, np.float32).T.reshape(len(layers), hidden, hidden_size)
    merged: dict[int, np.ndarray] = {}
    for layer, block in zip(layers, blocks):  # a layer listed twice: its feature twice
        merged[layer] = merged[layer] + block if layer in merged else block
    return tuple(merged), jnp.asarray(np.concatenate(list(merged.values())), jnp.float32)


def _to_target_vocabulary(folder: Path, tensors: dict, cfg: ModelConfig, vocab: int, token: int) -> None:
    """Convert the vocabulary tables in `tensors` in place (the embedding, and an untied head) to
    the target's V rows (the drafter's, zeros where it has none) + the mask row (the `pard_token` row)."""
    size = cfg.vocab_size

    def convert(table):
        if table.shape[0] != size:
            raise CheckpointError(f"{folder}: a vocabulary table has {table.shape[0]} rows, the config "
                                  f"{size}; the checkpoint does not match its config")
        keep = min(size, vocab)
        parts = [table[:keep]]
        if vocab > size:
            parts.append(np.zeros((vocab - size,) + table.shape[1:], table.dtype))
        return np.concatenate(parts + [table[token:token + 1]])

    if EMBED_NAME not in tensors:
        raise CheckpointError(f"{folder}: tensor {EMBED_NAME!r} is missing; the checkpoint does not match its config")
    tensors[EMBED_NAME] = convert(tensors[EMBED_NAME])
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    elif "lm_head.weight" in tensors:
        tensors["lm_head.weight"] = convert(tensors["lm_head.weight"])


def _draft_vocab(folder: Path, size: int, vocab: int) -> np.ndarray | None:
    """The draft vocabulary: the folder's draft.safetensors (checked against the `vocab` ids), else
    the drafter's own `size` ids where the target has more, else None (every id)."""
    draft_vocab = read_draft_vocab(folder)
    if draft_vocab is not None:
        if draft_vocab.ndim != 1 or not len(draft_vocab) or draft_vocab.min() < 0 or draft_vocab.max() >= vocab:
            raise CheckpointError(f"{folder / DRAFT_FILE}: draft_vocab holds ids outside the {vocab}-token vocabulary")
    elif size < vocab:  # the drafter's own ids only: the argmax over its D logits, as the authors'
        draft_vocab = np.arange(size, dtype=np.int32)
    return draft_vocab


# ----------------------------------------------------------------------------- export


def export_pard(drafter, folder: str | os.PathLike, *, target=None, dtype: str = "float32") -> Path:
    """Write `drafter` as an authors'-format folder (module docstring): an HF folder with
    `pard_token` / `spd_type` (+ the `pard2_*` keys and `warp_model.bin` when it has a
    projection). `target` (a Model, ModelConfig or its number of layers) is needed to write the
    target layers in HF's indexing when there is a projection."""
    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    depth = _depth(target)
    if drafter.projection is not None and depth is None:
        raise CheckpointError("exporting a target-dependent drafter needs its target (target=model) to name "
                              "the target layers in HF's indexing; or export it without its projection")
    if target is not None and not _int(target):
        cfg = target if isinstance(target, ModelConfig) else target.config
        drafter.check_compatible(cfg)
    folder = save_hf_folder(drafter.model.module, Path(folder), dtype=dtype, tokenizer=drafter.model.tokenizer)
    cfg_path = folder / "config.json"
    hf = json.loads(cfg_path.read_text())
    meta = {"draft_len": drafter.draft_len, "target_vocab_size": drafter.target_vocab_size}
    hf.update(pard_token=drafter.mask_token_id, spd_type="pard")
    if drafter.projection is not None:
        hf.update(spd_type="pard2", pard2=True, pard2_scale=float(drafter.feature_scale), pard2_proj_bias=False,
                  pard2_target_dim=drafter.feature_size,
                  pard2_target_layers=list(jaxspec_to_hf_layers(drafter.target_layers, depth)))
        meta["target_layers"] = list(drafter.target_layers)
        write_torch_tensors(folder / WARP_FILE, {PROJ_WEIGHT: np.asarray(drafter.projection, np.float32).T.astype(np_dtype)})
    hf[JAXSPEC_KEY] = meta
    cfg_path.write_text(json.dumps(hf, indent=2) + "\n")
    if drafter.draft_vocab is not None:
        write_safetensors(folder / DRAFT_FILE, {"draft_vocab": np.asarray(drafter.draft_vocab, np.int32)})
    return folder
