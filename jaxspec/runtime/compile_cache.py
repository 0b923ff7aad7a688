"""Compiled programs kept on disk for jaxspec's entry points (the CLI, `serve`, the benchmarks).

Compiling is most of a short CLI call's time (`jaxspec generate` on the default model: seconds
of compiling for a fraction of a second of decoding). Two caches share one folder, and
processes can share it (every entry is written atomically):

* JAX's persistent compilation cache, keyed by the lowered program: a later process with the
  same shapes skips XLA's compile, but still traces and lowers the program to find its key.
* jaxspec's program cache (`compiled`, `eval_shape`), keyed by what the trace is a function of:
  a later process loads the executable without tracing (see the section below).

The folder is `$JAXSPEC_COMPILE_CACHE`, else `$XDG_CACHE_HOME/jaxspec/xla` (`~/.cache/jaxspec/xla`),
with one subfolder per version of jaxspec's code; `JAXSPEC_COMPILE_CACHE=off` turns both off. A
library import changes nothing; `enable()` is called by the first `generate`/`stream`/`chat`
call, the CLI, `serve` and the benchmarks (research code that set JAX's own
`jax_compilation_cache_dir` keeps it: that folder then holds the program cache too).
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import os
import pickle
import platform
import re
import shutil
import tempfile
import threading
import time
import types
import zlib
from collections.abc import Mapping
from pathlib import Path

import jax
import numpy as np

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
    global _programs_dir
    current = jax.config.jax_compilation_cache_dir
    if current:  # already set (by an earlier call or by the user): keep it
        if _programs_dir is None:
            _programs_dir = Path(current) / PROGRAMS_DIR
            jax.monitoring.register_event_listener(_note_cache_hit)
        return Path(current)
    # One subfolder per version of jaxspec's code: programs are only kept when freshly compiled
    # (see `_compile`), so XLA entries of an older checkout would keep them out of the program
    # cache. Subfolders unused for STALE_DAYS are removed.
    versioned = folder / f"{CODE_PREFIX}{_code_digest()[:16]}"
    try:
        versioned.mkdir(parents=True, exist_ok=True)
        os.utime(versioned)
    except OSError:
        return None
    _prune(folder, keep=versioned)
    jax.config.update("jax_compilation_cache_dir", str(versioned))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _programs_dir = versioned / PROGRAMS_DIR
    jax.monitoring.register_event_listener(_note_cache_hit)
    return versioned


CODE_PREFIX = "jaxspec-code-"
STALE_DAYS = 14


def _prune(folder: Path, keep: Path) -> None:
    """Remove the subfolders of other code versions not used for STALE_DAYS (only folders named
    as `enable` names them; best effort: another process may be using or removing one)."""
    for sub in folder.iterdir():
        try:
            if (sub != keep and re.fullmatch(re.escape(CODE_PREFIX) + "[0-9a-f]{16}", sub.name) and sub.is_dir()
                    and time.time() - sub.stat().st_mtime > STALE_DAYS * 86400):
                shutil.rmtree(sub, ignore_errors=True)
        except OSError:
            pass


# ----------------------------------------------------------------------------- whole programs
#
# XLA's cache keys on the lowered program, so every process still traces and lowers each
# program before it can look the compiled one up: ~0.5 s per decode program of the default
# model, most of a second CLI call. The program cache below keys a compiled program on what
# its trace is a function of (the function, its static arguments, its arguments' structure,
# shapes, dtypes and placement, jaxspec's own source, the versions of the libraries it traces
# through, JAX's configuration and the machine) and keeps the executable itself, so a later
# process loads it without tracing. A key is only made from values it can spell out exactly:
# anything else (a closure, a lambda, an object it does not know, an argument split over
# devices) falls back to tracing and compiling through XLA's cache, never to a guess.

PROGRAMS_DIR = "jaxspec-programs"
_FORMAT = 2  # bump when what an entry holds changes
_programs_dir: Path | None = None  # set by `enable`: library calls without it never use the cache
_machine_key: str | None = None
# Whether the compile running in this thread was read from XLA's cache. Such an executable runs,
# but on CPU (jaxlib 0.10) serializing it again drops some of its functions: loaded later, it
# fails with "Function ... not found". Only freshly compiled programs are kept.
_compile = threading.local()


def _note_cache_hit(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _compile.from_xla_cache = True


class _Unkeyable(Exception):
    """A value the key cannot spell out exactly: the program is compiled, not cached."""


def _canon(x) -> str:
    """An exact, process-independent spelling of a static value (no memory addresses, no
    truncation); `_Unkeyable` for anything it does not know."""
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return f"{type(x).__name__}:{x!r}"
    if isinstance(x, (np.generic, np.dtype)):
        return f"{type(x).__name__}:{x!r}"
    if isinstance(x, enum.Enum):
        return f"enum:{_canon(type(x))}.{x.name}"
    if isinstance(x, type) or isinstance(x, (types.FunctionType, types.BuiltinFunctionType)):
        qualname = getattr(x, "__qualname__", "")
        if not qualname or "<" in qualname or getattr(x, "__closure__", None):  # locals, lambdas, closures
            raise _Unkeyable(f"{x!r}")
        return f"def:{x.__module__}.{qualname}"
    if isinstance(x, functools.partial):
        return f"partial({_canon(x.func)},{_canon(x.args)},{_canon(x.keywords)})"
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__}[{','.join(_canon(v) for v in x)}]"
    if isinstance(x, Mapping):
        items = sorted((_canon(k), _canon(v)) for k, v in x.items())
        return f"map{{{','.join(f'{k}={v}' for k, v in items)}}}"
    if isinstance(x, jax.tree_util.PyTreeDef):
        return _canon_tree(x)
    if isinstance(x, jax.ShapeDtypeStruct):
        return f"sds({x.shape},{x.dtype},{_placement(x.sharding)})"
    if isinstance(x, np.ndarray):
        return f"ndarray({x.shape},{x.dtype},{hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()})"
    if dataclasses.is_dataclass(x):
        fields = ",".join(f"{f.name}={_canon(getattr(x, f.name))}" for f in dataclasses.fields(x))
        return f"{_canon(type(x))}({fields})"
    jitted = getattr(x, "__wrapped__", None)  # a jitted function: its trace is its wrapped function's
    if jitted is not None and callable(x) and type(x).__name__ == "PjitFunction":
        return f"jit({_canon(jitted)})"
    raise _Unkeyable(f"{type(x).__module__}.{type(x).__qualname__}")


@functools.lru_cache(maxsize=64)
def _canon_tree(tree: jax.tree_util.PyTreeDef) -> str:
    """A tree's spelling, kept per tree: a model's structure (its graph definition) spells out
    to ~100k characters, and treedefs that compare equal trace alike (jit's own cache relies
    on it)."""
    node = tree.node_data()
    children = ",".join(_canon(c) for c in tree.children())
    return "*" if node is None else f"node({_canon(node[0])},{_canon(node[1])})[{children}]"


def _placement(sharding) -> str:
    """One device's placement (the program is compiled for it); split arguments are not keyed."""
    if sharding is None:
        return "default"
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (device,) = sharding.device_set
        return f"{device.platform}:{device.id}:{sharding.memory_kind}"
    raise _Unkeyable(f"argument placed by {type(sharding).__name__}")


