"""Tokenizers found next to a checkpoint: sentencepiece `tokenizer.model` or HF `tokenizer.json`."""

from __future__ import annotations

import shutil
from pathlib import Path

from jaxspec.errors import CheckpointError


class Tokenizer:
    """Text <-> ids. `encode` adds BOS the way the checkpoint's own tokenizer does."""

    files: tuple[Path, ...] = ()

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def save(self, folder: Path) -> None:
        for f in self.files:
            shutil.copy(f, Path(folder) / f.name)


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, path: Path, add_bos: bool = True):
        import sentencepiece as spm

        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(path))
        except (OSError, RuntimeError) as e:
            raise CheckpointError(f"{path} is not a sentencepiece model ({e}); remove or replace it") from None
        self._add_bos = add_bos and self._sp.bos_id() >= 0
        self.files = (Path(path),)

    def encode(self, text: str) -> list[int]:
        ids = list(self._sp.EncodeAsIds(text))
        return ([self._sp.bos_id()] if self._add_bos else []) + ids

    def decode(self, ids: list[int]) -> str:
        return self._sp.DecodeIds([int(i) for i in ids])

    @property
    def vocab_size(self) -> int:
        return self._sp.GetPieceSize()


class HFTokenizer(Tokenizer):
    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _Tok

        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as e:  # the tokenizers library raises a bare Exception on parse errors
            raise CheckpointError(f"{path} is not a valid tokenizer.json ({e}); remove or replace it") from None
        folder = Path(path).parent
        self.files = tuple(folder / n for n in ("tokenizer.json", "tokenizer_config.json",
                                                "special_tokens_map.json") if (folder / n).exists())

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()


def find_tokenizer(folder: Path) -> Tokenizer | None:
    """The folder's tokenizer (tokenizer.json preferred), or None: the model then works on ids."""
    folder = Path(folder)
    if (folder / "tokenizer.json").exists():
        return HFTokenizer(folder / "tokenizer.json")
    if (folder / "tokenizer.model").exists():
        return SentencePieceTokenizer(folder / "tokenizer.model")
    return None
