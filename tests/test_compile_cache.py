"""`jaxspec.runtime.compile_cache`'s program cache: a later process loads a program without tracing it,
the key changes with everything the trace depends on and is refused where it cannot be spelled
out exactly, and a damaged or unsafe entry is compiled again rather than trusted."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.runtime import compile_cache
from jaxspec.decoding.methods import decode

G = importlib.import_module("jaxspec.generate")
REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys
from jaxspec.runtime import compile_cache  # (not enabled by hand: a library call turns the cache on)
import jaxspec
model = jaxspec.load("pycode-5M")
prompt = [1, 5, 9, 14, 3]
spec = jaxspec.generate(model, prompt, max_new_tokens=16, method="speculative", draft_len=4, stop_at_eos=False)
greedy = jaxspec.generate(model, prompt, max_new_tokens=16, stop_at_eos=False)
stream = jaxspec.stream(model, prompt, max_new_tokens=16, method="lookahead", stop_at_eos=False)
streamed = [t for chunk in stream for t in chunk.tokens]
print(json.dumps(dict(spec=spec.tokens, greedy=greedy.tokens, streamed=streamed, counts=dict(compile_cache.counts))))
"""


def test_a_second_process_loads_its_programs_without_compiling(tmp_path):
    """The decode programs (speculative, greedy) and a stream's begin and advance (whose state
    is donated) come back from the program cache in a second process, none traced or compiled,
    with the same tokens, which equal greedy's."""
    env = {**os.environ, "JAXSPEC_COMPILE_CACHE": str(tmp_path / "cache"), "PYTHONWARNINGS": "ignore"}
    runs = [json.loads(subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True,
                                      text=True, timeout=600, check=True).stdout.splitlines()[-1]) for _ in range(2)]
    first, second = runs
    assert first["counts"].get("kept", 0) >= 4 and first["counts"].get("loaded", 0) == 0
    assert second["counts"].get("compiled", 0) == 0 and second["counts"]["loaded"] == first["counts"]["kept"]
    assert first["spec"] == second["spec"] == first["greedy"] == second["greedy"]
    assert first["streamed"] == second["streamed"] == first["greedy"]


def test_the_cache_is_off_when_the_environment_says_so(tmp_path):
    script = ("import json, jaxspec; from jaxspec.runtime import compile_cache; "
              "jaxspec.generate(jaxspec.load(), [1, 5, 9], max_new_tokens=4); "
              "print(json.dumps(dict(compile_cache.counts)))")
    env = {**os.environ, "JAXSPEC_COMPILE_CACHE": "off", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=600, check=True).stdout.splitlines()[-1]
    counts = json.loads(out)
    assert counts.get("compiled", 0) >= 1 and counts.get("kept", 0) == 0 and counts.get("loaded", 0) == 0


@pytest.fixture
def program_cache(tmp_path, monkeypatch):
    folder = tmp_path / "programs"
    monkeypatch.setattr(compile_cache, "_programs_dir", folder)
    return folder


def _key(request) -> str | None:
    return compile_cache.program_key("program", decode, request.args, request.statics, {})


def test_the_key_follows_what_the_trace_depends_on(program_cache, monkeypatch):
    model = jaxspec.load("pycode-5M")

    def key(prompt=(1, 5, 9), n=16, method="lookahead", **kw):
        return _key(G.prepare(model, list(prompt), n, method, **kw))

    base = key()
    assert base is not None and key() == base
    assert key(prompt=(7, 7, 7, 2)) == base  # the prompt's tokens are arguments (same 16-token bucket)
    others = [key(prompt=range(1, 18)), key(n=17), key(window=7), key(method="autoregressive"),
              key(temperature=0.7), key(stop_at_eos=False), key(stop_ids=[3])]
    assert len({base, *others}) == 1 + len(others)
    request = G.prepare(model, [1, 5, 9], 16, "lookahead")
    donated = compile_cache.program_key("program", decode, request.args, request.statics, {"donate_argnums": (1,)})
    assert donated not in (None, base)
    # JAX's configuration as this thread sees it: a precision context is another program, and
    # under a mesh context (which can change how a program traces) nothing is keyed.
    with jax.default_matmul_precision("highest"):
        assert key() not in (None, base)
    assert key() == base
    with jax.sharding.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))):
        assert key() is None
    # jaxspec's settings read while tracing: another LM-head logits budget is another program.
    monkeypatch.setattr(jaxspec.models.model, "ARGMAX_LOGITS_BYTES", 1024)
    assert key() not in (None, base)
    monkeypatch.undo()
    assert key() == base
    # Another version of jaxspec's code or of a library: another key.
    monkeypatch.setattr(compile_cache, "_machine_key", None)
    monkeypatch.setattr(compile_cache, "_code_digest", lambda: "edited")
    assert key() not in (None, base)


def test_what_cannot_be_spelled_out_is_not_cached(program_cache):
    x = jnp.ones(3)
    scale = 2.0
    assert compile_cache.program_key("program", lambda v: v * 2, (x,), {}, {}) is None

    def closure(v):
        return v * scale

    assert compile_cache.program_key("program", closure, (x,), {}, {}) is None
    assert compile_cache.program_key("program", _scaled, (x,), {"factor": object()}, {}) is None
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    split = jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    assert compile_cache.program_key("program", _scaled, (split,), {"factor": 2.0}, {}) is None
    # ... and still compiles and runs, uncached
    program = compile_cache.compiled(closure, (x,))
    assert np.asarray(program(x)).tolist() == [2.0, 2.0, 2.0] and not any(program_cache.glob("*.bin"))


