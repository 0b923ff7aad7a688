"""`python -m pallas_kernels --check-lowering`: lower every kernel for TPU and GPU from this machine.

Each (platform, case) is lowered (not interpreted) with `jax.export`, which runs the Pallas
lowering for the target platform (Mosaic for TPU, Triton for CUDA) without that hardware;
the cases cover every kernel and mask kind (dense, a token tree computed in the kernel,
PARD). Prints one OK/FAIL line per case and exits non-zero if any case fails.

What this proves is that JAX lowers each kernel to the platform's kernel IR (Mosaic MLIR,
Triton IR) and that the result is embedded as the platform's custom call. The final
compilation of that IR (Mosaic's layout passes, Triton to PTX) runs inside the TPU / GPU
compiler, so it is checked only on the hardware.
"""

from __future__ import annotations

import argparse
import functools
import sys
import traceback

import jax
import jax.numpy as jnp

from pallas_kernels.decode_attention import decode_attention
from pallas_kernels.masks import TreeMask
from pallas_kernels.pard_attention import pard_attention

PLATFORMS = ("tpu", "cuda")
DISABLED_CHECKS = (jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton"),)
sds = jax.ShapeDtypeStruct


def _decode_case(b, t, h, kv, d, s, dtype, window=None, tree: bool = False, softcap=None):
    """decode_attention with a dense mask, or with a token tree's relation (`TreeMask`: the
    DFS interval of each of the t tokens) computed in the kernel."""
    args = [sds((b, t, h, d), dtype), sds((b, kv, s, d), dtype), sds((b, kv, s, d), dtype), sds((b,), jnp.int32),
            sds((b, t, kv, d), dtype), sds((b, t, kv, d), dtype)]
    args += [sds((b, t), jnp.int32)] * 2 if tree else [sds((b, t, t), jnp.bool_)]
    args.append(sds((b, t), jnp.int32))

    def build(platform):
        def fn(*a):
            mask = TreeMask(pre=a[6], end=a[7]) if tree else a[6]
            return decode_attention(*a[:6], mask, a[-1], window, softcap, interpret=False, platform=platform)
        return fn
    return build, args


def _pard_case(b, n, h, kv, d, dtype, window=None, softcap=None):
    args = [sds((b, n, h, d), dtype), sds((b, n, kv, d), dtype), sds((b, n, kv, d), dtype),
            sds((b, n), jnp.int32), sds((b, n), jnp.int32)]
    return (lambda platform: functools.partial(pard_attention, sliding_window=window, softcap=softcap, interpret=False,
                                               platform=platform)), args


# (name, (function of the platform, abstract arguments)): every kernel, each mask kind.
CASES = (
    ("decode dense d64 gqa4 bf16", _decode_case(2, 1, 16, 4, 64, 1024, jnp.bfloat16)),
    ("decode dense d128 gqa4 fp32 window", _decode_case(1, 14, 8, 2, 128, 1024, jnp.float32, window=256)),
    # Token trees, by block size: lookahead (W, N, G) has W (N-1) + G (N-1) tokens.
    ("lookahead (15,5,15) d128 gqa4 bf16", _decode_case(2, 120, 32, 8, 128, 2048, jnp.bfloat16, tree=True)),
    ("lookahead (1,3,0) d64 gqa8 fp32", _decode_case(1, 2, 8, 1, 64, 500, jnp.float32, tree=True)),
    ("lookahead (4,3,4) d128 gqa1 fp32 window", _decode_case(1, 16, 4, 4, 128, 700, jnp.float32, window=64,
                                                             tree=True)),
    # Gemma 3 270M's local layers: head_dim 256, one KV head, window 512, a cache past the window.
    ("lookahead (7,4,7) gemma3 d256 mqa4 bf16 window", _decode_case(1, 42, 4, 1, 256, 2048, jnp.bfloat16,
                                                                      window=512, tree=True)),
    # Gemma 2's soft-capped attention scores (cap 50), its local layers' window of 4096.
    ("lookahead (7,4,7) gemma2 d256 gqa2 bf16 window softcap", _decode_case(1, 42, 8, 4, 256, 8192, jnp.bfloat16,
                                                                             window=4096, tree=True, softcap=50.0)),
    ("jacobi W=8 d64 gqa4 bf16", _decode_case(1, 9, 8, 2, 64, 300, jnp.bfloat16, tree=True)),
    ("hybrid (15,5,15)+K=8 d128 gqa4 bf16", _decode_case(2, 128, 32, 8, 128, 2048, jnp.bfloat16, tree=True)),
    ("pard d128 gqa4 bf16", _pard_case(2, 1024, 32, 8, 128, jnp.bfloat16)),
    ("pard d64 gqa1 fp32 window", _pard_case(1, 300, 4, 4, 64, jnp.float32, window=128)),
    ("pard d64 gqa2 fp32 softcap", _pard_case(1, 300, 4, 2, 64, jnp.float32, softcap=50.0)),
)


def check_lowering(platforms=PLATFORMS, cases=CASES, verbose=False) -> int:
    failures = 0
    for platform in platforms:
        for name, (build, args) in cases:
            try:
                # Triton kernels travel as an opaque custom call without jax.export's
                # stability guarantee; allow it explicitly (lowering is what we check here).
                exported = jax.export.export(jax.jit(build(platform)), platforms=(platform,),
                                             disabled_checks=DISABLED_CHECKS)(*args)
                text = exported.mlir_module()
                # The kernel must be in the module as a custom call, not silently interpreted.
                target = "tpu_custom_call" if platform == "tpu" else "__gpu$xla.gpu.triton"
                if target not in text:
                    raise RuntimeError(f"lowered module has no {target} custom call")
                print(f"OK    {platform:5s} {name}")
            except Exception as e:  # noqa: BLE001 -- report every case, then fail overall
                failures += 1
                msg = f"{type(e).__name__}: {e}".splitlines()
                print(f"FAIL  {platform:5s} {name}: {msg[0] if msg else ''}")
                if verbose:
                    traceback.print_exc()
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pallas_kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--check-lowering", action="store_true",
                        help="lower every kernel for TPU and CUDA with jax.export")
    parser.add_argument("--platforms", default=",".join(PLATFORMS),
                        help="comma-separated platforms to lower for (default: tpu,cuda)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print full tracebacks")
    args = parser.parse_args(argv)
    if not args.check_lowering:
        parser.print_help()
        return 2
    platforms = tuple(p for p in args.platforms.split(",") if p)
    failures = check_lowering(platforms, verbose=args.verbose)
    print(f"{failures} failure(s)" if failures else "all kernels lower")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
