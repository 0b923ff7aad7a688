"""The tokenizer of a GGUF file, rebuilt from its metadata as a `tokenizers.Tokenizer`.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary (`tokenizer.ggml.tokens`, with
`scores` and a `token_type` per token), the BPE merges, the special token ids, the BOS/EOS flags and
the chat template as metadata. We rebuild the pipeline transformers' GGUF converter builds
(`transformers.integrations.gguf.gguf_tokenizer_mapping`), so the ids match
`AutoTokenizer.from_pretrained(folder, gguf_file=...)`:

- "gpt2" (byte-level BPE: GPT-2, Llama 3, Qwen2, SmolLM, ...): the vocabulary in GPT-2's byte
  alphabet, the file's merges, a pre-tokenizer split picked by `tokenizer.ggml.pre` and a
  byte-level decoder;
- "llama" (sentencepiece BPE: Llama 2, Mistral, TinyLlama, ...): the pieces with byte fallback,
  merges from the file or, as usual, derived from the pieces' scores, "\u2581" for spaces with one
  added in front of the text (`tokenizer.ggml.add_space_prefix`), no normalizer.

Tokens typed CONTROL become special tokens, USER_DEFINED ones plain added tokens (both are matched
whole in the text); BOS is added when `tokenizer.ggml.add_bos_token` says so (for "llama" files
without the flag too, as llama.cpp does), EOS when `add_eos_token` does.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from jaxspec.errors import CheckpointError
from jaxspec.checkpoint.tokenizer import HFTokenizer

# llama.cpp's token types (gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer splits of byte-level vocabularies, by `tokenizer.ggml.pre`: the regex the
# vocabulary's merges were learned on (llama.cpp's `llama_vocab` and the models' tokenizer.json).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "minimax-m2"), _GPT4O_SPLIT),
}
# Vocabularies trained on text with every digit split off (llama.cpp splits "\p{N}" first, then
# applies GPT-2's regex; SmolLM2's and StarCoder's tokenizer.json: Digits + ByteLevel). On such a
# vocabulary this gives the ids transformers' converter gives with GPT-2's regex alone, since no
# merge joins a digit to anything.
DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
# Every other name ("gpt2", "default", ...) gets GPT-2's own byte-level regex, as in transformers.

SUPPORTED_MODELS = ("gpt2", "llama")


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for themselves, the
    others (controls, space, ...) take the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    spelling = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def tokenizer_from_gguf(metadata: Mapping[str, Any]) -> HFTokenizer | None:
    """The tokenizer a GGUF file's metadata describes (keys as in the file, values as
    `gguf.GGUFReader(path).fields[key].contents()` gives them), or None for a file with no
    vocabulary (`tokenizer.ggml.model` absent or "none"): the model then works on ids.
    CheckpointError for a tokenizer model other than "gpt2" and "llama", or malformed fields."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind is None or kind == "none":
        return None
    if kind not in SUPPORTED_MODELS:
        raise CheckpointError(f"GGUF tokenizer model {kind!r} (tokenizer.ggml.model) is not supported; "
                              f"supported: {', '.join(SUPPORTED_MODELS)}")
    tokens = _str_list(metadata, "tokenizer.ggml.tokens", required=True)
    n = len(tokens)
    types = _int_list(metadata, "tokenizer.ggml.token_type", n)
    merges = _merges(metadata)
    named = {name: _token_id(metadata, f"tokenizer.ggml.{key}", n) for name, key in (
        ("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"))}
    named = {name: i for name, i in named.items() if i is not None}

    if kind == "gpt2":
        # Control and user-defined tokens, and the named special ones, keep their spelling.
        raw = {i for i, ty in enumerate(types) if ty in (CONTROL, USER_DEFINED)} | set(named.values())
        backend = _byte_level_bpe(tokens, raw, merges, metadata.get("tokenizer.ggml.pre"))
    else:
        scores = _float_list(metadata, "tokenizer.ggml.scores", n)
        if merges is None and scores is None:
            raise CheckpointError("GGUF metadata has neither tokenizer.ggml.merges nor tokenizer.ggml.scores; "
                                  "a sentencepiece vocabulary needs one of them")
        if merges is None:
            merges = merges_from_scores(tokens, scores)
        unk = tokens[named["unk_token"]] if "unk_token" in named else None
        backend = _sentencepiece_bpe(tokens, merges, unk, bool(metadata.get("tokenizer.ggml.add_space_prefix", True)))

    # Control tokens are matched whole and dropped when decoding; user-defined ones are matched
    # whole and kept.
    from tokenizers import AddedToken

    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    if control:
        backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)

    # BOS/EOS framing. llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise.
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", kind == "llama")) and "bos_token" in named
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and "eos_token" in named
    backend.post_processor = _framing(tokens, named.get("bos_token") if add_bos else None,
                                      named.get("eos_token") if add_eos else None)

    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                              **{name: tokens[i] for name, i in named.items()}}
    template = metadata.get("tokenizer.chat_template")
    if template is not None:
        if not isinstance(template, str):
            raise CheckpointError(f"GGUF tokenizer.chat_template is a {type(template).__name__}, expected a str; "
                                  "the file is damaged")
        config["chat_template"] = template
    # The end-of-turn ids the file names stop a reply too.
    eot_keys = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    extra_eos = [i for k in eot_keys if (i := _token_id(metadata, k, n)) is not None]
    return HFTokenizer.from_backend(backend, config, extra_eos_ids=extra_eos)