def _leaf(x) -> str:
    aval = jax.typeof(x)
    return f"{aval.shape}:{aval.dtype}:{aval.weak_type}:{_placement(getattr(x, 'sharding', None))}"


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    """jaxspec's own code (and pallas_kernels'), which every trace runs through: an edited
    checkout never loads a program compiled from the old code."""
    h = hashlib.sha256()
    roots = [Path(__file__).resolve().parents[1]]  # jaxspec/, every subpackage
    try:
        import pallas_kernels

        roots.append(Path(pallas_kernels.__file__).parent)
    except ImportError:
        pass
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root.parent)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def _machine(h) -> None:
    """What else a trace or an executable depends on: JAX's configuration as it is now (a
    context such as `jax.default_matmul_precision` changes it per thread), jaxspec's settings
    read while tracing (the LM head's logits budget), and, fixed for the process, library
    versions, XLA's flags, the backend and its devices, and (for CPU code) the processor's
    features."""
    global _machine_key
    from jaxspec.models import model

    if not jax.sharding.get_abstract_mesh().empty:  # a mesh context can change how a program traces
        raise _Unkeyable("a mesh context is set")
    h.update(repr(sorted((k, repr(v)) for k, v in jax.config.values.items()
                         if k != "jax_compilation_cache_dir")).encode())
    h.update(f"argmax_logits_bytes={model.ARGMAX_LOGITS_BYTES}".encode())
    if _machine_key is None:
        m = hashlib.sha256()
        for name in ("jax", "jaxlib", "flax", "numpy", "ml_dtypes"):
            try:
                m.update(f"{name}={importlib.metadata.version(name)};".encode())
            except importlib.metadata.PackageNotFoundError:
                m.update(f"{name}=none;".encode())
        m.update(os.environ.get("XLA_FLAGS", "").encode())
        devices = jax.devices()
        m.update(f"{jax.default_backend()}|{devices[0].client.platform_version}|{len(devices)}|"
                 f"{devices[0].device_kind}|{platform.machine()}|{jax.process_count()}".encode())
        try:
            flags = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")]
            m.update("".join(flags[:1]).encode())
        except OSError:
            m.update(platform.processor().encode())
        m.update(_code_digest().encode())
        _machine_key = m.hexdigest()
    h.update(_machine_key.encode())


