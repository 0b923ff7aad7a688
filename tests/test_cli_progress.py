"""The cold start's phase lines on stderr (`jaxspec.progress`) for generate, chat and serve:
loading, auto's measurements, compiling, serve's warm-up; none with --quiet or --json (stdout
then one JSON object); a bad input still one line. And chat's statistics line: one line of at
most 80 columns whose tokens/s is the decoding's own (compiling said apart)."""

from __future__ import annotations

import io
import json
import re
import sys
import shutil
import time

import pytest
from flax import nnx

import jaxspec
from jaxspec import progress
from jaxspec.runtime import compile_cache
from jaxspec.cli import STATS_WIDTH
from jaxspec.cli.reporting import stats_lines
from jaxspec.generate import GenerateOutput

from cli_runner import run_cli

TINY = jaxspec.ModelConfig(
    model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=8, max_position_embeddings=128, bos_token_id=1, eos_token_ids=(2,),
)
# A phase's line, finished: "jaxspec: <label> ... 1.2 s[detail]" (nested phases indented).
PHASE = re.compile(r"jaxspec: +(?P<label>.+?) \.\.\. (?P<seconds>\d+\.\d) s(?P<detail>.*)")
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" \
           "{% if add_generation_prompt %}assistant:{% endif %}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    model = jaxspec.Model.from_module(jaxspec.Transformer(TINY, rngs=nnx.Rngs(0)))
    return model.save(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory):
    """A tiny random model with pycode-5M's tokenizer and a chat template."""
    cfg = jaxspec.ModelConfig(model_type="llama", vocab_size=4096, hidden_size=32, intermediate_size=64,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=256,
                              bos_token_id=1, eos_token_ids=(2,))
    out = jaxspec.Model.from_module(jaxspec.Transformer(cfg, rngs=nnx.Rngs(1))).save(
        tmp_path_factory.mktemp("chat") / "chat")
    shutil.copy(jaxspec.checkpoint.loading.resolve("pycode-5M") / "tokenizer.model", out / "tokenizer.model")
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out


def phase_lines(err: str) -> list[re.Match]:
    return [m for line in err.splitlines() if (m := PHASE.fullmatch(line))]


# ----------------------------------------------------------------------------- generate
def test_generate_says_each_phase_on_stderr(folder, capsys, monkeypatch):
    monkeypatch.delenv("JAXSPEC_PROGRESS", raising=False)  # on by default: stderr is no terminal here
    argv = ["generate", "--model", str(folder), "--prompt-ids", "1,5", "--max-new-tokens", "3", "--method", "greedy",
            "--seed", "11"]  # (a seed of its own: no other test has compiled this program)
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    lines = err.splitlines()
    assert re.fullmatch(rf"jaxspec: loading {re.escape(str(folder))} \.\.\. \d+\.\d s", lines[0]), lines
    assert re.fullmatch(r"jaxspec: compiling autoregressive \.\.\. \d+\.\d s", lines[1]), lines
    assert lines[2].startswith("[autoregressive] 3 tokens"), lines  # the statistics after the phases
    assert len(out.split()) == 3  # stdout: the tokens alone


def test_generate_auto_answers_at_once_and_says_why(folder, tmp_path, capsys):
    """auto times nothing before it answers: loading, one compile, the answer, and why greedy."""
    fresh = shutil.copytree(folder, tmp_path / "fresh")  # a model auto has learned nothing of in this process
    code, _, err = run_cli(["generate", "--model", str(fresh), "--prompt-ids", "1,5", "--max-new-tokens", "3"], capsys)
    assert code == 0, err
    labels = [m["label"] for m in phase_lines(err)]
    assert labels == [f"loading {fresh}", "compiling autoregressive"], labels
    assert re.search(r"^\[auto\] greedy: nothing measured here yet$", err, re.M), err
    # A second call of the same shape: greedy's first decode is learned, nothing is timed.
    code, _, err = run_cli(["generate", "--model", str(fresh), "--prompt-ids", "1,5", "--max-new-tokens", "3"], capsys)
    assert code == 0 and "auto: " not in err, err
    assert re.search(r"^\[auto\] greedy: measured fastest here \(.*\[learned from 1 decodes\]$", err, re.M), err


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_quiet_and_json_print_no_phase_lines(folder, capsys, flag):
    code, out, err = run_cli(["generate", "--model", str(folder), "--prompt-ids", "1,5", "--max-new-tokens", "3",
                              "--method", "greedy", "--seed", "12", flag], capsys)
    assert code == 0, err
    assert not phase_lines(err) and "jaxspec: " not in err, err
    if flag == "--json":
        result = json.loads(out)  # stdout is the one JSON object, nothing else
        assert len(result["tokens"]) == 3 and out.count("\n") == 1
    else:
        assert err.startswith("[autoregressive] 3 tokens"), err


