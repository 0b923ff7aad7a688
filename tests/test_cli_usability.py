"""Small things a new user meets first: `jaxspec --version`, defaults in --help, a one-line
`repr(model)`, transformers' generation arguments answered with jaxspec's, and the progress
lines of a cold start (loading, compiling) on stderr."""

from __future__ import annotations

import importlib.metadata
import re

import pytest
from flax import nnx

import jaxspec

from cli_runner import run_cli

TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=1, eos_token_ids=(2,),
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model = jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0)))
    return model.save(tmp_path_factory.mktemp("tiny") / "tiny")


def test_version(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"jaxspec {jaxspec.__version__}"
    assert jaxspec.__version__ == importlib.metadata.version("jaxspec")  # pyproject's version


def test_help_shows_defaults(capsys):
    code, out, _ = run_cli(["generate", "--help"], capsys)
    text = " ".join(out.split())  # (argparse wraps lines)
    assert code == 0
    for flag, default in (("--max-new-tokens", "(default: 128)"), ("--method", "(default: auto)"),
                          ("--top-p", "(default: 1.0)"),
                          ("--dtype", "default: blocks for a GGUF file on one device, else float32)")):
        block = text.split(flag, 2)[-1].split(" --", 1)[0]  # the option's own help, after the usage line
        assert default in block, (flag, block)
    assert "(default: None)" not in text and "(default: False)" not in text and "(default: True)" not in text
    assert text.count("default: pycode-5M") == 1  # a help that names its default is not told twice


def test_repr_is_one_line(folder):
    model = jaxspec.load(folder)
    text = repr(model)
    assert "\n" not in text and len(text) < 300, text
    for part in ("Model(llama", "2 layers", "vocab 64", "float32", "params", str(folder)):
        assert part in text, (part, text)


@pytest.mark.parametrize("name, value, names", [
    ("max_length", 8, "max_new_tokens"), ("do_sample", True, "temperature > 0"), ("num_beams", 4, "beam"),
    ("eos_token_id", 2, "stop_ids"), ("max_tokens", 16, "max_new_tokens"),
])
def test_transformers_arguments_name_jaxspecs(folder, name, value, names):
    model = jaxspec.load(folder)
    for call in (jaxspec.generate, jaxspec.stream):
        with pytest.raises(jaxspec.GenerationError, match=re.escape(names)) as e:
            call(model, [1, 5], **{name: value})
        origin = "an OpenAI / vLLM" if name == "max_tokens" else "a transformers"
        assert str(e.value).startswith(f"{name} is {origin} argument") and "\n" not in str(e.value)


def test_progress_lines(folder, capsys, monkeypatch):
    """On by default, a terminal or not (tests/test_cli_progress.py has the rest)."""
    argv = ["generate", "--model", str(folder), "--prompt-ids", "1,5", "--max-new-tokens", "2", "--method", "greedy"]
    monkeypatch.delenv("JAXSPEC_PROGRESS", raising=False)  # (stderr is no terminal here)
    code, _, err = run_cli(argv, capsys)
    lines = err.splitlines()
    assert code == 0
    assert re.fullmatch(rf"jaxspec: loading {re.escape(str(folder))} \.\.\. \d+\.\d s", lines[0]), lines
    assert re.fullmatch(r"jaxspec: compiling autoregressive \.\.\. \d+\.\d s", lines[1]), lines
    for quiet in (["--quiet"], ["--json"]):
        assert "jaxspec: loading" not in run_cli(argv + quiet, capsys)[2]
    # A bad request after loading: its error alone (the loading line is held back, then dropped).
    code, _, err = run_cli(["generate", "--model", str(folder), "--prompt-ids", "1,999", "--method", "greedy"], capsys)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("jaxspec: error: "), lines


def test_no_progress_lines_when_turned_off(folder, capsys, monkeypatch):
    monkeypatch.setenv("JAXSPEC_PROGRESS", "0")
    code, _, err = run_cli(["generate", "--model", str(folder), "--prompt-ids", "1,5", "--max-new-tokens", "2",
                            "--method", "greedy"], capsys)
    assert code == 0 and "jaxspec: loading" not in err and err.startswith("[autoregressive]")


def test_help_lists_each_methods_options_and_the_returned_fields():
    """`help(jaxspec.generate)` / `help(jaxspec.stream)`: every method's options with their
    defaults (from the option dataclasses themselves) and every field of the output."""
    import dataclasses

    import jaxspec
    from jaxspec.decoding.methods import METHODS

    for fn in (jaxspec.generate, jaxspec.stream):
        doc = fn.__doc__
        for name, method in METHODS.items():
            line = next(x for x in doc.splitlines() if x.strip().startswith(f"{name}:"))
            assert all(f"{f.name}=" in line for f in dataclasses.fields(method.options)), line
        assert all(f"{f.name}: " in doc for f in dataclasses.fields(jaxspec.GenerateOutput))
    assert "draft_len=None" in jaxspec.generate.__doc__ and "finish_reason: " in jaxspec.stream.__doc__
