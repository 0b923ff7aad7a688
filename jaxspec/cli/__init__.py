"""`jaxspec` command line, one module per command. Bad input prints one line to stderr and
exits with code 2 (`jaxspec.cli.arguments`)."""

from __future__ import annotations

import argparse

from jaxspec.cli import chat_command, export_command, generate_command, serve_command, train_command
from jaxspec.cli.arguments import EXIT_BAD_INPUT, METHOD_FLAGS, CommandParser, run_command
from jaxspec.cli.reporting import STATS_WIDTH, jax_backend

__all__ = ["EXIT_BAD_INPUT", "METHOD_FLAGS", "STATS_WIDTH", "build_parser", "jax_backend", "main"]

COMMANDS = {"generate": generate_command.run_generate, "chat": chat_command.run_chat, "train": train_command.run_train,
            "export": export_command.run_export, "train-drafter": train_command.run_train_drafter,
            "serve": serve_command.run_serve}


def build_parser() -> argparse.ArgumentParser:
    from jaxspec import __version__

    parser = CommandParser(prog="jaxspec", description="Lossless fast LLM decoding in JAX.")
    parser.add_argument("--version", action="version", version=f"jaxspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)

    generate_command.add_parser(sub)
    train_command.add_parsers(sub)  # train, train-drafter
    chat_command.add_parser(sub)
    export_command.add_parser(sub)
    serve_command.add_parser(sub)
    return parser


def entry() -> None:
    """The `jaxspec` command: `main`, then the process ends without waiting for what `auto`
    compiles in the background (`jaxspec.runtime.background.exit_process`)."""
    code = main(own_process=True)
    from jaxspec.runtime.background import exit_process

    exit_process(code)


# Commands whose process keeps its programs for long: held as loaded, the lighter form (`compile_cache.SLIM_PROGRAMS`).
KEEPS_PROGRAMS = ("chat", "serve")


def main(argv: list[str] | None = None, own_process: bool = False) -> int:
    """The command `argv` names; `own_process`: the process is the command's (`entry`), not a caller's."""
    args = build_parser().parse_args(argv)
    from jaxspec.runtime import compile_cache

    compile_cache.enable()  # a second call with the same shapes loads its programs from disk
    if own_process and args.command in KEEPS_PROGRAMS:
        compile_cache.slim_programs()
    return run_command(COMMANDS[args.command], args)
