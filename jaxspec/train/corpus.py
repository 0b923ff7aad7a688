"""Corpus -> sentencepiece tokenizer -> packed token arrays, and the deterministic batch order.

Documents are tokenized once, joined as `BOS doc EOS BOS doc EOS ...` and stored as uint16
`.npy` files that training memory-maps. Example k of the stream is a window of seq_len + 1
tokens; its position in the training order depends only on (seed, k), so the batch of any
step can be rebuilt from scratch — that is what makes `--resume` exact.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import random
import shutil
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

from jaxspec.errors import ConfigError
from jaxspec.train.train_config import DataConfig, TokenizerConfig

BOS, EOS = 1, 2

# Always left out of the "stdlib" corpus: tests, the IDE and installed third-party packages.
STDLIB_EXCLUDE = ("test/*", "tests/*", "*/test/*", "*/tests/*", "idlelib/*", "site-packages/*")


def corpus_root(data: DataConfig) -> Path:
    if data.corpus == "stdlib":
        return Path(sysconfig.get_paths()["stdlib"])
    root = Path(data.corpus).expanduser()
    if not root.exists():
        raise ConfigError(f"[data] corpus {data.corpus!r} does not exist; pass a text file, a folder "
                          "of text files, or \"stdlib\"")
    return root


def list_documents(data: DataConfig) -> tuple[Path, list[str]]:
    """The corpus root and its documents' relative paths, sorted (a file corpus is one document)."""
    root = corpus_root(data)
    if root.is_file():
        return root.parent, [root.name]
    exclude = data.exclude + (STDLIB_EXCLUDE if data.corpus == "stdlib" else ())
    # A folder every file of which an exclude pattern ending in "*" matches is not walked at all
    # (the stdlib's site-packages: ~48k files on this project's machine: 1.1 -> 0.015 s, the same list).
    pruned = [p for p in exclude if p.endswith("*")]
    files = []
    for folder, subfolders, names in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        subfolders[:] = [d for d in subfolders if not any(fnmatch.fnmatch(f"{base}{d}/", p) for p in pruned)]
        for name in names:
            rel = base + name
            if not any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(rel, p) for p in data.include):
                continue
            if any(fnmatch.fnmatch(rel, p) for p in exclude) or not (root / rel).is_file():
                continue
            files.append(rel)
    if not files:
        raise ConfigError(f"[data] corpus {root} has no files matching include={list(data.include)}; "
                          "check the path and the patterns")
    return root, sorted(files)


