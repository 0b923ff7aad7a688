"""A drafter's learning curve across training stages: held-out teacher-forced acceptance against
total training steps, read from the runs' own logs.

Each `jaxspec train-drafter` run evaluates its drafter on the recipe's held-out split (every
held-out context, target-dependent and -independent) at step 0 and every `eval_every` steps and
logs it to `metrics.jsonl`. A later stage starts from an earlier stage's export, so its steps
are counted from that export's step (`@OFFSET`). A stage trained on other data has another
held-out split: its step-0 point is the earlier drafter on that split, so the runs' number of
held-out contexts is in the table. Runs that log it also give S along each reply's decoding path
(`jaxspec.train.acceptance.decode_path`: what speculative decoding of that text gets). Per run, the slope of acceptance against log2(total steps)
(least squares over its points after step 0): what a doubling of training bought, the
learning curve's own prediction of what more steps would.

`--earlier RESULT` carries the runs of an earlier curve (its committed JSON) as they were
recorded, for stages whose run folders are gone; a `--run` of the same label replaces its
carried namesake, so rerunning a command that reads the result it writes changes nothing else.

    python -m benchmarks.drafter_curve --run "stage 1=runs/pard2-smollm2" \\
        --run "stage 2=runs/pard2-smollm2-stage2@450" --name pard2_smollm2_curve
    python -m benchmarks.drafter_curve --earlier benchmarks/results/pard2_smollm2_curve.json \\
        --run "stage 3=runs/pard2-smollm2-stage3@1450" --name pard2_smollm2_curve

Writes benchmarks/results/<name>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import RESULTS, command_line, write_result  # noqa: E402


def parse_run(text: str) -> tuple[str, Path, int]:
    """LABEL=FOLDER[@OFFSET] -> (label, folder, offset)."""
    label, sep, rest = text.partition("=")
    if not sep or not label:
        raise argparse.ArgumentTypeError(f"expected LABEL=FOLDER[@OFFSET], got {text!r}")
    folder, at, offset = rest.rpartition("@") if "@" in rest else (rest, "", "0")
    if not offset.isdigit():
        raise argparse.ArgumentTypeError(f"the offset after @ must be a step count, got {offset!r}")
    return label, Path(folder), int(offset)


def evaluations(folder: Path) -> list[dict]:
    """The run's held-out evaluations (the last record of each step: a resumed run rewrites its log)."""
    path = folder / "metrics.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} is missing: not a drafter run folder")
    by_step = {}
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line torn by a kill mid-write
            continue
        if "accept_len_td" in rec or "accept_len_ti" in rec:
            by_step[rec["step"]] = rec
    return [by_step[s] for s in sorted(by_step)]


def doubling_slope(points: list[dict], key: str) -> float | None:
    """Least-squares slope of points[key] against log2(total step) (every total step > 0); None
    under 2 distinct steps."""
    xy = [(math.log2(p["total_step"]), p[key]) for p in points if p.get(key) is not None]
    if len(xy) < 2 or len({x for x, _ in xy}) < 2:
        return None
    mx, my = sum(x for x, _ in xy) / len(xy), sum(y for _, y in xy) / len(xy)
    return sum((x - mx) * (y - my) for x, y in xy) / sum((x - mx) ** 2 for x, _ in xy)


def curve(label: str, folder: Path, offset: int) -> dict:
    points = []
    for rec in evaluations(folder):
        points.append({"step": rec["step"], "total_step": rec["step"] + offset, "contexts": rec.get("eval_contexts"),
                       "td": rec.get("accept_len_td"), "ti": rec.get("accept_len_ti"),
                       "path_td": rec.get("path_s_td"), "path_ti": rec.get("path_s_ti"),
                       "rates_td": rec.get("position_rates_td"), "rates_ti": rec.get("position_rates_ti")})
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    later = [p for p in points if p["step"] > 0]
    return {"label": label, "run": folder.name, "offset": offset, "points": points,
            "num_blocks": config.get("pard", {}).get("num_blocks"), "init": config.get("drafter", {}).get("init"),
            "chat_parts": config.get("chat", {}).get("parts", 1) if config.get("data", {}).get("corpus") == "chat"
            else None,
            "td_per_doubling": doubling_slope(later, "td"), "ti_per_doubling": doubling_slope(later, "ti")}


def carried_runs(path: Path, replaced: set[str]) -> list[dict]:
    """The runs an earlier drafter_curve result recorded, but those whose label is in `replaced`."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--earlier {path}: not readable as a result ({e})")
    if earlier.get("benchmark") != "drafter_curve":
        raise SystemExit(f"--earlier {path}: not a drafter_curve result")
    recorded = f"{path.name} of {earlier.get('date', '?')[:10]}"
    return [{**run, "carried_from": run.get("carried_from", recorded)} for run in earlier["runs"]
            if run["label"] not in replaced]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--earlier", type=Path, help="an earlier drafter_curve result (JSON) whose runs are carried")
    p.add_argument("--run", dest="runs", action="append", type=parse_run, required=True,
                   metavar="LABEL=FOLDER[@OFFSET]", help="a train-drafter run folder; OFFSET: the steps before it")
    p.add_argument("--target", default="smollm2-135m-instruct", help="the runs' target (for the title)")
    p.add_argument("--note", default="", help="a sentence for the table's caption")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="drafter_curve")
    args = p.parse_args(argv)
    carried = carried_runs(args.earlier, {label for label, _, _ in args.runs}) if args.earlier else []
    result = {"benchmark": "drafter_curve", "title": f"Learning curve of {args.target}'s drafter",
              "target": args.target, "note": args.note, "runs": carried + [curve(*run) for run in args.runs],
              "command": command_line(__file__, argv)}
    write_result(result, args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
