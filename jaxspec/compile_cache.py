"""JAX's persistent compilation cache for jaxspec's entry points (the CLI, the benchmarks).

XLA compilation is most of a short CLI call's time (`jaxspec generate` on the default model:
seconds of compiling for a fraction of a second of decoding). JAX can keep compiled programs
on disk, keyed by the program, the compile options, the backend and the JAX version, so a
later process with the same shapes loads the program instead of compiling it; the entries are
written atomically, so processes can share one folder.

The folder is `$JAXSPEC_COMPILE_CACHE`, else `$XDG_CACHE_HOME/jaxspec/xla` (`~/.cache/jaxspec/xla`);
`JAXSPEC_COMPILE_CACHE=off` turns it off. A library import changes nothing: `enable()` is called
by the CLI and the benchmarks (research code calls it, or sets JAX's own
`jax_compilation_cache_dir`, itself).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

ENV = "JAXSPEC_COMPILE_CACHE"
OFF = ("off", "0", "false", "none")
# Programs that compile faster than this are not worth a file (JAX's default is 1 s, which
# would skip most of a small model's programs).
MIN_COMPILE_SECONDS = 0.05


def cache_dir() -> Path | None:
    """The folder the cache uses, or None when it is turned off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in OFF:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "jaxspec" / "xla"


def enable() -> Path | None:
    """Point JAX's persistent compilation cache at `cache_dir()` (creating it); returns the folder,
    or None when turned off or when the folder cannot be created (then nothing is cached: a
    read-only home must not stop decoding). Set once per process: JAX reads the folder at its
    first compilation."""
    folder = cache_dir()
    if folder is None:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:  # already set (by an earlier call or by the user): keep it
        return Path(current)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
