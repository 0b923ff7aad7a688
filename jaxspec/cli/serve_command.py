"""`jaxspec serve`: the OpenAI-compatible HTTP server (docs/serving.md)."""

from __future__ import annotations

import os
import sys

from jaxspec.cli.arguments import add_decoding_options, method_options_from


def add_parser(sub) -> None:
    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching (docs/serving.md)")
    v.add_argument("model_tag", nargs="?", metavar="MODEL", help="the model, as vLLM's `vllm serve MODEL` "
                   "(or --model)")
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
    sec.add_argument("--max-waiting", type=int, default=256,
                     help="choices waiting for a slot; past it a request gets 503 with Retry-After (default 256)")
    sec.add_argument("--drafter-dir", action="append", default=[], metavar="FOLDER",
                     help="a drafter folder requests may name (by its folder name); repeatable")
    sec.add_argument("--allow-special-tokens", action="store_true",
                     help="let chat content spell special tokens such as <|im_end|> (default: refused)")
    v.add_argument("--drain-seconds", type=float, default=600.0,
                   help="on SIGTERM, how long requests in flight may take to finish")
    v.add_argument("--gpu-memory-utilization", dest="memory_utilization", type=float, default=None, metavar="F",
                   help="the share of the device's free memory the memory guard lets decoding use, in (0, 1] "
                        "(default 1; vLLM's flag; also $JAXSPEC_MEMORY_UTILIZATION)")
    v.add_argument("--quiet", action="store_true",
                   help="no progress lines (loading, auto's measurements, warm-up) on stderr")
    add_decoding_options(v)
    for action in v._actions:  # (serve's --seed seeds the server, as vLLM's: requests carry their own)
        if action.dest == "seed":
            action.default, action.help = None, ("seeds the generator that draws the seed of each sampled request "
                                                 "that gives none (default: at random); in [0, 2**32)")


def run_serve(args) -> int:
    """`jaxspec serve`: the server's settings checked, the model loaded, then requests until SIGTERM; the exit code."""
    import jaxspec
    from jaxspec.errors import GenerationError

    method_options = method_options_from(args)
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
    if args.model_tag is not None and args.model is not None and args.model_tag != args.model:
        raise GenerationError(f"two models: {args.model_tag!r} and --model {args.model!r}")
    args.model = args.model or args.model_tag
    if args.memory_utilization is not None:
        if not 0 < args.memory_utilization <= 1:
            raise GenerationError(f"--gpu-memory-utilization must be in (0, 1], got {args.memory_utilization}")
        os.environ["JAXSPEC_MEMORY_UTILIZATION"] = repr(args.memory_utilization)
    if not 0 <= args.port < 65536:
        raise GenerationError(f"--port must be in [0, 65535], got {args.port}")
    for flag, value in (("--max-body-bytes", args.max_body_bytes), ("--body-timeout", args.body_timeout),
                        ("--header-timeout", args.header_timeout)):
        if not value > 0:
            raise GenerationError(f"{flag} must be > 0, got {value}")
    if args.api_key is not None and not args.api_key.strip():
        raise GenerationError("--api-key (or JAXSPEC_API_KEY) is empty")
    try:
        from jaxspec.serving import app, guard, make_server
    except ImportError as e:
        raise GenerationError(str(e)) from None
    hosts = [h.strip().lower() for h in args.allowed_hosts.split(",") if h.strip()] if args.allowed_hosts \
        else guard.default_hosts(args.host)
    limits = guard.Limits(api_key=args.api_key, allowed_hosts=tuple(hosts),
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
        model = jaxspec.load(name, dtype=args.dtype, attention=args.attention, batch_invariant=args.batch_invariant,
                             layer_scan=args.layer_scan)
    # auto's measurements and the warm-up say themselves (`jaxspec.progress`)
    server = make_server(model, args.served_model_name or name, method=args.method, method_options=method_options,
                         slots=args.slots, context=args.context, chunk_steps=args.chunk_steps,
                         temperature=args.temperature, max_groups=args.max_groups, limits=limits,
                         max_plans=args.max_plans, max_waiting=args.max_waiting, drafter_dirs=args.drafter_dir,
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
