"""Quantized weights on this CPU: does keeping the weights quantized, dequantized inside each matmul,
pay against float32 (jaxspec's default, into which a GGUF's weights are dequantized at load)?

SmolLM2-135M-Instruct (its GGUF: Q8_0 token embeddings, the tied LM head, and Q4_1 layers) in
each weight format:

* float32: `jaxspec.load(model, dtype="float32")` (the GGUF's blocks dequantized at load; the default before blocks);
* bfloat16: `jaxspec.load(model, dtype="bfloat16")`;
* int8: `jaxspec.load(model, dtype="int8")`, int8 per output channel quantized from the float32
  weights, activations float32 (`jaxspec.models.quantize`);
* gguf kept: the file's own blocks kept (Q8_0 embeddings / head, Q4_1 layers: 4-bit values with a
  float16 scale and minimum per 32), dequantized inside each matmul by the same ordered convert;
  the same weights as float32's, bit for bit, so its tokens must equal float32 greedy's.

End to end: greedy decoding's tokens/s (`jaxspec.generate`, the whole call) of the real_bench
quick chats, every variant interleaved over rounds (the machine is shared: medians, and the
speed against float32 as the median of per-round ratios), the weights' bytes and the greedy
program's temporaries; lookahead, prompt lookup and speculative decoding with float32 and with
int8 weights in the same rounds, each checked token for token against greedy decoding of the same
weights (for int8 the exactness rule: the reference is the same quantized model). Then the
matmuls alone, timed the same way: the LM head's argmax and layer 0's seven projections at 1 and
4 rows, and the 30 layers' projections chained (a forward without attention: weights streamed from
memory, as decoding does), each format's own code, plus int8 with its convert left to XLA's
scheduler ("int8 unordered", `jaxspec.models.quantize`'s docstring).

    python -m benchmarks.quantized_weights                  # ~25 min on this project's shared 2-core CPU
    python -m benchmarks.quantized_weights --smoke          # 1 round, 8 tokens, no methods, few programs

Writes benchmarks/results/quantized_weights.{json,md}.
"""

from __future__ import annotations

from pathlib import Path as _Path
import argparse
import contextlib
import statistics
import sys
from pathlib import Path
from unittest import mock

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import jaxspec  # noqa: E402
import jaxspec.models.model as model_lib  # noqa: E402
import jaxspec.models.quantize as quantize  # noqa: E402
from benchmarks.harness import RESULTS, chat_cases, command_line, time_programs, write_result  # noqa: E402
from jaxspec.checkpoint.gguf_file import hf_tensor_name, open_gguf, read_gguf  # noqa: E402
from jaxspec.checkpoint.loading import Model, resolve  # noqa: E402
from jaxspec.runtime.memory import tree_bytes  # noqa: E402

MODEL = "smollm2-135m-instruct"
METHODS = ("lookahead", "prompt-lookup", "speculative")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ----------------------------------------------------------------------------- the GGUF's blocks, kept


def _ordered_bytes(data, x):
    """`data` (uint8 blocks) passed through a max XLA cannot fold (0, or 1 where x's first value is
    NaN), so its dequantization runs after `x` exists, as `quantize.dequantize_after` does for int8."""
    return jnp.maximum(data, jnp.isnan(x.reshape(-1)[0]).astype(data.dtype))


