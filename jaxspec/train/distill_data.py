"""Target-aligned drafter data (sequence-level distillation): the target's own continuations
of training-corpus prefixes.

A drafter is used on the target's outputs, not on the corpus, and a small target's greedy
text differs from human text (it repeats, it settles into its own idioms). Each sequence here
is a corpus prefix of a random length in [min_prefix, max_prefix] (a random position of the
training stream, never the held-out files) followed by the target's continuation up to
seq_len + 1 tokens, greedy or sampled at T = 1. Generation is `jaxspec.generate` on batches of
prefixes (one compiled while_loop per batch shape), done once per run folder and cached: the
file's name holds a fingerprint of the target's weights, the data and the distillation settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Callable

import numpy as np

from jaxspec.train.corpus import PackedData


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    greedy_sequences: int = 0  # target continuations generated greedily (0 = none)
    sampled_sequences: int = 0  # ... sampled at temperature 1 (full distribution, no top-k/top-p)
    min_prefix: int = 16  # corpus tokens before the continuation, drawn uniformly per sequence
    max_prefix: int = 64
    fraction: float = 0.5  # share of every training batch drawn from these sequences
    batch_size: int = 64  # prefixes per generate call
    cache: str = ""  # a folder where generated sequences are kept by fingerprint and reused ("" = the run's data/)

    @property
    def sequences(self) -> int:
        return self.greedy_sequences + self.sampled_sequences


def fingerprint(cfg: DistillConfig, data_fingerprint: str, target_digest: str, seq_len: int, seed: int) -> str:
    # What the rows depend on: not the batch mix, nor where the file is kept.
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("fraction", "cache")}
    return hashlib.sha256(json.dumps([fields, data_fingerprint, target_digest, seq_len, seed]).encode()).hexdigest()[:16]


def prefixes(train: np.ndarray, cfg: DistillConfig, seed: int) -> list[np.ndarray]:
    """cfg.sequences corpus prefixes: seeded start positions and lengths (document separators
    inside a prefix are kept: the target saw the same packed stream)."""
    rng = np.random.default_rng([seed, 17])
    lengths = rng.integers(cfg.min_prefix, cfg.max_prefix + 1, cfg.sequences)
    starts = rng.integers(0, len(train) - cfg.max_prefix - 1, cfg.sequences)
    return [np.asarray(train[s: s + n], np.int32) for s, n in zip(starts, lengths)]


def generate_sequences(target, train: np.ndarray, cfg: DistillConfig, seq_len: int, seed: int,
                       progress: bool = True) -> np.ndarray:
    """[cfg.sequences, seq_len + 1] int32: each row a prefix + the target's continuation
    (the greedy rows first, then the sampled ones)."""
    import jaxspec
    from tqdm.auto import tqdm

    rows = np.zeros((cfg.sequences, seq_len + 1), np.int32)
    heads = prefixes(train, cfg, seed)
    new_tokens = seq_len + 1 - cfg.min_prefix  # every row fills up; longer prefixes are cut below
    groups = ((0.0, range(cfg.greedy_sequences)), (1.0, range(cfg.greedy_sequences, cfg.sequences)))
    with tqdm(total=cfg.sequences, unit="seq", desc="target continuations", disable=not progress) as bar:
        for temperature, ids in groups:
            for lo in range(ids.start, ids.stop, cfg.batch_size):
                part = list(range(lo, min(lo + cfg.batch_size, ids.stop)))
                padded = part + [part[0]] * (cfg.batch_size - len(part))  # one compiled shape for every call
                out = jaxspec.generate(target, [heads[i].tolist() for i in padded], max_new_tokens=new_tokens,
                                       temperature=temperature, seed=seed * 100_003 + lo, stop_at_eos=False)
                for row, i in enumerate(part):
                    rows[i] = np.concatenate([heads[i], np.asarray(out.tokens[row], np.int32)])[: seq_len + 1]
                bar.update(len(part))
    return rows


def params_digest(params) -> str:
    """A hash of a model's weights (whatever file they came from)."""
    import jax

    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()


class DistillData:
    """Generated sequences: `batch(indices)` like `corpus.PackedData`."""

    def __init__(self, rows: np.ndarray, path: Path):
        self.rows, self.path = rows, path
        self.num_sequences = len(rows)

    def batch(self, indices) -> np.ndarray:
        return np.stack([np.asarray(self.rows[int(i)], np.int32) for i in indices])


def prepare(target, train: PackedData, cfg: DistillConfig, folder: Path, seq_len: int, seed: int,
            data_fingerprint: str, *, write: bool = True, log: Callable = print,
            progress: bool = True) -> DistillData | None:
    """The run's generated sequences (None when cfg asks for none): read from
    `distill-<fingerprint>.npy` in cfg.cache or `folder` when there, else generated (every
    process generates the same rows; only `write`, process 0, saves them)."""
    if cfg.sequences == 0:
        return None
    key = fingerprint(cfg, data_fingerprint, params_digest(target.params), seq_len, seed)
    folder = Path(cfg.cache).expanduser() if cfg.cache else Path(folder)
    path, meta_path = folder / f"distill-{key}.npy", folder / f"distill-{key}.json"
    if meta_path.exists() and path.exists():
        log(f"target continuations: reusing {path}")
        return DistillData(np.load(path, mmap_mode="r"), path)
    log(f"generating {cfg.greedy_sequences} greedy + {cfg.sampled_sequences} sampled target continuations "
        f"({seq_len + 1} tokens each)")
    t0 = time.time()
    rows = generate_sequences(target, np.asarray(train.tokens), cfg, seq_len, seed, progress=progress)
    seconds = time.time() - t0
    if write:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"distill-{key}.tmp.npy"
        np.save(tmp, rows)
        tmp.replace(path)  # atomic, as the corpus arrays; the metadata last, so its presence means complete
        meta_path.write_text(json.dumps({"fingerprint": key, "sequences": int(len(rows)),
                                         "greedy": cfg.greedy_sequences, "sampled": cfg.sampled_sequences,
                                         "tokens": int(rows.size), "seconds": round(seconds, 1)}, indent=1))
    log(f"target continuations: {len(rows)} sequences in {seconds:.0f}s")
    return DistillData(rows, path)