def test_progress_off_by_environment(folder, capsys, monkeypatch):
    monkeypatch.setenv("JAXSPEC_PROGRESS", "0")
    code, _, err = run_cli(["generate", "--model", str(folder), "--prompt-ids", "1,5", "--max-new-tokens", "3",
                            "--method", "greedy"], capsys)
    assert code == 0 and not phase_lines(err) and err.startswith("[autoregressive]"), err


def test_bad_input_after_loading_is_still_one_line(folder, capsys):
    """The loading line is held back until the request is known good: a bad request prints its
    error alone (scripts read one line)."""
    code, out, err = run_cli(["generate", "--model", str(folder), "--prompt-ids", "1,64", "--method", "greedy"], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("jaxspec: error: ") and "64" in err, err


# ----------------------------------------------------------------------------- chat
def test_chat_first_turn_stats_exclude_compiling(chat_folder, capsys, monkeypatch):
    """Each program's compile made 1.5 s slower: the first reply's decode seconds must not hold
    it (the stream's prefill program was once compiled inside its decode time)."""
    real, delay = compile_cache.compiled, 1.5

    def slow(*args, **kwargs):
        time.sleep(delay)
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_cache, "compiled", slow)
    monkeypatch.setattr("sys.stdin", io.StringIO("def f(x):\ndef f(x):\n\n"))  # two turns
    code, out, err = run_cli(["chat", "--model", str(chat_folder), "--max-new-tokens", "24", "--method", "greedy"],
                             capsys)
    assert code == 0, err
    assert any(m["label"] == f"loading {chat_folder}" for m in phase_lines(err)), err
    compiled = [m for m in phase_lines(err) if m["label"] == "compiling autoregressive (streamed)"]
    assert compiled and float(compiled[0]["seconds"]) >= 2 * delay, err  # begin and advance
    stats = [line for line in err.splitlines() if line.startswith("[greedy] ")]
    assert len(stats) == 2, err
    for line in stats:
        assert len(line) <= STATS_WIDTH, (len(line), line)
        got = re.match(r"\[greedy\] (\d+) tok(?:en)?s?(?: in|,) (\d+\.\d+) s[:,] (\d+\.\d) tok(?:en)?s/s", line)
        assert got, line
        n, seconds, rate = int(got[1]), float(got[2]), float(got[3])
        assert seconds < delay, line  # the decoding alone: no compile in it
        # tokens/s is tokens over those seconds (within the printed rounding)
        assert n / (seconds + 0.0005) - 0.05 <= rate <= n / max(seconds - 0.0005, 1e-9) + 0.05, line
    first = re.search(r"compile(?:d in)? (\d+\.\d) s", stats[0])
    assert first and float(first[1]) >= 2 * delay, stats[0]  # said apart, on the turn that compiled


def test_chat_stats_line_fits_80_columns_for_every_setting():
    def output(method, options, tokens, compile_s, trying):
        return GenerateOutput(tokens=list(range(tokens)), steps=tokens // 3 + 1, compression=3.0, seconds=12.345,
                              tokens_per_second=tokens / 12.345, method=method, compile_seconds=compile_s,
                              options=options, auto=None if trying is None else
                              {"trying": trying, "reason": "x" * 300})

    cases = [output("autoregressive", {}, 8, 0.0, None),
             output("lookahead", {"window": 7}, 256, 123.4, False),
             output("speculative", {"draft_len": 4, "lookup_guesses": 3}, 1024, 1234.5, True)]
    for out in cases:
        for cut in (None, 1024):
            (line,) = stats_lines(None, out, [1], cut_at=cut)
            assert len(line) <= STATS_WIDTH, (len(line), line)
            assert re.search(rf"{len(out.tokens)} tok(en)?s?[ ,]", line), line
            assert f"{out.tokens_per_second:.1f} tok" in line, line
            if out.compile_seconds:  # compile is never what is left out
                assert re.search(rf"compile(d in)? ({out.compile_seconds:.1f}|{out.compile_seconds:.0f}) s", line), line
            assert ("cut" in line) == (cut is not None), line
    short = stats_lines(None, cases[0], [1])[0]
    assert short == "[greedy] 8 tokens in 12.3 s: 0.6 tokens/s; S 3.00 (3 steps)", short
    # a reply whose chunks ran drafted or plain (auto's step modes) says how many steps were plain
    modes = output("speculative", {"draft_len": 4}, 40, 0.0, False)
    modes.auto["step_modes"] = {"plain_steps": 5}
    (line,) = stats_lines(None, modes, [1])
    assert "5 of 14 steps plain" in line and len(line) <= STATS_WIDTH, line


