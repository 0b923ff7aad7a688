"""Memory a decoding program needs, estimated before it is compiled, against what the device has.

A request whose method options are too large for the device (`guesses=5000` at a 128k
vocabulary needs a 150 GB n-gram pool) must fail with one line before XLA compiles or runs
it, not as a RESOURCE_EXHAUSTED traceback or an exhausted host. The estimate is

Two checks: `first_estimate`, from the options alone, before the step's token tree is built;
then `estimate`, with the state's exact size:

* state: the loop state's exact size (`jax.eval_shape` of the program's `begin`): output
  buffer, KV cache, the sources' states (lookahead's pool `b x vocab x G x (N-1)` int32 ids,
  the window, a drafter's cache), the accept histogram;
* step: the largest buffers one step or the prefill makes, whichever is larger. Per layer
  the attention scores `b x heads x T x (cache + T)` float32 (twice: scores and weights), the
  MLP's `3 x b x T x intermediate`, the residual stream; the block's K/V for every layer; the
  LM head: `b x T x vocab` float32 when sampling (the verifier reads probabilities), else
  `b x T x argmax_chunk(vocab, b x T)` (`Transformer.head_argmax`), plus, where that is a chunk
  (the block's logits over ARGMAX_LOGITS_BYTES), the chunk of the head's weight it slices out
  (`argmax_chunk(...) x hidden`: at Gemma 3's 262k vocabulary and hidden 640, a 64 MB budget over
  1024 rows makes chunks of 16384 entries, 42 MB in float32); T = the block's tokens (for the
  prefill one chunk, at most PREFILL_CHUNK tokens: the prompt runs chunk by chunk). Sampling adds the warp of one position's distribution per row (top-k /
  top-p sort keys and ids, cumulative sums, masks): `SAMPLING_BUFFERS x b x vocab` float32, as
  many as XLA's buffer assignment shows live at once.

Weights are already on the device and are reported, not counted against the free memory.
The request is refused when state + step exceed the device's free memory (accelerators:
`memory_stats()`; CPU: the host's MemAvailable). After compiling, `generate` adds XLA's own
figure (`memory_analysis()`) to the report.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import jax
import numpy as np

from jaxspec.runtime import compile_cache
from jaxspec.models.config import ModelConfig
from jaxspec.errors import MemoryLimitError
from jaxspec.models.model import argmax_chunk
from jaxspec.models.quantize import activation_dtype
from jaxspec.decoding.prefill import PREFILL_CHUNK

F32 = 4
SAMPLING_BUFFERS = 12


def tree_bytes(tree) -> int:
    """Bytes of a pytree's arrays (or ShapeDtypeStructs) on one device: a sharded array counts
    one shard; PRNG keys count their key data; an array held twice (a drafter's embeddings are its
    target's: `jaxspec.models.extended_embed`) counts once."""
    total, seen = 0, set()
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            if id(leaf) in seen:
                continue
            seen.add(id(leaf))
        if isinstance(leaf, jax.Array) and not leaf.is_fully_replicated and leaf.addressable_shards:
            total += leaf.addressable_shards[0].data.nbytes
            continue
        dtype = leaf.dtype
        if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            itemsize = 8  # two uint32 words (threefry), the default implementation
        else:
            itemsize = np.dtype(dtype).itemsize
        total += int(np.prod(leaf.shape)) * itemsize
    return total


def forward_bytes(cfg: ModelConfig, dtype_bytes: int, batch: int, tokens: int, keys: int, head_columns: int) -> int:
    """The largest buffers of one forward of `tokens` block tokens attending to `keys` keys
    (see the module docstring); layers run one after another, so only one layer's count."""
    attention = 2 * batch * cfg.num_heads * tokens * keys * F32
    mlp = 3 * batch * tokens * cfg.intermediate_size * F32
    residual = 4 * batch * tokens * cfg.hidden_size * F32
    block_kv = 2 * cfg.num_layers * batch * tokens * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    head = batch * tokens * head_columns * F32
    if 0 < head_columns < cfg.vocab_size:  # a chunked head copies its slice of the weight
        head += head_columns * cfg.hidden_size * dtype_bytes
    return attention + mlp + residual + block_kv + head


def free_memory(device) -> tuple[int | None, str]:
    """(free bytes, how that was read) for `device`: None when it cannot be read."""
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001  (a backend without memory statistics)
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), "memory_stats"
    if device.platform == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable"
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "sysconf"
        except (ValueError, OSError, AttributeError):
            pass
    return None, "unknown"


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    state_bytes: int
    step_bytes: int
    free_bytes: int | None = None  # filled in by `with_free_memory` at each request
    free_source: str = "unknown"
    device: str = ""

    @property
    def need_bytes(self) -> int:
        """What running the program adds on the device: state + the largest step."""
        return self.state_bytes + self.step_bytes

    def with_free_memory(self) -> "MemoryEstimate":
        device = jax.devices()[0]
        free, source = free_memory(device)
        return dataclasses.replace(self, free_bytes=free, free_source=source, device=str(device))

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "need_bytes": self.need_bytes}


