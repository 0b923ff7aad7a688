"""Parity with Hugging Face transformers (torch CPU, float32) on tiny random checkpoints.

Every case builds a random HF model in the test (no downloads), saves it with
`save_pretrained(safe_serialization=True)` and loads it with `jaxspec.load`, then checks
(a) full-sequence logits, (b) greedy generation token-for-token (a batch of two prompts of
different lengths through jaxspec, each row against HF run on that row alone), (c) the
`Model.save` -> `AutoModelForCausalLM.from_pretrained` round trip. Weights are drawn with a
large std so logits are far from uniform and greedy argmax is not tie-prone.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import struct
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jaxspec  # noqa: E402
from jaxspec.checkpoint.llama2c import interleaved_to_rotate_half  # noqa: E402
from jaxspec.models.config import ModelConfig, RopeConfig  # noqa: E402
from jaxspec.models.kv_cache import KVCache  # noqa: E402
from jaxspec.models.model import causal_mask  # noqa: E402
from jaxspec.checkpoint.tokenizer import HFTokenizer, SentencePieceTokenizer  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

WEIGHT_STD = 0.25
MAX_NEW = 24

BASE = dict(vocab_size=160, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)

# name -> (config class, overrides, prompt length)
CASES = {
    "llama_mha": (transformers.LlamaConfig, dict(num_key_value_heads=4), 24),
    "llama_gqa": (transformers.LlamaConfig, dict(), 28),
    "llama_mqa": (transformers.LlamaConfig, dict(num_key_value_heads=1), 20),
    "llama3_rope": (transformers.LlamaConfig, dict(
        max_position_embeddings=256, eos_token_id=[2, 7],
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=32)), 100),
    "llama_bias": (transformers.LlamaConfig, dict(attention_bias=True, mlp_bias=True), 26),
    "llama_tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True), 22),
    "qwen2": (transformers.Qwen2Config, dict(), 30),
    "qwen3": (transformers.Qwen3Config, dict(head_dim=16), 27),
    "mistral": (transformers.MistralConfig, dict(sliding_window=8), 33),
    # Gemma 3: sliding (window 8, local rope base) and full layers, a non-default attention scale,
    # q/k norms, (1 + w) norms, scaled tied embeddings, GeGLU, final logit soft-capping.
    "gemma3": (transformers.Gemma3TextConfig, dict(
        head_dim=16, sliding_window=8, query_pre_attn_scalar=24, final_logit_softcapping=30.0,
        num_hidden_layers=3, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": dict(rope_type="linear", rope_theta=1e6, factor=4.0),
                         "sliding_attention": dict(rope_type="default", rope_theta=1e4)},
        pad_token_id=0), 33),
    # Gemma 2: every other layer windowed, attention and final logit soft-capping (small caps, so
    # they bite on these random weights), no q/k norms, one RoPE.
    "gemma2": (transformers.Gemma2Config, dict(
        head_dim=16, sliding_window=8, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
        final_logit_softcapping=10.0, num_hidden_layers=3, pad_token_id=0), 33),
}


def randomize(model, seed: int, std: float = WEIGHT_STD):
    """Redraw every parameter (norm weights around 1, everything else around 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # (Gemma's norms apply 1 + w: around 0 there)
            mean = 1.0 if name.endswith("norm.weight") and "Gemma" not in type(model).__name__ else 0.0
            p.copy_(mean + std * torch.randn(p.shape, generator=gen))
    return model.eval()


def build_hf(config_cls, overrides: dict, seed: int):
    torch.manual_seed(seed)
    cfg = config_cls(**{**BASE, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                         dtype=torch.float32)
    return randomize(model, seed)


def hf_logits(hf, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.as_tensor(np.asarray(tokens), dtype=torch.long)).logits.float().numpy()


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, params, tokens, lengths):
    module = nnx.merge(graphdef, params)
    cfg = module.config
    b, t = tokens.shape
    cache = KVCache.zeros(cfg.num_layers, b, t, cfg.num_kv_heads, cfg.head_dim)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return module(tokens, positions, causal_mask(lengths, t), cache).logits


def jax_logits(model, tokens: np.ndarray, lengths=None) -> np.ndarray:
    """jaxspec's forward over a right-padded block from an empty cache (causal_mask, KVCache.zeros)."""
    tokens = np.asarray(tokens, np.int32)
    b, t = tokens.shape
    lengths = np.full((b,), t, np.int32) if lengths is None else np.asarray(lengths, np.int32)
    return np.asarray(_forward(model.graphdef, model.params, jnp.asarray(tokens), jnp.asarray(lengths)))


def hf_greedy(hf, prompt: list[int], max_new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=max_new, min_new_tokens=0,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@dataclasses.dataclass
class Case:
    name: str
    hf: object
    model: object
    folder: Path
    prompt_len: int
    seed: int

    def rng(self, salt: int) -> np.random.Generator:
        """Per-test data, independent of which other tests ran first."""
        return np.random.default_rng([self.seed, salt])


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    name = request.param
    config_cls, overrides, prompt_len = CASES[name]
    seed = list(CASES).index(name) + 1
    hf = build_hf(config_cls, overrides, seed)
    folder = tmp_path_factory.mktemp(name)
    hf.save_pretrained(folder, safe_serialization=True)
    return Case(name, hf, jaxspec.load(folder), folder, prompt_len, seed)


def test_config_matches_hf(case):
    hc, cfg = case.hf.config, case.model.config
    assert cfg.model_type == hc.model_type
    assert cfg.num_kv_heads == hc.num_key_value_heads
    assert cfg.head_dim == case.hf.model.layers[0].self_attn.head_dim
    assert cfg.tie_word_embeddings == bool(hc.tie_word_embeddings)
    attn = case.hf.model.layers[0].self_attn
    assert cfg.qkv_bias == (attn.q_proj.bias is not None)
    assert cfg.o_bias == (attn.o_proj.bias is not None)
    assert cfg.mlp_bias == (case.hf.model.layers[0].mlp.gate_proj.bias is not None)
    assert cfg.qk_norm == hasattr(attn, "q_norm")
    assert cfg.sliding_window == getattr(hc, "sliding_window", None)
    assert cfg.num_params == sum(p.numel() for p in case.hf.parameters())
    # Rotary frequencies equal HF's (float32 there, float64 here); Gemma 3 has one per layer type.
    rotary = case.hf.model.rotary_emb
    if cfg.model_type.startswith("gemma"):  # every layer's window as transformers' layer_types say
        assert [cfg.layer_window(i) for i in range(cfg.num_layers)] == [
            hc.sliding_window if t == "sliding_attention" else None for t in hc.layer_types]
    if cfg.layer_types and hasattr(rotary, "sliding_attention_inv_freq"):  # Gemma 3: one RoPE per layer type
        assert list(cfg.layer_types) == hc.layer_types
        for i, kind in enumerate(hc.layer_types):
            np.testing.assert_allclose(cfg.layer_rope(i).inverse_frequencies(cfg.head_dim),
                                       getattr(rotary, f"{kind}_inv_freq").numpy(), rtol=1e-6)
            assert cfg.layer_window(i) == (hc.sliding_window if kind == "sliding_attention" else None)
    else:
        np.testing.assert_allclose(cfg.rope.inverse_frequencies(cfg.head_dim), rotary.inv_freq.numpy(), rtol=1e-6)


def test_logits_match_hf(case):
    tokens = case.rng(1).integers(0, case.model.config.vocab_size, (2, case.prompt_len))
    expected = hf_logits(case.hf, tokens)
    assert expected.std() > 0.5  # the random weights give peaked, not near-uniform, logits
    np.testing.assert_allclose(jax_logits(case.model, tokens), expected, atol=1e-4, rtol=1e-4)


def test_padded_row_logits_match_hf(case):
    """A right-padded shorter row (causal_mask with lengths) equals HF on that row alone."""
    t, short = case.prompt_len, case.prompt_len - 7
    tokens = case.rng(2).integers(0, case.model.config.vocab_size, (2, t))
    got = jax_logits(case.model, tokens, lengths=[t, short])
    np.testing.assert_allclose(got[1, :short], hf_logits(case.hf, tokens[1:, :short])[0], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(got[0], hf_logits(case.hf, tokens[:1])[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ["mistral", "gemma3"], indirect=True)  # (Gemma 2 has no sdpa path)
def test_sdpa_sliding_window_matches(case):
    """HF's sdpa path (not just eager) agrees on the sliding-window mask; prompt > window."""
    assert case.model.config.sliding_window == 8
    assert case.prompt_len > 3 * case.model.config.sliding_window
    sdpa = transformers.AutoModelForCausalLM.from_pretrained(case.folder, attn_implementation="sdpa").eval()
    tokens = case.rng(3).integers(0, case.model.config.vocab_size, (2, case.prompt_len))
    np.testing.assert_allclose(jax_logits(case.model, tokens), hf_logits(sdpa, tokens), atol=1e-4, rtol=1e-4)


def test_greedy_matches_hf(case):
    vocab = case.model.config.vocab_size
    rng = case.rng(4)
    prompts = [rng.integers(3, vocab, n).tolist() for n in (case.prompt_len, case.prompt_len - 9)]
    out = jaxspec.generate(case.model, prompts, max_new_tokens=MAX_NEW, stop_at_eos=False)
    for prompt, got in zip(prompts, out.tokens):
        expected = hf_greedy(case.hf, prompt, MAX_NEW)
        assert len(expected) == MAX_NEW  # HF did not stop early
        assert got == expected


def test_save_round_trip_to_transformers(case, tmp_path):
    case.model.save(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(reloaded) is type(case.hf)
    tokens = case.rng(5).integers(0, case.model.config.vocab_size, (2, case.prompt_len))
    np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(case.hf, tokens), atol=1e-5, rtol=0)
    # ... and jaxspec reads its own output back to the same config.
    assert jaxspec.load(tmp_path).config == case.model.config


def test_sharded_checkpoint_matches_hf(tmp_path):
    hf = build_hf(transformers.Qwen2Config, {}, seed=21)
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    tokens = np.random.default_rng(21).integers(0, 160, (2, 19))
    np.testing.assert_allclose(jax_logits(jaxspec.load(tmp_path), tokens), hf_logits(hf, tokens),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ["llama3_rope"], indirect=True)
def test_llama3_scaling_matters(case):
    """The llama3 case really exercises the scaling: frequencies move, and so do the logits."""
    rope = case.model.config.rope
    assert rope.rope_type == "llama3" and rope.original_max_position_embeddings == 32
    scaled = rope.inverse_frequencies(case.model.config.head_dim)
    plain = RopeConfig(theta=rope.theta).inverse_frequencies(case.model.config.head_dim)
    assert scaled[0] == plain[0] and np.all(scaled[1:] < plain[1:])
    unscaled = transformers.AutoModelForCausalLM.from_pretrained(
        case.folder, attn_implementation="eager",
        rope_parameters=dict(rope_type="default", rope_theta=rope.theta)).eval()
    tokens = case.rng(6).integers(0, case.model.config.vocab_size, (1, case.prompt_len))
    assert np.abs(hf_logits(unscaled, tokens) - hf_logits(case.hf, tokens)).max() > 1e-2


@pytest.mark.parametrize("rope_parameters", [
    dict(rope_type="default", rope_theta=1e6),
    dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
    dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=2.0, high_freq_factor=8.0,
         original_max_position_embeddings=64),
], ids=["default", "linear", "llama3"])
def test_rope_frequencies_match_hf(rope_parameters):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hc = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=512,
                                  rope_parameters=rope_parameters)
    rotary = LlamaRotaryEmbedding(hc)
    assert rotary.attention_scaling == 1.0
    cfg = ModelConfig.from_hf(hc.to_dict())
    np.testing.assert_allclose(cfg.rope.inverse_frequencies(32), rotary.inv_freq.numpy(), rtol=1e-6)


@pytest.mark.parametrize("layout", ["rope_scaling_type", "rope_scaling_rope_type"])
def test_legacy_rope_scaling_config(layout):
    """transformers 4 layout: top-level rope_theta + rope_scaling (with `type` or `rope_type`)."""
    _, overrides, _ = CASES["llama3_rope"]
    params = dict(overrides["rope_parameters"])
    theta = params.pop("rope_theta")
    key = "type" if layout == "rope_scaling_type" else "rope_type"
    params[key] = params.pop("rope_type")
    rest = {k: v for k, v in overrides.items() if k != "rope_parameters"}
    legacy = {**BASE, **rest, "model_type": "llama", "rope_theta": theta, "rope_scaling": params}
    modern = {**BASE, **overrides, "model_type": "llama"}
    assert ModelConfig.from_hf(legacy) == ModelConfig.from_hf(modern)


# --- llama2.c ----------------------------------------------------------------------------


def rotate_half_to_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of `interleaved_to_rotate_half`: halves (i, i + d/2) back to pairs (2i, 2i+1)."""
    out, inp = w.shape
    head_dim = out // n_heads
    return w.reshape(n_heads, 2, head_dim // 2, inp).transpose(0, 2, 1, 3).reshape(out, inp)


def write_llama2c(path: Path, hf) -> None:
    """A llama2.c legacy (v0) .bin from an HF Llama's weights."""
    c = hf.config
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    layers = range(c.num_hidden_layers)
    head_dim = c.hidden_size // c.num_attention_heads
    shared = bool(c.tie_word_embeddings)
    header = (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
              c.num_key_value_heads, c.vocab_size if shared else -c.vocab_size, c.max_position_embeddings)

    def stack(fmt, fn=lambda w: w):
        return np.stack([fn(sd[fmt.format(i)]) for i in layers])

    angles = np.arange(c.max_position_embeddings)[:, None] * (
        1.0 / 10000.0 ** (np.arange(0, head_dim, 2) / head_dim))[None]
    arrays = [
        sd["model.embed_tokens.weight"],
        stack("model.layers.{}.input_layernorm.weight"),
        stack("model.layers.{}.self_attn.q_proj.weight", lambda w: rotate_half_to_interleaved(w, c.num_attention_heads)),
        stack("model.layers.{}.self_attn.k_proj.weight", lambda w: rotate_half_to_interleaved(w, c.num_key_value_heads)),
        stack("model.layers.{}.self_attn.v_proj.weight"),
        stack("model.layers.{}.self_attn.o_proj.weight"),
        stack("model.layers.{}.post_attention_layernorm.weight"),
        stack("model.layers.{}.mlp.gate_proj.weight"),
        stack("model.layers.{}.mlp.down_proj.weight"),
        stack("model.layers.{}.mlp.up_proj.weight"),
        sd["model.norm.weight"],
        np.cos(angles), np.sin(angles),
    ]
    if not shared:
        arrays.append(sd["lm_head.weight"])
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", *header))
        for a in arrays:
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def test_rotate_half_permutation_inverse():
    w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)
    assert not np.array_equal(rotate_half_to_interleaved(w, 6), w)
    np.testing.assert_array_equal(interleaved_to_rotate_half(rotate_half_to_interleaved(w, 6), 6), w)


@pytest.mark.parametrize("tied", [True, False], ids=["shared_classifier", "wcls"])
def test_llama2c_loader_matches_hf(tied, tmp_path):
    hf = build_hf(transformers.LlamaConfig, dict(tie_word_embeddings=tied, rope_parameters=None), seed=7)
    assert hf.config.rope_parameters["rope_theta"] == 10000.0
    path = tmp_path / "tiny.bin"
    write_llama2c(path, hf)
    model = jaxspec.load(path)
    assert model.config.tie_word_embeddings == tied
    assert (model.config.num_heads, model.config.num_kv_heads) == (4, 2)
    tokens = np.random.default_rng(7).integers(0, 160, (2, 30))
    np.testing.assert_allclose(jax_logits(model, tokens), hf_logits(hf, tokens), atol=1e-4, rtol=1e-4)


# --- tokenizers --------------------------------------------------------------------------


def corpus() -> list[str]:
    rng = np.random.default_rng(0)
    words = ["once", "upon", "a", "time", "there", "was", "little", "cat", "dog", "who", "liked", "to",
             "play", "in", "the", "park", "sun", "was", "bright", "and", "happy", "friends", "ran", "home"]
    return [" ".join(rng.choice(words, rng.integers(4, 12))).capitalize() + "." for _ in range(400)]


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory):
    """An HF Llama folder (vocab 320) with a sentencepiece BPE tokenizer.model (byte fallback)."""
    import sentencepiece as spm

    folder = tmp_path_factory.mktemp("sp_llama")
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=buf, model_type="bpe", vocab_size=300,
        byte_fallback=True, character_coverage=1.0, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
        # LLaMA 2's sentencepiece settings (no normalisation), which HF's LlamaTokenizer assumes.
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        minloglevel=2,
    )
    (folder / "tokenizer.model").write_bytes(buf.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False}))
    hf = build_hf(transformers.LlamaConfig, dict(vocab_size=320), seed=11)
    hf.save_pretrained(folder, safe_serialization=True)
    return folder, hf