def _scaled(x, *, factor):
    return jnp.sin(x) * factor


def test_a_damaged_entry_is_compiled_again_and_rewritten(program_cache):
    x = jnp.arange(4, dtype=jnp.float32) + 0.25
    want = (np.sin(np.asarray(x)) * 3.5).tolist()
    counts = compile_cache.counts
    before = counts.copy()
    assert np.allclose(compile_cache.compiled(_scaled, (x,), {"factor": 3.5})(x), want)
    (entry,) = program_cache.glob("*.bin")
    assert counts["kept"] == before["kept"] + 1
    entry.write_bytes(entry.read_bytes()[:100])  # torn
    assert np.allclose(compile_cache.compiled(_scaled, (x,), {"factor": 3.5})(x), want)
    assert counts["loaded"] == before["loaded"] and counts["kept"] == before["kept"] + 2
    assert np.allclose(compile_cache.compiled(_scaled, (x,), {"factor": 3.5})(x), want)
    assert counts["loaded"] == before["loaded"] + 1


def _scaled_tree(tree, *, factor):
    return jax.tree.map(lambda v: jnp.cos(v) * factor, tree)


def test_an_entry_leaves_out_the_argument_structure_its_key_fixes(program_cache):
    """The arguments' structure (for a decode program, the model's graph definition: slow to
    unpickle) is rebuilt from the arguments at load, not stored; the loaded program computes
    what the compiled one did. (A function no other test compiles: one read from XLA's cache
    would not be kept.)"""
    x = jnp.arange(3, dtype=jnp.float32)
    args = ({"a": x, "b": (x + 1, [x + 2])},)
    fresh = compile_cache.compiled(_scaled_tree, args, {"factor": 1.5})
    serialized, in_tree, out_tree = compile_cache._read(
        compile_cache.program_key("program", _scaled_tree, args, {"factor": 1.5}, compile_cache.backend_jit_options({})))
    assert in_tree is None and out_tree == fresh.out_tree
    loaded_before = compile_cache.counts["loaded"]
    loaded = compile_cache.compiled(_scaled_tree, args, {"factor": 1.5})
    assert compile_cache.counts["loaded"] == loaded_before + 1
    assert jax.tree.structure(loaded(*args)) == jax.tree.structure(args[0])
    for got, want in zip(jax.tree.leaves(loaded(*args)), jax.tree.leaves(fresh(*args))):
        assert np.asarray(got).tolist() == np.asarray(want).tolist()


def test_a_program_read_from_xlas_cache_is_not_kept(program_cache):
    """On CPU an executable XLA's cache loaded loses functions when serialized again: it runs
    here, but is not written to the program cache."""
    model = jaxspec.load("pycode-5M")
    request = G.prepare(model, [1, 5, 9], 16, "autoregressive", stop_at_eos=False)
    first = compile_cache.compiled(decode, request.args, request.statics)  # fresh, or from XLA's cache
    for entry in program_cache.glob("*.bin"):
        entry.unlink()
    jax.clear_caches()
    kept = compile_cache.counts["kept"]
    again = compile_cache.compiled(decode, request.args, request.statics)  # XLA's cache has it now
    assert compile_cache.counts["kept"] == kept and not any(program_cache.glob("*.bin"))
    tokens = [np.asarray(p(*request.args)[0].tokens).tolist() for p in (first, again)]
    assert tokens[0] == tokens[1]


def test_old_code_versions_are_pruned_and_nothing_else(tmp_path):
    now = tmp_path / f"{compile_cache.CODE_PREFIX}{'a' * 16}"
    old = tmp_path / f"{compile_cache.CODE_PREFIX}{'b' * 16}"
    recent = tmp_path / f"{compile_cache.CODE_PREFIX}{'c' * 16}"
    foreign = tmp_path / "0123456789abcdef"  # the user's own folder, however old
    for folder in (now, old, recent, foreign):
        folder.mkdir()
    month_ago = os.path.getmtime(now) - 30 * 86400
    for folder in (now, old, foreign):
        os.utime(folder, (month_ago, month_ago))
    compile_cache._prune(tmp_path, keep=now)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (now, recent, foreign))


def test_slim_programs_are_held_as_loaded_and_compute_the_same(program_cache, monkeypatch):
    """`slim_programs()` (the server's, chat's): a fresh program is held as loaded from its serialized
    form, with JAX's caches cleared after it; it computes what the compiled one does, donation included."""
    x = jnp.arange(5, dtype=jnp.float32) * 0.5
    fat = compile_cache.compiled(_donated_step, (x,), {"factor": 2.5}, donate_argnums=(0,))
    monkeypatch.setattr(compile_cache, "SLIM_PROGRAMS", True)
    cleared = []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(1))
    slim = compile_cache.compiled(_donated_step, (x,), {"factor": 3.5}, donate_argnums=(0,))
    assert cleared == [1] and type(slim) is type(fat)
    y = jnp.arange(5, dtype=jnp.float32) * 0.5
    out = slim(y)
    assert np.asarray(out).tolist() == (np.arange(5, dtype=np.float32) * 0.5 * 3.5 + 1).tolist()
    assert y.is_deleted()  # (the loaded program donates as the compiled one does)


def _donated_step(x, *, factor):
    return x * factor + 1
