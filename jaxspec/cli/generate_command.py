"""`jaxspec generate`: tokens from a prompt, with greedy's statistics beside a lossless
method's."""

from __future__ import annotations

import argparse
import json
import sys

from jaxspec.cli.arguments import (add_decoding_options, add_distributed_options, join_distributed_run, load_model,
                                   method_options_from, sampling_options, warn_unused_sampling)
from jaxspec.cli.reporting import identical_to_greedy, jax_backend
from jaxspec.errors import JaxspecError


def _ids(text: str) -> list[int]:
    items = text.replace(" ", "").split(",")
    if items == [""]:
        return []  # no ids at all: `generate` says the prompt is empty
    if "" in items:
        raise argparse.ArgumentTypeError(f"--prompt-ids has an empty item in {text!r} (item {items.index('') + 1}); "
                                         "pass comma-separated integers, e.g. 1,14,220")
    try:
        return [int(t) for t in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate tokens from a prompt")
    g.add_argument("--model", default=None,
                   help="HF folder, .gguf file, llama2.c .bin, a Hugging Face hub id in the local cache "
                        "(org/name), or a known name (pycode-5M, stories260K, smollm2-135m-instruct); "
                        "default: pycode-5M")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs a tokenizer in the checkpoint)")
    src.add_argument("--prompt-ids", type=_ids, help="comma-separated prompt token ids, e.g. 1,14,220")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate (besides the prompt)")
    add_decoding_options(g)
    g.add_argument("--no-eos-stop", action="store_true", help="do not stop at the end-of-sequence token")
    g.add_argument("--stop", action="append", metavar="TEXT",
                   help="end the text before TEXT (OpenAI's stop; repeatable, up to 4)")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="with --json: per token, its log-probability under the model and its K most likely "
                        "tokens (0-20)")
    g.add_argument("--quiet", action="store_true",
                   help="no progress lines (loading, auto's measurements, compiling) on stderr")
    g.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                   help="with a method other than greedy: also decode greedily, print both statistics and say "
                        "whether the text is identical (default here: on; chat's: off, a second decode per turn)")
    add_distributed_options(g)


def run_generate(args) -> int:
    """`jaxspec generate`: the text (or --json), with greedy's statistics beside the method's; the exit code."""
    join_distributed_run(args)
    import jaxspec

    from jaxspec import progress

    method_options = method_options_from(args)
    warn_unused_sampling(args)
    if args.logprobs is not None and not args.json:
        raise JaxspecError("--logprobs is reported in the --json output; add --json")
    phases = progress.activate(progress.Phases(progress.wanted(args.quiet or args.json)))
    name = args.model or jaxspec.checkpoint.loading.DEFAULT_MODEL
    with phases.phase(f"loading {name}"):
        model = load_model(args, name, method_options)
    prompt = args.prompt if args.prompt is not None else args.prompt_ids
    # auto's measurements and compiling say themselves (`jaxspec.progress`), once the request is checked
    out = jaxspec.generate(model, prompt, max_new_tokens=args.max_new_tokens, method=args.method,
                           stop_at_eos=not args.no_eos_stop, logprobs=args.logprobs, stop=args.stop,
                           **sampling_options(args), **method_options)
    phases.flush()
    if args.json:
        print(json.dumps({
            "tokens": out.tokens, "text": out.text, "finish_reason": out.finish_reason, "steps": out.steps, "compression": out.compression,
            "seconds": out.seconds, "tokens_per_second": out.tokens_per_second, "method": out.method,
            "config": {
                "model": model.source, "dtype": model.dtype, "attention": args.attention,
                "batch_invariant": model.batch_invariant,
                "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                **sampling_options(args), "stop_at_eos": not args.no_eos_stop, "compile_seconds": out.compile_seconds,
                "tensor_parallel": args.tensor_parallel, "data_parallel": args.data_parallel,
                **out.options, **out.extras,
            },
            "memory": out.memory,
            "auto": out.auto,
            **({} if out.logprobs is None else {"logprobs": out.logprobs}),
        }))
    else:
        print(out.text if out.text is not None else " ".join(map(str, out.tokens)))
        if out.auto is not None:
            print(f"[auto] {out.auto['reason']}", file=sys.stderr)
        sys.stdout.flush()  # the text before the statistics on a shared terminal
        runs = [out]
        if args.compare and out.method != "autoregressive":
            # Next to greedy's: the point of a lossless method is the same text in fewer steps.
            with phases.phase("decoding greedily, to compare (--no-compare skips it)"):
                runs.append(jaxspec.generate(model, prompt, max_new_tokens=args.max_new_tokens,
                                             method="autoregressive", stop_at_eos=not args.no_eos_stop,
                                             stop=args.stop,
                                             **sampling_options(args)))
            phases.flush()
        for run in runs:
            print(f"[{run.method}] {len(run.tokens)} tokens in {run.steps} steps "
                  f"(compression {run.compression:.2f}), {run.tokens_per_second:.1f} tokens/s, "
                  f"compile {run.compile_seconds:.1f}s", file=sys.stderr)
        if len(runs) == 2:
            speedup = runs[0].tokens_per_second / max(runs[1].tokens_per_second, 1e-9)
            print(f"speed-up over greedy: {speedup:.2f}x (measured, this run)", file=sys.stderr)
            if speedup < 1:
                print(f"hint: {runs[0].method} is slower than greedy on this device ({jax_backend()}); "
                      "--method auto picks the fastest setting here", file=sys.stderr)
        if len(runs) == 2 and args.temperature == 0:
            from jaxspec.inputs import normalize_prompts

            (prompt_ids,), _ = normalize_prompts(model, prompt)
            print(identical_to_greedy(model, prompt_ids, runs[0].tokens, runs[1].tokens), file=sys.stderr)
    return 0
