"""Greedy decoding's memory and step time: the block's full logits vs the LM-head argmax over vocabulary chunks
(`Transformer.head_argmax`), which holds [b, T, chunk] logits at a time but copies each chunk's rows of the head.
jaxspec chunks only where the logits exceed `ARGMAX_LOGITS_BYTES` (column `jaxspec`; before, every vocabulary over
16384). Cases: greedy lookahead on a random-weight Llama of the default model's shape with the vocabulary replaced,
and a real model's one-token steps; both programs compiled (XLA's memory analysis) and timed interleaved.

    python -m benchmarks.vocab_memory                  # vocab 4096, 32000, 128256, 151936; SmolLM2-135M
    python -m benchmarks.vocab_memory --smoke          # one small vocabulary, seconds
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

if __name__ == "__main__" and not __package__:  # run by path: the repository root on sys.path, as `-m` has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
from flax import nnx  # noqa: E402

import jaxspec  # noqa: E402
import jaxspec.models.model as model_lib  # noqa: E402
from benchmarks.harness import RESULTS, command_line, time_programs, write_result  # noqa: E402
from jaxspec import Model, ModelConfig, Transformer  # noqa: E402
from jaxspec.roofline import lookahead_block_tokens  # noqa: E402

SHAPE = dict(hidden_size=256, intermediate_size=688, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=64)
OFF = 1 << 40  # a logits budget no block exceeds: the full logits, as before the chunked head
CHUNK = 16384  # the chunk jaxspec's head used at every vocabulary over it before the budget


def compiled(module: Transformer, budget: int, prompts, options: dict) -> tuple[Model, dict, object]:
    """A Model holding the one program compiled with this ARGMAX_LOGITS_BYTES, its memory analysis and output."""
    model = Model.from_module(module, source="synthetic")
    with mock.patch.object(model_lib, "ARGMAX_LOGITS_BYTES", budget):  # read while tracing: the program keeps it
        jax.clear_caches()  # (else the other variant's cached trace of `decode` is reused)
        out = jaxspec.generate(model, prompts, **options)
    m = next(iter(model.compiled.values())).memory_analysis()
    return model, dict(temp_bytes=m.temp_size_in_bytes, argument_bytes=m.argument_size_in_bytes), out


def compare(case: str, module: Transformer, prompts, options: dict, block: int, rounds: int) -> list[dict]:
    """Both variants of one case, timed interleaved: the result rows."""
    vocab, rows = module.config.vocab_size, len(prompts) * block  # the head's rows in one step
    chunk = {"full logits": vocab, f"chunks of {CHUNK}": model_lib.argmax_chunk(vocab, rows, CHUNK)}
    variants = {name: compiled(module, OFF if c == vocab else CHUNK * 4 * rows, prompts, options)
                for name, c in chunk.items()}
    times = time_programs({name: (lambda m=model: jaxspec.generate(m, prompts, **options).tokens, ())
                           for name, (model, _, _) in variants.items()}, rounds)
    same = len({str(out.tokens) for _, _, out in variants.values()}) == 1
    out = [dict(case=case, vocab=vocab, variant=name, **memory, seconds_per_step=min(times[name]) / max(o.steps),
                block_logits_bytes=rows * 4 * chunk[name], identical_tokens=same,
                jaxspec=chunk[name] == model_lib.argmax_chunk(vocab, rows)) for name, (_, memory, o) in variants.items()]
    print(*out, sep="\n", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, nargs="+", default=[4096, 32000, 128256, 151936])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--config", type=int, nargs=3, default=[15, 5, 15], metavar=("W", "N", "G"))
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--model", default="smollm2-135m-instruct", help="the real model's case ('none': skip it)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="one small vocabulary, batch 2, one round")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.smoke:
        args.vocab, args.batch, args.rounds, args.new_tokens, args.model = [CHUNK + 1000], 2, 1, 6, "none"
    w, n, g = args.config
    options = dict(method="lookahead", window=w, ngram=n, guesses=g, max_new_tokens=args.new_tokens, stop_at_eos=False)
    block = lookahead_block_tokens(w, n, g)
    rows = []
    for vocab in args.vocab:
        cfg = ModelConfig(model_type="llama", vocab_size=vocab, max_position_embeddings=4096, bos_token_id=1,
                          eos_token_ids=(2,), tie_word_embeddings=True, **SHAPE)
        module = nnx.jit(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))()
        prompts = [[1] + [(7 * i + r) % (vocab - 3) + 3 for i in range(63)] for r in range(args.batch)]
        rows += compare(f"lookahead ({w},{n},{g}), batch {args.batch}, random d {SHAPE['hidden_size']}", module,
                        prompts, options, block, args.rounds)
    if args.model != "none":  # one-token steps of a real model: 64 tokens after a real prompt, batch 1
        real = jaxspec.load(args.model, dtype="float32")
        rows += compare(f"{args.model} greedy, batch 1", real.module, [real.tokenizer.encode(
            "Explain how a hash table handles collisions.")], dict(max_new_tokens=64, stop_at_eos=False), 1, args.rounds)
    result = dict(benchmark="vocab_memory", title="Greedy decoding: full block logits vs the head in chunks", rows=rows,
                  chunk=CHUNK, budget=model_lib.ARGMAX_LOGITS_BYTES, rounds=args.rounds, command=command_line(__file__, argv))
    write_result(result, args.out, "vocab_memory_smoke" if args.smoke else "vocab_memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