def _framing(tokens: Sequence[str], bos: int | None, eos: int | None):
    """The post-processor that puts BOS before and EOS after a sequence (each only if given), as
    transformers' `update_post_processor` writes it."""
    from tokenizers import processors

    def frame(part: str, type_id: int) -> list[str]:
        return ([f"{tokens[bos]}:{type_id}"] if bos is not None else []) + [f"${part}:{type_id}"] \
            + ([f"{tokens[eos]}:{type_id}"] if eos is not None else [])

    specials = [(tokens[i], i) for i in dict.fromkeys(x for x in (bos, eos) if x is not None)]
    return processors.TemplateProcessing(single=" ".join(frame("A", 0)),
                                         pair=" ".join(frame("A", 0) + frame("B", 1)), special_tokens=specials)


def _byte_level_bpe(tokens: Sequence[str], raw: set[int], merges, pre: str | None):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    # The vocabulary is written in GPT-2's byte alphabet; a token that is not (a mislabelled file)
    # is respelled from its UTF-8 bytes, as transformers does, unless it is in `raw`: tokens matched
    # whole in the text, before the byte mapping (control, user-defined and named special ones).
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {}
    for i, token in enumerate(tokens):
        if i not in raw and not set(token) <= alphabet:
            token = "".join(spelling[b] for b in token.encode("utf-8"))
        vocab[token] = i
    if merges is None:
        raise CheckpointError("GGUF metadata of a byte-level BPE tokenizer has no tokenizer.ggml.merges; "
                              "the file is incomplete")
    try:
        bpe = models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                         end_of_word_suffix="", fuse_unk=False, byte_fallback=False)
    except Exception as e:  # tokenizers raises bare Exceptions (e.g. a merge of unknown tokens)
        raise CheckpointError(f"GGUF tokenizer vocabulary and merges do not fit ({_short(e)}); "
                              "the file is damaged") from None
    tok = Tokenizer(bpe)
    if pre in PRE_TOKENIZER_SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif pre in DIGIT_SPLIT_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(tokens: Sequence[str], merges, unk: str | None, add_space_prefix: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(tokens)}
    try:
        bpe = models.BPE(vocab=vocab, merges=merges, dropout=None, fuse_unk=True, byte_fallback=True,
                         unk_token=unk)
    except Exception as e:  # tokenizers raises bare Exceptions
        raise CheckpointError(f"GGUF tokenizer vocabulary and merges do not fit ({_short(e)}); "
                              "the file is damaged") from None
    tok = Tokenizer(bpe)
    # Spaces become "\u2581"; the text is not split, and gets one "\u2581" in front (only at its
    # very start, not after each special token: transformers' non-legacy Llama behaviour).
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if add_space_prefix else "never", split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))  # the space added in front
    tok.decoder = decoders.Sequence(steps)
    return tok


def merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges for a sentencepiece vocabulary that lists none: every split of a piece into two
    pieces of the vocabulary is a merge, ranked by the merged piece's score, best first (ties:
    longer left part, then longer right part, then vocabulary order). This is the order
    sentencepiece's BPE applies them in, and the one transformers derives."""
    index = {token: i for i, token in enumerate(tokens)}
    found = []
    for token, score in dict(zip(tokens, scores)).items():
        pairs = [(token[:k], token[k:]) for k in range(1, len(token)) if token[:k] in index and token[k:] in index]
        pairs.sort(key=lambda p: (index[p[0]], index[p[1]]))
        found.extend((left, right, score) for left, right in pairs)
    # A stable sort, descending: equal keys keep the order above.
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _str_list(metadata: Mapping[str, Any], key: str, required: bool = False) -> list[str] | None:
    value = metadata.get(key)
    if value is None:
        if required:
            raise CheckpointError(f"GGUF metadata has no {key!r}; the file has no vocabulary")
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise CheckpointError(f"GGUF {key} must be a list of strings; the file is damaged")
    if required and not value:
        raise CheckpointError(f"GGUF {key} is empty; the file has no vocabulary")
    return list(value)


def _int_list(metadata: Mapping[str, Any], key: str, n: int) -> list[int]:
    value = metadata.get(key)
    if value is None:
        return [NORMAL] * n
    if not isinstance(value, (list, tuple)) or len(value) != n:
        raise CheckpointError(f"GGUF {key} must list one value per token ({n}); the file is damaged")
    return [int(v) for v in value]


def _float_list(metadata: Mapping[str, Any], key: str, n: int) -> list[float] | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or len(value) != n:
        raise CheckpointError(f"GGUF {key} must list one value per token ({n}); the file is damaged")
    return [float(v) for v in value]


def _merges(metadata: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    lines = _str_list(metadata, "tokenizer.ggml.merges")
    if lines is None:
        return None
    merges = []
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 2:
            raise CheckpointError(f"GGUF tokenizer.ggml.merges entry {line!r} is not two tokens separated by "
                                  "one space; the file is damaged")
        merges.append((parts[0], parts[1]))
    return merges


def _token_id(metadata: Mapping[str, Any], key: str, n: int) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    try:
        value = operator.index(value)  # an int, or a numpy integer
    except TypeError:
        pass
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < n:
        raise CheckpointError(f"GGUF {key} is {value!r}, not a token id below {n}; the file is damaged")
    return value