# ----------------------------------------------------------------------------- serve
def test_serve_says_loading_and_warm_up(folder, capsys, monkeypatch):
    from jaxspec.serving import app

    served = []

    def run(server, *args, sock=None, **kwargs):  # instead of uvicorn: record, close the socket
        served.append(server)
        sock.close()

    monkeypatch.setattr(app, "run", run)
    argv = ["serve", "--model", str(folder), "--port", "0", "--slots", "1", "--context", "64", "--method", "greedy"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0 and len(served) == 1, err
    labels = [m["label"] for m in phase_lines(err)]
    assert labels == [f"loading {folder}", "warming up: compiling greedy for 1 slot of 64 tokens"], err
    code, _, err = run_cli([*argv, "--quiet"], capsys)
    assert code == 0 and len(served) == 2 and not phase_lines(err), err


# ----------------------------------------------------------------------------- the lines themselves
class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_phase_lines_on_a_terminal_and_elsewhere():
    tty = progress.Phases(True, Terminal())
    with tty.phase("outer"):
        assert tty.stream.getvalue() == "jaxspec: outer ..."  # begun: visible while it runs
        with tty.phase("inner") as said:
            said.text = ": 2.00x"
    lines = tty.stream.getvalue().splitlines()
    assert lines[0] == "jaxspec: outer ..." and re.fullmatch(r"jaxspec:   inner \.\.\. \d\.\d s: 2\.00x", lines[1])
    assert re.fullmatch(r"jaxspec: outer \.\.\. \d\.\d s", lines[2]) and len(lines) == 3, lines

    log = progress.Phases(True, io.StringIO())
    with log.phase("loading"):
        pass
    assert log.stream.getvalue() == ""  # held back until the next phase begins (or the output)
    with log.phase("compiling"):
        assert re.fullmatch(r"jaxspec: loading \.\.\. \d\.\d s\n", log.stream.getvalue())
    log.discard()  # a failed command: its error is all that follows
    assert "compiling" not in log.stream.getvalue()
    with log.phase("again"):
        pass
    log.close()
    assert log.stream.getvalue().splitlines()[-1].startswith("jaxspec: again ... ")

    quiet = progress.Phases(False, Terminal())
    with quiet.phase("x"):
        pass
    assert quiet.stream.getvalue() == ""


def test_library_phases_report_only_to_an_active_command_line():
    with progress.phase("nobody listens") as said:
        said.text = "fine"  # (a no-op, usable either way)
    stream = Terminal()
    progress.activate(progress.Phases(True, stream))
    try:
        with progress.phase("auto: timing"):
            pass
        assert list(progress.bar(range(3), 3, "reading")) == [0, 1, 2]  # fast: no bar
    finally:
        progress.close()
    assert re.fullmatch(r"jaxspec: auto: timing \.\.\. \d\.\d s\n", stream.getvalue()), stream.getvalue()
    with progress.phase("after the command"):
        pass
    assert "after" not in stream.getvalue()


def test_a_library_call_says_its_phases_on_a_terminal_only(monkeypatch):
    """No command running (a script, a REPL): phase lines on a terminal, nothing in a log or a
    notebook (stderr not a TTY), nothing with JAXSPEC_PROGRESS=0."""
    for stream, env, said in ((Terminal(), "", True), (io.StringIO(), "", False), (Terminal(), "0", False)):
        monkeypatch.setattr(sys, "stderr", stream)
        monkeypatch.setenv("JAXSPEC_PROGRESS", env)
        with progress.phase("compiling lookahead"):
            pass
        assert bool(re.fullmatch(r"jaxspec: compiling lookahead \.\.\. \d\.\d s\n", stream.getvalue())) == said, \
            (env, stream.getvalue())


@pytest.mark.parametrize("stream", [Terminal(), io.StringIO()], ids=["terminal", "log"])
def test_a_long_loop_has_a_bar_on_a_terminal_only(stream, monkeypatch):
    monkeypatch.setattr(progress, "BAR_DELAY", 0.0)  # (every loop is long)
    progress.activate(progress.Phases(True, stream))
    try:
        with progress.phase("loading x"):
            assert list(progress.bar(iter(range(4)), 4, "dequantizing weights", unit="tensor")) == [0, 1, 2, 3]
    finally:
        progress.close()
    text = stream.getvalue()
    assert ("dequantizing weights" in text and "tensor" in text) == isinstance(stream, Terminal), text
    # the phase's line, whole, after the bar (which a carriage return clears)
    assert re.search(r"^jaxspec: loading x \.\.\. \d\.\d s$", text.replace("\r", "\n"), re.M), text
