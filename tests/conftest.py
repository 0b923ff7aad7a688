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
if FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()

import jax  # noqa: E402  (after XLA_FLAGS)
import pytest

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
