"""The step-cost model (jaxspec.roofline) against this CPU's measured c(T), and its predictions elsewhere.

Measures one jitted forward (the decode step's model call: T block tokens, T in {1, 8, 16, 32, 64, 128}, against
a 256-position KV cache, greedy argmax head, batch 1, float32) of stories260K, pycode-5M and
SmolLM2-135M-Instruct, and the CPU's calibration programs (`jaxspec.roofline.calibration_cases`: matmul chains,
256 MB streams, tiny decoders), all timed interleaved in the same rounds (`harness.time_programs`), minimum over
rounds. c(T) = t(T) / t(1), measured and predicted from the calibrated profile (`record`). `predict` recomputes a
result's predictions from its recorded calibration (tools/performance_tables.py writes docs/performance.md's tables).

    python -m benchmarks.roofline                 # ~5 min on 2 busy cores
    python -m benchmarks.roofline --rounds 5 --models stories260K
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import RESULTS, command_line, machine_info, time_programs, write_result  # noqa: E402
from jaxspec import ModelConfig  # noqa: E402
from jaxspec import roofline  # noqa: E402

TOKENS = (1, 8, 16, 32, 64, 128)
CACHE_LEN = 256
MODELS = ("stories260K", "pycode-5M", "smollm2-135m-instruct")


def forward_case(model, tokens: int):
    """The forward of `tokens` block tokens (causal block, a CACHE_LEN cache with 192 valid positions,
    greedy argmax head) as a decode loop runs it: `steps` forwards in one jitted loop, each fed the previous
    one's argmax (none hoisted; no host dispatch per step, as in decoding); `(fn, args, steps)` with steps
    chosen so the program runs ~30 ms, as the calibration programs do."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec import KVCache, causal_mask

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
    import jaxspec

    loaded = {name: jaxspec.load(name, dtype="float32") for name in models}  # the float32 model the fit describes
    cases = {key: (fn, args, steps) for key, (fn, args, calls, steps) in roofline.calibration_cases().items()
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
    `jaxspec.roofline.calibration_cases`) and each model's forwards (`("forward", name, T)` for every T
    in TOKENS; `configs`: name -> ModelConfig, `steps`: the forward programs' steps), with the
    predictions (`predict`)."""
    calib = dict(roofline.calibration(seconds), rounds=rounds)
    profile = roofline.profile_from_measurements(calib, name=f"{info['cpu']} ({info['cpu_count']} cores)")
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
    profile = roofline.profile_from_measurements(result["calibration"], name=result["profile"]["name"])
    rows = []
    for r in result["rows"]:
        cfg = ModelConfig.from_hf(result["configs"][r["model"]])
        cost = roofline.forward_cost(cfg, r["tokens"], 1, result["cache_len"], 4, profile, result["implementation"])
        base = roofline.predicted_seconds(cfg, 1, 1, result["cache_len"], 4, profile, result["implementation"])
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
