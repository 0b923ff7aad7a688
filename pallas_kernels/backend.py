"""Which Pallas backend a kernel compiles with, and the pieces every kernel here shares.

* CPU: `interpret=True` (chosen automatically): the kernels run as plain JAX ops, which is
  how the tests check them against the XLA reference.
* TPU: Mosaic. Per-row scalars (cache lengths, first cache block, the PARD tile lists)
  live whole in SMEM; everything else is a VMEM block per grid instance.
* GPU: Triton (`pallas.triton.CompilerParams`), although Mosaic GPU is the default GPU
  backend of this JAX (0.10) and Triton is deprecated there. Mosaic GPU is not practical
  for these kernels yet: it places every block in shared memory (a per-head cache slice of
  1024 x 128 bf16 K+V already needs 575 KB > 227 KB), it only copies blocks of a multiple
  of 128 bytes (so per-row scalars cannot be blocks), and its matmuls are Hopper/Blackwell
  warpgroup MMAs with their own layouts. A Mosaic GPU version is a rewrite around
  `plgpu.emit_pipeline` + `plgpu.wgmma` that would run on sm_90+ only; Triton runs on every
  CUDA GPU JAX supports. Triton wants power-of-two block shapes and dots of at least
  16 x 16, so kernels pad rows, key blocks and (on GPU) sequence lengths.

`platform` ("cpu" | "tpu" | "gpu" / "cuda" / "rocm") defaults to `jax.default_backend()`;
pass it with `interpret=False` to lower for another platform from this machine (what
`python -m pallas_kernels --check-lowering` does with `jax.export`).
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from pallas_kernels.errors import KernelConfigError
from pallas_kernels.reference import MASKED  # noqa: F401 -- the reference's masked score: fully masked rows stay finite
MIN_ROWS = 16  # Triton dots need every dim >= 16; bf16 sublane tiles on TPU are 16 rows
GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def resolve(platform: str | None, interpret: bool | None) -> tuple[str, bool]:
    """(platform, interpret) with the defaults filled in: interpret exactly on CPU."""
    platform = platform or jax.default_backend()
    if interpret is None:
        interpret = platform == "cpu"
    if not interpret and platform not in ("tpu", *GPU_PLATFORMS):
        raise KernelConfigError(f"no compiled Pallas backend for platform {platform!r}; use interpret=True")
    return platform, interpret


def compiler_params(platform: str, interpret: bool, grid_rank: int):
    if interpret:
        return None
    if platform == "tpu":
        from jax.experimental.pallas import tpu as pltpu
        return pltpu.CompilerParams(dimension_semantics=("parallel",) * grid_rank)
    from jax.experimental.pallas import triton as pltriton
    return pltriton.CompilerParams(num_warps=4, num_stages=2)


def next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def qk(q, k, scale, softcap=None):
    """q [R, d] . k [K, d]^T in float32, scaled after the matmul as the reference does; with
    `softcap`, soft-capped to softcap * tanh(score / softcap) (Gemma 2)."""
    scores = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32) * scale
    return scores if softcap is None else softcap * jnp.tanh(scores / softcap)


def pv(p, v):
    """p [R, K] (cast to v's dtype, as the reference does) . v [K, d] in float32."""
    return lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