def program_key(kind: str, fn, args: tuple, statics: dict, options: dict) -> str | None:
    """The cache key of `fn`'s program for these arguments, or None when it cannot be made
    exactly (then nothing is cached) or the cache is off."""
    if _programs_dir is None or jax.process_count() > 1:
        return None
    h = hashlib.sha256(f"{_FORMAT}|{kind}|".encode())
    try:
        _machine(h)
        leaves, tree = jax.tree.flatten(args)
        for part in (_canon(fn), _canon(statics), _canon(options), _canon(tree)):
            h.update(part.encode())
            h.update(b"\0")
        h.update("|".join(_leaf(x) for x in leaves).encode())
    except _Unkeyable:
        return None
    return h.hexdigest()


def _read(key: str):
    try:
        return pickle.loads(zlib.decompress((_programs_dir / f"{key}.bin").read_bytes()))
    except Exception:  # noqa: BLE001  (none yet, or torn, or stale: compiled again and rewritten)
        return None


def _write(key: str, value) -> bool:
    try:
        data = zlib.compress(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), 1)
        _programs_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=_programs_dir, prefix=f".{key}.", delete=False) as f:
            f.write(data)
        os.replace(f.name, _programs_dir / f"{key}.bin")  # atomic: a reader sees all of it or nothing
        return True
    except Exception:  # noqa: BLE001  (a full disk, an unpicklable value: the next process compiles)
        return False


def _serializable(program: jax.stages.Compiled) -> bool:
    """Programs that hold host callbacks, effects or closed-over constants would not come back
    whole from bytes; they are compiled in every process."""
    unloaded = getattr(program._executable, "_unloaded_executable", None)
    return (unloaded is not None and not unloaded.host_callbacks and not unloaded.keepalive
            and not unloaded.ordered_effects and not unloaded.unordered_effects
            and not getattr(program._params, "const_args", None))


# XLA:CPU options every program compiled here gets. Region analysis in copy insertion lets a
# decoding loop update its KV cache in place after the step's attention has read it: without it
# XLA:CPU copies the whole cache twice a step (K and V), ~200 MB a step for SmolLM2-135M at a
# 2k-token cache (docs/performance.md, "Copy insertion"). Buffers only: no value changes.
CPU_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}


def backend_jit_options(jit_options: dict) -> dict:
    """`jit_options` with this backend's compiler options added (the caller's own win)."""
    if jax.default_backend() != "cpu" or not CPU_COMPILER_OPTIONS:
        return jit_options
    return {**jit_options, "compiler_options": {**CPU_COMPILER_OPTIONS, **jit_options.get("compiler_options", {})}}


# Processes that keep many programs for long (`jaxspec serve`, `jaxspec chat`: `slim_programs()`) hold each
# one as loaded from its serialized form and clear JAX's caches after each compile: a program as compiled,
# with what JAX's trace, lowering and compilation caches keep of it, holds more memory (SmolLM2's greedy
# decode, 4 programs: 97 MB as compiled, 63 MB reloaded with the caches cleared). Off in library calls:
# clearing the caches makes every later trace and eager operation compile again once.
SLIM_PROGRAMS = False
_COMPILING = threading.Lock()
_compiling = 0  # threads inside a compile (`compiled`)


def slim_programs() -> None:
    """Hold this process's programs as loaded from their serialized form (see `SLIM_PROGRAMS`)."""
    global SLIM_PROGRAMS
    SLIM_PROGRAMS = True


# What this process's programs came from: "loaded" from the program cache, "compiled" (traced,
# lowered, then compiled or read from XLA's cache), "kept" (written to the program cache).
counts: collections.Counter = collections.Counter()


