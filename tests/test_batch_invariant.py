"""`jaxspec.load(..., batch_invariant=True)`: every row's logits equal the one-token, batch-1
forward's at the same position, bit for bit, whatever the block size, batch, tree relation and
cache length; every method then equals batch-1 greedy in bfloat16. With the switch off the same
comparisons find differences (the tests can fail)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxspec
from jaxspec.errors import ConfigError
from jaxspec.models.batch_invariant import ROW_TILE, fixed_rows, ordered_sum
from jaxspec.models.kv_cache import KVCache, commit, init_cache
from jaxspec.models.model import causal_mask
from stories import CASES, needs_stories

pytestmark = [needs_stories, pytest.mark.user_codegen]  # bitwise across shapes, as users compile

SEQUENCE = 48  # reference positions
rng = np.random.default_rng(7)


@functools.lru_cache(maxsize=None)
def stories(dtype: str, invariant: bool):
    return jaxspec.load("stories260K", dtype=dtype, batch_invariant=invariant)


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, params, tokens, positions, mask, cache):
    out = nnx.merge(graphdef, params)(tokens, positions, mask, cache)
    return out.logits, out.block_kv


@functools.lru_cache(maxsize=None)
def reference(dtype: str, invariant: bool):
    """One token at a time, batch 1: every position's logits and the cache that holds them all."""
    model = stories(dtype, invariant)
    seq = np.random.default_rng(0).integers(3, model.config.vocab_size, SEQUENCE)
    cache = init_cache(model.module, 1, 64)
    logits = []
    for p in range(SEQUENCE):
        out, block = _forward(model.graphdef, model.params, jnp.asarray([[seq[p]]]), jnp.asarray([[p]]),
                              jnp.ones((1, 1, 1), bool), cache)
        cache = commit(cache, block, jnp.zeros((1, 1), jnp.int32), jnp.ones((1,), jnp.int32))
        logits.append(np.asarray(out[0, 0]))
    return seq, np.stack(logits), cache


def cache_of(ref_cache: KVCache, lengths, size: int) -> KVCache:
    """A cache of len(lengths) rows of `size` positions, row b holding the reference's first lengths[b]."""
    b = len(lengths)
    pad = [(0, 0)] * 3 + [(0, size - ref_cache.max_len), (0, 0)]
    k, v = (jnp.pad(x, pad) if size > x.shape[3] else x[:, :, :, :size] for x in (ref_cache.k, ref_cache.v))
    keep = (jnp.arange(size)[None, :] < jnp.asarray(lengths)[:, None])[None, :, None, :, None]
    k, v = (jnp.where(keep, jnp.broadcast_to(x, (x.shape[0], b, *x.shape[2:])), 0) for x in (k, v))
    return KVCache(k=k, v=v, lengths=jnp.asarray(lengths, jnp.int32))


def chain_rows_differing(dtype: str, invariant: bool, t: int, lengths, size: int) -> tuple[int, int]:
    """Rows of a causal block of t tokens (row b after lengths[b] cached) whose logits differ from
    the one-token reference's at their position; and the rows compared."""
    seq, ref, ref_cache = reference(dtype, invariant)
    model = stories(dtype, invariant)
    b = len(lengths)
    tokens = np.stack([seq[n:n + t] for n in lengths])
    positions = np.stack([np.arange(n, n + t) for n in lengths])
    logits, _ = _forward(model.graphdef, model.params, jnp.asarray(tokens), jnp.asarray(positions),
                         causal_mask(jnp.full((b,), t), t), cache_of(ref_cache, lengths, size))
    logits = np.asarray(logits)
    bad = sum(not np.array_equal(logits[r, i], ref[n + i]) for r, n in enumerate(lengths) for i in range(t))
    return bad, b * t