def _gb(n: int) -> str:
    if n >= 1e12:
        return f"{n / 1e12:,.1f} TB"
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def step_bytes(cfg: ModelConfig, dtype_bytes: int, batch: int, prompt_len: int, block: int, cache_len: int,
               sampled: bool) -> int:
    """The larger of one step's and the prefill's buffers (see the module docstring)."""
    step = forward_bytes(cfg, dtype_bytes, batch, block, cache_len + block,
                         cfg.vocab_size if sampled else argmax_chunk(cfg.vocab_size, batch * block))
    step += SAMPLING_BUFFERS * batch * cfg.vocab_size * F32 if sampled else 0
    chunk = min(prompt_len, PREFILL_CHUNK)  # (the prefill runs chunk by chunk: `jaxspec.decoding.prefill`)
    prefill = forward_bytes(cfg, dtype_bytes, batch, chunk, cache_len + chunk, 0) + batch * cfg.vocab_size * F32
    return max(step, prefill)


def kv_cache_bytes(cfg: ModelConfig, dtype_bytes: int, batch: int, cache_len: int) -> int:
    return 2 * cfg.num_layers * batch * cache_len * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


def first_estimate(cfg: ModelConfig, dtype_bytes: int, engine, weights_bytes: int, batch: int, prompt_len: int,
                   cache_len: int) -> MemoryEstimate:
    """From the options alone, before the step's token tree exists (its tables grow with the
    block's square, so `guesses=10**9` must be refused before it is built): the step and the
    KV cache as the state (the sources' states are counted by `estimate`)."""
    return MemoryEstimate(weights_bytes=weights_bytes, state_bytes=kv_cache_bytes(cfg, dtype_bytes, batch, cache_len),
                          step_bytes=step_bytes(cfg, dtype_bytes, batch, prompt_len, engine.block_tokens, cache_len,
                                                engine.verifier.sampled))


def estimate(args: tuple, statics: dict, cfg: ModelConfig, dtype_bytes: int, begin_fn) -> MemoryEstimate:
    """The estimate of a program (`jaxspec.runtime.plan.Program`) from its `begin`'s arguments and
    static arguments, free memory not read yet; `begin_fn` is traced (`jax.eval_shape`), never compiled."""
    params, prompts = args[1], args[2]
    state = compile_cache.eval_shape(begin_fn, args, statics)
    engine = statics["engine"]
    batch, prompt_len = prompts.shape
    return MemoryEstimate(weights_bytes=tree_bytes(params), state_bytes=tree_bytes(state),
                          step_bytes=step_bytes(cfg, dtype_bytes, batch, prompt_len, engine.tree.size,
                                                statics["cache_len"], engine.verifier.sampled))