def is_heldout(rel_path: str, fraction: float) -> bool:
    """Deterministic split by a hash of the relative path (stable across machines and runs)."""
    h = int.from_bytes(hashlib.sha256(rel_path.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def train_tokenizer(root: Path, files: list[str], cfg: TokenizerConfig, out_prefix: Path, seed: int) -> Path:
    """Train a sentencepiece model on the training documents; returns `<out_prefix>.model`.

    Settings for source code: no normalisation and no whitespace collapsing (indentation is
    meaning), whitespace-only pieces allowed (runs of indentation become one token), no dummy
    prefix (encode/decode round-trips exactly), byte fallback (any byte is representable).
    """
    import sentencepiece as spm

    lines = [ln for f in files for ln in read_text(root / f).splitlines() if ln.strip()]
    random.Random(seed).shuffle(lines)
    lines = lines[: cfg.input_sentence_size]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as fh:
        fh.write("\n".join(lines))
        sample = fh.name
    try:
        spm.SentencePieceTrainer.Train(
            input=sample, model_prefix=str(out_prefix), vocab_size=cfg.vocab_size,
            model_type=cfg.model_type, byte_fallback=cfg.byte_fallback,
            character_coverage=1.0,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True, split_digits=True, add_dummy_prefix=False,
            max_sentence_length=cfg.max_sentence_length, unk_id=0, bos_id=BOS, eos_id=EOS, pad_id=-1,
            num_threads=2, minloglevel=2, shuffle_input_sentence=False,
        )
    except RuntimeError as e:
        raise ConfigError(f"sentencepiece could not train a {cfg.vocab_size}-token vocabulary on this corpus "
                          f"({str(e).strip()}); adjust [tokenizer] vocab_size (with byte_fallback it must exceed 259 plus "
                          "the corpus's distinct characters) or use a larger corpus") from None
    finally:
        Path(sample).unlink()
    return Path(f"{out_prefix}.model")


def piece_byte_lengths(tokenizer_path: Path) -> np.ndarray:
    """UTF-8 bytes each token stands for (byte pieces 1, control tokens 0): for bits per byte."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    lengths = np.zeros(sp.GetPieceSize(), np.int64)
    for i in range(sp.GetPieceSize()):
        if sp.IsByte(i):
            lengths[i] = 1
        elif not (sp.IsControl(i) or sp.IsUnknown(i)):
            lengths[i] = len(sp.IdToPiece(i).replace("\u2581", " ").encode("utf-8"))
    return lengths


def encode_documents(tokenizer_path: Path, root: Path, files: list[str]) -> np.ndarray:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    parts = []
    for f in files:
        ids = sp.EncodeAsIds(read_text(root / f))
        parts.append(np.asarray([BOS, *ids, EOS], np.uint16))
    return np.concatenate(parts) if parts else np.zeros((0,), np.uint16)


class PackedData:
    """A memory-mapped token stream cut into windows of seq_len + 1 tokens (inputs + next-token targets)."""

    def __init__(self, path: Path, seq_len: int):
        self.tokens = np.load(path, mmap_mode="r")
        self.seq_len = seq_len
        self.num_sequences = (len(self.tokens) - 1) // seq_len
        if self.num_sequences < 1:
            raise ConfigError(f"{path} holds {len(self.tokens)} tokens, fewer than one sequence of "
                              f"{seq_len + 1}; use a larger corpus or a smaller [data] seq_len")

    def sequence(self, i: int) -> np.ndarray:
        start = i * self.seq_len
        return np.asarray(self.tokens[start: start + self.seq_len + 1], np.int32)

    def batch(self, indices) -> np.ndarray:
        return np.stack([self.sequence(int(i)) for i in indices])


def training_order(num_sequences: int, seed: int, start: int, count: int) -> np.ndarray:
    """Sequence ids of examples start .. start+count-1: a fresh seeded permutation per epoch."""
    ids = np.empty(count, np.int64)
    for n, k in enumerate(range(start, start + count)):
        epoch, pos = divmod(k, num_sequences)
        ids[n] = _epoch_permutation(num_sequences, seed, epoch)[pos]
    return ids


_PERMUTATIONS: dict[tuple[int, int, int], np.ndarray] = {}


def _epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    key = (n, seed, epoch)
    if key not in _PERMUTATIONS:
        _PERMUTATIONS.clear()  # one epoch at a time is enough
        _PERMUTATIONS[key] = np.random.default_rng([seed, epoch]).permutation(n)
    return _PERMUTATIONS[key]


def prepare_data(data: DataConfig, tok: TokenizerConfig, folder: Path, seed: int, fingerprint: str,
                 log=print, tokenizer_model: Path | None = None, rebuild: bool = True) -> dict:
    """Tokenizer + packed train/held-out arrays in `folder`, built once and reused while the
    data and tokenizer sections of the config are unchanged. Returns the metadata dict.

    `tokenizer_model`: use this sentencepiece model instead of training one (a drafter must
    share its target's tokenizer); include its hash in `fingerprint`. `rebuild=False` (a resumed
    run): data built from other settings is a ConfigError, not rebuilt. Nothing is created
    before the corpus is found."""
    meta_path = folder / "data.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == fingerprint:
            return meta
        if not rebuild:
            raise ConfigError(f"{folder} was built from other data or tokenizer settings (fingerprint "
                              f"{meta.get('fingerprint')}, now {fingerprint}); a resumed run keeps its data: "
                              "restore the settings (or the target's tokenizer), or train into a new --out")
        log(f"data/tokenizer settings changed; rebuilding {folder}")
    root, files = list_documents(data)
    folder.mkdir(parents=True, exist_ok=True)
    heldout = [f for f in files if is_heldout(f, data.heldout_fraction)]
    train = [f for f in files if not is_heldout(f, data.heldout_fraction)]
    if not heldout or not train:
        # Tiny corpora (tests, single files): hold out the last document / the tail instead.
        train, heldout = (files[:-1], files[-1:]) if len(files) > 1 else (files, [])
    if tokenizer_model is None:
        log(f"corpus {root}: {len(train)} training / {len(heldout)} held-out documents; training tokenizer")
        tokenizer = train_tokenizer(root, train, tok, folder / "tokenizer", seed)
    else:
        log(f"corpus {root}: {len(train)} training / {len(heldout)} held-out documents; tokenizing")
        tokenizer = folder / "tokenizer.model"
        shutil.copy(tokenizer_model, tokenizer)
    train_ids = encode_documents(tokenizer, root, train)
    if heldout:
        heldout_ids = encode_documents(tokenizer, root, heldout)
    else:  # one document: its last 5% is the held-out split
        cut = int(len(train_ids) * (1 - max(data.heldout_fraction, 0.05)))
        train_ids, heldout_ids = train_ids[:cut], train_ids[cut:]
    for name, ids in (("train", train_ids), ("heldout", heldout_ids)):
        tmp = folder / f"{name}.tmp.npy"
        np.save(tmp, ids)
        tmp.replace(folder / f"{name}.npy")  # atomic: a killed run never leaves half an array
    meta = {
        "fingerprint": fingerprint, "corpus": str(root), "train_files": train, "heldout_files": heldout,
        "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(heldout_ids)),
        "train_bytes": sum((root / f).stat().st_size for f in train),
        "heldout_bytes": sum((root / f).stat().st_size for f in heldout),
    }
    tmp = folder / "data.tmp.json"
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(meta_path)
    return meta
