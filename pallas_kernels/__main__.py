"""`python -m pallas_kernels --check-lowering`: prove the kernels compile for TPU and GPU from here.

Each (platform, shape) is lowered (not interpreted) with `jax.export`, which runs the Pallas
lowering for the target platform (Mosaic for TPU, Triton for CUDA) without that hardware.
Prints one OK/FAIL line per case and exits non-zero if any case fails.
"""

from __future__ import annotations

import argparse
import functools
import sys
import traceback

import jax
import jax.numpy as jnp

from pallas_kernels.decode_attention import decode_attention

PLATFORMS = ("tpu", "cuda")
DISABLED_CHECKS = (jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton"),)

# (name, batch, block tokens, query heads, kv heads, head_dim, cache slots, dtype, window)
SHAPES = (
    ("decode d64 gqa4 bf16", 2, 1, 16, 4, 64, 1024, jnp.bfloat16, None),
    ("lookahead d128 gqa4 bf16", 2, 14, 32, 8, 128, 2048, jnp.bfloat16, None),
    ("lookahead d64 gqa4 fp32", 1, 33, 8, 2, 64, 500, jnp.float32, None),
    ("lookahead d128 gqa4 fp32 window", 1, 14, 8, 2, 128, 1024, jnp.float32, 256),
)


def attention_args(b, t, h, kv, d, s, dtype):
    sds = jax.ShapeDtypeStruct
    return (sds((b, t, h, d), dtype), sds((b, s, kv, d), dtype), sds((b, s, kv, d), dtype),
            sds((b,), jnp.int32), sds((b, t, kv, d), dtype), sds((b, t, kv, d), dtype),
            sds((b, t, t), jnp.bool_), sds((b, t), jnp.int32))


def check_lowering(platforms=PLATFORMS, shapes=SHAPES, verbose=False) -> int:
    failures = 0
    for platform in platforms:
        for name, b, t, h, kv, d, s, dtype, window in shapes:
            fn = functools.partial(decode_attention, sliding_window=window, interpret=False,
                                   platform=platform)
            try:
                # Triton kernels travel as an opaque custom call without jax.export's
                # stability guarantee; allow it explicitly (lowering is what we check here).
                exported = jax.export.export(jax.jit(fn), platforms=(platform,),
                                             disabled_checks=DISABLED_CHECKS)(
                    *attention_args(b, t, h, kv, d, s, dtype))
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