def per_device(estimate: MemoryEstimate, cfg: ModelConfig, dtype_bytes: int, mesh, batch: int, cache_len: int
               ) -> MemoryEstimate:
    """One device's share under tensor parallelism (`jaxspec.models.tensor_parallel`): the KV cache over
    the `model` axis when the KV heads split, the step's buffers when the heads and the ffn
    split; everything over `data` when the batch divides. `weights_bytes` is already one
    device's (`tree_bytes` of sharded arrays counts one shard)."""
    from jaxspec.models.tensor_parallel import DATA_AXIS, MODEL_AXIS, splits

    tp, dp = mesh.shape[MODEL_AXIS], mesh.shape.get(DATA_AXIS, 1)
    split = splits(cfg, tp)
    rows = dp if batch % dp == 0 else 1
    kv = kv_cache_bytes(cfg, dtype_bytes, batch, cache_len)
    kv_share = kv // (tp if split["kv_heads"] else 1)
    step_share = tp if split["heads"] and split["ffn"] else 1
    return dataclasses.replace(estimate, state_bytes=(estimate.state_bytes - kv + kv_share) // rows,
                               step_bytes=estimate.step_bytes // step_share // rows)


def utilization() -> float:
    """The share of the free memory decoding may use: $JAXSPEC_MEMORY_UTILIZATION (serve's
    --gpu-memory-utilization), in (0, 1]; 1 when unset."""
    text = os.environ.get("JAXSPEC_MEMORY_UTILIZATION", "").strip()
    if not text:
        return 1.0
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise MemoryLimitError(f"JAXSPEC_MEMORY_UTILIZATION must be a number in (0, 1], got {text!r}")
    return share


def check(estimate: MemoryEstimate, what: str) -> MemoryEstimate:
    """The estimate with the free memory read now (times `utilization()`); refused (one line)
    when it cannot fit. `what` names the request."""
    estimate = estimate.with_free_memory()
    if estimate.free_bytes is not None and utilization() < 1:
        estimate = dataclasses.replace(estimate, free_bytes=int(estimate.free_bytes * utilization()),
                                       free_source=f"{estimate.free_source} x {utilization():g}")
    if estimate.free_bytes is not None and estimate.need_bytes > estimate.free_bytes:
        raise MemoryLimitError(
            f"{what} needs about {_gb(estimate.need_bytes)} (state {_gb(estimate.state_bytes)}, step "
            f"{_gb(estimate.step_bytes)}; weights {_gb(estimate.weights_bytes)} already loaded) but {estimate.device} "
            f"has {_gb(estimate.free_bytes)} free"
            + (f" for decoding (--gpu-memory-utilization {utilization():g})" if utilization() < 1 else "")
            + "; lower the batch, max_new_tokens or the method's options")
    return estimate


# ----------------------------------------------------------------------------- the two checks of a request


def describe(name: str, options, batch: int, max_new_tokens: int) -> str:
    """How a refusal names the request: the method, its integer options, the batch and budget
    (0: prompt and output share the prompt length given, as a server's slots do)."""
    settings = ", ".join(f"{k}={v}" for k, v in options.as_dict().items()
                         if type(v) is int and not (k == "lp_devices" and v == 1))
    budget = f", max_new_tokens {max_new_tokens}" if max_new_tokens else ""
    return f"{name}{f' ({settings})' if settings else ''} at batch {batch}{budget}"


def _on_device(model, estimate: MemoryEstimate, batch: int, cache_len: int) -> MemoryEstimate:
    """Tensor parallelism: one device's share is what must fit."""
    if model.mesh is None:
        return estimate
    return per_device(estimate, model.config, activation_dtype(model.dtype).itemsize, model.mesh, batch, cache_len)


def guard_options(model, engine, what: str, batch: int, prompt_len: int, max_new_tokens: int,
                  cache_copies: float = 0) -> None:
    """The first check (`first_estimate`, plus `cache_copies` copies of the KV cache in the step),
    before the engine's tree is built. The weights' bytes are counted once per parameter tree
    (flattening it costs milliseconds at every call)."""
    cache_len = engine.cache_length(prompt_len + max_new_tokens, tree_free=True)
    weights_key = ("weights", id(model.params))
    if weights_key not in model.memory_estimates:
        # A new tree (params reassigned) replaces the old entry; the entry holds its tree, so the
        # id cannot be reused by another tree while it is cached.
        for old in [k for k in model.memory_estimates if k[0] == "weights"]:
            model.memory_estimates.pop(old, None)  # (another thread may have removed it)
        model.memory_estimates[weights_key] = (model.params, tree_bytes(model.params))
    estimate = first_estimate(model.config, activation_dtype(model.dtype).itemsize, engine,
                              model.memory_estimates[weights_key][1], batch, prompt_len, cache_len)
    estimate = dataclasses.replace(estimate, step_bytes=estimate.step_bytes + int(cache_copies * estimate.state_bytes))
    check(_on_device(model, estimate, batch, cache_len), what)


def guard_program(model, key, args: tuple, statics: dict, what: str, begin_fn) -> MemoryEstimate:
    """The second check (`estimate`, cached on the model under the program's `key`); the estimate
    with the free memory it was checked against, for `GenerateOutput.memory`."""
    if key not in model.memory_estimates:
        batch = args[2].shape[0]
        model.memory_estimates[key] = _on_device(
            model, estimate(args, statics, model.config, activation_dtype(model.dtype).itemsize, begin_fn), batch,
            statics["cache_len"])
    return check(model.memory_estimates[key], what)
