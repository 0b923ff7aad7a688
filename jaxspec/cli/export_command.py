"""`jaxspec export`: a checkpoint saved as an HF folder, swapped in over an old one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def add_parser(sub) -> None:
    e = sub.add_parser("export", help="save a checkpoint as an HF folder that transformers loads")
    e.add_argument("--model", required=True)
    e.add_argument("--out", required=True, help="a new or empty folder (outside the model's own folder)")
    e.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    e.add_argument("--force", action="store_true",
                   help="replace a non-empty --out: the export is written beside it, then swapped in")


def _check_export_target(model_path: Path, out: Path, force: bool) -> Path:
    """The real path to write to; CheckpointError for an --out that is a file, is (or is
    inside, or holds) the model being exported, or is not empty without --force."""
    from jaxspec.errors import CheckpointError

    if out.exists() and not out.is_dir():
        raise CheckpointError(f"--out {out} is a file, not a folder; pass a folder path")
    source, target = model_path.resolve(), out.resolve()
    if target == source or source in target.parents:
        raise CheckpointError(f"--out {out} is inside the model being exported ({model_path}); "
                              "export to a folder outside it")
    if target in source.parents:
        raise CheckpointError(f"--out {out} holds the model being exported ({model_path}); "
                              "export to a folder that does not contain it")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise CheckpointError(f"--out {out} is not empty; choose a new folder, or pass --force to replace "
                              "its contents")
    return target


def _save_replacing(model, target: Path, dtype: str) -> Path:
    """`model.save` into a temporary folder beside `target`, then swap it in: `target` is only
    ever the old folder or the complete new one, and the old one is removed last."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.export-{os.getpid()}")
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save(tmp, dtype=dtype)
        if target.exists():
            os.replace(target, old)
            try:
                os.replace(tmp, target)
            except BaseException:
                os.replace(old, target)  # put the old folder back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def run_export(args) -> int:
    """`jaxspec export`: the model saved as an HF folder at --out; the exit code."""
    import jaxspec
    from jaxspec.checkpoint.loading import resolve

    target = _check_export_target(resolve(args.model), Path(args.out), args.force)
    model = jaxspec.load(args.model, dtype=args.dtype)
    _save_replacing(model, target, args.dtype)
    print(f"saved {model.config.architecture} to {args.out}")
    return 0