class Q4_1Linear(nnx.Module):
    """A GGUF Q4_1 weight [out, in] as the file stores it: per 32 inputs of an output channel, 16 bytes of
    4-bit values q (the low nibbles are the first 16, the high ones the last 16) and float16 d and m;
    w = d * q + m, in float32, as `gguf.quants` dequantizes it."""

    def __init__(self, qs: np.ndarray, d: np.ndarray, m: np.ndarray):
        self.qs, self.d, self.m = nnx.Param(jnp.asarray(qs)), nnx.Param(jnp.asarray(d)), nnx.Param(jnp.asarray(m))
        self.out_features, blocks, _ = qs.shape
        self.in_features = 32 * blocks

    def __call__(self, x):
        qs = _ordered_bytes(self.qs[...], x)
        q = jnp.concatenate([qs & 15, qs >> 4], axis=-1).astype(jnp.float32)  # [out, blocks, 32]
        w = self.d[...].astype(jnp.float32)[..., None] * q + self.m[...].astype(jnp.float32)[..., None]
        w = w.reshape(self.out_features, self.in_features)
        return jnp.einsum("...i,oi->...o", x, w, preferred_element_type=jnp.float32).astype(x.dtype)


class Q8_0Embed(nnx.Module):
    """GGUF Q8_0 token embeddings [vocab, d] as the file stores them: int8 values and a float16 scale per
    32 of a row (w = q * d). Also the tied LM head (`KeptTransformer`)."""

    def __init__(self, qs: np.ndarray, d: np.ndarray):
        self.embedding, self.d = nnx.Param(jnp.asarray(qs)), nnx.Param(jnp.asarray(d))
        self.num_embeddings, self.features = qs.shape

    def rows(self, q, d):
        blocks = q.astype(jnp.float32).reshape(*q.shape[:-1], -1, 32) * d.astype(jnp.float32)[..., None]
        return blocks.reshape(*q.shape)

    def __call__(self, ids):
        return self.rows(jnp.take(self.embedding[...], ids, axis=0), jnp.take(self.d[...], ids, axis=0))


