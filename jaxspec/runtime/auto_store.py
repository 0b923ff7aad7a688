"""`method="auto"`'s measurements on disk, so that a later process on this machine does not
measure again.

Measuring c costs a few forward compiles (3-14 s on this project's CPU for the shipped models),
and the CLI's default method is `auto`: without this store every `jaxspec generate` would pay
it. Entries are keyed by the model (checkpoint, config, dtype, attention, layout), this machine
(host name, CPU count, backend, device kind and count, processes, JAX version) and the shape
bucket, and keep the date they were measured; the choice that uses one says so
(`Choice.recalled`).

Where: the file named by JAXSPEC_AUTO_CACHE (`off` turns the store off), else
`$XDG_CACHE_HOME/jaxspec/auto.json` (`~/.cache/...`). A file that cannot be read is reported
(a warning) and replaced by the next write; writes are atomic (a temporary file renamed).

In a multi-process run process 0 decides: it reads the store and tells the others (all then
skip the measurement or all measure, since the forwards are collective programs), and only it
writes.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

ENV = "JAXSPEC_AUTO_CACHE"
# 3: the KV cache stored heads-major (a forward's cost changed; 2's timings are of the old programs)
# 2: a key holds forwards timed together (c divides them); 1 kept each model's apart
VERSION = 3


def path() -> Path | None:
    """The store's file, or None when JAXSPEC_AUTO_CACHE=off."""
    value = os.environ.get(ENV, "")
    if value.lower() in ("off", "0", "none"):
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxspec" / "auto.json"


def model_identity(model) -> tuple:
    """What a measurement of this model on this machine depends on."""
    config = hashlib.sha256(repr(model.config).encode()).hexdigest()[:16]
    mesh = None if model.mesh is None else sorted(model.mesh.shape.items())
    return (str(Path(model.source).resolve()) if model.source else None, config, str(model.dtype), model.attention,
            mesh, socket.gethostname(), os.cpu_count(), jax.default_backend(), jax.devices()[0].device_kind,
            jax.device_count(), jax.process_count(), jax.__version__)


def _read(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
        if data.get("version") != VERSION or not isinstance(data.get("entries"), dict):
            raise ValueError(f"not a version-{VERSION} store")
        return data["entries"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as e:
        warnings.warn(f"jaxspec: ignoring the auto measurement store {file} ({e}); it will be rewritten",
                      stacklevel=3)
        return {}


def _write(file: Path, key: str, values: list[float]) -> None:
    entries = _read(file)
    entries[key] = {"values": values,
                    "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=file.parent, prefix=file.name, suffix=".tmp", delete=False) as f:
            json.dump({"version": VERSION, "entries": entries}, f, indent=1)
        os.replace(f.name, file)
    except OSError as e:  # a read-only home, say: measuring again next time is the only cost
        warnings.warn(f"jaxspec: could not write the auto measurement store {file} ({e})", stacklevel=3)


def _from_process_0(found: list[float] | None, size: int) -> list[float] | None:
    if jax.process_count() == 1:
        return found
    from jax.experimental import multihost_utils

    row = np.zeros(size + 1, np.float32)
    if found is not None:
        row[0], row[1:] = 1, found
    row = np.asarray(multihost_utils.broadcast_one_to_all(row))
    return row[1:].tolist() if row[0] else None


def recall(key: tuple, size: int, measure: Callable[[], list[float]]) -> tuple[list[float], str | None]:
    """The `size` values stored under `key` by an earlier process, or `measure()`'s (then stored).
    Second: None when measured now, else where and when they were measured."""
    file = path()
    text = json.dumps(key, default=str)
    found, when = None, "by process 0"
    if file is not None and jax.process_index() == 0:
        entry = _read(file).get(text)
        try:  # an entry edited by hand into something else is measured again, and replaced
            found = [float(v) for v in entry["values"]] if len(entry["values"]) == size else None
            when = str(entry["measured"])
        except (TypeError, KeyError, ValueError):
            found = None
    values = _from_process_0(found, size)
    if values is not None:
        return values, f"{file}, measured {when}"
    values = [float(v) for v in measure()]
    if file is not None and jax.process_index() == 0:
        _write(file, text, values)
    return values, None
