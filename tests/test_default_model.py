"""The shipped default model (jaxspec/assets/pycode-5M): integrity, default loading, CLI, and
greedy parity with Hugging Face transformers on the very folder that ships."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

import jaxspec
from jaxspec.cli import main
from jaxspec.checkpoint.loading import DEFAULT_MODEL, NAMED_MODELS
from jaxspec.train.train_config import load_train_config
from jaxspec.train.corpus import read_text

REPO = Path(__file__).resolve().parents[1]
FOLDER = NAMED_MODELS[DEFAULT_MODEL]()
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def model():
    return jaxspec.load()


def test_shipped_folder_is_complete_small_and_matches_its_card_and_config():
    files = {p.name for p in FOLDER.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.model", "README.md"} <= files
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) <= 15 * 2**20
    card = (FOLDER / "README.md").read_text()
    digest = re.search(r"model.safetensors sha256: `([0-9a-f]{64})`", card).group(1)
    assert hashlib.sha256((FOLDER / "model.safetensors").read_bytes()).hexdigest() == digest
    trained = load_train_config(REPO / "configs" / "pycode.toml").model_config()
    hf = json.loads((FOLDER / "config.json").read_text())
    assert hf["torch_dtype"] == "bfloat16"
    shipped = jaxspec.ModelConfig.from_hf(hf)
    assert shipped == trained  # the shipped architecture is the one configs/pycode.toml trains


def test_default_load_is_the_shipped_model(model):
    assert model.source == str(FOLDER)
    assert model.tokenizer.vocab_size == model.config.vocab_size == 4096
    code = read_text(REPO / "jaxspec" / "train" / "corpus.py")
    assert model.tokenizer.decode(model.tokenizer.encode(code)[1:]) == code  # exact round trip


def test_cli_generates_without_model_flag(capsys):
    assert main(["generate", "--prompt", PROMPT, "--max-new-tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["tokens"]) == 16 and out["config"]["model"] == str(FOLDER)


def test_lookahead_equals_greedy_on_code(model):
    greedy = jaxspec.generate(model, PROMPT, max_new_tokens=64, stop_at_eos=False)
    look = jaxspec.generate(model, PROMPT, max_new_tokens=64, method="lookahead", stop_at_eos=False)
    assert look.tokens == greedy.tokens
    assert look.steps < greedy.steps


def test_transformers_loads_the_shipped_folder_with_the_same_greedy_output(model):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    ids = model.tokenizer.encode(PROMPT)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False, eos_token_id=None,
                          min_new_tokens=48, pad_token_id=0)
    theirs = out[0, len(ids):].tolist()
    ours = jaxspec.generate(model, ids, max_new_tokens=48, stop_at_eos=False).tokens
    assert ours == theirs
    # and the logits agree, not just the argmax
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].numpy()
    from jaxspec.train.objective import sequence_logits
    import jax.numpy as jnp

    np.testing.assert_allclose(np.asarray(sequence_logits(model.module, jnp.asarray([ids]))[0]), logits,
                               atol=2e-4, rtol=1e-4)