# (block tokens, cached lengths per row, cache positions): a single row and token, batches of 3
# and 8, a block of 33 (past ROW_TILE rows and a KEY_CHUNK boundary), buckets from 64 to 1024.
CHAINS = [(1, [5], 64), (1, [3, 17, 40, 9, 30, 1, 22, 12], 256), (2, [14, 30, 0], 1024),
          (7, [40], 64), (33, [2, 10, 15], 128)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_row_equals_the_one_token_batch_one_forward(dtype):
    for t, lengths, size in CHAINS:
        bad, rows = chain_rows_differing(dtype, True, t, lengths, size)
        assert bad == 0, f"T={t}, lengths {lengths}, cache {size}: {bad}/{rows} rows differ"


def test_without_the_switch_the_same_rows_differ():
    """The negative control: XLA's own orders round differently, so the comparison can fail."""
    found = sum(chain_rows_differing("bfloat16", False, t, lengths, size)[0] for t, lengths, size in CHAINS[1:])
    assert found > 0


def random_tree(t: int, rs) -> np.ndarray:
    """parent[i] < i (-1: a child of the last cached token)."""
    return np.asarray([-1] + [int(rs.integers(-1, i)) for i in range(1, t)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tree_tokens_equal_greedy_along_their_path(dtype):
    """A token of a random tree sees the cache and its ancestors: its logits equal the one-token
    forward's after exactly that path (each path decoded token by token, batch 1)."""
    model = stories(dtype, True)
    seq, _, ref_cache = reference(dtype, True)
    rs = np.random.default_rng(3)
    t, cached = 12, 20
    parent = random_tree(t, rs)
    tokens = rs.integers(3, model.config.vocab_size, t)
    depth = np.zeros(t, int)
    for i in range(t):
        depth[i] = 0 if parent[i] < 0 else depth[parent[i]] + 1
    sees = np.zeros((t, t), bool)
    for i in range(t):
        j = i
        while j >= 0:
            sees[i, j] = True
            j = parent[j]
    logits, _ = _forward(model.graphdef, model.params, jnp.asarray(tokens[None]), jnp.asarray(cached + depth[None]),
                         jnp.asarray(sees[None]), cache_of(ref_cache, [cached], 128))
    logits = np.asarray(logits[0])
    for i in range(t):
        path = [j for j in range(t) if sees[i, j]]  # ancestors in position order, i last
        cache = cache_of(ref_cache, [cached], 64)
        for j in path:
            out, block = _forward(model.graphdef, model.params, jnp.asarray([[tokens[j]]]),
                                  jnp.asarray([[cached + depth[j]]]), jnp.ones((1, 1, 1), bool), cache)
            cache = commit(cache, block, jnp.zeros((1, 1), jnp.int32), jnp.ones((1,), jnp.int32))
        assert np.array_equal(logits[i], np.asarray(out[0, 0])), f"tree token {i} (path {path})"


def test_fixed_rows_and_ordered_sum():
    x = jnp.asarray(rng.standard_normal((70, 24)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((24, 40)), jnp.float32)
    f = jax.jit(lambda x: fixed_rows(lambda r: r @ w, x))
    whole = np.asarray(f(x))
    assert whole.shape == (70, 40)
    for m in (1, 2, ROW_TILE, ROW_TILE + 1, 70):
        np.testing.assert_array_equal(np.asarray(f(x[:m])), whole[:m])
    np.testing.assert_allclose(whole, np.asarray(x @ w), rtol=1e-5, atol=1e-5)
    y = jnp.asarray(rng.standard_normal((3, 5, 37)), jnp.float32)
    s = np.asarray(jax.jit(lambda y: ordered_sum(y, 1))(y))
    np.testing.assert_allclose(s, np.asarray(y).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda y: ordered_sum(y, 1))(y[:1])), s[:1])


def test_the_one_row_head_takes_the_fast_product_only_where_its_argmax_is_the_tiles(monkeypatch):
    """float32 greedy's one-row head runs XLA's matrix-vector product and keeps its argmax only where
    the top two logits are further apart than both products' rounding bound; a near-tie (here: a row's
    best entry's weights given to another entry, an exact tie) goes to the tiles' product, which
    decides it as every block shape does (the lowest id)."""
    from jaxspec.models.model import Transformer

    model = stories("float32", True)
    module = nnx.merge(model.graphdef, model.params)
    assert module.head_norm is not None and module.head_norm == pytest.approx(float(np.max(np.linalg.norm(
        np.asarray(module.embed_tokens.embedding[...]), axis=1))))
    w = module.embed_tokens.embedding[...]
    xs = jnp.asarray(np.random.default_rng(3).standard_normal((64, 1, w.shape[1])), jnp.float32)
    one_row = jax.jit(lambda x: module.head_argmax(x))
    tiles = jax.jit(lambda x: module._argmax_by_row_tiles(x, w, True))
    assert [int(one_row(x)[0]) for x in xs] == [int(tiles(x)[0]) for x in xs]
    # the bound holds: the two products' logits differ by less than it
    u = np.finfo(np.float32).eps / 2
    gamma = w.shape[1] * u / (1 - w.shape[1] * u)
    gemv = np.stack([np.asarray(jnp.einsum("...d,vd->...v", x, w)) for x in xs])
    tile = np.stack([np.asarray(fixed_rows(lambda r: jnp.einsum("...d,vd->...v", r, w), x)) for x in xs])
    assert np.all(np.abs(gemv - tile) <= 2 * gamma * np.linalg.norm(np.asarray(xs), axis=-1, keepdims=True)
                  * module.head_norm)
    # a tie: a row's best entry's weights copied to another entry
    x, best = xs[0], int(tiles(xs[0])[0])
    other = 0 if best else 1
    module.embed_tokens.embedding[...] = w.at[other].set(w[best])
    calls = []
    tiles_argmax = Transformer._argmax_by_row_tiles
    monkeypatch.setattr(Transformer, "_argmax_by_row_tiles",
                        lambda self, *a: calls.append(1) or tiles_argmax(self, *a))
    with jax.disable_jit():  # (a concrete predicate: lax.cond runs one branch)
        assert int(module.head_argmax(x)[0]) == min(best, other) and calls
        calls.clear()
        module.embed_tokens.embedding[...] = w
        assert int(module.head_argmax(x)[0]) == best and not calls


# per model: methods whose blocks are chains, trees and a drafter's (each decoded batched: a block
# of rows whose caches differ in length)
METHODS = {
    "stories260K": [("lookahead", dict(window=7, ngram=4, guesses=7)), ("jacobi", dict(window=8))],
    "pycode-5M": [("prompt-lookup", dict(ngram=3, guesses=5)), ("speculative", {})],
}


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_equals_batch_one_greedy_in_bfloat16(name):
    model = jaxspec.load(name, dtype="bfloat16", batch_invariant=True)
    assert model.batch_invariant and "batch_invariant" in repr(model)
    if name == "stories260K":
        prompts = [list(c["prompt"]) for c in CASES[:3]]
    else:
        prompts = ["def add(a, b):", "import os\n\ndef read(path):", "class Stack:\n    def __init__(self):"]
    greedy = [jaxspec.generate(model, [p], max_new_tokens=32, stop_at_eos=False).tokens[0] for p in prompts]
    batched = jaxspec.generate(model, prompts, max_new_tokens=32, stop_at_eos=False).tokens
    assert batched == greedy, "greedy batched != greedy alone"
    for method, options in METHODS[name]:
        got = jaxspec.generate(model, prompts, method=method, max_new_tokens=32, stop_at_eos=False, **options)
        assert got.tokens == greedy, f"{method} {options}"


def test_float32_greedy_still_equals_the_llama2c_references():
    """The fixed orders round differently from XLA's, not worse: stories260K's greedy references
    (llama2.c's own decoding) still come out."""
    model = stories("float32", True)
    for case in CASES:
        got = jaxspec.generate(model, [list(case["prompt"])], max_new_tokens=len(case["greedy"]), stop_at_eos=False)
        assert got.tokens[0] == list(case["greedy"])


def test_the_switch_needs_xla_attention():
    with pytest.raises(ConfigError, match="batch_invariant"):
        jaxspec.load("stories260K", attention="pallas", batch_invariant=True)


MESH_SCRIPT = """
import json, sys
import jaxspec
from stories import CASES
prompts = [list(c["prompt"]) for c in CASES[:2]]
one = jaxspec.load("stories260K", dtype="bfloat16", batch_invariant=True)
greedy = [jaxspec.generate(one, [p], max_new_tokens=24, stop_at_eos=False).tokens[0] for p in prompts]
lp = jaxspec.generate(one, prompts, method="lookahead", window=6, ngram=3, guesses=6, lp_devices=4,
                      max_new_tokens=24, stop_at_eos=False).tokens
tp = jaxspec.load("stories260K", dtype="bfloat16", batch_invariant=True, tensor_parallel=2)
tp_greedy = [jaxspec.generate(tp, [p], max_new_tokens=24, stop_at_eos=False).tokens[0] for p in prompts]
tp_batched = jaxspec.generate(tp, prompts, max_new_tokens=24, stop_at_eos=False).tokens
tp_lookahead = jaxspec.generate(tp, prompts, method="lookahead", window=6, ngram=3, guesses=6, max_new_tokens=24,
                                stop_at_eos=False).tokens
print(json.dumps(dict(lp=lp == greedy, tp_batched=tp_batched == tp_greedy, tp_lookahead=tp_lookahead == tp_greedy,
                      tp_invariant=tp.batch_invariant)))
"""


def test_lookahead_parallelism_and_tensor_parallelism_keep_it():
    """LP (the lookahead branch split over 4 devices) equals one device's greedy; under TP (2 devices)
    batched greedy and lookahead equal TP greedy alone (TP sums a row's products over devices in its
    own order, so its greedy is its own reference). bfloat16, 8 forced CPU devices."""
    import json
    import os
    import sys

    from processes import ROOT, cpu_env, run_processes

    env = cpu_env(8)
    env["PYTHONPATH"] += os.pathsep + str(ROOT / "tests")  # (the worker reads the stories cases as the tests do)
    [(code, out, err)] = run_processes([[sys.executable, "-c", MESH_SCRIPT]], env, timeout=600)
    assert code == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1]) == dict(lp=True, tp_batched=True, tp_lookahead=True,
                                                            tp_invariant=True)


