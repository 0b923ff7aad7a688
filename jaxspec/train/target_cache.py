"""The frozen target's outputs over a drafter's training data, computed once and kept on disk.

Drafter training needs, at every position of every training sequence, the target's hidden
states at the feature layers (target-dependent mode), the log-probability of the next token
(CAT weights), its argmax (agreement, acceptance) and its distribution over the draft
vocabulary (distillation). Running the target inside every training step recomputed all of
that at each epoch and doubled the step (SmolLM2: 21 -> 10.7 CPU-s); here it runs once per
sequence of the packed data set, in chunks, each chunk flushed to memory-mapped `.npy` files
before the count of finished sequences is advanced (`progress.json`, written atomically), so a
killed stage resumes at its first unfinished chunk and produces the same arrays.

The distribution is kept as its `top_k` largest draft-vocabulary log-probabilities
(normalised over the draft vocabulary, as the trainer's KD target always was) with their
column ids: distillation against the renormalised top-k (sparse KD) instead of all V' columns,
which would be 16 KB a token. Features are stored as bfloat16 bits (uint16).

Files (`folder`): features.npy [N, L, F] uint16 (bfloat16 bits), gold_logp.npy [N, L]
float32 (log p_T(x_{t+1} | x_<=t)), argmax.npy [N, L] int32 (over the full vocabulary),
topk_logp.npy [N, L, k] float32, topk_cols.npy [N, L, k] int32 (draft-vocabulary columns, or
token ids without a draft vocabulary), progress.json, meta.json.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jaxtyping import Array, Int

from jaxspec.errors import ConfigError
from jaxspec.train.corpus import PackedData
from jaxspec.train.pard_objective import target_outputs

FIELDS = ("features", "gold_logp", "argmax", "topk_logp", "topk_cols")


@dataclasses.dataclass(frozen=True)
class TargetOutputs:
    """Memory-mapped target outputs of sequences 0..N-1 of one `PackedData` (see the module)."""

    folder: Path
    features: np.ndarray
    gold_logp: np.ndarray
    argmax: np.ndarray
    topk_logp: np.ndarray
    topk_cols: np.ndarray

    @classmethod
    def open(cls, folder: Path) -> "TargetOutputs":
        return cls(folder, *(np.load(folder / f"{name}.npy", mmap_mode="r") for name in FIELDS))

    def batch(self, indices) -> dict[str, np.ndarray]:
        """The outputs of sequences `indices`, features as float32."""
        idx = np.asarray(indices, np.int64)
        out = {name: np.asarray(getattr(self, name)[idx]) for name in FIELDS}
        out["features"] = out["features"].view(ml_dtypes.bfloat16).astype(np.float32)
        return out


def _compute(target_graphdef, layers: tuple[int, ...], top_k: int):
    @jax.jit
    def run(target_params, inputs: Int[Array, "b L"], next_tokens: Int[Array, "b L"],
            vocab: Int[Array, " v"] | None):
        logits, features = target_outputs(nnx.merge(target_graphdef, target_params), inputs, layers)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        gold = jnp.take_along_axis(logp, next_tokens[..., None], axis=-1)[..., 0]
        restricted = logits if vocab is None else logits[..., vocab]
        top, cols = jax.lax.top_k(jax.nn.log_softmax(restricted.astype(jnp.float32), axis=-1), top_k)
        return (features.astype(jnp.bfloat16), gold, jnp.argmax(logits, -1).astype(jnp.int32), top,
                cols.astype(jnp.int32))
    return run


def fingerprint_of(data_fingerprint: str, target_digest: str, layers, draft_vocab, top_k: int, seq_len: int) -> str:
    import hashlib

    vocab = "" if draft_vocab is None else hashlib.sha256(np.asarray(draft_vocab, np.int32).tobytes()).hexdigest()
    return hashlib.sha256(json.dumps([data_fingerprint, target_digest, list(layers), vocab, top_k, seq_len]).encode()
                          ).hexdigest()[:16]


def prepare(target, data: PackedData, layers: tuple[int, ...], draft_vocab: np.ndarray | None, top_k: int,
            folder: Path, fingerprint: str, *, chunk: int = 8, log: Callable = print, progress: bool = True,
            clock=None) -> TargetOutputs:
    """Compute (or finish, or reuse) the target's outputs over every sequence of `data` into
    `folder`; `fingerprint` names what they are a function of (a folder holding another's is
    refused). `clock`: a `chat_data.StageClock`, charged after every chunk."""
    from tqdm.auto import tqdm

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n, length = data.num_sequences, data.seq_len
    vocab_size = target.config.vocab_size if draft_vocab is None else len(draft_vocab)
    if top_k > vocab_size:
        raise ConfigError(f"[pard] teacher_top_k ({top_k}) exceeds the draft vocabulary ({vocab_size})")
    feature_size = len(layers) * target.config.hidden_size
    shapes = {"features": ((n, length, feature_size), np.uint16), "gold_logp": ((n, length), np.float32),
              "argmax": ((n, length), np.int32), "topk_logp": ((n, length, top_k), np.float32),
              "topk_cols": ((n, length, top_k), np.int32)}
    meta_path, progress_path = folder / "meta.json", folder / "progress.json"
    meta = {"fingerprint": fingerprint, "sequences": n, "seq_len": length, "layers": list(layers), "top_k": top_k}
    if meta_path.exists():
        saved = json.loads(meta_path.read_text())
        if saved != meta:
            raise ConfigError(f"{folder} holds the target outputs of other data or settings ({saved.get('fingerprint')}, "
                              f"now {fingerprint}); delete it to recompute")
        done = json.loads(progress_path.read_text())["done"] if progress_path.exists() else 0
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r+") for name in FIELDS}
    else:
        arrays = {name: np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)
                  for name, (shape, dtype) in shapes.items()}
        _write_json(progress_path, {"done": 0})
        _write_json(meta_path, meta)
        done = 0
    if done < n:
        log(f"target outputs: {done} of {n} sequences done; computing the rest into {folder}")
        run = _compute(target.graphdef, layers, top_k)
        vocab = None if draft_vocab is None else jnp.asarray(draft_vocab, jnp.int32)
        with tqdm(total=n, initial=done, unit="seq", desc="target outputs", disable=not progress) as bar:
            for lo in range(done, n, chunk):
                ids = np.arange(lo, min(lo + chunk, n))
                seqs = data.batch(np.concatenate([ids, np.full(chunk - len(ids), ids[0])]))  # one shape
                outs = jax.device_get(run(target.params, jnp.asarray(seqs[:, :-1]), jnp.asarray(seqs[:, 1:]), vocab))
                for name, value in zip(FIELDS, outs):
                    value = np.asarray(value)[:len(ids)]
                    arrays[name][ids] = value.view(np.uint16) if name == "features" else value
                for a in arrays.values():
                    a.flush()
                _write_json(progress_path, {"done": int(ids[-1]) + 1})  # after the data it counts
                if clock is not None:
                    clock.charge("target outputs")
                bar.update(len(ids))
    del arrays
    return TargetOutputs.open(folder)


def _write_json(path: Path, value) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)
