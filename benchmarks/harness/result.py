"""Writing a result: the JSON with the machine's facts, when and how it ran, and its rendering.

Every benchmark ends in `write_result`: results/<name>.json, then report.py's markdown (and its
PNG, where it has a plot for the benchmark) from that JSON alone, so a table in the docs and the
file beside the JSON never differ. `main_decode` is the whole command line of a decode benchmark.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Callable

from benchmarks.harness.machine import RESULTS, ROOT, machine_info, repo_relative


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command_line(script: str, argv) -> str:
    """The command that reruns a benchmark, from the repository root: `python -m benchmarks.NAME ARGS`."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join(["python", "-m", f"benchmarks.{Path(script).stem}", *(shlex.quote(_portable(a)) for a in args)])


def _portable(arg: str) -> str:
    """An argument naming a path inside the repository, as a path relative to it (as the command
    runs from the root): a result must not record this machine's checkout."""
    path = Path(arg)
    return repo_relative(path) if path.is_absolute() and path.resolve().is_relative_to(ROOT) else arg


def dumps(result: dict) -> str:
    """JSON, one key per line, but a list of numbers (a run's tokens) on one line."""
    text = json.dumps(result, indent=1)
    return re.sub(r"\[\n([\s\d.eE+\-,]+?)\n\s*\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",")
                  + "]", text) + "\n"


def write_result(result: dict, out: Path, name: str | None = None, quiet: bool = False) -> Path:
    """results -> OUT/NAME.json, .md (and .png): the machine's facts and the date added if missing."""
    from benchmarks import report

    result.setdefault("machine", machine_info())
    result.setdefault("date", now())
    name = name or result["benchmark"]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(dumps(result))
    lines = report.standalone(result)
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    report.plot(result, out / f"{name}.png")
    if not quiet:
        print("\n".join(lines))
    return path


def main_decode(script: str, doc: str, arguments: Callable[[argparse.ArgumentParser], None],
                declare: Callable, argv=None) -> int:
    """The command line of a decode benchmark: `arguments(parser)` adds its options, `declare(args)`
    returns its DecodeBench. Exits 1 when a setting's tokens differ from the reference's."""
    from benchmarks.harness.decode import run_decode

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    p.add_argument("--name", help="result files' name (default: the benchmark's)")
    p.add_argument("--rounds", type=int, help="repeat the whole grid this many times (default: the benchmark's)")
    p.add_argument("--fresh", action="store_true", help="discard the runs of an interrupted run instead of resuming")
    arguments(p)
    args = p.parse_args(argv)
    bench = declare(args)
    name = args.name or bench.name
    bench = dataclasses.replace(bench, name=name, rounds=args.rounds or bench.rounds)
    journal = args.out / f".{name}.runs.jsonl"
    result = run_decode(bench, journal, fresh=args.fresh)
    result["command"] = command_line(script, argv)
    write_result(result, args.out, name)
    journal.unlink()
    wrong = [n for n, s in result["summary"].items()
             if s["identical_to_reference"] != s["cases"] or not s["same_every_round"]]
    if wrong:
        print(f"outputs differ from {bench.reference}: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0
