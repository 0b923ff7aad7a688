"""Tokenizers found next to a checkpoint: sentencepiece `tokenizer.model` or HF `tokenizer.json`
(with its `tokenizer_config.json`), or one rebuilt from a GGUF file's metadata
(`jaxspec.checkpoint.gguf_tokenizer`).

Every tokenizer encodes the way the checkpoint's own tokenizer does (BOS only where that one adds
it), knows its BOS id, the ids that end a reply (EOS and end-of-turn tokens such as `<|im_end|>`),
and the checkpoint's chat template, if any.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from jaxspec.checkpoint.chat_template import ChatTemplate, chat_template_source
from jaxspec.errors import CheckpointError, PromptError

# Tokens that end an assistant turn in the common chat formats (ChatML, Llama 3, Phi-3, Gemma, ...).
# Where the vocabulary has one as a special token, generation stops on it as on EOS.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "<|return|>",
)

# The named special tokens transformers passes to chat templates (and keeps in tokenizer_config.json).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def check_text(text: Any) -> str:
    """`text` if it is a str of valid Unicode (encodable as UTF-8), else PromptError."""
    if isinstance(text, (bytes, bytearray)):
        raise PromptError(f"prompt text must be str, got {type(text).__name__}; decode it first, "
                          "e.g. data.decode('utf-8', errors='replace')")
    if not isinstance(text, str):
        raise PromptError(f"prompt text must be str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PromptError(f"prompt text is not valid Unicode: {text[e.start:e.end]!r} at index {e.start} "
                          "(a lone surrogate); pass valid text, e.g. decoded with errors='replace'") from None
    return text


class Tokenizer:
    """Text <-> ids. `encode` adds BOS the way the checkpoint's own tokenizer does.

    Subclasses implement `_encode`, `decode` and `vocab_size`; `encode` checks the text first.
    """

    files: tuple[Path, ...] = ()
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()  # EOS first, then end-of-turn ids
    chat_template: ChatTemplate | None = None

    @property
    def eos_id(self) -> int | None:
        return self.eos_ids[0] if self.eos_ids else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`; with `add_special_tokens`, framed (BOS/EOS) as the checkpoint's own
        tokenizer frames it. Raises PromptError for text that is not valid Unicode."""
        return self._encode(check_text(text), add_special_tokens)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        raise NotImplementedError

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> list[int]:
        """The ids of `messages` rendered with the chat template (as transformers'
        `apply_chat_template(..., tokenize=True)`: the template writes any BOS itself)."""
        if self.chat_template is None:
            raise PromptError("this tokenizer has no chat template; give a plain prompt, or a checkpoint whose "
                              "tokenizer_config.json (or GGUF) has a chat_template")
        text = self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **extra)
        return self.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def save(self, folder: Path) -> None:
        for f in self.files:
            shutil.copy(f, Path(folder) / f.name)


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({_short(e)}); fix or remove it") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} holds a {type(value).__name__}, expected a JSON object; fix or remove it")
    return value


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _token_text(value: Any) -> str | None:
    """A special token from a config: a str, or an AddedToken dict ({"content": ...})."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _token_options(value: Any) -> dict[str, bool]:
    """The AddedToken options (lstrip, rstrip, ...) of a token given as a dict in a config."""
    if not isinstance(value, Mapping):
        return {}
    return {k: bool(value[k]) for k in ("single_word", "lstrip", "rstrip", "normalized", "special") if k in value}


def _folder_config(folder: Path) -> tuple[dict, str | None]:
    """`tokenizer_config.json` (special tokens missing there taken from the legacy
    `special_tokens_map.json`) and the text of `chat_template.jinja`, which wins over the config's
    chat_template, as in transformers."""
    config = _read_json(folder / "tokenizer_config.json")
    for name, value in _read_json(folder / "special_tokens_map.json").items():
        if name in SPECIAL_TOKEN_NAMES and config.get(name) is None:
            config[name] = value
    jinja = folder / "chat_template.jinja"
    return config, (jinja.read_text(encoding="utf-8") if jinja.exists() else None)


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece `tokenizer.model`. BOS is added when `add_bos` says so; by default as the
    sibling tokenizer_config.json's add_bos_token says, else yes (LlamaTokenizer's default)."""

    def __init__(self, path: Path, add_bos: bool | None = None):
        import sentencepiece as spm

        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(path))
        except (OSError, RuntimeError) as e:
            raise CheckpointError(f"{path} is not a sentencepiece model ({e}); remove or replace it") from None
        config, jinja = _folder_config(Path(path).parent)
        if add_bos is None:
            add_bos = bool(config.get("add_bos_token", True))
        self._add_bos = add_bos and self._sp.bos_id() >= 0
        self.files = (Path(path),)
        self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else None
        eos = [self._sp.eos_id()] if self._sp.eos_id() >= 0 else []
        for piece in END_OF_TURN_TOKENS:
            i = self._sp.PieceToId(piece)
            # PieceToId gives the unk id for a piece the model does not have.
            if i != self._sp.unk_id() and self._sp.IdToPiece(i) == piece and i not in eos:
                eos.append(i)
        self.eos_ids = tuple(eos)
        special = {"bos_token": self.piece(self._sp.bos_id()), "eos_token": self.piece(self._sp.eos_id()),
                   "unk_token": self.piece(self._sp.unk_id()), "pad_token": self.piece(self._sp.pad_id())}
        special.update({n: t for n in SPECIAL_TOKEN_NAMES if (t := _token_text(config.get(n))) is not None})
        source = jinja if jinja is not None else chat_template_source(config.get("chat_template"))
        self.chat_template = ChatTemplate(source, {k: v for k, v in special.items() if v}) if source else None

    def piece(self, i: int) -> str | None:
        """Id `i`'s own vocabulary entry (its SentencePiece piece), None outside the vocabulary."""
        return self._sp.IdToPiece(i) if 0 <= i < self._sp.GetPieceSize() else None

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = list(self._sp.EncodeAsIds(text))
        return ([self._sp.bos_id()] if self._add_bos and add_special_tokens else []) + ids

    def decode(self, ids: list[int]) -> str:
        return self._sp.DecodeIds([int(i) for i in ids])

    @property
    def vocab_size(self) -> int:
        return self._sp.GetPieceSize()


