"""What the commands share: the parser (bad input prints one line to stderr and exits with
code 2), the decoding and multi-process options, the flags read back as `jaxspec.generate`
options, and the error handling around a command."""

from __future__ import annotations

import argparse
import sys

from jaxspec.errors import JaxspecError

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


class CommandParser(argparse.ArgumentParser):
    """The parser of `jaxspec` and of each of its commands: bad input is one line on stderr and
    exit code EXIT_BAD_INPUT; --help shows the defaults worth saying."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line instead of argparse's usage block
        print(f"jaxspec: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


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


DTYPES = ("float32", "bfloat16", "int8", "blocks")


def _dtype(text: str) -> str | None:
    """--dtype: jaxspec's names, and vLLM's `auto` (the default) and `float`."""
    name = {"auto": None, "float": "float32"}.get(text, text)
    if name is not None and name not in DTYPES:
        hint = " (half precision here is bfloat16)" if text in ("half", "float16") else ""
        raise argparse.ArgumentTypeError(f"--dtype must be auto, {', '.join(DTYPES)}, got {text!r}{hint}")
    return name


def add_decoding_options(g: argparse.ArgumentParser) -> None:
    """The options of a command that decodes (generate, chat, serve): the method, sampling and
    penalties, the weights' dtype and layout, and each method's own flags (`METHOD_FLAGS`)."""
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
    g.add_argument("--dtype", default=None, type=_dtype, metavar="{auto,float32,bfloat16,int8,blocks}",
                   help="the weights' dtype (int8: quantized per output channel; blocks: a GGUF's Q8_0/Q4_x/Q5_x "
                        "blocks kept, the float32 weights exactly; both with float32 activations; vLLM's float = "
                        "float32; auto, the default: blocks for a GGUF file on one device, else float32)")
    g.add_argument("--attention", default="xla", help="attention backend (xla|pallas)")
    g.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=False,
                   help="compute every row's logits in one order whatever the step's block size, batch and cache "
                        "length, so every method equals greedy bit for bit in every dtype (docs/performance.md, "
                        "\"Batch invariance\"; XLA attention only)")
    g.add_argument("--layer-scan", action=argparse.BooleanOptionalAction, default=None,
                   help="hold the layers as one stack run by lax.scan: each program compiles one layer, in a "
                        "fraction of the time and memory, with the same numerics (docs/performance.md, \"Layer "
                        "scan\"; default: where it was measured no slower, one device and layers of one structure)")
    g.add_argument("--tensor-parallel", "--tensor-parallel-size", dest="tensor_parallel", type=int, default=1,
                   metavar="T",
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
    sp.add_argument("--first-alternatives", dest="first_alternatives", type=int,
                    help="also verify the drafter's next A most likely first drafts, one token each (default 0)")
    sp.add_argument("--lookup-guesses", dest="lookup_guesses", type=int,
                    help="speculative: also verify up to G prompt-lookup candidates per step (default 0: none)")
    sp.add_argument("--lookup-ngram", dest="lookup_ngram", type=int,
                    help="speculative: prompt-lookup n-gram size N (candidates of N-1 tokens; default 5)")
    sp.add_argument("--lookup-route", dest="lookup_route", action="store_true", default=None,
                    help="speculative with --lookup-guesses: verify one chain a step, the best lookup candidate's "
                         "or the drafter's, chosen by the drafter's confidence (fewer tokens a step)")


def add_distributed_options(parser: argparse.ArgumentParser) -> None:
    """--coordinator, --num-processes, --process-id: the multi-process run `join_distributed_run` joins."""
    d = parser.add_argument_group(
        "multi-process runs (every process runs the same command with its own --process-id; "
        "defaults: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)")
    d.add_argument("--coordinator", help="HOST:PORT of process 0's coordinator, e.g. 10.0.0.1:1234")
    d.add_argument("--num-processes", type=int, help="number of processes in the run")
    d.add_argument("--process-id", type=int, help="this process's index in [0, num_processes)")


def join_distributed_run(args) -> None:
    """Join the multi-process run the options (or environment) describe, before JAX starts."""
    from jaxspec.models.meshes import initialize_distributed

    initialize_distributed(args.coordinator, args.num_processes, args.process_id)


# Method options the CLI forwards to `jaxspec.generate` when given, and the flag that sets each.
METHOD_FLAGS = {"window": "--window", "ngram": "--ngram", "guesses": "--guesses",
                "pool_from_prompt": "--no-pool-from-prompt", "verify_window": "--no-verify-window",
                "lp_devices": "--lp-devices", "drafter": "--drafter", "draft_len": "--draft-len",
                "target_features": "--target-independent", "lookup_guesses": "--lookup-guesses",
                "lookup_ngram": "--lookup-ngram", "lookup_route": "--lookup-route",
                "first_alternatives": "--first-alternatives"}


def method_options_from(args) -> dict:
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


def warn_unused_sampling(args) -> None:
    """--top-k / --top-p shape sampling only: say so when greedy decoding ignores them."""
    unused = [flag for flag, given in (("--top-k", args.top_k != 0), ("--top-p", args.top_p != 1.0)) if given]
    if unused and args.temperature == 0:
        print(f"jaxspec: note: {' and '.join(unused)} {'is' if len(unused) == 1 else 'are'} ignored under greedy "
              "decoding (--temperature 0); pass --temperature > 0 to sample", file=sys.stderr)


def load_model(args, model: str, method_options: dict):
    """The model on the mesh the options ask for. `--lp-devices L --tensor-parallel T`: straight
    onto the (lp, model) mesh of L x T devices, each process reading only its slices."""
    import jaxspec
    from jaxspec.models.meshes import lp_mesh

    lp = method_options.get("lp_devices", 1)
    if lp > 1 and args.tensor_parallel > 1 and args.data_parallel == 1:
        return jaxspec.load(model, dtype=args.dtype, attention=args.attention, mesh=lp_mesh(lp, args.tensor_parallel),
                            batch_invariant=args.batch_invariant, layer_scan=args.layer_scan)
    return jaxspec.load(model, dtype=args.dtype, attention=args.attention, tensor_parallel=args.tensor_parallel,
                        batch_invariant=args.batch_invariant, layer_scan=args.layer_scan,
                        data_parallel=args.data_parallel)


def sampling_options(args) -> dict:
    """The sampling and penalty flags as `jaxspec.generate` keyword arguments."""
    return dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, min_p=args.min_p,
                repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                frequency_penalty=args.frequency_penalty)


def run_command(handler, args) -> int:
    """`handler(args)`'s exit code; bad input (a `JaxspecError`, or an `OSError` such as an
    unreadable checkpoint or output path): its one line on stderr and EXIT_BAD_INPUT."""
    from jaxspec import progress

    try:
        return handler(args)
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
