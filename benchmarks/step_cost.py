"""Per-step cost of lookahead vs greedy on this machine, for a model of a given size.

Lookahead pays off when one step over ~1 + (W-1) + (N-2)W + G(N-1) block tokens costs
little more than a one-token step (memory-bound decoding on an accelerator); on a CPU the
block's arithmetic is not free. This measures that ratio directly: seconds per step of
greedy and of several lookahead configs, on a real checkpoint or on a synthetic model
with random weights (the ratio does not depend on the weights; S does, so S is not
reported for synthetic models).

    python benchmarks/step_cost.py --synthetic 1b --dtype bfloat16
    python benchmarks/step_cost.py --model stories260K
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

import jaxspec
from machine import machine_info
from jaxspec import Model, ModelConfig, Transformer

RESULTS = Path(__file__).resolve().parent / "results"

# Llama-style shapes (vocab 32000, GQA 4:1 above 1B).
SYNTHETIC = {
    "tiny": dict(hidden_size=256, intermediate_size=688, num_layers=4, num_heads=4, num_kv_heads=4),
    "150m": dict(hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=12),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_layers=22, num_heads=32, num_kv_heads=4),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32, num_kv_heads=32),
    # Llama-3.2-1B and Llama-3.1-8B shapes (vocabulary 128256; the 1B ties its embeddings).
    "llama3-1b": dict(hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8,
                      vocab_size=128256, tie_word_embeddings=True),
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                      vocab_size=128256),
}
CONFIGS = [(1, 3, 1), (4, 3, 4), (8, 4, 8), (15, 5, 15), (7, 5, 7), (10, 5, 10)]


def synthetic_model(size: str | dict, dtype: str, name: str | None = None) -> Model:
    """A random-weight Llama, built on the default device by one compiled init: `size` names a
    `SYNTHETIC` shape or is such a dict (vocabulary 32000 unless it says)."""
    shape = dict(SYNTHETIC[size] if isinstance(size, str) else size)
    shape.setdefault("vocab_size", 32000)
    cfg = ModelConfig(model_type="llama", head_dim=shape["hidden_size"] // shape["num_heads"],
                      max_position_embeddings=4096, bos_token_id=1, eos_token_ids=(2,), **shape)
    jdtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[dtype]
    module = nnx.jit(lambda: Transformer(cfg, dtype=jdtype, rngs=nnx.Rngs(0)))()
    return Model.from_module(module, dtype=dtype, source=f"synthetic-{name or size}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="checkpoint path or name")
    src.add_argument("--synthetic", choices=sorted(SYNTHETIC), help="random-weight Llama of this size")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)

    model = synthetic_model(args.synthetic, args.dtype) if args.synthetic else \
        jaxspec.load(args.model or "stories260K", dtype=args.dtype)
    prompt = [1] + [(7 * i) % (model.config.vocab_size - 3) + 3 for i in range(args.prompt_len - 1)]
    runs = [("greedy", {})] + [("lookahead", dict(window=w, ngram=n, guesses=g)) for w, n, g in CONFIGS]
    rows = []
    for method, options in runs:
        jaxspec.generate(model, prompt, max_new_tokens=args.new_tokens, method=method, stop_at_eos=False, **options)
        per_step = []
        for _ in range(args.repeats):
            out = jaxspec.generate(model, prompt, max_new_tokens=args.new_tokens, method=method,
                                   stop_at_eos=False, **options)
            per_step.append(out.seconds / out.steps)
        rows.append(dict(method=method, **options, seconds_per_step=min(per_step), steps=out.steps,
                         compression=out.compression, tokens_per_second=out.tokens_per_second))
        print(rows[-1], flush=True)
    base = rows[0]["seconds_per_step"]
    for r in rows:
        r["step_cost_ratio"] = r["seconds_per_step"] / base
    name = args.synthetic or Path(model.source).stem
    result = dict(model=name, params=model.config.num_params, dtype=args.dtype, rows=rows,
                  machine=machine_info(), device=str(jax.devices()[0]),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command="python " + " ".join(sys.argv))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"step_cost_{name}_{args.dtype}_{jax.default_backend()}"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Step cost: {name} ({model.config.num_params / 1e6:.1f}M params, {args.dtype}) on {result['device']}",
             "", f"{result['date']}, `{result['command']}`, jax {jax.__version__}", "",
             "| method | W | N | G | ms/step | step-cost ratio | S (this prompt) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r.get('window', '')} | {r.get('ngram', '')} | {r.get('guesses', '')} | "
                     f"{1e3 * r['seconds_per_step']:.2f} | {r['step_cost_ratio']:.2f} | "
                     f"{r['compression']:.2f}{' (random weights)' if args.synthetic else ''} |")
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
