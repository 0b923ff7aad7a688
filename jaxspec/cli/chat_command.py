"""`jaxspec chat`: a conversation with an instruction-tuned model, each reply streamed."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from jaxspec.cli.arguments import (add_decoding_options, load_model, method_options_from, sampling_options,
                                   warn_unused_sampling)
from jaxspec.cli.reporting import stats_lines


def add_parser(sub) -> None:
    c = sub.add_parser("chat", help="chat with an instruction-tuned model (history kept, reply streamed)")
    c.add_argument("--model", required=True, help="HF folder or .gguf file with a chat template, a Hugging Face hub "
                                                  "id in the local cache (org/name), or a known name "
                                                  "(smollm2-135m-instruct)")
    c.add_argument("--message", help="one user message: print the reply and exit (default: interactive)")
    c.add_argument("--system", help="a system message before the conversation")
    c.add_argument("--max-new-tokens", type=int, default=256, help="per reply")
    c.add_argument("--stop", action="append", metavar="TEXT",
                   help="end each reply before TEXT (OpenAI's stop; repeatable, up to 4)")
    add_decoding_options(c)
    c.add_argument("--chunk-steps", type=int, default=4, help="decoding steps between two streamed pieces")
    c.add_argument("--compare", action=argparse.BooleanOptionalAction, default=False,
                   help="also decode each reply greedily and say whether the method's reply is identical "
                        "(default here: off, a second decode per turn; generate's: on)")
    c.add_argument("--json", action="store_true", help="with --message: print one JSON object, no streaming")
    c.add_argument("--quiet", action="store_true",
                   help="no progress lines (loading, auto's measurements, compiling) on stderr")


def run_chat(args) -> int:
    """`jaxspec chat`: one reply (--message) or a conversation on the terminal; the exit code."""
    import jaxspec

    options = dict(method=args.method, max_new_tokens=args.max_new_tokens, stop=args.stop, **sampling_options(args),
                   **method_options_from(args))
    warn_unused_sampling(args)
    from jaxspec import progress

    phases = progress.activate(progress.Phases(progress.wanted(args.quiet or args.json)))
    with phases.phase(f"loading {args.model}"):
        model = load_model(args, args.model, options)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    said_auto = [None]  # the setting auto chose last: its reason is said when it changes

    def greedy_of(reply):
        if not args.compare:
            return None
        if args.temperature != 0:
            raise jaxspec.GenerationError("--compare checks a lossless method against greedy: use temperature 0")
        return jaxspec.generate(model, reply.prompt_ids, max_new_tokens=args.max_new_tokens, stop_ids=reply.stop_ids,
                                stop=args.stop)

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
        cut = None if reply.finish_reason == "stop" else args.max_new_tokens
        print("\n".join(stats_lines(model, out, reply.prompt_ids, greedy, cut)), file=sys.stderr)

    if args.message is not None:
        if args.json:
            reply = jaxspec.chat(model, [*messages, {"role": "user", "content": args.message}], **options)
            print(json.dumps(_json_reply(args, model, reply, greedy_of(reply))))
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


def _json_reply(args, model, reply, greedy) -> dict:
    """--json: the reply, its statistics and settings as one object; with `greedy` (--compare),
    whether the reply is greedy's and where it first differs."""
    out = reply.output
    difference = None
    if greedy is not None:
        from jaxspec import exactness

        difference = exactness.compare(model, reply.prompt_ids, greedy.tokens, out.tokens)
    return {"reply": reply.text, "finish_reason": reply.finish_reason, "tokens": out.tokens,
            "steps": out.steps, "compression": out.compression, "seconds": out.seconds,
            "tokens_per_second": out.tokens_per_second, "method": out.method,
            "identical_to_greedy": None if greedy is None else out.tokens == greedy.tokens,
            "first_difference": None if difference is None else
            {**dataclasses.asdict(difference), "near_tie": difference.near_tie},
            "config": {"model": model.source, "dtype": model.dtype, **sampling_options(args),
                       "max_new_tokens": args.max_new_tokens, **out.options},
            "memory": out.memory}
