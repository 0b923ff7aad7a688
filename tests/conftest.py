"""Suite-wide fixtures."""

from __future__ import annotations

import gc
import os
import tempfile

# XLA's backend optimisation turned down for this session and every process it starts (they
# inherit the environment; set before JAX creates its CPU client): the suite checks what
# programs compute, not how fast they run, and most of its time is compiling
# (`.ci/run`'s tests, two runs on one machine the same night: 753.9 s -> 703.0 s;
# test_lookahead.py::test_speculative_methods_equal_greedy 26.7 -> 21.6 s). LLVM's
# passes keep IEEE semantics at every level (XLA asks for no fast math): pycode-5M's,
# stories260K's and SmolLM2's lookahead and sampled tokens are the same at both levels.
FAST_COMPILE = "--xla_backend_optimization_level=0"
# Also XLA:CPU's loop emitters in place of its newer fusion emitters, and the whole module in one
# LLVM codegen split (32 by default): the same tokens in 40% of the backend compile time.
# The whole suite (-n 2, 1,201 passed both times): 1,786 s before, 1,674 s after; real-model
# programs (above REAL_PROGRAM_BYTES) keep XLA's defaults and are most of what is left.
# tests/test_speculative.py alone, one process, fresh caches, 2026-12-07 (jax.monitoring's
# backend_compile_duration / the file's wall time): 77 s / 146 s at level 0 alone; 40 s / 110 s
# with the loop emitters; 65 s / 128 s in one split; 31 s / 97 s with both (29 passed each time).
# Modules marked `user_codegen` (bitwise claims across shapes: tests/test_batch_invariant.py)
# compile with XLA's emitters as a user's programs do, in this process and the ones they start.
QUICK_CODEGEN = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
USER_CODEGEN = [("xla_cpu_use_fusion_emitters", True), ("xla_cpu_parallel_codegen_split_count", 32)]
for _flag in (FAST_COMPILE, *QUICK_CODEGEN):
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

import jax  # noqa: E402  (after XLA_FLAGS)
import numpy as np  # noqa: E402
import pytest
from jax._src import compiler as _jax_compiler  # noqa: E402

# ... except for programs that carry a real model's weights (more than REAL_PROGRAM_BYTES of
# arguments: SmolLM2's and Gemma 3's decode loops, not the tiny models'). Level 0 saves those
# no compile time (SmolLM2's greedy loop: 6.2 s at level 0, 6.3 s at the default) and runs
# them ~5x slower (3 chats x 64 tokens: 10.2 s against 1.8 s), so they compile at the default
# level, through the compile options' overrides (which also key JAX's persistent cache).
# Measured on 2026-12-06 with `-n 2 --dist loadfile`: test_smollm2 + test_gemma3 + test_serve
# took 424 s at level 0 and 342 s at the default; four tiny-model files (test_speculative,
# test_lookahead, test_pallas_attention, test_penalties_logprobs) took 175 s at level 0 and
# 197 s at the default. The whole suite took 1167 s before this split and 1093, 1134 and 1212 s
# (a clean clone) after it: one run before, a spread as wide as the gain.
# They also keep XLA's own emitters (USER_CODEGEN): the loop emitters compiled SmolLM2's greedy
# loop in 23.3 s against 8.5 s and ran 48 tokens in 1.30 s against 1.06 s (2026-12-07, one
# process each, compile cache off). Processes the tests start (workers, notebooks) keep level 0
# and the quicker codegen for every program.
REAL_PROGRAM_BYTES = 8 << 20


def _argument_bytes(module) -> int:
    """Bytes of the arguments of a lowered module's `main` function (0 if it has none)."""
    from jax._src.lib.mlir import ir

    with module.context:
        for op in module.body.operations:
            if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
                total = 0
                for arg in ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value).inputs:
                    try:
                        tensor = ir.RankedTensorType(arg)
                    except ValueError:  # a token (callbacks)
                        continue
                    bits = max(getattr(tensor.element_type, "width", 32), 8)
                    total += int(np.prod(tensor.shape, dtype=np.int64)) * bits // 8
                return total
    return 0


_user_codegen = False  # set while a `user_codegen` module runs


def _compile_with_overrides(compile_or_get_cached):
    def compile_(backend, computation, devices, compile_options, *args, **kwargs):
        real = _argument_bytes(computation) > REAL_PROGRAM_BYTES
        if real or _user_codegen:
            compile_options.env_option_overrides = [*compile_options.env_option_overrides, *USER_CODEGEN,
                                                    *([("xla_backend_optimization_level", "2")] if real else [])]
        return compile_or_get_cached(backend, computation, devices, compile_options, *args, **kwargs)

    return compile_


if hasattr(_jax_compiler, "compile_or_get_cached"):  # JAX's private entry: a JAX without it compiles all at level 0
    _jax_compiler.compile_or_get_cached = _compile_with_overrides(
        _jax_compiler.compile_or_get_cached)

from jaxspec.runtime import compile_cache  # noqa: E402

# `method="auto"` keeps its measurements on disk for later processes (`jaxspec.runtime.auto_store`):
# not in the tests, which must measure for themselves and leave the user's store alone. (Set
# here, so that the CLI and notebook processes the tests start inherit it.)
os.environ["JAXSPEC_AUTO_CACHE"] = "off"
# The persistent compilation cache (`jaxspec.runtime.compile_cache`): one folder for this test session,
# shared by this process and every CLI, worker and notebook process the tests start, so a
# program compiled once (the default model's greedy loop, say) is loaded, not compiled, by the
# next module or process; never the user's folder. Tests of the cache itself name their own.
# (pytest-xdist's workers inherit the folder from the process that started them.)
if "JAXSPEC_TEST_COMPILE_CACHE" not in os.environ:
    _SESSION_CACHE = tempfile.TemporaryDirectory(prefix="jaxspec-test-xla-")
    os.environ["JAXSPEC_TEST_COMPILE_CACHE"] = _SESSION_CACHE.name
os.environ["JAXSPEC_COMPILE_CACHE"] = os.environ["JAXSPEC_TEST_COMPILE_CACHE"]
compile_cache.enable()


@pytest.fixture(autouse=True, scope="module")
def _codegen(request):
    """A `user_codegen` module's programs, and the processes it starts, compile with XLA's own
    emitters (QUICK_CODEGEN off)."""
    global _user_codegen
    if request.node.get_closest_marker("user_codegen") is None:
        yield
        return
    flags = os.environ["XLA_FLAGS"]
    os.environ["XLA_FLAGS"] = " ".join(f for f in flags.split() if f not in QUICK_CODEGEN)
    # The program cache's keys read XLA_FLAGS once per process: read again, so this module never
    # loads a program another module compiled with the quicker codegen (nor leaves it one).
    compile_cache._machine_key = None
    _user_codegen = True
    try:
        yield
    finally:
        _user_codegen = False
        os.environ["XLA_FLAGS"] = flags
        compile_cache._machine_key = None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Free each test module's compiled programs when it ends.

    XLA's CPU backend maps every compiled program's code into memory of its own (3 mappings
    per program), and JAX's caches keep the programs of every jitted function a module ran.
    The whole suite in one process then passes the kernel's limit of 65530 mappings
    (vm.max_map_count) and LLVM segfaults in the next compile. Clearing JAX's caches after each
    module (its module-scoped models are gone by then too) keeps the count flat."""
    yield
    jax.clear_caches()
    gc.collect()
