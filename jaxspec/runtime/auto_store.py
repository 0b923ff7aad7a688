"""`method="auto"`'s ledgers on disk (`jaxspec.runtime.auto.Ledger`): what the decodes of earlier
processes on this machine measured, so that a later process starts from it.

Entries are keyed by the model (checkpoint, config, dtype, attention, layout), this machine
(host name, CPU count, backend, device kind and count, processes, JAX version), the drafter's
content, jaxspec's version and the request's shape, and keep the date they were stored; a
choice that uses one says so (`Choice.recalled`).

Where: the file named by JAXSPEC_AUTO_CACHE (`off` turns the store off), else
`$XDG_CACHE_HOME/jaxspec/auto.json` (`~/.cache/...`). A file that cannot be read is reported
(a warning) and replaced by the next write; writes are atomic (a temporary file renamed). In a
multi-process run only process 0 writes.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import socket
import tempfile
import warnings
from pathlib import Path

import jax

ENV = "JAXSPEC_AUTO_CACHE"
# 5: tallies weighted by recency; the layer layout (scanned or unrolled) in the model's key
# 4: ledgers of decodes (`jaxspec.runtime.auto.Ledger`), no forward timings or races
# 3: the KV cache stored heads-major (a forward's cost changed; 2's timings are of the old programs)
# 2: a key holds forwards timed together (c divides them); 1 kept each model's apart
VERSION = 5


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
    # batch-invariant numerics cost their own time (`jaxspec.models.batch_invariant`)
    attention = model.attention + ("+batch_invariant" if getattr(model, "batch_invariant", False) else "")
    # (a scanned stack of layers is another program, of another cost: `jaxspec.models.model.LayerStack`)
    layout = "layer_scan" if getattr(model, "layer_scan", False) else "unrolled"
    return (str(Path(model.source).resolve()) if model.source else None, config, str(model.dtype), attention,
            layout, mesh, socket.gethostname(), os.cpu_count(), jax.default_backend(), jax.devices()[0].device_kind,
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


def _write(file: Path, key: str, values) -> None:
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


def load(key: tuple) -> tuple[dict | None, str | None]:
    """The value stored under `key` by an earlier process, and where and when it was stored
    (None, None: nothing stored, or the store is off)."""
    file = path()
    if file is None:
        return None, None
    entry = _read(file).get(json.dumps(key, default=str))
    if not isinstance(entry, dict) or not isinstance(entry.get("values"), dict):
        return None, None
    return entry["values"], f"{file}, stored {entry.get('measured')}"


def save(key: tuple, value: dict) -> None:
    """Store `value` (JSON) under `key`, replacing what was there (`load`)."""
    file = path()
    if file is not None:
        _write(file, json.dumps(key, default=str), value)