def test_the_server_answers_as_generate_alone_in_bfloat16():
    """Slots decode requests together (a batch of rows whose caches differ); with the switch each
    answer equals `generate` of its prompt alone, in bfloat16 as in float32."""
    import concurrent.futures

    import httpx

    from jaxspec.serving import make_server
    from jaxspec.serving.app import background

    model = jaxspec.load("pycode-5M", dtype="bfloat16", batch_invariant=True)
    prompts = ["def fibonacci(n):", "import os\n", "class Stack:\n    def push(self, x):", "for i in range(10):"]
    server = make_server(model, "pycode-5M", method="autoregressive", slots=4, context=256, chunk_steps=3)
    with background(server) as url:
        def complete(prompt):
            answer = httpx.post(f"{url}/completions", timeout=300,
                                json={"model": "pycode-5M", "prompt": prompt, "max_tokens": 24, "temperature": 0})
            answer.raise_for_status()
            return answer.json()["choices"][0]["text"]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(complete, prompts))
    for prompt, text in zip(prompts, texts):
        alone = jaxspec.generate(model, prompt, max_new_tokens=24, stop_ids=server.requests.eos_ids)
        assert text == alone.text, prompt


def test_the_command_line_switch():
    """`--batch-invariant`: the JSON config and `--compare` say which numerics ran; with
    `--attention pallas` it is one line and exit code 2."""
    import json
    import os
    import subprocess
    import sys

    from stories import CHECKPOINT

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    base = [sys.executable, "-m", "jaxspec", "generate", "--model", str(CHECKPOINT), "--prompt-ids",
            ",".join(map(str, CASES[0]["prompt"])), "--max-new-tokens", "16", "--batch-invariant"]
    proc = subprocess.run(base + ["--json", "--method", "lookahead"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["config"]["batch_invariant"] is True
    assert result["tokens"] == list(CASES[0]["greedy"][:16])
    proc = subprocess.run(base + ["--method", "lookahead"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "identical to greedy: yes (batch-invariant numerics)" in proc.stderr
    proc = subprocess.run(base + ["--attention", "pallas"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "batch_invariant" in proc.stderr and "Traceback" not in proc.stderr
