"""`jaxspec train` and `jaxspec train-drafter`: a model, or a PARD-2 drafter, from a config."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxspec.cli.arguments import add_distributed_options, join_distributed_run
from jaxspec.errors import ConfigError


def _recipe(text: str) -> str:
    """--config: a TOML file, else a recipe shipped in the package by name (`pycode`, `pycode.toml`
    or `configs/pycode.toml`: the wheel holds configs/*.toml as `jaxspec/configs`)."""
    if Path(text).exists():
        return text
    from importlib import resources

    name = Path(text).name if Path(text).suffix == ".toml" else f"{Path(text).name}.toml"
    shipped = resources.files("jaxspec") / "configs" / name
    return str(shipped) if shipped.is_file() else text  # (a missing file: the config loader names it)


def _workers(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--data-workers must be a whole number >= 1, got {text!r}")
    return int(text)


def _add_run_options(p, config_help: str, export_help: str) -> None:
    """The options `train` and `train-drafter` share: the recipe, the run folder and its cadence."""
    p.add_argument("--config", required=True, type=_recipe, help=config_help)
    p.add_argument("--out", help="run folder (default: runs/<config name>)")
    p.add_argument("--steps", type=int, help="override [train] steps: where the run stops (the schedule is fixed when a run starts: [optim] schedule_steps)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (a TOML value: --set pard.cat=false --set optim.learning_rate=1e-3);"
                        " repeatable")
    p.add_argument("--resume", action="store_true", help="continue from the newest readable checkpoint in --out")
    p.add_argument("--no-export", dest="export", action="store_false", help=export_help)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print one JSON object with the final metrics")


def add_parsers(sub) -> None:
    t = sub.add_parser("train", help="train a model from a config in configs/ (tokenizer, data, model)")
    _add_run_options(t, "training config TOML, e.g. configs/pycode.toml, or a shipped recipe's name (pycode)",
                     "skip the HF folder export at the end")
    add_distributed_options(t)

    d = sub.add_parser("train-drafter", help="train a PARD-2 drafter for a target (configs/pard2_*.toml)")
    _add_run_options(d, "drafter training TOML, e.g. configs/pard2_pycode.toml, or a shipped recipe's name "
                        "(pard2_pycode, pard2_smollm2)", "skip the drafter export at the end")
    d.add_argument("--data-workers", type=_workers, default=1, metavar="N",
                   help="chat-data parts made at once, each in a process of its own that loads the target (the "
                        "data is the same; on a machine where one process leaves cores idle it is made sooner)")


def _overrides(args) -> dict[str, dict] | None:
    """--set SECTION.KEY=VALUE (VALUE read as TOML, else as a string) and --steps, as config overrides."""
    import tomllib

    out: dict[str, dict] = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. --set pard.cat=false")
        try:
            parsed = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value.strip()  # a bare word: a string (init=target:2, corpus=stdlib)
        out.setdefault(section, {})[name] = parsed
    if args.steps is not None:
        out.setdefault("train", {})["steps"] = args.steps
    return out or None


def run_train(args) -> int:
    """`jaxspec train`: a model trained from --config into its run folder; the exit code."""
    join_distributed_run(args)  # data parallel across processes: the mesh spans all their devices
    from jaxspec.train.train_config import load_train_config
    from jaxspec.train.trainer import train

    cfg = load_train_config(args.config, _overrides(args))
    out_dir = args.out or f"runs/{cfg.name}"
    log = (lambda *a, **k: print(*a, file=sys.stderr, **k))
    result = train(cfg, out_dir, resume=args.resume, log=log, progress=args.progress, export=args.export)
    summary = {"out_dir": str(result.out_dir), "steps": result.steps, "final_loss": result.final_loss,
               "eval_loss": result.eval_loss, "eval_bits_per_byte": result.eval_bits_per_byte,
               "seconds": result.seconds, "tokens_seen": result.tokens_seen,
               "export_dir": None if result.export_dir is None else str(result.export_dir)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"trained {cfg.name}: held-out loss {result.eval_loss:.4f} nats/token, "
              f"{result.eval_bits_per_byte:.4f} bits/byte; run folder {result.out_dir}")
    return 0


def run_train_drafter(args) -> int:
    """`jaxspec train-drafter`: a PARD-2 drafter trained from --config into its run folder; the exit code."""
    from jaxspec.train.drafter_config import load_drafter_config
    from jaxspec.train.drafter_trainer import describe_acceptance, train_drafter

    cfg = load_drafter_config(args.config, _overrides(args))
    result = train_drafter(cfg, args.out or f"runs/{cfg.name}", resume=args.resume,
                           log=lambda *a, **k: print(*a, file=sys.stderr, **k), progress=args.progress,
                           export=args.export, data_workers=args.data_workers)
    summary = {"out_dir": str(result.out_dir), "steps": result.steps, "final_loss": result.final_loss,
               "seconds": result.seconds, **result.eval,
               "export_dir": None if result.export_dir is None else str(result.export_dir)}
    print(json.dumps(summary) if args.json
          else f"trained drafter {cfg.name}: {describe_acceptance(result.eval)}; run folder {result.out_dir}")
    return 0