def give_back_freed_memory() -> None:
    """Return the heap pages freed since to the OS: glibc keeps them, and a compile frees hundreds
    of MB of temporaries (the server's warm-up on SmolLM2: its RSS 2.15 GB -> 1.87 GB)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # (not glibc)
        pass


def compiled(fn, args: tuple, statics: dict | None = None, **jit_options) -> jax.stages.Compiled:
    """`jax.jit(fn, static_argnames=statics, **jit_options).lower(*args, **statics).compile()`,
    loaded from the program cache when this process or an earlier one compiled it."""
    from jax.experimental import serialize_executable

    statics = statics or {}
    jit_options = backend_jit_options(jit_options)
    key = program_key("program", fn, args, statics, jit_options)
    entry = None if key is None else _read(key)
    if entry is not None:
        serialized, in_tree, out_tree = entry
        try:
            program = serialize_executable.deserialize_and_load(
                serialized, _in_tree(args) if in_tree is None else in_tree, out_tree)
            counts["loaded"] += 1
            return program
        except Exception:  # noqa: BLE001  (unloadable here: compiled again below)
            pass
    _compile.from_xla_cache = False
    global _compiling
    with _COMPILING:
        _compiling += 1
    try:
        program = jax.jit(fn, static_argnames=tuple(statics), **jit_options).lower(*args, **statics).compile()
    finally:
        with _COMPILING:
            _compiling -= 1
    counts["compiled"] += 1
    # (an executable XLA's cache loaded is neither kept nor reloaded: on CPU its serialized form lacks functions)
    keep = key is not None and not _compile.from_xla_cache
    slim = SLIM_PROGRAMS and not _compile.from_xla_cache
    if (keep or slim) and _serializable(program):
        try:
            serialized, in_tree, out_tree = serialize_executable.serialize(program)
        except Exception:  # noqa: BLE001  (not serializable after all: compiled in every process)
            serialized = None
        if serialized is not None and keep:
            # The arguments' structure is part of the key, so it is rebuilt from them at load rather
            # than stored: pickled, a model's graph definition costs ~4 ms to read back.
            counts["kept"] += _write(key, (serialized, None if in_tree == _in_tree(args) else in_tree, out_tree))
        if serialized is not None and slim:
            program = serialize_executable.deserialize_and_load(serialized, in_tree, out_tree)
            # What held the compiled one: JAX's trace, lowering and compilation caches. Cleared only while no
            # other thread compiles (a program destroyed while another is serialized is not a risk taken).
            with _COMPILING:
                if not _compiling:
                    jax.clear_caches()
    give_back_freed_memory()
    return program


class _Graph:
    """A graph definition as a key part, hashed once per object: its own hash walks the whole
    graph (~0.5 ms) and a call looks its key up six times. Equal definitions stay equal keys
    (two drafters of one structure share a program)."""

    __slots__ = ("value", "_hash")

    def __init__(self, value):
        self.value = value
        hit = _GRAPH_HASHES.get(id(value))
        if hit is None or hit[0] is not value:  # the entry holds its object: an id is not reused under it
            if len(_GRAPH_HASHES) >= 64:
                _GRAPH_HASHES.clear()
            hit = _GRAPH_HASHES[id(value)] = (value, hash(value))
        self._hash = hit[1]

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Graph) and (other.value is self.value or other.value == self.value)


_GRAPH_HASHES: dict[int, tuple] = {}


def graph_key(graphdefs):
    """(target graph definition, per-source definitions), each hashed once per object."""
    if isinstance(graphdefs, tuple):
        return tuple(graph_key(g) for g in graphdefs)
    return _Graph(graphdefs)


def forget_graph_hashes() -> None:
    """Drop the remembered graph hashes (the next key of each graph hashes it again)."""
    _GRAPH_HASHES.clear()


def compiled_into(table: dict, key, fn, args: tuple, statics: dict | None = None, **jit_options
                  ) -> tuple[jax.stages.Compiled, float]:
    """`table[key]`, `compiled` into the table first when missing (a model's or a server's
    programs); with the seconds that took (0.0 when it was there)."""
    if key in table:
        return table[key], 0.0
    t0 = time.perf_counter()
    table[key] = compiled(fn, args, statics, **jit_options)
    return table[key], time.perf_counter() - t0


def _in_tree(args: tuple) -> jax.tree_util.PyTreeDef:
    """The structure a compiled program's arguments have (positional, no keyword arguments)."""
    return jax.tree.structure((args, {}))


def eval_shape(fn, args: tuple, statics: dict | None = None) -> list[jax.ShapeDtypeStruct]:
    """The shapes and dtypes of `fn(*args, **statics)`'s outputs, flat, from the program cache
    when known (`jax.eval_shape` traces the function)."""
    statics = statics or {}
    key = program_key("shapes", fn, args, statics, {})
    entry = None if key is None else _read(key)
    if entry is not None:
        return entry
    out = [jax.ShapeDtypeStruct(x.shape, x.dtype)
           for x in jax.tree.leaves(jax.eval_shape(functools.partial(fn, **statics), *args))]
    if key is not None:
        _write(key, out)
    return out
