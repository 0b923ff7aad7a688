"""What batch-invariant numerics cost, and what they buy: `jaxspec.load(..., batch_invariant=True)`
against the same model without, per dtype, for greedy and drafted methods (tokens/s, interleaved),
and whether each output equals batch-1 greedy bit for bit in its own mode.

For each dtype, the two models (switch off, on) decode the same chat prompts with each method:
one run of a (prompt, method) for each mode, then the next, rounds repeating the whole grid, so
the two modes see the same machine. Decode time only (`GenerateOutput.seconds`: compiling apart,
every program warmed first). "identical" counts outputs equal to greedy's at batch 1 in the same
mode; greedy's own row is greedy at batch 4 (the prompts decoded together).

Then, where the cost comes from (`--components`): each of the model's matmul shapes as greedy runs
it (one row: XLA's matrix-vector code) and as the switch runs it (`fixed_rows`: a 2-row GEMM), and
one layer's attention (`xla_attention` against `invariant_attention`) at several context lengths,
each a compiled program timed alone.

    python -m benchmarks.batch_invariance                     # SmolLM2: float32, bfloat16, blocks
    python -m benchmarks.batch_invariance --model pycode-5M --dtypes float32 --rounds 1 --name batch_invariance_smoke
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxspec  # noqa: E402
from benchmarks.harness import RESULTS, chat_cases, code_cases, command_line, write_result  # noqa: E402

# (label, method, options): greedy, SmolLM2's auto setting (its shipped drafter), lookahead, prompt lookup
METHODS = [
    ("greedy", "autoregressive", {}),
    ("speculative K=3 + lookup (routed)", "speculative",
     dict(draft_len=3, lookup_ngram=4, lookup_guesses=4, lookup_route=True, first_alternatives=1)),
    ("lookahead (7,4,7)", "lookahead", dict(window=7, ngram=4, guesses=7)),
    ("prompt lookup (3,5)", "prompt-lookup", dict(ngram=3, guesses=5)),
]
MODES = (("off", False), ("on", True))


def prompts_for(model, count: int) -> list[list[int]]:
    cases = chat_cases(model, "bench", count) if model.tokenizer.chat_template else code_cases(model, count)
    return [list(c.ids) for c in cases]


def run(model_name: str, dtype: str, count: int, new_tokens: int, rounds: int) -> list[dict]:
    models = {label: jaxspec.load(model_name, dtype=dtype, batch_invariant=on) for label, on in MODES}
    prompts = prompts_for(models["off"], count)
    methods = [m for m in METHODS if m[1] != "speculative" or model_name.startswith("smollm2")]

    def decode(mode, method, options, batch):
        return jaxspec.generate(models[mode], batch, method=method, max_new_tokens=new_tokens, stop_at_eos=False,
                                **options)

    greedy = {mode: [decode(mode, "autoregressive", {}, [p]).tokens[0] for p in prompts] for mode, _ in MODES}
    rows = {}
    for label, method, options in methods:  # warm every program (and check exactness) once
        for mode, _ in MODES:
            if method == "autoregressive":
                got = decode(mode, method, options, prompts).tokens
            else:
                got = [decode(mode, method, options, [p]).tokens[0] for p in prompts]
            rows[(label, mode)] = dict(model=model_name, dtype=dtype, method=label, mode=mode,
                                       identical=sum(a == b for a, b in zip(got, greedy[mode])),
                                       prompts=len(prompts), tokens=0, seconds=0.0, steps=0)
    for r in range(rounds):
        for p in prompts:
            for label, method, options in methods:
                for mode, _ in MODES:
                    out = decode(mode, method, options, [p])
                    row = rows[(label, mode)]
                    row["tokens"] += len(out.tokens[0])
                    row["seconds"] += out.seconds
                    row["steps"] += out.steps[0]
        print(f"{model_name} {dtype}: round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    out = []
    for row in rows.values():
        row["tokens_per_second"] = round(row["tokens"] / row["seconds"], 2)
        row["seconds"] = round(row["seconds"], 3)
        out.append(row)
    return out


def components(model_name: str, dtypes) -> list[dict]:
    """Microseconds of each matmul shape at one row (plain, `fixed_rows`) and of one layer's attention
    (plain, invariant) at T = 1 over a few context lengths."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.harness.programs import time_programs
    from jaxspec.models.attention import xla_attention
    from jaxspec.models.batch_invariant import fixed_rows, invariant_attention

    cfg = jaxspec.load(model_name, dtype="float32").config
    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    rng = np.random.default_rng(0)
    shapes = {"q/o": (d, cfg.num_heads * hd), "k/v": (d, cfg.num_kv_heads * hd), "gate/up": (d, f), "down": (f, d),
              "LM head": (d, cfg.vocab_size)}  # (n_in, n_out)
    out = []
    for dtype in dtypes:
        jd = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
        for name, (n_in, n_out) in shapes.items():
            # as the model holds it: [in, out], a tied head as the embedding [vocab, d]
            tied = name == "LM head" and cfg.tie_word_embeddings
            w = jnp.asarray(rng.standard_normal((n_out, n_in) if tied else (n_in, n_out)) * 0.05, jd)
            x = jnp.asarray(rng.standard_normal((1, n_in)), jd)
            spec = "md,vd->mv" if tied else "md,dv->mv"
            plain = jax.jit(lambda x, w: jnp.einsum(spec, x, w, preferred_element_type=jnp.float32))
            fixed = jax.jit(lambda x, w: fixed_rows(lambda r: jnp.einsum(spec, r, w, preferred_element_type=jnp.float32),
                                                    x))
            t = time_programs({"plain": (plain, (x, w)), "fixed_rows": (fixed, (x, w))}, rounds=40)
            out.append(dict(part=f"matmul {name} {n_in}x{n_out}", dtype=dtype, plain_us=min(t["plain"]) * 1e6,
                            invariant_us=min(t["fixed_rows"]) * 1e6))
        for context in (100, 300, 1000):
            s = max(256, -(-(context + 1) // 256) * 256)
            kv, h = cfg.num_kv_heads, cfg.num_heads
            q = jnp.asarray(rng.standard_normal((1, 1, h, hd)), jd)
            cache = jnp.asarray(rng.standard_normal((1, kv, s, hd)), jd)
            new = jnp.asarray(rng.standard_normal((1, 1, kv, hd)), jd)
            args = (q, cache, cache, jnp.asarray([context]), new, new, jnp.ones((1, 1, 1), bool),
                    jnp.asarray([[context]]))
            t = time_programs({"plain": (jax.jit(xla_attention), args),
                               "invariant": (jax.jit(invariant_attention), args)}, rounds=40)
            out.append(dict(part=f"attention, one layer, context {context} (cache {s})", dtype=dtype,
                            plain_us=min(t["plain"]) * 1e6, invariant_us=min(t["invariant"]) * 1e6))
    for row in out:
        row["plain_us"], row["invariant_us"] = round(row["plain_us"], 1), round(row["invariant_us"], 1)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "blocks"])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--name", default="batch_invariance")
    p.add_argument("--components", action="store_true", help="also time each matmul shape and attention alone")
    p.add_argument("--components-only", action="store_true",
                   help="time the components only and add them to an existing result")
    args = p.parse_args(argv)
    path = args.out / f"{args.name}.json"
    if args.components_only:
        if not path.exists():
            raise SystemExit(f"{path} does not exist: run without --components-only first")
        result = json.loads(path.read_text())
        result["components"] = components(args.model, [d for d in args.dtypes if d != "blocks"])
        result["components_command"] = command_line(__file__, argv)
        write_result(result, args.out, args.name)
        return 0
    rows = []
    for dtype in args.dtypes:
        rows += run(args.model, dtype, args.prompts, args.new_tokens, args.rounds)
    result = {"benchmark": "batch_invariance", "title": "Batch-invariant numerics: cost and exactness",
              "model": args.model, "prompts": args.prompts, "new_tokens": args.new_tokens, "rounds": args.rounds,
              "rows": rows, "command": command_line(__file__, argv)}
    if args.components:
        result["components"] = components(args.model, [d for d in args.dtypes if d != "blocks"])
    write_result(result, args.out, args.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
