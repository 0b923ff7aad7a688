"""Memory and step time of greedy lookahead at large vocabularies: full block logits vs the chunked LM-head
argmax (`Transformer.head_argmax`).

Greedy verification reads only each block token's argmax. With full logits a step holds float32 logits
[b, T, vocab] (b 8, T 120 at (15,5,15), vocab 128256: 493 MB); the chunked head holds [b, T, chunk] at a time.
Per vocabulary: both programs compiled, XLA's memory analysis (temporaries, arguments, outputs), both decodes
timed interleaved (`harness.time_programs`, the best round per step). The model: a random-weight Llama of the
default model's shape with the vocabulary replaced (the numbers do not depend on weights).

    python benchmarks/vocab_memory.py                  # vocab 4096, 32000, 128256, 151936
    python benchmarks/vocab_memory.py --smoke          # one small vocabulary, seconds
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
from flax import nnx

import jaxspec
import jaxspec.model as model_lib
from harness import RESULTS, command_line, time_programs, write_result
from jaxspec import Model, ModelConfig, Transformer

SHAPE = dict(hidden_size=256, intermediate_size=688, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=64)
OFF = 1 << 40  # an ARGMAX_CHUNK no vocabulary exceeds: the full logits, as before the chunked head


def compile_variant(module: Transformer, chunk: int, prompts, options: dict) -> tuple[Model, dict, object]:
    """A Model holding the one program compiled with this ARGMAX_CHUNK, its memory analysis and output."""
    model = Model.from_module(module, source="synthetic")
    saved = model_lib.ARGMAX_CHUNK
    model_lib.ARGMAX_CHUNK = chunk  # read while tracing: the compiled program keeps it
    jax.clear_caches()  # (else the other variant's cached trace of `decode` is reused)
    try:
        out = jaxspec.generate(model, prompts, **options)
    finally:
        model_lib.ARGMAX_CHUNK = saved
    (program,) = model.compiled.values()
    m = program.memory_analysis()
    return model, dict(temp_bytes=m.temp_size_in_bytes, argument_bytes=m.argument_size_in_bytes,
                       output_bytes=m.output_size_in_bytes), out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, nargs="+", default=[4096, 32000, 128256, 151936])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--config", type=int, nargs=3, default=[15, 5, 15], metavar=("W", "N", "G"))
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="one small vocabulary, batch 2, one round")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.smoke:
        args.vocab, args.batch, args.rounds, args.new_tokens = [model_lib.ARGMAX_CHUNK + 1000], 2, 1, 6
    w, n, g = args.config
    options = dict(method="lookahead", window=w, ngram=n, guesses=g, max_new_tokens=args.new_tokens,
                   stop_at_eos=False)
    block = 1 + (w - 1) + (n - 2) * w + g * (n - 1)
    rows = []
    for vocab in args.vocab:
        cfg = ModelConfig(model_type="llama", vocab_size=vocab, max_position_embeddings=4096, bos_token_id=1,
                          eos_token_ids=(2,), tie_word_embeddings=True, **SHAPE)
        module = nnx.jit(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))()
        prompts = [[1] + [(7 * i + r) % (vocab - 3) + 3 for i in range(63)] for r in range(args.batch)]
        variants = {"full logits": compile_variant(module, OFF, prompts, options),
                    "chunked argmax": compile_variant(module, model_lib.ARGMAX_CHUNK, prompts, options)}
        times = time_programs({name: (lambda m=model: jaxspec.generate(m, prompts, **options).tokens, ())
                               for name, (model, _, _) in variants.items()}, args.rounds)
        same = variants["full logits"][2].tokens == variants["chunked argmax"][2].tokens
        for name, (_, memory, out) in variants.items():
            rows.append(dict(vocab=vocab, variant=name, **memory, seconds_per_step=min(times[name]) / max(out.steps),
                             block_logits_bytes=args.batch * block * 4 * (
                                 vocab if name == "full logits" else model_lib.argmax_chunk(vocab)),
                             identical_tokens=same))
            print(rows[-1], flush=True)
    result = dict(benchmark="vocab_memory", title=f"Greedy lookahead ({w},{n},{g}) at batch {args.batch}: full "
                  "block logits vs chunked argmax", batch=args.batch, config=[w, n, g], block_tokens=block,
                  chunk=model_lib.ARGMAX_CHUNK, shape=SHAPE, rounds=args.rounds, rows=rows,
                  command=command_line(__file__, argv))
    write_result(result, args.out, "vocab_memory_smoke" if args.smoke else "vocab_memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
