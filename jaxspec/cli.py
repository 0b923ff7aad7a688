"""`jaxspec` command line. Bad input prints one line to stderr and exits with code 2."""

from __future__ import annotations

import argparse
import json
import sys

from jaxspec.errors import JaxspecError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage block
        print(f"jaxspec: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def _seed(text: str) -> int:
    # jax.random.key takes a 32-bit seed here (larger ints overflow or silently alias smaller ones).
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if not 0 <= seed < 2**32:
        raise argparse.ArgumentTypeError(f"--seed must be an integer in [0, 2**32), got {text!r}")
    return seed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxspec", description="Lossless fast LLM decoding in JAX.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate tokens from a prompt")
    g.add_argument("--model", required=True, help="HF folder, llama2.c .bin, or a known name (stories260K)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs a tokenizer in the checkpoint)")
    src.add_argument("--prompt-ids", type=_ids, help="comma-separated prompt token ids, e.g. 1,14,220")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--method", default="autoregressive", help="decoding method (autoregressive|greedy|...)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    g.add_argument("--seed", type=_seed, default=0, help="random seed for sampling, in [0, 2**32)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    g.add_argument("--attention", default="xla", help="attention backend (xla|pallas)")
    g.add_argument("--no-eos-stop", action="store_true", help="do not stop at the end-of-sequence token")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    la = g.add_argument_group("lookahead / prompt-lookup / jacobi (defaults: configs/lookahead.toml by model size)")
    la.add_argument("--window", type=int, help="lookahead window W (jacobi: guess length)")
    la.add_argument("--ngram", type=int, help="n-gram size N (N-1 lookahead levels; candidates of N-1 tokens)")
    la.add_argument("--guesses", type=int, help="max candidates G verified per step")
    la.add_argument("--no-pool-from-prompt", dest="pool_from_prompt", action="store_false", default=None,
                    help="do not seed the n-gram pool with the prompt's n-grams")
    la.add_argument("--no-verify-window", dest="verify_window", action="store_false", default=None,
                    help="verify pool candidates only, not the lookahead window's own diagonals")

    e = sub.add_parser("export", help="save a checkpoint as an HF folder that transformers loads")
    e.add_argument("--model", required=True)
    e.add_argument("--out", required=True)
    e.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    return parser


# Method options the CLI forwards to `jaxspec.generate` when given.
METHOD_FLAGS = ("window", "ngram", "guesses", "pool_from_prompt", "verify_window")


def _generate(args) -> int:
    import jaxspec

    model = jaxspec.load(args.model, dtype=args.dtype, attention=args.attention)
    prompt = args.prompt if args.prompt is not None else args.prompt_ids
    method_options = {k: getattr(args, k) for k in METHOD_FLAGS if getattr(args, k) is not None}
    out = jaxspec.generate(model, prompt, max_new_tokens=args.max_new_tokens, method=args.method,
                           temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                           seed=args.seed, stop_at_eos=not args.no_eos_stop, **method_options)
    if args.json:
        print(json.dumps({
            "tokens": out.tokens, "text": out.text, "steps": out.steps, "compression": out.compression,
            "seconds": out.seconds, "tokens_per_second": out.tokens_per_second, "method": out.method,
            "config": {
                "model": model.source, "dtype": args.dtype, "attention": args.attention,
                "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
                "stop_at_eos": not args.no_eos_stop, "compile_seconds": out.compile_seconds,
                **out.options, **out.extras,
            },
        }))
    else:
        print(out.text if out.text is not None else " ".join(map(str, out.tokens)))
        print(f"[{out.method}] {len(out.tokens)} tokens in {out.steps} steps "
              f"(compression {out.compression:.2f}), {out.tokens_per_second:.1f} tokens/s, "
              f"compile {out.compile_seconds:.1f}s", file=sys.stderr)
    return 0


def _export(args) -> int:
    import jaxspec

    model = jaxspec.load(args.model, dtype=args.dtype)
    folder = model.save(args.out, dtype=args.dtype)
    print(f"saved {model.config.architecture} to {folder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": _generate, "export": _export}[args.command](args)
    except JaxspecError as e:
        print(f"jaxspec: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # an unreadable checkpoint or output path: still one line, no traceback
        print(f"jaxspec: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