def test_sentencepiece_tokenizer(tokenizer_folder):
    import sentencepiece as spm

    folder, hf = tokenizer_folder
    model = jaxspec.load(folder)
    tok = model.tokenizer
    assert isinstance(tok, SentencePieceTokenizer)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    assert tok.vocab_size == sp.get_piece_size() == 300
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    for text in ["Once upon a time the cat ran home.", "Zoë saw 🙂 — naïve #42!", "Hello\nworld  x"]:
        ids = tok.encode(text)
        assert ids == [1] + sp.encode(text)
        assert ids == hf_tok.encode(text)
        assert tok.decode(ids) == text
    assert len(tok.encode("🙂")) > 2  # byte fallback: unseen characters become byte pieces

    text = "Once upon a time there was"
    out = jaxspec.generate(model, text, max_new_tokens=12, stop_at_eos=False)  # one unbatched prompt
    assert isinstance(out.text, str)
    assert out.tokens == hf_greedy(hf, tok.encode(text), 12)
    assert out.text == sp.decode(out.tokens)


def test_tokenizer_json_preferred_over_sentencepiece(tokenizer_folder, tmp_path):
    import shutil

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder, hf = tokenizer_folder
    both = tmp_path / "both"
    shutil.copytree(folder, both)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus(), trainers.BpeTrainer(
        vocab_size=290, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    bpe.save(str(both / "tokenizer.json"))
    assert bpe.get_vocab_size() <= 320

    model = jaxspec.load(both)
    assert isinstance(model.tokenizer, HFTokenizer)
    text = "The happy dog liked to play — ünïcode 🙂"
    ids = model.tokenizer.encode(text)
    assert ids == bpe.encode(text).ids
    assert ids != SentencePieceTokenizer(both / "tokenizer.model").encode(text)
    assert model.tokenizer.decode(ids) == text
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(both / "tokenizer.json"))
    assert fast.encode(text, add_special_tokens=False) == ids

    out = jaxspec.generate(model, "The cat", max_new_tokens=8, stop_at_eos=False)
    assert out.tokens == hf_greedy(hf, bpe.encode("The cat").ids, 8)

    # Model.save carries the tokenizer files along.
    saved = tmp_path / "saved"
    model.save(saved)
    assert (saved / "tokenizer.json").exists()
    assert jaxspec.load(saved).tokenizer.encode(text) == ids
    assert json.loads((saved / "config.json").read_text())["vocab_size"] == 320


def test_gemma3_multimodal_checkpoint_loads_its_language_model(tmp_path):
    """A `Gemma3ForConditionalGeneration` folder (model_type "gemma3", the text config nested, the
    language model's tensors under `model.language_model.`, a vision tower beside them): jaxspec
    loads the language model, whose logits on text equal transformers' multimodal model's."""
    text = dict(BASE, head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    torch.manual_seed(41)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    hf = randomize(transformers.Gemma3ForConditionalGeneration(config).to(torch.float32), 41)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = jaxspec.load(tmp_path)
    assert model.config.model_type == "gemma3_text" and model.config.layer_types == tuple(text["layer_types"])
    tokens = np.random.default_rng(41).integers(3, 160, (1, 30))
    with torch.no_grad():
        expected = hf(input_ids=torch.as_tensor(tokens), attention_mask=torch.ones(1, 30, dtype=torch.long)).logits
    np.testing.assert_allclose(jax_logits(model, tokens), expected.float().numpy(), atol=1e-4, rtol=1e-4)