class KeptTransformer(model_lib.Transformer):
    """The Transformer with a `Q8_0Embed` as its tied head: the head's rows dequantized chunk by chunk
    (at most `quantize.DEQUANT_PIECE_BYTES` of float32 each), the argmax running over the chunks."""

    def _chunk(self, x) -> int:
        rows = max(1, int(np.prod(x.shape[:-1])))
        most = min(model_lib.ARGMAX_LOGITS_BYTES // (4 * rows), quantize.piece_channels(x.shape[-1]))
        return model_lib.argmax_chunk(self.config.vocab_size, rows, most)

    def _logits(self, x, start, size):
        head = self.embed_tokens
        q = jax.lax.dynamic_slice_in_dim(head.embedding[...], start, size, 0)
        d = jax.lax.dynamic_slice_in_dim(head.d[...], start, size, 0)
        q = jnp.maximum(q, jnp.int8(-128) + jnp.isnan(x.reshape(-1)[0]).astype(jnp.int8))  # (ordered after x)
        return jnp.einsum("...d,vd->...v", x, head.rows(q, d), preferred_element_type=jnp.float32)

    def head_logits(self, x):
        vocab, chunk = self.config.vocab_size, self._chunk(x)

        def body(i, out):
            start = jnp.minimum(i * chunk, vocab - chunk)
            return jax.lax.dynamic_update_slice_in_dim(out, self._logits(x, start, chunk), start, out.ndim - 1)

        return jax.lax.fori_loop(0, -(-vocab // chunk), body, jnp.zeros((*x.shape[:-1], vocab), jnp.float32))

    def head_argmax(self, x, chunk=None):
        vocab, chunk = self.config.vocab_size, chunk or self._chunk(x)

        def body(i, carry):  # ties to the lowest id, as `Transformer.head_argmax`
            best, best_id = carry
            start = jnp.minimum(i * chunk, vocab - chunk)
            scores = self._logits(x, start, chunk)
            top = jnp.max(scores, axis=-1)
            better = top > best
            return jnp.where(better, top, best), jnp.where(better, start + jnp.argmax(scores, -1).astype(jnp.int32),
                                                           best_id)

        init = (jnp.full(x.shape[:-1], -jnp.inf, jnp.float32), jnp.zeros(x.shape[:-1], jnp.int32))
        return jax.lax.fori_loop(0, -(-vocab // chunk), body, init)[1]


def _blocks(info, block_bytes: int) -> np.ndarray:
    data = np.asarray(info.data)
    return data.reshape(data.shape[0], -1, block_bytes)


def gguf_kept(name: str) -> Model:
    """The model with its GGUF file's Q8_0 embeddings and Q4_1 projections kept as blocks (norms from
    the float32 load; llama.cpp's q/k row order undone on the blocks' rows, in the row order the loader
    reads them in: `read_gguf`'s tensors, a `RowPermuted` with its `rows` for a llama q/k)."""
    import gguf

    f32 = jaxspec.load(name, dtype="float32")
    module, cfg = f32.module, f32.config
    reader = open_gguf(resolve(name))
    _, loaded, _ = read_gguf(resolve(name))
    by_hf = {hf_tensor_name(t.name): t for t in reader.tensors}
    emb = by_hf["model.embed_tokens.weight"]
    if emb.tensor_type != gguf.GGMLQuantizationType.Q8_0 or not cfg.tie_word_embeddings:
        raise SystemExit(f"{name}: gguf kept needs tied Q8_0 token embeddings")
    blocks = _blocks(emb, 34)
    module.embed_tokens = Q8_0Embed(blocks[..., 2:].copy().view(np.int8).reshape(blocks.shape[0], -1),
                                    blocks[..., :2].copy().view(np.float16)[..., 0])
    for i, layer in enumerate(module.layers):
        for proj in PROJECTIONS:
            part = "self_attn" if proj in PROJECTIONS[:4] else "mlp"
            info = by_hf[f"model.layers.{i}.{part}.{proj}.weight"]
            if info.tensor_type != gguf.GGMLQuantizationType.Q4_1:
                raise SystemExit(f"{name}: gguf kept needs Q4_1 projections, {info.name} is {info.tensor_type.name}")
            b = _blocks(info, 20)
            rows = getattr(loaded[f"model.layers.{i}.{part}.{proj}.weight"], "rows", None)  # llama's q and k
            if rows is not None:
                b = b[rows]
            half = lambda a: a.copy().view(np.float16)[..., 0]  # noqa: E731  (2 bytes -> one float16)
            setattr(getattr(layer, part), proj, Q4_1Linear(b[..., 4:].copy(), half(b[..., :2]), half(b[..., 2:4])))
    module.__class__ = KeptTransformer
    return Model.from_module(module, tokenizer=f32.tokenizer, dtype="float32", source=f"{f32.source} (blocks kept)")


# ----------------------------------------------------------------------------- end to end


def end_to_end(models: dict, cases, new_tokens: int, rounds: int, methods: tuple) -> tuple[list, list]:
    """Greedy decoding per variant (+ float32's and int8's methods), interleaved: rows per variant and
    per method."""
    settings = {(v, "greedy"): m for v, m in models.items()}
    settings.update({(v, method): models[v] for v in ("float32", "int8") if v in models for method in methods})
    outputs, temp = {}, {}
    for (variant, method), model in settings.items():  # compiled and run once each, untimed
        outputs[variant, method] = [jaxspec.generate(model, [list(c.ids)], method=method, max_new_tokens=new_tokens,
                                                     stop_at_eos=False) for c in cases]
        temp[variant, method] = max(o.memory.get("compiled", {}).get("temp_bytes", 0) or 0
                                    for o in outputs[variant, method])
        print(variant, method, [o.tokens[0][:8] for o in outputs[variant, method]], flush=True)
    programs = {(key, j): (lambda m=model, key=key, c=c: jaxspec.generate(
        m, [list(c.ids)], method=key[1], max_new_tokens=new_tokens, stop_at_eos=False).tokens, ())
        for key, model in settings.items() for j, c in enumerate(cases)}
    times = time_programs(programs, rounds)
    per_round = {key: [sum(times[key, j][r] for j in range(len(cases))) for r in range(rounds)] for key in settings}
    tps = {key: [len(cases) * new_tokens / s for s in secs] for key, secs in per_round.items()}
    tokens = {key: [o.tokens[0] for o in outs] for key, outs in outputs.items()}

    def same(a, b) -> int:
        return sum(x == y for x, y in zip(tokens[a], tokens[b]))

    def first_difference(a, b) -> list:
        return [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), None)
                for x, y in zip(tokens[a], tokens[b])]

    base = ("float32", "greedy")
    variants = []
    for variant, model in models.items():
        key = (variant, "greedy")
        ratio = [a / b for a, b in zip(per_round[base], per_round[key])]  # speed against float32, per round
        variants.append(dict(
            variant=variant, dtype=model.dtype, weights_bytes=tree_bytes(model.params), greedy_temp_bytes=temp[key],
            tokens_per_s=statistics.median(tps[key]), tokens_per_s_range=[min(tps[key]), max(tps[key])],
            speed_vs_float32=statistics.median(ratio), speed_vs_float32_range=[min(ratio), max(ratio)],
            identical_to_float32_greedy=same(key, base), first_difference_from_float32=first_difference(key, base)))
    method_rows = []
    for method in methods:
        for variant in ("float32", "int8"):
            key, ref = (variant, method), (variant, "greedy")
            if key not in settings:
                continue
            ratio = [a / b for a, b in zip(per_round[ref], per_round[key])]  # against its own greedy
            same_method = [a / b for a, b in zip(per_round["float32", method], per_round[key])]
            method_rows.append(dict(
                variant=variant, method=method, options={k: _relative(v) for k, v in outputs[key][0].options.items()
                                                         if isinstance(v, (int, float, str, bool))},
                tokens_per_s=statistics.median(tps[key]), speed_vs_own_greedy=statistics.median(ratio),
                speed_vs_float32_same_method=statistics.median(same_method),
                compression=statistics.mean(o.compression[0] for o in outputs[key]),
                identical_to_own_greedy=same(key, ref), cases=len(cases)))
    return variants, method_rows


# ----------------------------------------------------------------------------- the matmuls alone


def _rms(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def _layer_projections(module, x, h):
    layer = module.layers[0]
    a, m = layer.self_attn, layer.mlp
    return [getattr(a, p)(x) for p in PROJECTIONS[:4]] + [m.gate_proj(x), m.up_proj(x), m.down_proj(h)]


def _stack(module, x):
    """Every layer's seven projections, each layer's input the one before's output (the order a forward
    streams the weights in; attention left out)."""
    for layer in module.layers:
        a, m = layer.self_attn, layer.mlp
        kv = a.k_proj(x) + a.v_proj(x)
        x = _rms(x + a.o_proj(a.q_proj(x)) + jnp.tile(kv, x.shape[-1] // kv.shape[-1]))
        x = _rms(x + m.down_proj(jax.nn.silu(m.gate_proj(x)) * m.up_proj(x)))
    return x


def micro(models: dict, rows_list, rounds: int, smoke: bool) -> list:
    """The head's argmax, layer 0's projections and the 30 layers' projections, per variant and row
    count, each compiled ahead of time (the "int8 unordered" ones with the ordered convert patched out)."""
    cfg = next(iter(models.values())).config
    rng = np.random.default_rng(0)
    programs, facts = {}, {}
    plain = lambda q, x: q.astype(x.dtype)  # noqa: E731  (the convert left to XLA's scheduler)
    variants = dict(models)
    if "int8" in models:
        variants["int8 unordered"] = models["int8"]
    kinds = {"head argmax": lambda mod, x, h: mod.head_argmax(x),
             "layer 0 projections": lambda mod, x, h: _layer_projections(mod, x, h),
             f"{cfg.num_layers} layers' projections": lambda mod, x, h: _stack(mod, x)}
    if smoke:
        kinds.pop(f"{cfg.num_layers} layers' projections")
    inputs = {rows: (jnp.asarray(rng.standard_normal((rows, cfg.hidden_size), dtype=np.float32)),
                     jnp.asarray(rng.standard_normal((rows, cfg.intermediate_size), dtype=np.float32)))
              for rows in rows_list}
    for kind, fn in kinds.items():
        for rows, (x, h) in inputs.items():
            for variant, model in variants.items():
                dtype = quantize.activation_dtype(model.dtype)

                def run(params, x, h, fn=fn, graphdef=model.graphdef):
                    return fn(nnx.merge(graphdef, params), x, h)

                args = (model.params, x.astype(dtype), h.astype(dtype))
                with contextlib.ExitStack() as patches:
                    if variant == "int8 unordered":  # (read while tracing: the compiled program keeps it)
                        for where in (quantize, model_lib):
                            patches.enter_context(mock.patch.object(where, "dequantize_after", plain))
                    compiled = jax.jit(run).lower(*args).compile()
                analysis = compiled.memory_analysis()
                facts[kind, rows, variant] = getattr(analysis, "temp_size_in_bytes", None)
                programs[kind, rows, variant] = (compiled, args)
                print("compiled", kind, rows, variant, flush=True)
    times = time_programs(programs, rounds)
    out = []
    for (kind, rows, variant), secs in times.items():
        base = times[kind, rows, "float32"]
        ratio = [a / b for a, b in zip(base, secs)]
        out.append(dict(program=kind, rows=rows, variant=variant, ms=1e3 * statistics.median(secs),
                        ms_range=[1e3 * min(secs), 1e3 * max(secs)], speed_vs_float32=statistics.median(ratio),
                        temp_bytes=facts[kind, rows, variant]))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--variants", default="float32,bfloat16,int8,gguf kept")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="methods checked and timed with float32 and int8 weights ('' for none)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5, help="end-to-end rounds")
    p.add_argument("--micro-rounds", type=int, default=15)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4])
    p.add_argument("--smoke", action="store_true", help="1 round, 8 tokens, no methods, no layer stack")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.smoke:
        args.rounds, args.micro_rounds, args.new_tokens, args.methods = 1, 2, 8, ""
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "float32" not in names:
        raise SystemExit("--variants must include float32 (the reference every ratio is against)")
    models = {v: gguf_kept(args.model) if v == "gguf kept" else jaxspec.load(args.model, dtype=v) for v in names}
    cases = chat_cases(models["float32"], "quick")
    methods = tuple(m for m in args.methods.split(",") if m)
    variants, method_rows = end_to_end(models, cases, args.new_tokens, args.rounds, methods)
    micro_rows = micro(models, args.rows, args.micro_rounds, args.smoke)
    result = dict(benchmark="quantized_weights", title="Quantized weights on this CPU: float32, bfloat16, int8 and "
                  "the GGUF's own blocks", model=args.model, cases=[c.name for c in cases], new_tokens=args.new_tokens,
                  rounds=args.rounds, micro_rounds=args.micro_rounds, piece_bytes=quantize.DEQUANT_PIECE_BYTES,
                  variants=variants, methods=method_rows, micro=micro_rows, command=command_line(__file__, argv))
    write_result(result, args.out, "quantized_weights_smoke" if args.smoke else "quantized_weights")
    wrong = [f"{r['variant']} {r['method']}" for r in method_rows if r["identical_to_own_greedy"] != r["cases"]]
    kept = [v for v in variants if v["variant"] == "gguf kept" and v["identical_to_float32_greedy"] != len(cases)]
    if wrong or kept:
        print(f"not identical to their reference: {wrong + [v['variant'] for v in kept]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


ROOT = _Path(__file__).resolve().parents[1]


def _relative(value):
    """A path inside the repository as a path from its root (results are committed)."""
    if isinstance(value, str) and value.startswith(str(ROOT) + "/"):
        return value[len(str(ROOT)) + 1:]
    return value
