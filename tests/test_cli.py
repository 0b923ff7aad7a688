"""The `jaxspec` command line: JSON output on a real checkpoint, and one-line errors for bad input.

Bad input must exit with code 2 and print exactly one line on stderr that names the problem
(no traceback). The same inputs through the Python API raise `jaxspec.JaxspecError`
subclasses (all `ValueError`s). Corrupt checkpoints are built in the test from a tiny random
model saved with `Model.save`, then edited.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import jax
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.checkpoint.safetensors_io import read_safetensors, write_safetensors

REPO = Path(__file__).resolve().parents[1]
from cli_runner import run_cli  # noqa: F401 (also imported from here by other test modules)
from stories import CHECKPOINT, REFERENCE, STORIES, needs_stories

JSON_KEYS = {"tokens", "text", "finish_reason", "steps", "compression", "seconds", "tokens_per_second", "method", "config", "memory",
             "auto"}

TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=1, eos_token_ids=(2,),
)
K_PROJ = "model.layers.0.self_attn.k_proj.weight"  # HF shape (num_kv_heads * head_dim, hidden) = (16, 32)
UP_PROJ = "model.layers.1.mlp.up_proj.weight"
EXTRA = "model.layers.5.self_attn.q_proj.weight"


def assert_one_line_error(code: int, out: str, err: str, needles: list[str]) -> None:
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jaxspec: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# ----------------------------------------------------------------------------- checkpoints on disk


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> dict[str, Path]:
    """A good tiny HF folder and corrupt variants of it; truncated llama2.c files."""
    root = tmp_path_factory.mktemp("ckpt")
    model = jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0)))
    good = model.save(root / "good")
    tensors = {k: np.array(v) for k, v in read_safetensors(good / "model.safetensors").items()}
    assert tensors[K_PROJ].shape == (16, 32)

    def variant(name: str, edit_tensors: Callable[[dict], None] | None = None) -> Path:
        folder = model.save(root / name)
        if edit_tensors is not None:
            edited = dict(tensors)
            edit_tensors(edited)
            write_safetensors(folder / "model.safetensors", edited)
        return folder

    paths = {"good": good, "missing_path": root / "does-not-exist"}

    paths["unknown_model_type"] = variant("unknown_model_type")
    config = json.loads((paths["unknown_model_type"] / "config.json").read_text())
    config["model_type"] = "gpt2"
    (paths["unknown_model_type"] / "config.json").write_text(json.dumps(config))

    paths["missing_tensor"] = variant("missing_tensor", lambda t: t.pop(UP_PROJ))
    paths["unexpected_tensor"] = variant("unexpected_tensor",
                                         lambda t: t.__setitem__(EXTRA, np.zeros((32, 32), np.float32)))
    paths["misshaped_tensor"] = variant("misshaped_tensor",
                                        lambda t: t.__setitem__(K_PROJ, np.zeros((8, 32), np.float32)))

    paths["truncated_safetensors"] = variant("truncated_safetensors")
    blob = (good / "model.safetensors").read_bytes()
    (paths["truncated_safetensors"] / "model.safetensors").write_bytes(blob[: len(blob) // 2])

    paths["unreadable_weights"] = variant("unreadable_weights")  # model.safetensors is a directory
    (paths["unreadable_weights"] / "model.safetensors").unlink()
    (paths["unreadable_weights"] / "model.safetensors").mkdir()

    if CHECKPOINT.exists():
        head = CHECKPOINT.read_bytes()[:5000]
        (root / "truncated.bin").write_bytes(head)
        (root / "header_only.bin").write_bytes(head[:20])
        paths["truncated_bin"] = root / "truncated.bin"
        paths["short_header_bin"] = root / "header_only.bin"
    (root / "empty.bin").write_bytes(b"")
    paths["empty_bin"] = root / "empty.bin"
    return paths


@pytest.fixture(scope="module")
def tiny(ckpt) -> jaxspec.Model:
    return jaxspec.load(ckpt["good"])


# ----------------------------------------------------------------------------- bad input cases

# name -> (CLI args after `generate --model PATH`, library call, error class, substrings of the message)
# The library call gets (ckpt paths, loaded tiny model).
LOAD_CASES = {
    "missing_path": (jaxspec.CheckpointError, ["does-not-exist", "does not exist"]),
    "unknown_model_type": (jaxspec.ConfigError, ["'gpt2'", "model_type", "llama"]),
    "missing_tensor": (jaxspec.CheckpointError, [UP_PROJ, "missing"]),
    "unexpected_tensor": (jaxspec.CheckpointError, [EXTRA, "unexpected"]),
    "misshaped_tensor": (jaxspec.CheckpointError, [K_PROJ, "(8, 32)", "(16, 32)"]),
    "truncated_safetensors": (jaxspec.CheckpointError, ["model.safetensors", "truncated"]),
    "truncated_bin": (jaxspec.CheckpointError, ["truncated.bin", "truncated", "5000"]),
    "short_header_bin": (jaxspec.CheckpointError, ["header_only.bin", "truncated"]),
    "empty_bin": (jaxspec.CheckpointError, ["empty.bin", "empty"]),
}

GENERATE_CASES = {
    # name: (extra CLI args, generate kwargs, error class, substrings)
    "prompt_id_out_of_vocab": (["--prompt-ids", "1,64"], dict(prompt=[1, 64]), jaxspec.PromptError,
                               ["64", "vocabulary"]),
    "negative_prompt_id": (["--prompt-ids=-1"], dict(prompt=[-1]), jaxspec.PromptError, ["-1", "vocabulary"]),
    "empty_prompt": (["--prompt-ids="], dict(prompt=[]), jaxspec.PromptError, ["empty"]),
    "too_long": (["--prompt-ids", "1,2,3", "--max-new-tokens", "126"], dict(prompt=[1, 2, 3], max_new_tokens=126),
                 jaxspec.PromptError, ["126", "max length 128"]),
    "zero_new_tokens": (["--prompt-ids", "1", "--max-new-tokens", "0"], dict(prompt=[1], max_new_tokens=0),
                        jaxspec.GenerationError, ["max_new_tokens", "0"]),
    "unknown_method": (["--prompt-ids", "1", "--method", "beam"], dict(prompt=[1], method="beam"),
                       jaxspec.GenerationError, ["'beam'", "autoregressive"]),
    "text_without_tokenizer": (["--prompt", "Once upon a time"], dict(prompt="Once upon a time"),
                               jaxspec.PromptError, ["tokenizer"]),
    "bad_top_p": (["--prompt-ids", "1", "--temperature", "1", "--top-p", "0"],
                  dict(prompt=[1], temperature=1.0, top_p=0.0), jaxspec.GenerationError, ["top_p"]),
}


@pytest.mark.parametrize("case", sorted(LOAD_CASES))
def test_cli_bad_checkpoint_is_one_line(ckpt, capsys, case):
    if case not in ckpt:
        pytest.skip(f"stories260K.bin not found under {STORIES}; needed to build {case}")
    _, needles = LOAD_CASES[case]
    code, out, err = run_cli(["generate", "--model", str(ckpt[case]), "--prompt-ids", "1"], capsys)
    assert_one_line_error(code, out, err, needles)


@pytest.mark.parametrize("case", sorted(LOAD_CASES))
def test_library_bad_checkpoint_raises_jaxspec_error(ckpt, case):
    if case not in ckpt:
        pytest.skip(f"stories260K.bin not found under {STORIES}; needed to build {case}")
    error, needles = LOAD_CASES[case]
    with pytest.raises(error) as info:
        jaxspec.load(ckpt[case])
    assert isinstance(info.value, jaxspec.JaxspecError) and isinstance(info.value, ValueError)
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize("case", sorted(GENERATE_CASES))
def test_cli_bad_request_is_one_line(ckpt, capsys, case):
    args, _, _, needles = GENERATE_CASES[case]
    code, out, err = run_cli(["generate", "--model", str(ckpt["good"]), *args], capsys)
    assert_one_line_error(code, out, err, needles)


@pytest.mark.parametrize("case", sorted(GENERATE_CASES))
def test_library_bad_request_raises_jaxspec_error(tiny, case):
    _, kwargs, error, needles = GENERATE_CASES[case]
    with pytest.raises(error) as info:
        jaxspec.generate(tiny, **kwargs)
    assert isinstance(info.value, jaxspec.JaxspecError) and isinstance(info.value, ValueError)
    for needle in needles:
        assert needle in str(info.value)


def test_unknown_attention_backend(ckpt, tiny, capsys):
    code, out, err = run_cli(["generate", "--model", str(ckpt["good"]), "--prompt-ids", "1",
                              "--attention", "flash9"], capsys)
    assert_one_line_error(code, out, err, ["'flash9'", "xla"])
    with pytest.raises(jaxspec.ConfigError, match="flash9"):
        jaxspec.load(ckpt["good"], attention="flash9")


def test_unparsable_prompt_ids(ckpt, tiny, capsys):
    code, out, err = run_cli(["generate", "--model", str(ckpt["good"]), "--prompt-ids", "1,x"], capsys)
    assert_one_line_error(code, out, err, ["--prompt-ids", "'1,x'"])
    with pytest.raises(jaxspec.PromptError, match="'x'"):
        jaxspec.generate(tiny, [1, "x"])


@pytest.mark.parametrize("args, needles", [
    (["--seed", "99999999999999999999"], ["--seed", "99999999999999999999"]),
    (["--max-new-tokens", "1.5"], ["--max-new-tokens", "'1.5'"]),
    (["--dtype", "float8"], ["--dtype", "'float8'"]),
])
def test_unparsable_options(ckpt, capsys, args, needles):
    code, out, err = run_cli(["generate", "--model", str(ckpt["good"]), "--prompt-ids", "1", *args], capsys)
    assert_one_line_error(code, out, err, needles)


def test_missing_required_arguments(capsys):
    assert_one_line_error(*run_cli([], capsys), ["command"])
    # --model is optional (the shipped default model); --prompt / --prompt-ids is not
    assert_one_line_error(*run_cli(["generate"], capsys), ["--prompt"])
    assert_one_line_error(*run_cli(["generate", "--model", "x"], capsys), ["--prompt"])


def test_unreadable_weights_file_is_one_line(ckpt, capsys):
    code, out, err = run_cli(["generate", "--model", str(ckpt["unreadable_weights"]), "--prompt-ids", "1"], capsys)
    assert_one_line_error(code, out, err, ["model.safetensors"])


def test_export_to_a_file_path_is_one_line(ckpt, tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    code, out, err = run_cli(["export", "--model", str(ckpt["good"]), "--out", str(blocker)], capsys)
    assert_one_line_error(code, out, err, ["not-a-folder"])


def test_export_round_trips(ckpt, tiny, tmp_path, capsys):
    code, out, err = run_cli(["export", "--model", str(ckpt["good"]), "--out", str(tmp_path / "copy")], capsys)
    assert code == 0 and "LlamaForCausalLM" in out
    copy = jaxspec.load(tmp_path / "copy")
    assert copy.config == tiny.config
    for a, b in zip(jax.tree.leaves(copy.params), jax.tree.leaves(tiny.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- real output


def _reference_case(i: int) -> dict:
    return json.loads(REFERENCE.read_text())["cases"][i]


@needs_stories
def test_json_output_on_stories260k(capsys):
    case = _reference_case(1)
    argv = ["generate", "--model", str(CHECKPOINT), "--prompt-ids", ",".join(map(str, case["prompt"])),
            "--max-new-tokens", str(len(case["greedy"])), "--method", "greedy", "--no-eos-stop", "--json"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == JSON_KEYS
    assert result["tokens"] == case["greedy"]
    assert result["text"] is None  # no tokenizer ships with stories260K
    assert result["steps"] == len(case["greedy"]) and result["compression"] == 1.0
    assert result["method"] == "autoregressive"
    assert result["seconds"] > 0 and result["tokens_per_second"] > 0
    config = result["config"]
    assert config["model"] == str(CHECKPOINT) and config["dtype"] == "float32"
    assert config["max_new_tokens"] == len(case["greedy"]) and config["temperature"] == 0.0
    assert config["stop_at_eos"] is False


@needs_stories
def test_plain_output_on_stories260k(capsys):
    case = _reference_case(1)  # same shapes as the JSON test: the compiled program is reused
    n = len(case["greedy"])
    code, out, err = run_cli(["generate", "--model", str(CHECKPOINT), "--prompt-ids",
                              ",".join(map(str, case["prompt"])), "--max-new-tokens", str(n), "--no-eos-stop"],
                             capsys)
    assert code == 0
    assert out.split() == [str(t) for t in case["greedy"]]
    assert f"{n} tokens in {n} steps" in err


@needs_stories
def test_entry_point_subprocess_json():
    case = _reference_case(0)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "jaxspec", "generate", "--model", str(CHECKPOINT), "--prompt-ids", "1",
         "--max-new-tokens", "24", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == JSON_KEYS
    assert result["tokens"] == case["greedy"][:24]


def test_second_process_loads_its_programs_from_the_compile_cache(tmp_path):
    """`jaxspec.runtime.compile_cache`: the first CLI call writes its compiled programs to the folder
    JAXSPEC_COMPILE_CACHE names, a second call with the same shapes loads them (its compile time
    drops) and prints the same tokens."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "JAXSPEC_COMPILE_CACHE": str(tmp_path / "xla")}
    argv = [sys.executable, "-m", "jaxspec", "generate", "--prompt-ids", "1,5,9", "--method", "lookahead",
            "--max-new-tokens", "16", "--no-compare"]
    runs = [subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    assert runs[0].stdout == runs[1].stdout
    first, second = (float(re.search(r"compile ([0-9.]+)s", r.stderr).group(1)) for r in runs)
    assert any((tmp_path / "xla").iterdir())
    assert second < 0.6 * first, (first, second)


def test_compile_cache_folder_and_off_switch(monkeypatch, tmp_path):
    from jaxspec.runtime import compile_cache

    monkeypatch.setenv("JAXSPEC_COMPILE_CACHE", "off")
    assert compile_cache.cache_dir() is None and compile_cache.enable() is None
    monkeypatch.setenv("JAXSPEC_COMPILE_CACHE", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.cache_dir() == tmp_path / "jaxspec" / "xla"
    monkeypatch.setenv("JAXSPEC_COMPILE_CACHE", str(tmp_path / "elsewhere"))
    assert compile_cache.cache_dir() == tmp_path / "elsewhere"


@needs_stories
def test_entry_point_subprocess_bad_input_exit_code():
    proc = subprocess.run(
        [sys.executable, "-m", "jaxspec", "generate", "--model", str(CHECKPOINT), "--prompt-ids", "1,512"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "jaxspec: error: prompt has token id 512 outside the vocabulary [0, 512)" in proc.stderr
    assert "Traceback" not in proc.stderr
