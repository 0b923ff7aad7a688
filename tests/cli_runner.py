"""The `jaxspec` command run in the test's own process, its output captured: one helper for the
CLI tests (test_cli.py, which hands it on, test_cli_progress.py, test_cli_usability.py, test_lookahead.py)."""

from __future__ import annotations

from jaxspec.cli import main


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `jaxspec ARGV`, read through pytest's `capsys`; argparse's
    own exits (--help, --version, a bad flag) give their code too."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err
