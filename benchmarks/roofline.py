"""The step-cost model, from first principles: the step-cost ratio c(T) behind every method's speed-up, and
its check against this CPU's measured c(T).

Every lossless method here turns one greedy step into one forward over a block of T tokens that emits S
tokens on average; its speed-up over greedy is `S / c(T)`, c(T) = predicted_seconds(T) / predicted_seconds(1),
the cost of a T-token step in greedy steps. S is measured (it depends on the text and the model); c(T) is
physics, predicted here from the model's shapes and a hardware profile (`forward_cost`: a roofline per
operation, max(compute, memory) on an accelerator, their sum on a CPU, summed over the operations, plus a fixed
cost per layer and per call), so a speed-up can be predicted for hardware nobody here has run on. The model,
what is calibrated and how (accelerators: `PROFILES`, the vendors' spec sheets cited at each entry; the paper's
stack: `PAPER_PROFILE`; this CPU: `calibration_cases`, programs that never run a checked model; how an
implementation touches memory: `IMPLEMENTATIONS`) and why a CPU needs its extra terms: docs/performance.md.
Nothing is fitted to the check.

The check (`python -m benchmarks.roofline`): one jitted forward (the decode step's model call: T block tokens,
T in {1, 8, 16, 32, 64, 128}, against a 256-position KV cache, greedy argmax head, batch 1, float32) of
stories260K, pycode-5M and SmolLM2-135M-Instruct, and the calibration programs, all timed interleaved in the
same rounds (`harness.time_programs`), minimum over rounds. c(T) = t(T) / t(1), measured and predicted from
the calibrated profile (`record`). `predict` recomputes a result's predictions from its recorded calibration
(tools/performance_tables.py writes docs/performance.md's tables). Nothing in jaxspec imports this model
(`jaxspec.runtime.auto` learns from the decodes it runs); it lives beside the benchmark that checks it.

    python -m benchmarks.roofline                 # ~5 min on 2 busy cores
    python -m benchmarks.roofline --rounds 5 --models stories260K
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
import types
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, command_line, machine_info, time_programs, write_result  # noqa: E402
from jaxspec import KVCache, ModelConfig, Transformer, causal_mask  # noqa: E402
# (not public: a step's block tokens, the model's memory arithmetic, the head's argmax chunk)
from jaxspec.decoding.methods import lookahead_block_tokens, prompt_lookup_block_tokens  # noqa: E402,F401
from jaxspec.errors import ConfigError  # noqa: E402
from jaxspec.models.model import argmax_chunk  # noqa: E402
from jaxspec.runtime.memory import F32, kv_cache_bytes  # noqa: E402

GB = 1e9
TB = 1e12
TFLOPS = 1e12


# ----------------------------------------------------------------------------- hardware


Curve = tuple[tuple[float, float], ...]  # ((working-set bytes, bytes/s), ...), increasing sizes


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """One device's numbers for the roofline. Accelerators: spec-sheet values; a CPU: measured.

    The fields after `source` default to an accelerator's behaviour:

    * `tile_rows`: a matmul's rows are padded to this tile (tensor-core / MXU) when there is no
      measured `matmul_rows` / `matmul_efficiency` curve (the fraction of peak a matmul of that
      many rows reaches: a CPU's kernels and threads do not saturate at a few rows);
    * `read_curve` / `rw_curve`: bytes/s of streaming reads (weights, KV cache) and of read+write
      passes (activations, scores) by working-set size, where caches matter (a CPU); empty: every
      byte at `hbm_bytes_per_s`;
    * `overlap`: whether an op's compute and memory traffic overlap (an accelerator's asynchronous
      copies feed its matrix units while they compute: the roofline's max). A CPU's cores both load
      and compute: its ops pay the sum;
    * `gemm_packs`: a matmul of more than one row first packs its weight into panels (a CPU GEMM:
      one more write and read of the weight, at the read+write bandwidth its size allows; a one-row
      product streams the weight once);
    * `matmul_call_seconds`: per entry of a batched matmul (a CPU loops over the (batch x KV-head)
      entries of attention's batched products; an accelerator runs them as one kernel);
    * `exp_seconds`, `reduce_seconds`: compute time per softmax exponential and per argmax element,
      where the arithmetic, not the memory, limits them (a CPU's scalar variadic reduce);
    * `tied_head_bytes_per_s`, `copy_bytes_per_s`: measured rates of the LM head's one-row product
      against a tied [vocab, hidden] table (a row-dot kernel, slower than the column form on XLA's
      CPU) and of the chunked argmax's chunk copies; 0: the read bandwidth and the read+write curve;
    * `softmax_access_seconds`: seconds per float32 access of a materialised softmax's fused passes
      (reductions, broadcasts, exp: slower per byte than a plain stream on a CPU), measured at
      `softmax_working_set` bytes and scaled by the read+write curve elsewhere; 0: bytes at the
      read+write curve plus `exp_seconds` per score.
    """

    name: str
    peak_bf16_flops: float
    peak_fp32_flops: float
    hbm_bytes_per_s: float
    memory_bytes: float
    fixed_layer_seconds: float
    source: str
    fixed_call_seconds: float = 0.0
    tile_rows: int = 1
    matmul_rows: tuple[int, ...] = ()
    matmul_efficiency: tuple[float, ...] = ()
    read_curve: Curve = ()
    rw_curve: Curve = ()
    overlap: bool = True
    gemm_packs: bool = False
    matmul_call_seconds: float = 0.0
    exp_seconds: float = 0.0
    reduce_seconds: float = 0.0
    tied_head_bytes_per_s: float = 0.0
    copy_bytes_per_s: float = 0.0
    softmax_access_seconds: float = 0.0
    softmax_working_set: float = 0.0

    def __post_init__(self):
        for name in ("peak_bf16_flops", "peak_fp32_flops", "hbm_bytes_per_s", "memory_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
                raise ConfigError(f"HardwareProfile {self.name!r}: {name} must be a positive number, got {value!r}")
        for name in ("fixed_layer_seconds", "fixed_call_seconds", "matmul_call_seconds", "exp_seconds",
                     "reduce_seconds", "tied_head_bytes_per_s", "copy_bytes_per_s", "softmax_access_seconds",
                     "softmax_working_set"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise ConfigError(f"HardwareProfile {self.name!r}: {name} must be a number >= 0, got {value!r}")
        if len(self.matmul_rows) != len(self.matmul_efficiency):
            raise ConfigError(f"HardwareProfile {self.name!r}: matmul_rows and matmul_efficiency differ in length")
        if list(self.matmul_rows) != sorted(set(self.matmul_rows)) or any(r < 1 for r in self.matmul_rows):
            raise ConfigError(f"HardwareProfile {self.name!r}: matmul_rows must be increasing positive integers")
        if any(not 0 < e <= 1 for e in self.matmul_efficiency):
            raise ConfigError(f"HardwareProfile {self.name!r}: matmul efficiencies must lie in (0, 1]")
        if not isinstance(self.tile_rows, int) or self.tile_rows < 1:
            raise ConfigError(f"HardwareProfile {self.name!r}: tile_rows must be a positive integer")
        for name in ("read_curve", "rw_curve"):
            curve = getattr(self, name)
            sizes = [point[0] for point in curve]
            if sizes != sorted(set(sizes)) or any(size <= 0 or bw <= 0 for size, bw in curve):
                raise ConfigError(f"HardwareProfile {self.name!r}: {name} needs increasing positive sizes and "
                                  "positive bytes/s")

    def peak_flops(self, dtype_bytes: int) -> float:
        """Dense matmul peak at the compute dtype (2 bytes: bf16/fp16 tensor units; 4: fp32)."""
        return self.peak_bf16_flops if dtype_bytes == 2 else self.peak_fp32_flops

    def efficiency(self, rows: int) -> float:
        """Fraction of peak a matmul with `rows` rows (M = batch x tokens) reaches: the measured curve
        (linear in log rows between its points, flat beyond), else tile padding: rows / (rows rounded
        up to `tile_rows`), the idle part of a tensor-core / MXU tile."""
        if self.matmul_rows:
            return _interpolate(tuple(zip(self.matmul_rows, self.matmul_efficiency)), rows)
        return rows / (math.ceil(rows / self.tile_rows) * self.tile_rows)

    def read_bandwidth(self, working_set: float) -> float:
        """Bytes/s of a stream of reads over `working_set` bytes."""
        return _interpolate(self.read_curve, working_set) if self.read_curve else self.hbm_bytes_per_s

    def rw_bandwidth(self, working_set: float) -> float:
        """Bytes/s of read+write passes over `working_set` bytes."""
        return _interpolate(self.rw_curve, working_set) if self.rw_curve else self.hbm_bytes_per_s


def _interpolate(curve, x: float) -> float:
    """A measured curve at `x`: linear in log x between its points, flat beyond its ends."""
    xs, ys = [p[0] for p in curve], [p[1] for p in curve]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = next(i for i, v in enumerate(xs) if v >= x)
    f = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return ys[i - 1] + f * (ys[i] - ys[i - 1])


# Fixed cost of a decoder layer, first principles (no accelerator measurement exists here): a
# fused LLaMA layer is ~12 kernels (2 RMSNorms, QKV matmul, RoPE, attention, O matmul + residual,
# gate/up matmul, SwiGLU, down matmul + residual); a GPU pays ~2 us launch-to-launch per dependent
# kernel (CUDA's documented launch latency is "a few microseconds"), a TPU ~1 us per fused op (one
# on-device program, no launches: the per-op pipeline fill). Sensitivity: docs/performance.md.
_KERNELS_PER_LAYER = 12
_GPU_FIXED = _KERNELS_PER_LAYER * 2e-6
_TPU_FIXED = _KERNELS_PER_LAYER * 1e-6
# Smallest efficient matmul tile in rows: Hopper's wgmma instruction is m64 (and cuBLAS's smallest
# common CTA tiles are 64 rows on Ampere too); a TPU MXU is 128x128 (v5e, v5p) or 256x256 (v6e).
_GPU_TILE = 64

PROFILES: dict[str, HardwareProfile] = {
    # NVIDIA A100 80GB SXM datasheet: FP16/BF16 tensor 312 TFLOPS dense (624 sparse), FP32 19.5 TFLOPS,
    # HBM2e 2,039 GB/s, 80 GB.
    "a100": HardwareProfile("NVIDIA A100-80GB SXM", 312 * TFLOPS, 19.5 * TFLOPS, 2039 * GB, 80 * GB, _GPU_FIXED,
                            "NVIDIA A100 datasheet (80GB SXM)", tile_rows=_GPU_TILE),
    # NVIDIA H100 SXM5 datasheet: BF16 tensor 989 TFLOPS dense (1,979 sparse), FP32 67 TFLOPS, HBM3 3.35 TB/s, 80 GB.
    "h100": HardwareProfile("NVIDIA H100 SXM", 989 * TFLOPS, 67 * TFLOPS, 3.35 * TB, 80 * GB, _GPU_FIXED,
                            "NVIDIA H100 datasheet (SXM5)", tile_rows=_GPU_TILE),
    # NVIDIA H200 SXM datasheet: BF16 tensor 989 TFLOPS dense (same GH100 die), FP32 67 TFLOPS, HBM3e 4.8 TB/s, 141 GB.
    "h200": HardwareProfile("NVIDIA H200 SXM", 989 * TFLOPS, 67 * TFLOPS, 4.8 * TB, 141 * GB, _GPU_FIXED,
                            "NVIDIA H200 datasheet (SXM)", tile_rows=_GPU_TILE),
    # Cloud TPU v5e (cloud.google.com/tpu/docs/v5e): 197 TFLOPS bf16, 16 GB HBM2 at 819 GB/s, 4 MXUs 128x128.
    # No fp32 figure: fp32 matmuls at precision HIGHEST take 6 bf16 passes (an estimate, peak / 6).
    "v5e": HardwareProfile("Google TPU v5e", 197 * TFLOPS, 197 / 6 * TFLOPS, 819 * GB, 16 * GB, _TPU_FIXED,
                           "cloud.google.com/tpu/docs/v5e", tile_rows=128),
    # Cloud TPU v5p (cloud.google.com/tpu/docs/v5p): 459 TFLOPS bf16, 95 GB HBM2e at 2,765 GB/s, 128x128 MXUs.
    "v5p": HardwareProfile("Google TPU v5p", 459 * TFLOPS, 459 / 6 * TFLOPS, 2765 * GB, 95 * GB, _TPU_FIXED,
                           "cloud.google.com/tpu/docs/v5p", tile_rows=128),
    # Cloud TPU v6e / Trillium (cloud.google.com/tpu/docs/v6e): 918 TFLOPS bf16, 32 GB HBM at 1,638 GB/s,
    # two 256x256 MXUs.
    "v6e": HardwareProfile("Google TPU v6e", 918 * TFLOPS, 918 / 6 * TFLOPS, 1638 * GB, 32 * GB, _TPU_FIXED,
                           "cloud.google.com/tpu/docs/v6e", tile_rows=256),
}

# The paper's stack (Fu et al. 2024: lade on transformers' LLaMA in PyTorch eager, fp16, A100):
# every aten op is dispatched from Python. transformers' LlamaDecoderLayer with eager attention
# issues 61 top-level aten ops per layer and 47 outside the layers (counted with torch.profiler,
# `tools/performance_tables.py --count-eager`); an eager op costs ~4-7 us of host time (measured on this
# machine's CPU, `x + 1` on a 4-element tensor, quiet to loaded; 7 us taken: a CUDA launch adds to
# it). The host cost is added to the GPU's roofline, a bound: an asynchronous stream can overlap
# part of it.
EAGER_OPS_PER_LAYER = 61
EAGER_OPS_OUTSIDE_LAYERS = 47
EAGER_SECONDS_PER_OP = 7e-6
PAPER_PROFILE = dataclasses.replace(
    PROFILES["a100"], name="NVIDIA A100-80GB SXM, PyTorch eager",
    fixed_layer_seconds=EAGER_OPS_PER_LAYER * EAGER_SECONDS_PER_OP,
    fixed_call_seconds=EAGER_OPS_OUTSIDE_LAYERS * EAGER_SECONDS_PER_OP,
    source="NVIDIA A100 datasheet; fixed cost = eager aten ops x host time per op")


# ----------------------------------------------------------------------------- implementations


@dataclasses.dataclass(frozen=True)
class Implementation:
    """How a forward's implementation touches memory beyond the weights, per element.

    `score_f32_accesses` / `score_value_accesses`: float32 and compute-dtype reads + writes of every
    attention score (b x heads x T x keys); 0 and 0 for a fused kernel that keeps them on chip.
    `cache_passes`: passes over the KV cache (1 = read once). `head_chunk_copies`: the chunked
    argmax copies each vocabulary chunk of the head before its matmul (read, write, read: 3 passes).
    `logits_accesses`: float32 accesses per logit (the argmax's reads included)."""

    name: str
    score_f32_accesses: int
    score_value_accesses: int
    cache_passes: int
    head_chunk_copies: bool
    logits_accesses: int
    about: str

    @property
    def materialised(self) -> bool:
        return bool(self.score_f32_accesses or self.score_value_accesses)


IMPLEMENTATIONS: dict[str, Implementation] = {
    # Counted from XLA's compiled CPU program of jaxspec.models.attention.xla_attention (jax 0.10): the score
    # and value dots write the two score blocks (1 f32 access), a scale fusion reads and writes them
    # (2), a concatenate (2), the mask select (2), max + exp (reads twice, writes once: 3), the sum
    # (1), the normalise fusion reads them once (1); it writes the probabilities and the PV dots
    # read them (2, at the value dtype). The dots read the heads-major cache as it is stored (1 pass;
    # stored [b, s, kv, d] until 2026-12-05, it was transposed first: read, write, read, 3 passes);
    # the chunked head copies each chunk (dynamic-slice fusion).
    "xla": Implementation("xla", 12, 2, 1, True, 4, "jaxspec's XLA reference attention (attention='xla')"),
    # A flash-style kernel (jaxspec's Pallas kernels, FlashAttention): scores stay on chip, the cache
    # is read in place once, the head's chunks are read where they lie.
    "fused": Implementation("fused", 0, 0, 1, False, 2, "fused attention kernel (attention='pallas', flash)"),
    # The least an unfused attention can do: the scores written once in float32, read once by a fused
    # softmax that writes the probabilities, which the value product reads (XLA's GPU/TPU fusion of the
    # reference attention lies between this and the CPU count above; not measured here).
    "unfused": Implementation("unfused", 2, 2, 1, False, 2, "scores materialised once (the best unfused case)"),
    # transformers' eager LLaMA attention in fp16, as lade ran it: matmul writes the scores (1),
    # / sqrt(d) (2), + mask (2), softmax(dtype=float32) reads fp16 (1) and writes fp32 (1 f32),
    # .to(fp16) reads fp32 (1 f32) and writes (1), the PV matmul reads (1); the legacy cache is
    # torch.cat-ed every step (read, write) before attention reads it (3 passes); full logits.
    "eager": Implementation("eager", 2, 8, 3, False, 3, "transformers eager LLaMA attention, PyTorch (the paper)"),
}


# ----------------------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class OpCost:
    """One operation of the forward: its FLOPs and bytes, the seconds of each side and in all."""

    name: str
    flops: float
    bytes: float
    compute_seconds: float
    memory_seconds: float
    seconds: float

    @property
    def compute_bound(self) -> bool:
        return self.compute_seconds > self.memory_seconds


@dataclasses.dataclass(frozen=True)
class ForwardCost:
    """A forward's predicted cost: `seconds` = layers x (the layer's ops + fixed) + the head's ops
    + fixed per call. `layer_ops` are one layer's, `head_ops` the embedding, final norm and LM head's."""

    seconds: float
    flops: float
    bytes: float
    fixed_seconds: float
    layer_ops: tuple[OpCost, ...]
    head_ops: tuple[OpCost, ...]
    num_layers: int

    @property
    def compute_bound_fraction(self) -> float:
        """Share of the ops' time (fixed cost excluded) spent in compute-bound operations."""
        ops = [(op, self.num_layers) for op in self.layer_ops] + [(op, 1) for op in self.head_ops]
        total = sum(op.seconds * n for op, n in ops)
        return sum(op.seconds * n for op, n in ops if op.compute_bound) / total if total else 0.0


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check(cfg, tokens, batch, cache_len, dtype_bytes, profile, implementation):
    if not isinstance(cfg, ModelConfig):
        raise ConfigError(f"cfg must be a jaxspec ModelConfig, got {type(cfg).__name__}")
    _positive_int("tokens", tokens)
    _positive_int("batch", batch)
    _positive_int("cache_len", cache_len, 0)
    if dtype_bytes not in (2, 4) or isinstance(dtype_bytes, bool):
        raise ConfigError(f"dtype_bytes must be 2 (bf16/fp16) or 4 (fp32), got {dtype_bytes!r}")
    if not isinstance(profile, HardwareProfile):
        raise ConfigError(f"profile must be a HardwareProfile (PROFILES, or profile_from_measurements), got {profile!r}")
    if implementation not in IMPLEMENTATIONS:
        raise ConfigError(f"unknown implementation {implementation!r}; known: {', '.join(IMPLEMENTATIONS)}")


class _Ops:
    """Builds one forward's OpCosts on a profile; `state_bw` is the read bandwidth of the persistent
    state (weights + KV cache: re-read every forward, so the whole of it is the working set)."""

    def __init__(self, profile: HardwareProfile, dtype_bytes: int, state_bytes: float):
        self.p, self.wb = profile, dtype_bytes
        self.state_bw = profile.read_bandwidth(state_bytes)

    def op(self, name, flops=0.0, rows=1, state_bytes=0.0, passes=(), extra_compute=0.0) -> OpCost:
        """`state_bytes` stream at the state's bandwidth; each `(bytes, working_set)` of `passes`
        moves at the read+write bandwidth its working set allows; `extra_compute`: seconds of
        non-matmul arithmetic (exp, argmax)."""
        p = self.p
        compute = (flops / (p.peak_flops(self.wb) * p.efficiency(rows)) if flops else 0.0) + extra_compute
        memory = state_bytes / self.state_bw + sum(b / p.rw_bandwidth(ws) for b, ws in passes if b)
        total = max(compute, memory) if p.overlap else compute + memory
        return OpCost(name, flops, state_bytes + sum(b for b, _ in passes), compute, memory, total)

    def matmul(self, name, rows, k_in, n_out) -> OpCost:
        """x[rows, k_in] @ W[k_in, n_out]: W streamed once (and, by a CPU GEMM, packed: written and
        read again), x read and the output written."""
        weights = k_in * n_out * self.wb
        act = rows * (k_in + n_out) * self.wb
        packing = (2 * weights, weights) if (self.p.gemm_packs and rows > 1) else (0.0, 1.0)
        return self.op(name, 2 * rows * k_in * n_out, rows, weights, ((act, act), packing))


def forward_cost(cfg: ModelConfig, tokens: int, batch: int = 1, cache_len: int = 0, dtype_bytes: int = 2,
                 profile: HardwareProfile = PROFILES["h100"], implementation: str = "fused",
                 head: str = "argmax") -> ForwardCost:
    """The predicted cost of one forward of `tokens` block tokens per sequence, `batch` sequences,
    attending to a KV cache of `cache_len` positions (the buffer the attention reads), weights and
    activations at `dtype_bytes`, on `profile`, as `implementation` touches memory. `head`:
    "argmax" (greedy: only the argmax, chunked over the vocabulary) or "logits" (full float32
    logits, for sampling). See the module docstring for the model."""
    _check(cfg, tokens, batch, cache_len, dtype_bytes, profile, implementation)
    if head not in ("argmax", "logits"):
        raise ConfigError(f"head must be 'argmax' or 'logits', got {head!r}")
    impl = IMPLEMENTATIONS[implementation]
    b, t, wb = batch, tokens, dtype_bytes
    d, f, v, hd = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    h, kv = cfg.num_heads, cfg.num_kv_heads
    q, kvd = h * hd, kv * hd
    m = b * t  # matmul rows
    keys = cache_len + t
    cache_layer = kv_cache_bytes(cfg, wb, b, cache_len) / cfg.num_layers  # one layer's K and V
    build = _Ops(profile, wb, cfg.num_params * wb + kv_cache_bytes(cfg, wb, b, cache_len))

    ops = [build.matmul("q_proj", m, d, q), build.matmul("k_proj", m, d, kvd), build.matmul("v_proj", m, d, kvd),
           build.matmul("o_proj", m, q, d), build.matmul("gate_proj", m, d, f), build.matmul("up_proj", m, d, f),
           build.matmul("down_proj", m, f, d)]
    scores = b * h * t * keys
    group_rows = (h // kv) * t  # one KV head's query rows
    qkvo = m * (2 * q + 2 * kvd) * wb  # Q, the block's K/V, the attention output
    # A CPU loops over the batched products' (batch x KV head) entries: 4 products per entry (scores
    # and values, against the cache and against the block); the fixed cost holds one entry's.
    calls = (4 * b * kv - 4) * profile.matmul_call_seconds
    if impl.materialised:
        score_bytes = scores * (impl.score_f32_accesses * F32 + impl.score_value_accesses * wb)
        mask_bytes = 2 * b * group_rows * keys  # the visibility mask, [b, group rows, keys] booleans
        ops.append(build.op("attention_matmuls", 4 * scores * hd, group_rows, impl.cache_passes * cache_layer,
                            ((qkvo, qkvo),), extra_compute=calls))
        softmax = build.op("softmax", passes=((score_bytes + mask_bytes, 2 * scores * F32),),
                           extra_compute=scores * profile.exp_seconds)
        if profile.softmax_access_seconds:
            # the measured per-access cost of fused softmax passes (exp included), scaled to this working set
            accesses = scores * (impl.score_f32_accesses + impl.score_value_accesses * wb / F32) + mask_bytes / F32
            scale = profile.rw_bandwidth(profile.softmax_working_set) / profile.rw_bandwidth(2 * scores * F32)
            seconds = accesses * profile.softmax_access_seconds * scale
            softmax = dataclasses.replace(softmax, compute_seconds=0.0, memory_seconds=seconds, seconds=seconds)
        ops.append(softmax)
    else:
        ops.append(build.op("attention", 4 * scores * hd, group_rows, impl.cache_passes * cache_layer,
                            ((qkvo, qkvo),), extra_compute=calls + scores * profile.exp_seconds))
    # RMSNorms (read + write d, twice), residual adds (read 2d, write d, twice), RoPE on q and k
    # (read + write), SwiGLU (read 2f, write f), the block's K/V stacked for the caller (write).
    elementwise = m * (10 * d + 2 * (q + kvd) + 3 * f + 2 * kvd) * wb
    ops.append(build.op("elementwise", passes=((elementwise, 2 * m * max(d, f) * wb),)))

    # LM head: the hidden states against the vocabulary in chunks, then the argmax (or the logits).
    chunk = argmax_chunk(v, m) if head == "argmax" else v
    head_weights = d * v * wb
    copies = 2 * head_weights if (chunk < v and impl.head_chunk_copies) else 0.0  # write + read of each chunk
    logit_bytes = m * v * F32 * (impl.logits_accesses + (head == "logits"))
    lm_head = build.matmul("lm_head", m, d, v)
    if cfg.tie_word_embeddings and profile.tied_head_bytes_per_s and m == 1:
        # the one-row product against a [vocab, hidden] table: the row-dot kernel's measured rate
        act = m * (d + v) * wb
        memory = head_weights / profile.tied_head_bytes_per_s + act / profile.rw_bandwidth(act)
        total = max(lm_head.compute_seconds, memory) if profile.overlap else lm_head.compute_seconds + memory
        lm_head = dataclasses.replace(lm_head, memory_seconds=memory, seconds=total)
    copy = build.op("head_chunk_copies", passes=((copies, chunk * d * wb * 2),))
    if copies and profile.copy_bytes_per_s:
        copy = dataclasses.replace(copy, memory_seconds=copies / profile.copy_bytes_per_s,
                                   seconds=copies / profile.copy_bytes_per_s)
    head_ops = (
        build.op("embed_and_norm", state_bytes=m * d * wb, passes=((3 * m * d * wb, 3 * m * d * wb),)),
        lm_head,
        copy,
        build.op("logits_argmax", passes=((logit_bytes, 2 * m * chunk * F32),),
                 extra_compute=m * v * profile.reduce_seconds if head == "argmax" else 0.0),
    )
    n = cfg.num_layers
    fixed = (n + 1) * profile.fixed_layer_seconds + profile.fixed_call_seconds  # the head as one more layer
    seconds = n * sum(op.seconds for op in ops) + sum(op.seconds for op in head_ops) + fixed
    flops = n * sum(op.flops for op in ops) + sum(op.flops for op in head_ops)
    nbytes = n * sum(op.bytes for op in ops) + sum(op.bytes for op in head_ops)
    return ForwardCost(seconds, flops, nbytes, fixed, tuple(ops), head_ops, n)


def predicted_seconds(cfg: ModelConfig, tokens: int, batch: int = 1, cache_len: int = 0, dtype_bytes: int = 2,
                      profile: HardwareProfile = PROFILES["h100"], implementation: str = "fused",
                      head: str = "argmax") -> float:
    """Predicted seconds of one forward: `forward_cost(...).seconds`."""
    return forward_cost(cfg, tokens, batch, cache_len, dtype_bytes, profile, implementation, head).seconds


def step_cost(cfg: ModelConfig, tokens: int, batch: int = 1, cache_len: int = 0, dtype_bytes: int = 2,
              profile: HardwareProfile = PROFILES["h100"], implementation: str = "fused",
              head: str = "argmax") -> float:
    """c(T): a step of `tokens` block tokens in greedy (one-token) steps, same batch and cache."""
    args = (batch, cache_len, dtype_bytes, profile, implementation, head)
    return predicted_seconds(cfg, tokens, *args) / predicted_seconds(cfg, 1, *args)


def predicted_speedup(tokens_per_step: float, cost: float) -> float:
    """Speed-up over greedy = S / c: S tokens per step (>= 1: a lossless step emits at least one
    token), each step costing c greedy steps."""
    for name, value in (("tokens_per_step (S)", tokens_per_step), ("step cost (c)", cost)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if tokens_per_step < 1:
        raise ConfigError(f"tokens_per_step (S) must be >= 1 (every step emits a token), got {tokens_per_step}")
    if cost <= 0:
        raise ConfigError(f"step cost (c) must be > 0, got {cost}")
    return tokens_per_step / cost


def fits(cfg: ModelConfig, batch: int, cache_len: int, dtype_bytes: int, profile: HardwareProfile) -> bool:
    """Whether the weights and the KV cache fit the device's memory (the step's buffers aside)."""
    _check(cfg, 1, batch, cache_len, dtype_bytes, profile, "fused")
    return cfg.num_params * dtype_bytes + kv_cache_bytes(cfg, dtype_bytes, batch, cache_len) <= profile.memory_bytes


# ----------------------------------------------------------------------------- this CPU, measured


def _memory_total() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CALIBRATION_WIDTH = 512  # K = N of the compute calibration: a 1 MB float32 weight, resident in L2
_MB = 2 ** 20
READ_SIZES = (1 * _MB, 4 * _MB, 16 * _MB, 64 * _MB, 256 * _MB)  # the read curve's working sets
RW_SIZES = (_MB // 2, 2 * _MB, 8 * _MB, 32 * _MB, 128 * _MB)  # float32 arrays for the read+write curve
_TARGET = 0.03  # seconds each calibration program should take (as long as a checked forward's program)
_HEAD = (32768, 512)  # the head calibration: a tied [vocab, hidden] table (64 MB), chunked and not
_SCORES = (8, 128, 512)  # a score-sized float32 array (2 MB) for the per-element calibrations
# float32 accesses per element of jax.nn.softmax(y * 0.5) as XLA compiles it for CPU (its HLO: max + exp
# read twice and write once, the sum reads, the normalise reads and writes)
_SOFTMAX_ACCESSES = 6
_TINY_STEPS = 256  # forwards per tiny-decoder program (inside a fori_loop, as decoding runs them)
_BATCHED = (8, 8, 256)  # the batched-matmul calibration: [entries, 8, 8] x [entries, 8, 256]


def _through(y, *weights):
    for w in weights:
        y = y @ w
    return y


class _HeadOnly:
    """Just what `Transformer.head_argmax` reads: a tied embedding table, one vocabulary shard."""

    def __init__(self, table):
        vocab, hidden = table.shape
        self.config = types.SimpleNamespace(vocab_size=vocab, tie_word_embeddings=True)
        self.vocab_shards = 1
        self.batch_invariant = False
        self.embed_tokens = types.SimpleNamespace(embedding=table)

    def softcap(self, logits):  # (Gemma's final-logit soft cap: none here)
        return logits


def _steps(seconds_each: float) -> int:
    return max(2, min(4096, round(_TARGET / seconds_each)))


def calibration_cases() -> dict:
    """The calibration programs, `key -> (fn, args, calls, steps)`, none of them a checked model:
    each loops `steps` times inside one jitted `fori_loop` (no host dispatch between steps) for
    ~30 ms. A matmul of each row count against a 1 MB weight that stays in L2 (compute); a bf16 one;
    a one-row product over a weight of each READ_SIZES size (read bandwidth by working set); an
    elementwise pass over arrays of each RW_SIZES size (read+write bandwidth); a chunked and a
    whole LM head over a tied 64 MB table (its row-dot read and chunk copy rates); exp, multiply and argmax over a
    score-sized array; a batched tiny matmul of 2 and 256 entries; tiny (hidden 8) decoders of
    2 and 10 layers."""
    def looped(body, steps):
        return jax.jit(lambda *a: jax.lax.fori_loop(0, steps, lambda i, y: body(y, *a[1:]), a[0]))

    cases = {}
    width = CALIBRATION_WIDTH
    weight = jnp.full((width, width), 1.0 / width, jnp.float32)
    for r in CALIBRATION_ROWS:
        steps = _steps(2 * r * width * width / 5e10 + 2e-6)
        cases[("matmul", r)] = (looped(lambda y, w: y @ w, steps), (jnp.ones((r, width), jnp.float32), weight), 1,
                                steps)
    steps = _steps(2 * 256 * width * width / 5e10)
    cases["bf16"] = (looped(lambda y, w: y @ w, steps),
                     (jnp.ones((256, width), jnp.bfloat16), weight.astype(jnp.bfloat16)), 1, steps)
    # Weights are streamed matrix by matrix: a one-row product through size / 1 MB distinct 1 MB
    # matrices (w = 1/n keeps the row at 1; one matrix, at 1 MB, is re-read from L2).
    chains = {}
    for size in READ_SIZES:
        chains[size] = [jnp.full((width, width), 1.0 / width, jnp.float32) for _ in range(size // _MB)]
        steps = _steps(size / 1e10)
        cases[("read", size)] = (looped(_through, steps), (jnp.ones((1, width), jnp.float32), *chains[size]), 1,
                                 steps)
    for size in RW_SIZES:
        steps = _steps(2 * size / 3e10)
        cases[("rw", size)] = (looped(lambda y: y * 0.5 + 1.0, steps), (jnp.ones((size // F32,), jnp.float32),),
                               1, steps)
    vocab, hidden = _HEAD
    table = jnp.full((vocab, hidden), 1e-3, jnp.float32)
    for chunk in (vocab, vocab // 2):  # the whole table at once, and in two chunks (each chunk copied)
        def head(y, w, chunk=chunk):
            net = _HeadOnly(w)
            return y + Transformer.head_argmax(net, y, chunk)[..., None].astype(y.dtype) * 1e-9
        steps = _steps(vocab * hidden * F32 / 5e9)
        ones = jnp.ones((1, hidden), jnp.float32)
        cases[("head", "whole" if chunk == vocab else "chunked")] = (looped(head, steps), (ones, table), 1, steps)
    scores = jnp.ones(_SCORES, jnp.float32)
    steps = _steps(math.prod(_SCORES) * 1e-9)
    cases["exp"] = (looped(lambda y: jnp.exp(y * -1e-3), steps), (scores,), 1, steps)
    cases["mul"] = (looped(lambda y: y * -1e-3 + 0.5, steps), (scores,), 1, steps)
    cases["softmax"] = (looped(lambda y: jax.nn.softmax(y * 0.5, axis=-1), steps), (scores,), 1, steps)
    cases["argmax"] = (looped(lambda y: y + jnp.argmax(y, axis=-1)[..., None].astype(y.dtype) * 1e-9, steps),
                       (scores,), 1, steps)
    cases["max"] = (looped(lambda y: y + jnp.max(y, axis=-1, keepdims=True) * 1e-9, steps), (scores,), 1, steps)
    rows, depth, keys = _BATCHED
    for count in (2, 256):
        qs = jnp.ones((count, rows, depth), jnp.float32)
        ks = jnp.full((count, depth, keys), 1.0 / depth, jnp.float32)  # keeps the values at 1
        steps = _steps(count * 2e-6)
        cases[("batched", count)] = (looped(lambda y, k: jnp.einsum("eqd,eds->eqs", y, k)[..., :depth], steps),
                                     (qs, ks), 1, steps)
    for layers in (2, 10):
        cfg = ModelConfig(model_type="llama", vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=layers,
                          num_heads=1, num_kv_heads=1, head_dim=8, max_position_embeddings=64)
        graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))

        def loop(p, tok, pos, mask, cache, g=graphdef):
            net = nnx.merge(g, p)
            return jax.lax.fori_loop(0, _TINY_STEPS, lambda i, t: net(t, pos, mask, cache, head="argmax").preds, tok)

        args = (params, jnp.ones((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32), causal_mask(jnp.array([1]), 1),
                KVCache.zeros(layers, 1, 8, 1, 8))
        cases[("tiny", layers)] = (jax.jit(loop), args, 1, _TINY_STEPS)
    return cases


def calibration(seconds: dict) -> dict:
    """The measured quantities from `calibration_cases`' seconds per step (JSON-ready)."""
    width = CALIBRATION_WIDTH
    flops = {str(r): 2 * r * width * width / seconds[("matmul", r)] for r in CALIBRATION_ROWS}
    read = [[size, size / seconds[("read", size)]] for size in READ_SIZES]
    rw = [[size, 2 * size / seconds[("rw", size)]] for size in RW_SIZES]
    table = _HEAD[0] * _HEAD[1] * F32
    whole, chunked = seconds[("head", "whole")], seconds[("head", "chunked")]
    elements = math.prod(_SCORES)
    reduce = max(seconds["argmax"] - seconds["max"], 0.0) / elements
    tiny = {n_: seconds[("tiny", n_)] for n_ in (2, 10)}
    per_layer = max((tiny[10] - tiny[2]) / 8, 0.0)
    return dict(
        matmul_flops=flops, matmul_width=width,
        bf16_flops=2 * 256 * width * width / seconds["bf16"],
        read_curve=read, rw_curve=rw,
        tied_head_bytes_per_s=table / max(whole - _HEAD[0] * reduce, 1e-9),
        copy_bytes_per_s=2 * table / max(chunked - whole, 1e-9),
        exp_seconds=max(seconds["exp"] - seconds["mul"], 0.0) / elements,
        reduce_seconds=reduce,
        softmax_access_seconds=seconds["softmax"] / (_SOFTMAX_ACCESSES * elements),
        softmax_working_set=2 * elements * F32,
        matmul_call_seconds=max(seconds[("batched", 256)] - seconds[("batched", 2)], 0.0) / 254,
        fixed_layer_seconds=per_layer, fixed_call_seconds=max(tiny[2] - 3 * per_layer, 0.0),
        memory_bytes=_memory_total())


def profile_from_measurements(m: dict, name: str = "this CPU") -> HardwareProfile:
    """A HardwareProfile from `calibration`'s dict (a recorded calibration is reused as it is). DRAM
    bytes/s: the read curve's largest size (256 MB, beyond the caches)."""
    rows = tuple(sorted(int(r) for r in m["matmul_flops"]))
    peak = max(m["matmul_flops"].values())
    read = tuple((float(a), float(b)) for a, b in m["read_curve"])
    return HardwareProfile(
        name=name, peak_bf16_flops=m["bf16_flops"], peak_fp32_flops=peak,
        hbm_bytes_per_s=read[-1][1], memory_bytes=m["memory_bytes"],
        fixed_layer_seconds=m["fixed_layer_seconds"], fixed_call_seconds=m["fixed_call_seconds"],
        source="measured on this machine (benchmarks/roofline.py: calibration)",
        matmul_rows=rows, matmul_efficiency=tuple(m["matmul_flops"][str(r)] / peak for r in rows),
        read_curve=read, rw_curve=tuple((float(a), float(b)) for a, b in m["rw_curve"]), overlap=False,
        gemm_packs=True, matmul_call_seconds=m["matmul_call_seconds"],
        exp_seconds=m["exp_seconds"], reduce_seconds=m["reduce_seconds"],
        softmax_access_seconds=m["softmax_access_seconds"], softmax_working_set=m["softmax_working_set"],
        tied_head_bytes_per_s=m["tied_head_bytes_per_s"], copy_bytes_per_s=m["copy_bytes_per_s"])


# ----------------------------------------------------------------------------- the check on this CPU


TOKENS = (1, 8, 16, 32, 64, 128)
CACHE_LEN = 256
MODELS = ("stories260K", "pycode-5M", "smollm2-135m-instruct")


def forward_case(model, tokens: int):
    """The forward of `tokens` block tokens (causal block, a CACHE_LEN cache with 192 valid positions,
    greedy argmax head) as a decode loop runs it: `steps` forwards in one jitted loop, each fed the previous
    one's argmax (none hoisted; no host dispatch per step, as in decoding); `(fn, args, steps)` with steps
    chosen so the program runs ~30 ms, as the calibration programs do."""
    cfg, graphdef = model.config, model.graphdef

    def loop(params, tokens, positions, mask, cache, steps):
        net = nnx.merge(graphdef, params)
        return jax.lax.fori_loop(0, steps, lambda i, tok: net(tok, positions, mask, cache, head="argmax").preds, tokens)

    fn = jax.jit(loop)
    cache = KVCache.zeros(cfg.num_layers, 1, CACHE_LEN, cfg.num_kv_heads, cfg.head_dim)
    cache = cache.replace(lengths=jnp.array([192], jnp.int32))
    args = (model.params, jnp.full((1, tokens), 5, jnp.int32), 192 + jnp.arange(tokens, dtype=jnp.int32)[None],
            causal_mask(jnp.array([tokens]), tokens), cache)
    jax.block_until_ready(fn(*args, jnp.int32(1)))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args, jnp.int32(2)))
    steps = max(1, min(512, round(0.03 / ((time.perf_counter() - start) / 2))))
    return fn, (*args, jnp.int32(steps)), steps


def measure(models, rounds: int) -> dict:
    loaded = {name: jaxspec.load(name, dtype="float32") for name in models}  # the float32 model the fit describes
    cases = {key: (fn, args, steps) for key, (fn, args, calls, steps) in calibration_cases().items()
             if calls == 1}  # (every calibration program is one call of `steps` steps)
    for name, model in loaded.items():
        for t in TOKENS:
            cases[("forward", name, t)] = forward_case(model, t)
    times = time_programs({key: (fn, args) for key, (fn, args, _) in cases.items()}, rounds)
    seconds = {key: min(times[key]) / steps for key, (_, _, steps) in cases.items()}  # the least disturbed round
    return record(seconds, {name: model.config for name, model in loaded.items()},
                  {key: steps for key, (_, _, steps) in cases.items()}, rounds, machine_info())


def record(seconds: dict, configs: dict, steps: dict, rounds: int, info: dict) -> dict:
    """The result of a run from its seconds per step: the calibration programs' (the keys of
    `calibration_cases`) and each model's forwards (`("forward", name, T)` for every T
    in TOKENS; `configs`: name -> ModelConfig, `steps`: the forward programs' steps), with the
    predictions (`predict`)."""
    calib = dict(calibration(seconds), rounds=rounds)
    profile = profile_from_measurements(calib, name=f"{info['cpu']} ({info['cpu_count']} cores)")
    rows = [dict(model=name, params=cfg.num_params, tokens=t, steps=steps[("forward", name, t)],
                 measured_seconds=seconds[("forward", name, t)],
                 measured_c=seconds[("forward", name, t)] / seconds[("forward", name, 1)])
            for name, cfg in configs.items() for t in TOKENS]
    result = dict(benchmark="roofline", title="Step-cost model vs this CPU: c(T) measured and predicted",
                  calibration=calib, profile=dataclasses.asdict(profile),
                  configs={name: cfg.to_hf() for name, cfg in configs.items()}, cache_len=CACHE_LEN,
                  dtype="float32", batch=1, implementation="xla", rows=rows, machine=info)
    return dict(result, rows=predict(result))


def predict(result: dict) -> list[dict]:
    """The recorded measurements with predictions recomputed by the current model from the recorded
    calibration (so the model can be revised without measuring again; the measurement is the record)."""
    profile = profile_from_measurements(result["calibration"], name=result["profile"]["name"])
    rows = []
    for r in result["rows"]:
        cfg = ModelConfig.from_hf(result["configs"][r["model"]])
        cost = forward_cost(cfg, r["tokens"], 1, result["cache_len"], 4, profile, result["implementation"])
        base = predicted_seconds(cfg, 1, 1, result["cache_len"], 4, profile, result["implementation"])
        rows.append(dict(r, predicted_seconds=cost.seconds, predicted_c=cost.seconds / base,
                         compute_bound_fraction=cost.compute_bound_fraction))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    write_result(dict(measure(args.models, args.rounds), command=command_line(__file__, argv)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
