"""Bad input through the Python API and the CLI (issue #19): prompts and options of every type a
caller may pass, text that is not valid Unicode, non-object config.json files, `jaxspec export`
into occupied or overlapping folders, and the smaller CLI messages.

Every rejection is a `JaxspecError` whose one-line message names the type or value given and
what is expected; the CLI prints that line and exits 2. Generation uses the shipped default
model with a couple of new tokens; export uses a tiny random model saved by the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.generate import prepare
from test_cli import run_cli

REPO = Path(__file__).resolve().parents[1]

TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=1, eos_token_ids=(2,),
)


@pytest.fixture(scope="module")
def model() -> jaxspec.Model:
    return jaxspec.load()


def assert_one_line_error(code: int, out: str, err: str, needles: list[str], absent: tuple[str, ...] = ()) -> str:
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("jaxspec: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    for needle in absent:
        assert needle not in lines[0], (needle, lines[0])
    return lines[0]


def generate(model, prompt, **kwargs):
    return jaxspec.generate(model, prompt, **{"max_new_tokens": 2, **kwargs})


# ----------------------------------------------------------------------------- text that is not Unicode


def test_lone_surrogate_prompt_is_a_prompt_error(model):
    with pytest.raises(jaxspec.PromptError, match="not valid Unicode") as e:
        generate(model, "a\udcff")
    assert "\n" not in str(e.value)
    with pytest.raises(jaxspec.PromptError, match="not valid Unicode"):
        generate(model, ["ok", "a\udcff"])


def test_cli_undecodable_prompt_is_one_line(capsys):
    # What argparse hands over for `--prompt $'\xff'`: the byte as a surrogate escape.
    code, out, err = run_cli(["generate", "--prompt", "a\udcff", "--max-new-tokens", "2"], capsys)
    assert_one_line_error(code, out, err, ["not valid Unicode", "surrogate"])


def test_cli_undecodable_prompt_bytes_in_argv_exit_2():
    """The real path: a raw 0xff byte in argv (no UTF-8), decoded by Python with surrogateescape."""
    proc = subprocess.run([sys.executable, "-m", "jaxspec", "generate", "--prompt", b"a\xff",
                           "--max-new-tokens", "2"], capture_output=True, cwd=REPO, timeout=300)
    err = proc.stderr.decode("utf-8", errors="replace").strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == b"", (proc.returncode, err)
    assert len(err) == 1 and err[0].startswith("jaxspec: error: ") and "not valid Unicode" in err[0], err


# ----------------------------------------------------------------------------- prompt types


@pytest.mark.parametrize("prompt, needles", [
    (b"def f():", ["got bytes", "decode"]),
    (bytearray(b"ab"), ["got bytearray"]),
    ([[1, 2], 3], ["mixes", "[1, 2] (list)", "3 (int)"]),
    ([1, [2, 3]], ["mixes", "1 (int)", "[2, 3] (list)"]),
    (["text", 5], ["mixes", "'text' (str)", "5 (int)"]),
    (5, ["got int"]),
    ({1, 2}, ["got set"]),
    (iter([1, 2]), ["got list_iterator"]),
    (None, ["got NoneType"]),
    ([1.0, 2], ["1.0 (float)", "not a token id"]),
    ([True, 2], ["True (bool)", "not a token id"]),
    ([[1, 2], [3, "x"]], ["prompt row 1", "'x' (str)"]),
    (np.array([1.5, 2.0]), ["must be integers", "float64"]),
    (np.ones((1, 2, 2), np.int32), ["1-D", "2-D", "(1, 2, 2)"]),
    ([np.ones((2, 2), np.int32)], ["prompt row 0", "1-D", "(2, 2)"]),
    ([], ["empty"]),
    ([[1], []], ["prompt row 1 is empty"]),
])
def test_bad_prompt_types_name_the_type(model, prompt, needles):
    with pytest.raises(jaxspec.PromptError) as e:
        generate(model, prompt)
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    if not any("empty" in n for n in needles):  # e.g. an int or a set used to read "prompt is empty"
        assert "empty" not in message, message


def _inputs(request) -> tuple:
    """What a prepared request hands the compiled program: prompts, lengths, sampling, statics."""
    prompts, lengths, sampling = np.asarray(request.args[2]), np.asarray(request.args[3]), request.args[5]
    return (prompts.tolist(), lengths.tolist(), float(sampling.temperature), int(sampling.top_k),
            float(sampling.top_p), request.statics, request.batched)


def test_prompts_as_lists_numpy_and_jax_agree(model):
    rows = [[1, 14, 220], [1, 400, 12]]
    want = _inputs(prepare(model, rows, max_new_tokens=2))
    for form in (np.asarray(rows), jnp.asarray(rows), [np.asarray(r) for r in rows], [jnp.asarray(r) for r in rows],
                 [tuple(r) for r in rows], [[np.int64(t) for t in r] for r in rows],
                 [[jnp.int32(t) for t in r] for r in rows]):
        assert _inputs(prepare(model, form, max_new_tokens=2)) == want, type(form)
    one = _inputs(prepare(model, rows[0], max_new_tokens=2))
    for form in (jnp.asarray(rows[0]), np.asarray(rows[0], np.uint16), tuple(rows[0])):
        assert _inputs(prepare(model, form, max_new_tokens=2)) == one
    assert _inputs(prepare(model, range(1, 4))) == _inputs(prepare(model, [1, 2, 3]))


def test_a_list_of_jax_rows_decodes_like_lists(tiny):
    rows = [[1, 14, 20], [1, 40, 12]]
    assert generate(tiny, [jnp.asarray(r) for r in rows]).tokens == generate(tiny, rows).tokens


# ----------------------------------------------------------------------------- option types


def test_numpy_and_jax_integers_are_accepted_wherever_ints_are(model, tiny):
    prompt = [1, 14, 220, 14, 220]
    want = prepare(model, prompt, method="prompt-lookup", ngram=3, guesses=2, max_new_tokens=3, seed=1,
                   stop_ids=[2], temperature=0.5, top_k=5, top_p=0.875)
    got = prepare(model, prompt, method="prompt-lookup", ngram=np.int64(3), guesses=jnp.int32(2),
                  max_new_tokens=np.int16(3), seed=jnp.uint32(1), stop_ids=np.asarray([2]),
                  temperature=np.float32(0.5), top_k=np.int64(5), top_p=jnp.float32(0.875))
    assert _inputs(got) == _inputs(want)
    assert got.options == want.options and type(got.options.ngram) is int  # reported options stay plain ints
    json.dumps(got.options.as_dict())
    assert jaxspec.stream(model, prompt, max_new_tokens=2, chunk_steps=np.int64(3)).chunk_steps == 3
    out = generate(tiny, [1, 14, 20, 14, 20], method="prompt-lookup", ngram=np.int64(3), max_new_tokens=np.int64(2))
    assert out.options["ngram"] == 3 and len(out.tokens) == 2


@pytest.mark.parametrize("kwargs, needles", [
    (dict(temperature="1"), ["temperature", "'1' (str)", "number"]),
    (dict(temperature=None), ["temperature", "None (NoneType)"]),
    (dict(temperature=float("nan")), ["temperature", "nan"]),
    (dict(temperature=1.0, top_p="0.9"), ["top_p", "'0.9' (str)"]),
    (dict(temperature=1.0, top_k="5"), ["top_k", "'5' (str)", "integer"]),
    (dict(temperature=1.0, top_k=2.5), ["top_k", "2.5 (float)"]),
    (dict(temperature=1.0, top_k=-1), ["top_k", "-1"]),
    (dict(max_new_tokens="2"), ["max_new_tokens", "'2' (str)"]),
    (dict(max_new_tokens=2.0), ["max_new_tokens", "2.0 (float)"]),
    (dict(max_new_tokens=True), ["max_new_tokens", "True (bool)"]),
    (dict(seed="0"), ["seed", "'0' (str)"]),
    (dict(stop_ids=3), ["stop_ids", "list of token ids", "3 (int)"]),
    (dict(stop_ids=["2"]), ["stop_ids", "'2' (str)"]),
    (dict(stop_at_eos="no"), ["stop_at_eos", "'no' (str)"]),
    (dict(method=["lookahead"]), ["method", "list"]),
    (dict(method="prompt-lookup", ngram="3"), ["ngram", "'3'"]),
])
def test_bad_option_types_are_generation_errors(model, kwargs, needles):
    with pytest.raises(jaxspec.GenerationError) as e:
        generate(model, [1, 2], **kwargs)
    message = str(e.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_method_option_errors_name_the_method(model):
    with pytest.raises(jaxspec.GenerationError, match=r"^prompt-lookup ngram must be an integer in \[2, 2147483647\], got 1"):
        generate(model, [1, 2], method="prompt-lookup", ngram=1)
    with pytest.raises(jaxspec.GenerationError, match=r"^prompt-lookup guesses must be"):
        generate(model, [1, 2], method="prompt-lookup", guesses=-1)
    with pytest.raises(jaxspec.GenerationError, match=r"^jacobi window must be an integer in \[1, 2147483647\], got 0"):
        generate(model, [1, 2], method="jacobi", window=0)
    with pytest.raises(jaxspec.GenerationError, match=r"^lookahead ngram must be an integer in \[2, 2147483647\], got 1"):
        generate(model, [1, 2], method="lookahead", ngram=1)
    pycode = jaxspec.load("pycode-5M")  # (hybrid needs a drafter: the default model's)
    with pytest.raises(jaxspec.GenerationError, match=r"^hybrid window must be an integer in \[1, 2147483647\], got 0"):
        generate(pycode, [1, 2], method="hybrid", window=0)


# ----------------------------------------------------------------------------- config.json not an object


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0))).save(
        tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tiny(tiny_folder) -> jaxspec.Model:
    return jaxspec.load(tiny_folder)


@pytest.mark.parametrize("content, kind", [("[]", "array"), ("3", "number"), ('"llama"', "string"),
                                           ("null", "null")])
def test_config_json_that_is_not_an_object(tiny_folder, tmp_path, capsys, content, kind):
    import shutil

    folder = Path(shutil.copytree(tiny_folder, tmp_path / "m"))
    (folder / "config.json").write_text(content)
    with pytest.raises(jaxspec.CheckpointError, match=f"holds a JSON {kind}, not an object"):
        jaxspec.load(folder)
    code, out, err = run_cli(["generate", "--model", str(folder), "--prompt-ids", "1"], capsys)
    assert_one_line_error(code, out, err, ["config.json", f"JSON {kind}"])


# ----------------------------------------------------------------------------- jaxspec export


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _assert_same_weights(folder: Path, reference: Path) -> None:
    a, b = jaxspec.load(folder), jaxspec.load(reference)
    assert a.config == b.config
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_export_refuses_a_non_empty_folder_unless_forced(tiny_folder, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier export")
    (out / "model.safetensors.index.json").write_text("{}")  # would shadow the new weights when loading
    code, o, err = run_cli(["export", "--model", str(tiny_folder), "--out", str(out)], capsys)
    assert_one_line_error(code, o, err, [str(out), "not empty", "--force"])
    assert sorted(_tree(out)) == ["model.safetensors.index.json", "stale.txt"]

    code, o, err = run_cli(["export", "--model", str(tiny_folder), "--out", str(out), "--force"], capsys)
    assert code == 0, err
    assert sorted(_tree(out)) == ["config.json", "model.safetensors"]  # nothing old left behind
    _assert_same_weights(out, tiny_folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left beside it

    empty = tmp_path / "empty"
    empty.mkdir()
    code, o, err = run_cli(["export", "--model", str(tiny_folder), "--out", str(empty)], capsys)
    assert code == 0, err
    _assert_same_weights(empty, tiny_folder)


def test_forced_export_that_fails_keeps_the_old_folder(tiny_folder, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old export")

    def broken_save(self, folder, dtype="float32"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise OSError("No space left on device")

    monkeypatch.setattr(jaxspec.Model, "save", broken_save)
    code, o, err = run_cli(["export", "--model", str(tiny_folder), "--out", str(out), "--force"], capsys)
    assert_one_line_error(code, o, err, ["No space left"])
    assert _tree(out) == {"keep.txt": b"old export"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_export_onto_or_around_its_own_source_is_refused(tiny_folder, tmp_path, capsys):
    import shutil

    source = Path(shutil.copytree(tiny_folder, tmp_path / "src" / "model"))
    before = _tree(source)
    for out, needle in ((source, "inside the model"), (source / "sub", "inside the model"),
                        (source / ".." / "model", "inside the model"), (source.parent, "holds the model")):
        for force in ((), ("--force",)):
            code, o, err = run_cli(["export", "--model", str(source), "--out", str(out), *force], capsys)
            assert_one_line_error(code, o, err, [needle])
    assert _tree(source) == before and not (source / "sub").exists()


def test_export_to_an_existing_file_is_one_line(tiny_folder, tmp_path, capsys):
    blocker = tmp_path / "weights.bin"
    blocker.write_text("")
    for force in ((), ("--force",)):
        code, o, err = run_cli(["export", "--model", str(tiny_folder), "--out", str(blocker), *force], capsys)
        assert_one_line_error(code, o, err, [str(blocker), "is a file"], absent=("Errno",))
    assert blocker.read_text() == ""


# ----------------------------------------------------------------------------- smaller CLI messages


@pytest.mark.parametrize("ids", ["1,,2", "1,2,", ",1", "1, ,2"])
def test_cli_prompt_ids_with_an_empty_item(capsys, ids):
    code, out, err = run_cli(["generate", "--prompt-ids", ids], capsys)
    assert_one_line_error(code, out, err, ["--prompt-ids", "empty item", repr(ids)])


def test_cli_method_flag_the_method_does_not_take_names_the_flag(capsys):
    code, out, err = run_cli(["generate", "--prompt-ids", "1", "--method", "lookahead", "--target-independent"],
                             capsys)
    assert_one_line_error(code, out, err, ["--target-independent", "--method lookahead", "--window"],
                          absent=("target_features",))
    code, out, err = run_cli(["generate", "--prompt-ids", "1", "--draft-len", "3", "--method", "greedy"], capsys)
    assert_one_line_error(code, out, err, ["--draft-len", "--method greedy", "no method flags"],
                          absent=("draft_len",))
    code, out, err = run_cli(["generate", "--prompt-ids", "1", "--draft-len", "3"], capsys)  # the default: auto
    assert_one_line_error(code, out, err, ["--draft-len does not apply to --method auto", "--method lookahead"],
                          absent=("draft_len",))
    code, out, err = run_cli(["chat", "--model", "pycode-5M", "--message", "hi", "--method", "jacobi",
                              "--ngram", "3"], capsys)
    assert_one_line_error(code, out, err, ["--ngram", "--method jacobi", "its flags: --window"])


def test_cli_top_k_and_top_p_under_greedy_are_reported_as_ignored(tiny_folder, capsys):
    code, out, err = run_cli(["generate", "--model", str(tiny_folder), "--prompt-ids", "1,14", "--max-new-tokens",
                              "2", "--top-k", "5", "--top-p", "0.5", "--no-compare"], capsys)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "ignored" in line]
    assert len(notes) == 1 and "--top-k and --top-p are ignored under greedy decoding" in notes[0], err
    # The note comes before decoding: an invalid --max-new-tokens stops each run right after it.
    bad = ["generate", "--model", str(tiny_folder), "--prompt-ids", "1", "--max-new-tokens", "0"]
    code, out, err = run_cli([*bad, "--top-p", "0.9"], capsys)
    assert code == 2 and err.splitlines()[0] == ("jaxspec: note: --top-p is ignored under greedy decoding "
                                                 "(--temperature 0); pass --temperature > 0 to sample")
    for quiet in ([], ["--temperature", "1", "--top-k", "5"], ["--top-k", "0", "--top-p", "1"]):
        code, out, err = run_cli([*bad, *quiet], capsys)
        assert_one_line_error(code, out, err, ["max_new_tokens"])