# tokenizer_config.json keys dropped from a saved copy: files and remote code of the source
# repository (the copy has neither), and add_bos_token/add_eos_token, which transformers 5 neither
# reads next to a tokenizer.json nor saves (the framing is tokenizer.json's post-processor).
_DROPPED_CONFIG_KEYS = ("auto_map", "tokenizer_file", "vocab_file", "merges_file", "name_or_path",
                        "_commit_hash", "special_tokens_map_file", "tokenizer_class", "add_bos_token",
                        "add_eos_token")


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (a `tokenizer.json`) with the settings transformers reads from
    `tokenizer_config.json`: the named special tokens (bos_token, eos_token, ...),
    `added_tokens_decoder` and the chat template (`chat_template.jinja` wins over the config's).

    BOS/EOS framing is tokenizer.json's post-processor, as in transformers 5, which ignores the
    config's add_bos_token/add_eos_token when a tokenizer.json is present.
    """

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _Tok

        try:
            tok = _Tok.from_file(str(path))
        except Exception as e:  # the tokenizers library raises a bare Exception on parse errors
            raise CheckpointError(f"{path} is not a valid tokenizer.json ({e}); remove or replace it") from None
        folder = Path(path).parent
        config, jinja = _folder_config(folder)
        self.files = tuple(folder / n for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                                "chat_template.jinja") if (folder / n).exists())
        self._setup(tok, config, jinja, ())

    @classmethod
    def from_backend(cls, backend, config: Mapping[str, Any], extra_eos_ids: Iterable[int] = ()) -> HFTokenizer:
        """A tokenizer from a `tokenizers.Tokenizer` object (its post-processor frames sequences with
        BOS/EOS; the object is kept and may get added tokens) and tokenizer_config.json-style
        settings (special tokens, chat_template, ...); `extra_eos_ids` also end a reply."""
        self = cls.__new__(cls)
        self.files = ()
        self._setup(backend, dict(config), None, extra_eos_ids)
        return self

    def _setup(self, tok, config: dict, jinja: str | None, extra_eos_ids: Iterable[int]) -> None:
        from tokenizers import AddedToken

        self._tok = tok
        self._config = config
        self._jinja = jinja

        # As transformers does on load: tokens the config lists in added_tokens_decoder but
        # tokenizer.json lacks are added, and the named special tokens (bos, eos, ...) are made
        # special tokens (added if missing, so their ids may follow the vocabulary's).
        present = {t.content for t in tok.get_added_tokens_decoder().values()}
        decoder = config.get("added_tokens_decoder") or {}
        if isinstance(decoder, Mapping):
            for _, entry in sorted(decoder.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
                if isinstance(entry, Mapping) and isinstance(entry.get("content"), str) \
                        and entry["content"] not in present:
                    tok.add_tokens([AddedToken(entry["content"], **_token_options(entry))])
                    present.add(entry["content"])
        self.special_tokens = {n: t for n in SPECIAL_TOKEN_NAMES if (t := _token_text(config.get(n))) is not None}
        named = [AddedToken(_token_text(config[n]), **{"normalized": False, **_token_options(config[n]),
                                                       "special": True})
                 for n in SPECIAL_TOKEN_NAMES if n in self.special_tokens]
        if named:
            tok.add_special_tokens(named)

        bos, eos = self.special_tokens.get("bos_token"), self.special_tokens.get("eos_token")
        self.bos_id = tok.token_to_id(bos) if bos is not None else None
        eos_id = tok.token_to_id(eos) if eos is not None else None
        added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
        eos_ids = [eos_id] if eos_id is not None else []
        for i in [added[t] for t in END_OF_TURN_TOKENS if t in added] + [int(i) for i in extra_eos_ids]:
            if i not in eos_ids:
                eos_ids.append(i)
        self.eos_ids = tuple(eos_ids)

        source = jinja if jinja is not None else chat_template_source(config.get("chat_template"))
        self.chat_template = ChatTemplate(source, self.special_tokens) if source else None

        # transformers cleans up " ." -> "." etc. on decode only when asked to, and never for BPE.
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False)) \
            and type(tok.model).__name__ != "BPE"

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        text = self._tok.decode([int(i) for i in ids], skip_special_tokens=True)
        return _clean_up_spaces(text) if self._clean_up else text

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    @property
    def backend(self):
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    def save(self, folder: Path) -> None:
        """Write tokenizer.json (whose post-processor carries the BOS/EOS framing) and
        tokenizer_config.json (special tokens, chat template), which
        `transformers.AutoTokenizer.from_pretrained(folder)` loads to the same ids and the same
        rendered chat template."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(folder / "tokenizer.json"))
        config = {k: v for k, v in self._config.items() if k not in _DROPPED_CONFIG_KEYS}
        # The generic class: it takes tokenizer.json as it is (a model-specific class may rebuild
        # the pipeline its own way).
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config.update(self.special_tokens)
        if self.chat_template is not None:
            keep = self._jinja is None and isinstance(self._config.get("chat_template"), (list, tuple, Mapping))
            config["chat_template"] = self._config["chat_template"] if keep else self.chat_template.source
        else:
            config.pop("chat_template", None)
        config.setdefault("clean_up_tokenization_spaces", False)
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                                      encoding="utf-8")
        # A chat_template.jinja would win over the config's template: keep none of a stale one.
        (folder / "chat_template.jinja").unlink(missing_ok=True)


def _clean_up_spaces(text: str) -> str:
    """transformers' `clean_up_tokenization`: drop the space a word-piece decoder leaves before
    punctuation and English contractions."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


def find_tokenizer(folder: Path) -> Tokenizer | None:
    """The folder's tokenizer (tokenizer.json preferred), or None: the model then works on ids."""
    folder = Path(folder)
    if (folder / "tokenizer.json").exists():
        return HFTokenizer(folder / "tokenizer.json")
    if (folder / "tokenizer.model").exists():
        return SentencePieceTokenizer(folder / "tokenizer.model")
    return None

