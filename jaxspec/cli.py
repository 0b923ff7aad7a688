"""`jaxspec` command line. Bad input prints one line to stderr and exits with code 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

from jaxspec.errors import ConfigError, JaxspecError

EXIT_BAD_INPUT = 2


class _HelpFormatter(argparse.HelpFormatter):
    """--help shows an option's default where it has one worth saying (not None, a flag's
    True/False, an empty value, or a help text that already speaks of its default)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (action.option_strings and default is not None and default is not argparse.SUPPRESS
                and not isinstance(default, bool) and default not in ("", []) and "default" not in text.lower()):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line instead of argparse's usage block
        print(f"jaxspec: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


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


def _window(text: str) -> int | str:
    """--window: an integer, or "auto" (lookahead: (W, N, G) chosen for this device)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window must be an integer or auto, got {text!r}") from None


def _top_k(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--top-k must be an integer, got {text!r}") from None
    if not 0 <= k < 2**31:
        raise argparse.ArgumentTypeError(f"--top-k must be in [0, 2**31) (0 = off), got {text}")
    return k


def _seed(text: str) -> int:
    # jax.random.key takes a 32-bit seed here (larger ints overflow or silently alias smaller ones).
    try:
        seed = int(text)
    except ValueError:
        seed = -1
    if not 0 <= seed < 2**32:
        raise argparse.ArgumentTypeError(f"--seed must be an integer in [0, 2**32), got {text!r}")
    return seed


def _recipe(text: str) -> str:
    """--config: a TOML file, else a recipe shipped in the package by name (`pycode`, `pycode.toml`
    or `configs/pycode.toml`: the wheel holds configs/*.toml as `jaxspec/configs`)."""
    if Path(text).exists():
        return text
    from importlib import resources

    name = Path(text).name if Path(text).suffix == ".toml" else f"{Path(text).name}.toml"
    shipped = resources.files("jaxspec") / "configs" / name
    return str(shipped) if shipped.is_file() else text  # (a missing file: the config loader names it)


def build_parser() -> argparse.ArgumentParser:
    from jaxspec import __version__

    parser = _Parser(prog="jaxspec", description="Lossless fast LLM decoding in JAX.")
    parser.add_argument("--version", action="version", version=f"jaxspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate tokens from a prompt")
    g.add_argument("--model", default=None,
                   help="HF folder, .gguf file, llama2.c .bin, a Hugging Face hub id in the local cache "
                        "(org/name), or a known name (pycode-5M, stories260K, smollm2-135m-instruct); "
                        "default: pycode-5M")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs a tokenizer in the checkpoint)")
    src.add_argument("--prompt-ids", type=_ids, help="comma-separated prompt token ids, e.g. 1,14,220")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate (besides the prompt)")
    _add_decoding_options(g)
    g.add_argument("--no-eos-stop", action="store_true", help="do not stop at the end-of-sequence token")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.add_argument("--logprobs", type=int, default=None, metavar="K",
                   help="with --json: per token, its log-probability under the model and its K most likely "
                        "tokens (0-20)")
    g.add_argument("--quiet", action="store_true",
                   help="no progress lines (loading, auto's measurements, compiling) on stderr")
    g.add_argument("--no-compare", dest="compare", action="store_false",
                   help="with a method other than greedy: do not also run greedy to print both statistics")
    _add_distributed_options(g)

    t = sub.add_parser("train", help="train a model from a config in configs/ (tokenizer, data, model)")
    t.add_argument("--config", required=True, type=_recipe,
                   help="training config TOML, e.g. configs/pycode.toml, or a shipped recipe's name (pycode)")
    t.add_argument("--out", help="run folder (default: runs/<config name>)")
    t.add_argument("--steps", type=int, help="override [train] steps: where the run stops (the schedule is fixed when a run starts: [optim] schedule_steps)")
    t.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (a TOML value: --set pard.cat=false --set optim.learning_rate=1e-3);"
                        " repeatable")
    t.add_argument("--resume", action="store_true", help="continue from the newest readable checkpoint in --out")
    t.add_argument("--no-export", dest="export", action="store_false", help="skip the HF folder export at the end")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    t.add_argument("--json", action="store_true", help="print one JSON object with the final metrics")
    _add_distributed_options(t)

    d = sub.add_parser("train-drafter", help="train a PARD-2 drafter for a target (configs/pard2_*.toml)")
    d.add_argument("--config", required=True, type=_recipe,
                   help="drafter training TOML, e.g. configs/pard2_pycode.toml, or a shipped recipe's name "
                        "(pard2_pycode, pard2_smollm2)")
    d.add_argument("--out", help="run folder (default: runs/<config name>)")
    d.add_argument("--steps", type=int, help="override [train] steps: where the run stops (the schedule is fixed when a run starts: [optim] schedule_steps)")
    d.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (a TOML value: --set pard.cat=false --set optim.learning_rate=1e-3);"
                        " repeatable")
    d.add_argument("--resume", action="store_true", help="continue from the newest readable checkpoint in --out")
    d.add_argument("--no-export", dest="export", action="store_false", help="skip the drafter export at the end")
    d.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    d.add_argument("--json", action="store_true", help="print one JSON object with the final metrics")

    c = sub.add_parser("chat", help="chat with an instruction-tuned model (history kept, reply streamed)")
    c.add_argument("--model", required=True, help="HF folder or .gguf file with a chat template, a Hugging Face hub "
                                                  "id in the local cache (org/name), or a known name "
                                                  "(smollm2-135m-instruct)")
    c.add_argument("--message", help="one user message: print the reply and exit (default: interactive)")
    c.add_argument("--system", help="a system message before the conversation")
    c.add_argument("--max-new-tokens", type=int, default=256, help="per reply")
    _add_decoding_options(c)
    c.add_argument("--chunk-steps", type=int, default=4, help="decoding steps between two streamed pieces")
    c.add_argument("--compare", action="store_true",
                   help="also decode each reply greedily and say whether the method's reply is identical")
    c.add_argument("--json", action="store_true", help="with --message: print one JSON object, no streaming")
    c.add_argument("--quiet", action="store_true",
                   help="no progress lines (loading, auto's measurements, compiling) on stderr")

    e = sub.add_parser("export", help="save a checkpoint as an HF folder that transformers loads")
    e.add_argument("--model", required=True)
    e.add_argument("--out", required=True, help="a new or empty folder (outside the model's own folder)")
    e.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    e.add_argument("--force", action="store_true",
                   help="replace a non-empty --out: the export is written beside it, then swapped in")

    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching (docs/serving.md)")
    v.add_argument("--model", default=None, help="as for generate; default: pycode-5M")
    v.add_argument("--served-model-name", help="the model id clients pass (default: --model as given)")
    v.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1: this machine only)")
    v.add_argument("--port", type=int, default=8000, help="0: a free port (the address is printed)")
    # (vLLM's spellings too: --max-num-seqs, --max-model-len, --disable-log-requests)
    v.add_argument("--slots", "--max-num-seqs", dest="slots", type=int, default=8,
                   help="requests decoded at once (the compiled batch)")
    v.add_argument("--context", "--max-model-len", dest="context", type=int,
                   help="prompt + output tokens per request (default: min(model's, 2048))")
    v.add_argument("--log-requests", dest="log_requests", action="store_true", default=False,
                   help="one line per answered completion on stderr (id, route, method, tokens, finish, "
                        "latency, status)")
    v.add_argument("--disable-log-requests", dest="log_requests", action="store_false",
                   help="no request lines (the default; vLLM's flag)")
    v.add_argument("--chunk-steps", type=int, default=4, help="decoding steps between two host syncs")
    v.add_argument("--max-groups", type=int, default=4,
                   help="slot groups kept compiled at once (one per method / greedy-or-sampled / ignore_eos)")
    sec = v.add_argument_group("security and limits (docs/serving.md, Security)")
    sec.add_argument("--api-key", default=os.environ.get("JAXSPEC_API_KEY"),
                     help="require Authorization: Bearer KEY (default: $JAXSPEC_API_KEY; none: no key)")
    sec.add_argument("--allowed-hosts", default=None,
                     help="comma-separated Host header names answered (default: the bound address and localhost; *: any)")
    sec.add_argument("--allowed-origins", default="",
                     help="comma-separated browser origins allowed cross-origin (CORS); default: none")
    sec.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body (default 1 MiB)")
    sec.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request body may take to arrive")
    sec.add_argument("--header-timeout", type=float, default=10.0,
                     help="seconds a connection may take to send its request headers")
    sec.add_argument("--max-plans", type=int, default=8,
                     help="distinct per-request method settings compiled in the server's life (the rest: 400)")
    sec.add_argument("--drafter-dir", action="append", default=[], metavar="FOLDER",
                     help="a drafter folder requests may name (by its folder name); repeatable")
    sec.add_argument("--allow-special-tokens", action="store_true",
                     help="let chat content spell special tokens such as <|im_end|> (default: refused)")
    v.add_argument("--drain-seconds", type=float, default=600.0,
                   help="on SIGTERM, how long requests in flight may take to finish")
    v.add_argument("--quiet", action="store_true",
                   help="no progress lines (loading, auto's measurements, warm-up) on stderr")
    _add_decoding_options(v)
    for action in v._actions:  # (serve's --seed seeds the server, as vLLM's: requests carry their own)
        if action.dest == "seed":
            action.default, action.help = None, ("seeds the generator that draws the seed of each sampled request "
                                                 "that gives none (default: at random); in [0, 2**32)")
    return parser


def _add_decoding_options(g: argparse.ArgumentParser) -> None:
    g.add_argument("--method", default="auto",
                   help="decoding method: auto (the fastest on this device, greedy unless another is measured "
                        "faster), autoregressive|greedy, lookahead, prompt-lookup, jacobi, speculative, hybrid")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=_top_k, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below MIN_P x the top one's probability (0 = off)")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divide (multiply) the positive (negative) logits of prompt and output tokens (1 = off)")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="subtract once per token in the output (0 = off)")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract per occurrence in the output (0 = off); every method applies the penalties alike")
    g.add_argument("--seed", type=_seed, default=0, help="random seed for sampling, in [0, 2**32)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"],
                   help="the weights' dtype (int8: quantized per output channel, float32 activations)")
    g.add_argument("--attention", default="xla", help="attention backend (xla|pallas)")
    g.add_argument("--tensor-parallel", type=int, default=1, metavar="T",
                   help="shard the weights over T devices (GSPMD, Megatron layout; docs/scaling.md)")
    g.add_argument("--data-parallel", type=int, default=1, metavar="D", help="with --tensor-parallel: the batch over D")
    la = g.add_argument_group("lookahead / prompt-lookup / jacobi (defaults: configs/lookahead.toml by model size)")
    la.add_argument("--window", type=_window,
                    help="lookahead window W, or auto: (W, N, G) chosen for this device (jacobi: guess length)")
    la.add_argument("--ngram", type=int, help="n-gram size N (N-1 lookahead levels; candidates of N-1 tokens)")
    la.add_argument("--guesses", type=int, help="max candidates G verified per step")
    la.add_argument("--no-pool-from-prompt", dest="pool_from_prompt", action="store_false", default=None,
                    help="do not seed the n-gram pool with the prompt's n-grams")
    la.add_argument("--no-verify-window", dest="verify_window", action="store_false", default=None,
                    help="verify pool candidates only, not the lookahead window's own diagonals")
    la.add_argument("--lp-devices", dest="lp_devices", type=int,
                    help="lookahead parallelism: split each step over this many devices (greedy only)")
    sp = g.add_argument_group("speculative / hybrid (PARD / PARD-2 drafter; hybrid also takes the lookahead flags)")
    sp.add_argument("--drafter", help="drafter folder or name (default: the default model's shipped drafter)")
    sp.add_argument("--draft-len", dest="draft_len", type=int, help="K drafts per step (default: the drafter's)")
    sp.add_argument("--target-independent", dest="target_features", action="store_false", default=None,
                    help="draft without the target's hidden states (no projection needed)")
    sp.add_argument("--lookup-guesses", dest="lookup_guesses", type=int,
                    help="speculative: also verify up to G prompt-lookup candidates per step (default 0: none)")
    sp.add_argument("--lookup-ngram", dest="lookup_ngram", type=int,
                    help="speculative: prompt-lookup n-gram size N (candidates of N-1 tokens; default 5)")


def _add_distributed_options(parser: argparse.ArgumentParser) -> None:
    d = parser.add_argument_group(
        "multi-process runs (every process runs the same command with its own --process-id; "
        "defaults: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)")
    d.add_argument("--coordinator", help="HOST:PORT of process 0's coordinator, e.g. 10.0.0.1:1234")
    d.add_argument("--num-processes", type=int, help="number of processes in the run")
    d.add_argument("--process-id", type=int, help="this process's index in [0, num_processes)")


def _initialize_distributed(args) -> None:
    """Join the multi-process run the options (or environment) describe, before JAX starts."""
    from jaxspec.models.meshes import initialize_distributed

    initialize_distributed(args.coordinator, args.num_processes, args.process_id)


# Method options the CLI forwards to `jaxspec.generate` when given, and the flag that sets each.
METHOD_FLAGS = {"window": "--window", "ngram": "--ngram", "guesses": "--guesses",
                "pool_from_prompt": "--no-pool-from-prompt", "verify_window": "--no-verify-window",
                "lp_devices": "--lp-devices", "drafter": "--drafter", "draft_len": "--draft-len",
                "target_features": "--target-independent", "lookup_guesses": "--lookup-guesses",
                "lookup_ngram": "--lookup-ngram"}


def _method_options(args) -> dict:
    """The method flags given, as `generate` options; a flag the method does not take is an
    error that names the flag (not the option it maps to)."""
    from jaxspec.errors import GenerationError
    from jaxspec.decoding.methods import ALIASES, METHODS

    given = {k: getattr(args, k) for k in METHOD_FLAGS if getattr(args, k) is not None}
    if args.method == "auto" and given:  # (the default method: it chooses every option itself)
        flags = [METHOD_FLAGS[k] for k in given]
        raise GenerationError(f"{', '.join(flags)} {'does' if len(flags) == 1 else 'do'} not apply to --method auto "
                              "(the default: it chooses the method and its options); name a method, e.g. "
                              "--method lookahead, to set them")
    method = METHODS.get(ALIASES.get(args.method, args.method))
    if method is not None:  # an unknown method: `generate` names it and the known ones
        unknown = [METHOD_FLAGS[k] for k in given if k not in method.option_names]
        if unknown:
            takes = [METHOD_FLAGS[k] for k in METHOD_FLAGS if k in method.option_names]
            raise GenerationError(f"{', '.join(unknown)} {'does' if len(unknown) == 1 else 'do'} not apply to "
                                  f"--method {args.method}; "
                                  + (f"its flags: {', '.join(takes)}" if takes else "it takes no method flags"))
    return given


def _warn_unused_sampling(args) -> None:
    """--top-k / --top-p shape sampling only: say so when greedy decoding ignores them."""
    unused = [flag for flag, given in (("--top-k", args.top_k != 0), ("--top-p", args.top_p != 1.0)) if given]
    if unused and args.temperature == 0:
        print(f"jaxspec: note: {' and '.join(unused)} {'is' if len(unused) == 1 else 'are'} ignored under greedy "
              "decoding (--temperature 0); pass --temperature > 0 to sample", file=sys.stderr)


def _load(args, model: str, method_options: dict):
    """The model on the mesh the options ask for. `--lp-devices L --tensor-parallel T`: straight
    onto the (lp, model) mesh of L x T devices, each process reading only its slices."""
    import jaxspec
    from jaxspec.models.meshes import lp_mesh

    lp = method_options.get("lp_devices", 1)
    if lp > 1 and args.tensor_parallel > 1 and args.data_parallel == 1:
        return jaxspec.load(model, dtype=args.dtype, attention=args.attention, mesh=lp_mesh(lp, args.tensor_parallel))
    return jaxspec.load(model, dtype=args.dtype, attention=args.attention, tensor_parallel=args.tensor_parallel,
                        data_parallel=args.data_parallel)


def _generate(args) -> int:
    _initialize_distributed(args)
    import jaxspec

    from jaxspec import progress

    method_options = _method_options(args)
    _warn_unused_sampling(args)
    if args.logprobs is not None and not args.json:
        raise JaxspecError("--logprobs is reported in the --json output; add --json")
    phases = progress.activate(progress.Phases(progress.wanted(args.quiet or args.json)))
    name = args.model or jaxspec.checkpoint.loading.DEFAULT_MODEL
    with phases.phase(f"loading {name}"):
        model = _load(args, name, method_options)
    prompt = args.prompt if args.prompt is not None else args.prompt_ids
    # auto's measurements and compiling say themselves (`jaxspec.progress`), once the request is checked
    out = jaxspec.generate(model, prompt, max_new_tokens=args.max_new_tokens, method=args.method,
                           stop_at_eos=not args.no_eos_stop, logprobs=args.logprobs, **_sampling(args),
                           **method_options)
    phases.flush()
    if args.json:
        print(json.dumps({
            "tokens": out.tokens, "text": out.text, "steps": out.steps, "compression": out.compression,
            "seconds": out.seconds, "tokens_per_second": out.tokens_per_second, "method": out.method,
            "config": {
                "model": model.source, "dtype": args.dtype, "attention": args.attention,
                "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                **_sampling(args), "stop_at_eos": not args.no_eos_stop, "compile_seconds": out.compile_seconds,
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
                                             **_sampling(args)))
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
            print(_identical_to_greedy(model, prompt_ids, runs[0].tokens, runs[1].tokens), file=sys.stderr)
    return 0


def jax_backend() -> str:
    import jax

    return jax.default_backend()


def _sampling(args) -> dict:
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, min_p=args.min_p,
                repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty)


def _identical_to_greedy(model, prompt_ids, tokens, greedy_tokens) -> str:
    """"identical to greedy: yes", or where the outputs part and whether the two disputed
    tokens' logits are a near-tie at the model's dtype (`jaxspec.decoding.exactness`)."""
    from jaxspec.decoding import exactness

    difference = exactness.compare(model, prompt_ids, greedy_tokens, tokens)
    return "identical to greedy: yes" if difference is None else \
        f"identical to greedy: NO, {difference.describe(model.dtype)}"


STATS_WIDTH = 80  # columns of chat's statistics line


def _fit(parts: dict[str, tuple[str, ...]], plan: list[str], width: int = STATS_WIDTH) -> str:
    """`parts` joined by "; ", each in one of its forms (longest first; "" leaves it out): while the
    line is wider than `width`, the next part `plan` names takes its next form."""
    chosen = dict.fromkeys(parts, 0)

    def line() -> str:
        return "; ".join(form for name, forms in parts.items() if (form := forms[chosen[name]]))

    for name in plan:
        if len(line()) <= width:
            break
        if name in parts and chosen[name] + 1 < len(parts[name]):
            chosen[name] += 1
    text = line()
    return text if len(text) <= width else text[:width - 3] + "..."


def _secs(seconds: float) -> str:
    """Seconds to 2-3 significant digits (a short reply decodes in milliseconds)."""
    return f"{seconds:.3f}" if seconds < 1 else f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"


def _stats_lines(model, out, prompt_ids, greedy=None, cut_at: int | None = None) -> list[str]:
    """A reply's statistics in one line of at most STATS_WIDTH columns: tokens, the decoding's own
    seconds and tokens/s (compiling and auto's measurements not counted: said apart), S; with
    `greedy`, a second line comparing the two (and a hint when the method is slower)."""
    setting = ("greedy" if out.method == "autoregressive" else out.method) + (
        f" K={out.options['draft_len']}" if "draft_len" in out.options else "") + (
        f" + lookup G={out.options['lookup_guesses']}" if out.options.get("lookup_guesses") else "")
    n, measured, secs, rate = len(out.tokens), (out.auto or {}).get("measure_seconds") or 0.0, _secs(out.seconds), \
        f"{out.tokens_per_second:.1f}"
    compact = setting.replace(" + lookup ", "+lookup ")
    parts = {"rate": (f"[{setting}] {n} tokens in {secs} s: {rate} tokens/s",
                      f"[{setting}] {n} tokens, {secs} s, {rate} tok/s", f"[{setting}] {n} tok, {secs} s, {rate} tok/s",
                      f"[{compact}] {n} tok, {secs} s, {rate} tok/s")}
    if out.compile_seconds > 0:
        parts["compile"] = (f"compiled in {out.compile_seconds:.1f} s", f"compile {out.compile_seconds:.1f} s",
                            f"compile {out.compile_seconds:.0f} s")
    parts["S"] = (f"S {out.compression:.2f} ({out.steps} steps)", f"S {out.compression:.2f}", "")
    if measured:
        parts["auto"] = (f"auto measured {measured:.1f} s", f"auto {measured:.1f} s", "")
    if cut_at is not None:
        parts["cut"] = (f"cut at --max-new-tokens {cut_at}", "cut at the limit", "cut")
    # shorter wording first, then the least needed parts left out; tokens, tokens/s and compile stay
    lines = [_fit(parts, ["cut", "S", "auto", "compile", "cut", "auto", "S", "rate", "rate", "compile", "rate"])]
    if greedy is not None:
        speedup = out.tokens_per_second / max(greedy.tokens_per_second, 1e-9)
        lines.append(f"[greedy] {greedy.tokens_per_second:.1f} tokens/s, speed-up {speedup:.2f}x; "
                     + _identical_to_greedy(model, prompt_ids, out.tokens, greedy.tokens))
        if speedup < 1:
            lines.append(f"hint: {out.method} is slower than greedy on this device ({jax_backend()}); "
                         "--method auto picks the fastest setting here")
    return lines


def _chat(args) -> int:
    import jaxspec

    options = dict(method=args.method, max_new_tokens=args.max_new_tokens, **_sampling(args),
                   **_method_options(args))
    _warn_unused_sampling(args)
    from jaxspec import progress

    phases = progress.activate(progress.Phases(progress.wanted(args.quiet or args.json)))
    with phases.phase(f"loading {args.model}"):
        model = _load(args, args.model, options)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    said_auto = [None]  # the setting auto chose last: its reason is said when it changes

    def greedy_of(reply):
        if not args.compare:
            return None
        if args.temperature != 0:
            raise jaxspec.GenerationError("--compare checks a lossless method against greedy: use temperature 0")
        return jaxspec.generate(model, reply.prompt_ids, max_new_tokens=args.max_new_tokens, stop_ids=reply.stop_ids)

    def turn(text: str) -> None:
        nonlocal messages
        # auto's measurements and compiling (the first reply; a longer conversation may compile
        # again) say themselves before the reply streams (`jaxspec.progress`)
        live = jaxspec.chat_stream(model, [*messages, {"role": "user", "content": text}],
                                   chunk_steps=args.chunk_steps, **options)
        for piece in live:
            phases.flush()  # (what the wait before the first piece was, before the reply)
            print(piece, end="", flush=True)
        print(flush=True)
        reply = live.reply
        messages = reply.messages
        greedy = greedy_of(reply)
        phases.flush()
        out = reply.output
        if out.auto is not None and said_auto[0] != (out.method, out.options):
            said_auto[0] = (out.method, out.options)
            print(f"[auto] {out.auto['reason']}", file=sys.stderr)
        cut = None if reply.finish_reason == "end_of_turn" else args.max_new_tokens
        print("\n".join(_stats_lines(model, out, reply.prompt_ids, greedy, cut)), file=sys.stderr)

    if args.message is not None:
        if args.json:
            reply = jaxspec.chat(model, [*messages, {"role": "user", "content": args.message}], **options)
            greedy = greedy_of(reply)
            out = reply.output
            difference = None
            if greedy is not None:
                from jaxspec.decoding import exactness

                difference = exactness.compare(model, reply.prompt_ids, greedy.tokens, out.tokens)
            print(json.dumps({"reply": reply.text, "finish_reason": reply.finish_reason, "tokens": out.tokens,
                              "steps": out.steps, "compression": out.compression, "seconds": out.seconds,
                              "tokens_per_second": out.tokens_per_second, "method": out.method,
                              "identical_to_greedy": None if greedy is None else out.tokens == greedy.tokens,
                              "first_difference": None if difference is None else
                              {**dataclasses.asdict(difference), "near_tie": difference.near_tie},
                              "config": {"model": model.source, "dtype": args.dtype, **_sampling(args),
                                         "max_new_tokens": args.max_new_tokens, **out.options},
                              "memory": out.memory}))
        else:
            turn(args.message)
        return 0
    phases.flush()
    print(f"chatting with {model.source} ({args.method}); an empty line or Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            text = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if not text.strip():
            return 0
        turn(text)


def _overrides(args) -> dict[str, dict] | None:
    """--set SECTION.KEY=VALUE (VALUE read as TOML, else as a string) and --steps, as config overrides."""
    import tomllib

    out: dict[str, dict] = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. --set pard.cat=false")
        try:
            parsed = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value.strip()  # a bare word: a string (init=target:2, corpus=stdlib)
        out.setdefault(section, {})[name] = parsed
    if args.steps is not None:
        out.setdefault("train", {})["steps"] = args.steps
    return out or None


def _train(args) -> int:
    _initialize_distributed(args)  # data parallel across processes: the mesh spans all their devices
    from jaxspec.train.train_config import load_train_config
    from jaxspec.train.trainer import train

    cfg = load_train_config(args.config, _overrides(args))
    out_dir = args.out or f"runs/{cfg.name}"
    log = (lambda *a, **k: print(*a, file=sys.stderr, **k))
    result = train(cfg, out_dir, resume=args.resume, log=log, progress=args.progress, export=args.export)
    summary = {"out_dir": str(result.out_dir), "steps": result.steps, "final_loss": result.final_loss,
               "eval_loss": result.eval_loss, "eval_bits_per_byte": result.eval_bits_per_byte,
               "seconds": result.seconds, "tokens_seen": result.tokens_seen,
               "export_dir": None if result.export_dir is None else str(result.export_dir)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"trained {cfg.name}: held-out loss {result.eval_loss:.4f} nats/token, "
              f"{result.eval_bits_per_byte:.4f} bits/byte; run folder {result.out_dir}")
    return 0


def _train_drafter(args) -> int:
    from jaxspec.train.drafter_config import load_drafter_config
    from jaxspec.train.drafter_trainer import train_drafter

    cfg = load_drafter_config(args.config, _overrides(args))
    result = train_drafter(cfg, args.out or f"runs/{cfg.name}", resume=args.resume,
                           log=lambda *a, **k: print(*a, file=sys.stderr, **k), progress=args.progress,
                           export=args.export)
    summary = {"out_dir": str(result.out_dir), "steps": result.steps, "final_loss": result.final_loss,
               "seconds": result.seconds, **result.eval,
               "export_dir": None if result.export_dir is None else str(result.export_dir)}
    print(json.dumps(summary) if args.json else f"trained drafter {cfg.name}: " + ", ".join(
        f"{k} {v:.3f}" for k, v in result.eval.items() if k.startswith("accept_len")) + f"; run folder {result.out_dir}")
    return 0


def _check_export_target(model_path: Path, out: Path, force: bool) -> Path:
    """The real path to write to; CheckpointError for an --out that is a file, is (or is
    inside, or holds) the model being exported, or is not empty without --force."""
    from jaxspec.errors import CheckpointError

    if out.exists() and not out.is_dir():
        raise CheckpointError(f"--out {out} is a file, not a folder; pass a folder path")
    source, target = model_path.resolve(), out.resolve()
    if target == source or source in target.parents:
        raise CheckpointError(f"--out {out} is inside the model being exported ({model_path}); "
                              "export to a folder outside it")
    if target in source.parents:
        raise CheckpointError(f"--out {out} holds the model being exported ({model_path}); "
                              "export to a folder that does not contain it")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise CheckpointError(f"--out {out} is not empty; choose a new folder, or pass --force to replace "
                              "its contents")
    return target


def _save_replacing(model, target: Path, dtype: str) -> Path:
    """`model.save` into a temporary folder beside `target`, then swap it in: `target` is only
    ever the old folder or the complete new one, and the old one is removed last."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.export-{os.getpid()}")
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save(tmp, dtype=dtype)
        if target.exists():
            os.replace(target, old)
            try:
                os.replace(tmp, target)
            except BaseException:
                os.replace(old, target)  # put the old folder back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _export(args) -> int:
    import jaxspec
    from jaxspec.checkpoint.loading import resolve

    target = _check_export_target(resolve(args.model), Path(args.out), args.force)
    model = jaxspec.load(args.model, dtype=args.dtype)
    _save_replacing(model, target, args.dtype)
    print(f"saved {model.config.architecture} to {args.out}")
    return 0


def _serve(args) -> int:
    import jaxspec
    from jaxspec.errors import GenerationError

    method_options = _method_options(args)
    fixed = [flag for flag, given in (("--top-k", args.top_k != 0), ("--top-p", args.top_p != 1.0),
                                      ("--min-p", args.min_p != 0), ("--repetition-penalty", args.repetition_penalty != 1),
                                      ("--presence-penalty", args.presence_penalty != 0),
                                      ("--frequency-penalty", args.frequency_penalty != 0),
                                      ("--tensor-parallel", args.tensor_parallel != 1),
                                      ("--data-parallel", args.data_parallel != 1),
                                      ("--lp-devices", "lp_devices" in method_options)) if given]
    if fixed:
        raise GenerationError(f"{', '.join(fixed)}: not a server setting (sampling and penalties are set per request; "
                              "serve decodes on one device)")
    if not 0 <= args.port < 65536:
        raise GenerationError(f"--port must be in [0, 65535], got {args.port}")
    for flag, value in (("--max-body-bytes", args.max_body_bytes), ("--body-timeout", args.body_timeout),
                        ("--header-timeout", args.header_timeout)):
        if not value > 0:
            raise GenerationError(f"{flag} must be > 0, got {value}")
    if args.api_key is not None and not args.api_key.strip():
        raise GenerationError("--api-key (or JAXSPEC_API_KEY) is empty")
    try:
        from jaxspec.serving import app, make_server
    except ImportError as e:
        raise GenerationError(str(e)) from None
    hosts = [h.strip().lower() for h in args.allowed_hosts.split(",") if h.strip()] if args.allowed_hosts \
        else app.default_hosts(args.host)
    limits = app.Limits(api_key=args.api_key, allowed_hosts=tuple(hosts),
                        allowed_origins=tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip()),
                        max_body_bytes=args.max_body_bytes, body_timeout_s=args.body_timeout,
                        header_timeout_s=args.header_timeout)
    try:  # the port first: a busy one is said before a minute of loading and compiling
        sock = app.listen(args.host, args.port)
    except OSError as e:
        raise GenerationError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    from jaxspec import progress

    phases = progress.activate(progress.Phases(progress.wanted(args.quiet)))
    name = args.model or jaxspec.checkpoint.loading.DEFAULT_MODEL
    with phases.phase(f"loading {name}"):
        model = jaxspec.load(name, dtype=args.dtype, attention=args.attention)
    # auto's measurements and the warm-up say themselves (`jaxspec.progress`)
    server = make_server(model, args.served_model_name or name, method=args.method, method_options=method_options,
                         slots=args.slots, context=args.context, chunk_steps=args.chunk_steps,
                         temperature=args.temperature, max_groups=args.max_groups, limits=limits,
                         max_plans=args.max_plans, drafter_dirs=args.drafter_dir,
                         special_tokens=args.allow_special_tokens, log_requests=args.log_requests, seed=args.seed)
    progress.close()  # the cold start is over: requests' work is not reported here
    if server.auto_reason:
        options = ", ".join(f"{k}={v}" for k, v in server.settings.method_options)
        print(f"jaxspec: --method auto chose {server.settings.method}" + (f" ({options})" if options else "")
              + f" for requests that name no method: {server.auto_reason}", file=sys.stderr)
    try:
        app.run(server, args.host, args.port, drain_seconds=args.drain_seconds, sock=sock)
    except OSError as e:
        raise GenerationError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from jaxspec.runtime import compile_cache

    compile_cache.enable()  # a second call with the same shapes loads its programs from disk
    from jaxspec import progress

    try:
        return {"generate": _generate, "chat": _chat, "train": _train, "export": _export,
                "train-drafter": _train_drafter, "serve": _serve}[args.command](args)
    except JaxspecError as e:
        progress.discard()  # bad input: its one line alone (a phase line held back is dropped)
        print(f"jaxspec: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # an unreadable checkpoint or output path: still one line, no traceback
        progress.discard()
        print(f"jaxspec: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        progress.close()


if __name__ == "__main__":
    sys.exit(main())
