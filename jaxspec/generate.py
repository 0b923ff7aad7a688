"""`jaxspec.generate` and `jaxspec.stream`: validate a request, run one compiled decoding loop,
report what it did.

`generate` runs the whole loop as one program. `stream` runs the same engine as two programs:
`begin` (prefill, first token) and `advance` (steps until a traced step count), called chunk
after chunk on the state pytree it returns, so tokens reach the caller every few steps
without a host round trip per step and without recompiling per chunk."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import progress
from jaxspec.runtime import auto
from jaxspec import stop_strings
from jaxspec.runtime import compile_cache
from jaxspec.runtime.step_modes import Acceptance, StepModes
from jaxspec.errors import GenerationError, PromptError, shown
from jaxspec.inputs import as_bool, describe, given, int_arg, is_array, normalize_prompts, number_arg, plain_option
from jaxspec.checkpoint.loading import Model
from jaxspec.runtime.memory import MemoryEstimate
from jaxspec.decoding.engine import finish
from jaxspec.decoding.methods import ALIASES, METHODS, advance, begin, decode
from jaxspec.runtime.plan import (AUTO_RUNGS_FROM, CONVERSATION_RUNGS_FROM, Program, context_cache_len,
                                  plan_decode, prompt_bucket, resolve)
from jaxspec.decoding.sampling import MAX_LOGPROBS, SAMPLING_BOUNDS, SamplingParams, penalized


@dataclasses.dataclass
class GenerateOutput:
    tokens: list  # new ids: list[int] for one prompt, list[list[int]] for a batch
    steps: int | list[int]  # model forwards, prefill included
    compression: float | list[float]  # new tokens / steps
    seconds: float  # decode wall time, compilation excluded
    tokens_per_second: float
    method: str
    compile_seconds: float
    text: str | list[str] | None = None
    # logprobs=k: per generated token, {"token", "logprob", "top_logprobs": [(id, logprob), ...k]},
    # the target's own (raw) distribution at that token, whatever the method (one list per prompt)
    logprobs: list | None = None
    options: dict = dataclasses.field(default_factory=dict)  # the method's options, defaults filled in
    extras: dict = dataclasses.field(default_factory=dict)  # method-specific statistics
    # Device memory: the estimate made before compiling (`jaxspec.runtime.memory`), the free memory it was
    # checked against, and XLA's own analysis of the compiled program ("compiled").
    memory: dict = dataclasses.field(default_factory=dict)
    # method="auto" / window="auto": what was chosen and why (`jaxspec.runtime.auto.Choice.as_dict`), else None.
    auto: dict | None = None
    # "stop" (an EOS or stop id ended it, or a `stop` string) | "length" (max_new_tokens), per prompt: the
    # server's (OpenAI's) words
    finish_reason: str | list[str] = "length"


@dataclasses.dataclass
class Request:
    """A validated generation request: its program (`jaxspec.runtime.plan.Program`: the engine, the
    shapes, the static arguments) and the program's device inputs."""

    name: str
    options: Any
    program: Program
    args: tuple  # (graphdef, params, prompts, lengths, rng, sampling)
    batched: bool
    memory: MemoryEstimate | None = None
    auto: Any = None  # `jaxspec.runtime.auto.Choice` when method="auto" or window="auto" chose the method
    arguments: dict = dataclasses.field(default_factory=dict)  # `prepare`'s, as given (a setting to try is
    # prepared from them in the background)
    shape: tuple = ()  # the ledger's request shape (`_Learning`)

    @property
    def engine(self):
        return self.program.plan.engine

    @property
    def statics(self) -> dict:
        return self.program.statics

    def compile_key(self, program: str) -> tuple:
        return self.program.key(program)


@dataclasses.dataclass(frozen=True)
class _Learning:
    """What `auto`'s ledger of a request is keyed by (`jaxspec.runtime.auto.Ledger.of`), and the
    shape its programs are compiled for: a setting compiled in the background for one request is
    ready for the next of the same shape."""

    batch: int
    kind: str  # "generate" / "stream" (+ "+logits": penalties or logprobs)
    sampled: bool
    lookahead_only: bool
    shape: tuple  # (prompt buffer, max_new_tokens, the generation arguments)

    def ledger(self) -> dict:
        return dict(kind=self.kind, sampled=self.sampled)

    def ready(self, model: Model):
        done = _background(model).ready
        return lambda candidate: (candidate.label, self) in done


def _background(model: Model):
    from jaxspec.runtime.background import Background

    if model.background is None:
        model.background = Background()
    return model.background


def _choose(model: Model, learning: _Learning, method: str, method_options: dict):
    """`method="auto"` (no method options) or `"lookahead", window="auto"` (ngram and guesses
    chosen too; the other lookahead options kept): the method and options `jaxspec.runtime.auto`'s
    ledger picks, at once."""
    if method == "auto" and method_options:
        raise GenerationError(f"method 'auto' chooses the method and its options; it takes none, got "
                              f"{', '.join(sorted(method_options))}")
    if method == "lookahead" and {"ngram", "guesses"} & {k for k, v in method_options.items() if v is not None}:
        raise GenerationError("window='auto' chooses ngram and guesses too; do not pass them")
    choice = auto.choose(model, learning.batch, lookahead_only=learning.lookahead_only, ready=learning.ready(model),
                         **learning.ledger())
    options = {k: v for k, v in method_options.items() if k != "window"}
    return choice.method, {**options, **choice.options}, choice


def _hashable(value):
    """A generation argument as a key part (arrays, even 0-d, are not hashable); one not checked yet
    and not plain (its own error comes later) by its repr."""
    try:
        if is_array(value) or isinstance(value, (list, tuple)):
            return tuple(np.asarray(value).tolist()) if np.ndim(value) else np.asarray(value).item()
        hash(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _check_length(model: Model, rows: list[list[int]], max_new_tokens: int) -> None:
    longest = max(len(r) for r in rows)
    limit = model.config.max_position_embeddings
    if longest + max_new_tokens > limit:
        raise PromptError(
            f"prompt ({longest} tokens) + max_new_tokens ({shown(max_new_tokens)}) exceeds the model's "
            f"max length {limit}; shorten the prompt or lower max_new_tokens"
        )


# transformers' (and OpenAI's) generation arguments, which `generate` does not take: what to pass instead.
FOREIGN_ARGUMENTS = {
    "max_length": "max_new_tokens=N (the tokens generated, not counting the prompt)",
    "max_tokens": "max_new_tokens=N",
    "do_sample": "temperature > 0 to sample (with top_k / top_p); temperature=0, the default, decodes greedily",
    "num_beams": "no beam search: decoding is greedy (temperature=0) or sampled (temperature > 0)",
    "eos_token_id": "stop_ids=[...] (ids that end a row besides the model's EOS; stop_at_eos=False ignores EOS)",
    "num_return_sequences": "a list of prompts (a batch), or one call per seed",
    "streamer": "jaxspec.stream(model, prompt, ...), which yields the text as it is decoded",
}


# Where an argument of FOREIGN_ARGUMENTS comes from, when not from transformers' `generate`.
FOREIGN_ORIGINS = {"max_tokens": "an OpenAI / vLLM"}


def _refuse_foreign(method_options: dict) -> None:
    for name in method_options:
        if name in FOREIGN_ARGUMENTS:
            origin = FOREIGN_ORIGINS.get(name, "a transformers")
            raise GenerationError(f"{name} is {origin} argument, not jaxspec's; pass {FOREIGN_ARGUMENTS[name]}")


def _sampling(temperature, top_k, top_p, **knobs) -> tuple[SamplingParams, tuple, dict]:
    """The sampling arguments checked: the `SamplingParams`, (temperature, top_k, top_p) and the
    other knobs (min_p, the penalties) as numbers. The types are checked here; the ranges (and
    their messages) are `SamplingParams.create`'s."""
    temperature = number_arg("temperature", temperature, SAMPLING_BOUNDS["temperature"].described)
    top_k = int_arg("top_k", top_k, "an integer in [0, 2**31) (0 = off)", lambda n: n < 2**31)
    top_p = number_arg("top_p", top_p, SAMPLING_BOUNDS["top_p"].described)
    knobs = {k: number_arg(k, v, SAMPLING_BOUNDS[k].described) for k, v in knobs.items()}
    return SamplingParams.create(temperature, top_k, top_p, **knobs), (temperature, top_k, top_p), knobs


def _end_ids(model: Model, stop_at_eos, stop_ids) -> tuple[int, ...]:
    """The ids that end a row: the model's EOS ids (unless `stop_at_eos` is false), then `stop_ids`."""
    stop_at_eos_flag = as_bool(stop_at_eos)
    if stop_at_eos_flag is None:
        raise GenerationError(f"stop_at_eos must be true or false, got {given(stop_at_eos)}")
    vocab = model.config.vocab_size
    if is_array(stop_ids) and np.ndim(stop_ids) == 1:
        stop_ids = np.asarray(stop_ids).tolist()
    if not isinstance(stop_ids, Sequence) or isinstance(stop_ids, (str, bytes, bytearray)):
        raise GenerationError(f"stop_ids must be a list of token ids, got {given(stop_ids)}")
    stop_ids = tuple(int_arg("stop_ids", t, f"token ids in [0, {vocab})", lambda n: 0 <= n < vocab)
                     for t in stop_ids)
    eos_ids = tuple(model.config.eos_token_ids) if stop_at_eos_flag else ()
    return tuple(dict.fromkeys(eos_ids + stop_ids))


def prepare(model: Model, prompt, max_new_tokens: int = 128, method: str = "autoregressive",
            temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
            stop_at_eos: bool = True, stop_ids: Sequence[int] = (), *, min_p: float = 0.0,
            repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
            logprobs: int | None = None, conversation: bool = False, _choice=None, **method_options) -> Request:
    """Check every argument and build the request (see `generate` for their meaning).
    `conversation`: shapes of a conversation turn (`stream`): the cache one rung of
    `context_cache_len` and the prompt padded to it less the reply's budget, so that every turn of
    a chat runs the programs its first turn compiled. `method="auto"` (and `window="auto"`) uses
    rungs too (smaller ones): what it compiles in the background serves later prompts of any length.

    Integer arguments take Python, numpy or jax integers (0-d arrays too); numbers take floats
    as well; anything else is a GenerationError naming the type given and what is expected."""
    arguments = dict(prompt=prompt, max_new_tokens=max_new_tokens, method=method, temperature=temperature,
                     top_k=top_k, top_p=top_p, seed=seed, stop_at_eos=stop_at_eos, stop_ids=stop_ids, min_p=min_p,
                     repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                     frequency_penalty=frequency_penalty, logprobs=logprobs, conversation=conversation,
                     **method_options)
    if not isinstance(model, Model):
        raise GenerationError(f"model must be a loaded model (model = jaxspec.load(name or path)), "
                              f"got {describe(model)}")
    if not isinstance(method, str):
        raise GenerationError(f"method must be a method name (str), got {describe(method)}")
    _refuse_foreign(method_options)
    compile_cache.enable()  # (on by default, as the CLI's: JAXSPEC_COMPILE_CACHE=off turns it off)
    method_options = {k: plain_option(v) for k, v in method_options.items()}
    max_new_tokens = int_arg("max_new_tokens", max_new_tokens, "an integer >= 1", lambda n: n >= 1)
    rows, batched = normalize_prompts(model, prompt)
    sampling, (temperature, top_k, top_p), knobs = _sampling(temperature, top_k, top_p, min_p=min_p,
                                                             repetition_penalty=repetition_penalty,
                                                             presence_penalty=presence_penalty,
                                                             frequency_penalty=frequency_penalty)
    if logprobs is not None:
        logprobs = int_arg("logprobs", logprobs, f"None or an integer in [0, {MAX_LOGPROBS}] (the most likely "
                           "tokens reported per token)", lambda n: 0 <= n <= MAX_LOGPROBS)
    generation = {k: _hashable(v) for k, v in dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                                   stop_at_eos=stop_at_eos, stop_ids=stop_ids, **knobs).items()}
    longest = max(len(r) for r in rows)
    logits = penalized(**{k: v for k, v in knobs.items() if k != "min_p"}) or logprobs is not None
    choosing = _choice is not None or method == "auto" or (method == "lookahead" and method_options.get("window") == "auto")
    rungs = CONVERSATION_RUNGS_FROM if conversation else AUTO_RUNGS_FROM if choosing else None
    buffer = prompt_bucket(longest) if rungs is None else context_cache_len(longest + max_new_tokens, 1 << 62, rungs)
    learning = _Learning(batch=len(rows), kind=("stream" if conversation else "generate") + ("+logits" * logits),
                         sampled=temperature != 0, lookahead_only=method == "lookahead",
                         shape=(buffer, max_new_tokens, tuple(sorted(generation.items()))))
    choice = _choice
    if choice is not None:
        method, method_options = choice.method, {**method_options, **choice.options}
    auto_chooses = choice is None and (method == "auto" or (method == "lookahead" and
                                                            method_options.get("window") == "auto"))
    # A method named is checked first (an unknown one is refused before the rest); the length before
    # auto chooses (a request that cannot run teaches auto nothing).
    resolved = None if auto_chooses else resolve(model, method, method_options)
    _check_length(model, rows, max_new_tokens)
    if auto_chooses:
        method, method_options, choice = _choose(model, learning, method, method_options)
        resolved = resolve(model, method, method_options)
    seed = int_arg("seed", seed, "an integer in [0, 2**32)", lambda n: 0 <= n < 2**32)
    # Before anything is compiled: refuse what cannot fit (one line).
    plan = plan_decode(model, resolved, greedy=temperature == 0,
                       penalties=penalized(**{k: v for k, v in knobs.items() if k != "min_p"}),
                       logprobs=-1 if logprobs is None else logprobs, batch=len(rows), prompt_len=prompt_bucket(longest),
                       max_new_tokens=max_new_tokens, eos_ids=_end_ids(model, stop_at_eos, stop_ids))
    program = plan.program(model, batch=len(rows), prompt_len=longest, max_new_tokens=max_new_tokens, rungs=rungs)
    request = Request(name=plan.name, options=plan.options, program=program,
                      args=program.arguments(model, rows, seed, sampling), batched=batched, auto=choice,
                      arguments=arguments, shape=(learning,))
    if choice is not None and choice.trying and not learning.lookahead_only and request.compile_key("advance" if conversation else "decode") \
            not in model.compiled:
        # A setting to try whose program is not the one compiled in the background (a shape at a
        # cache rung's edge): greedy now, never a compile on the caller's time for a try.
        fallback = dataclasses.replace(choice, method="autoregressive", options={}, trying=False,
                                       reason=f"greedy: {choice.label} is not compiled for this request's shape yet")
        return prepare(model, **{**arguments, "method": "autoregressive"}, _choice=fallback)
    # With the loop state's exact size (traced, not compiled): the estimate `generate` reports.
    request.memory = program.check_memory(model, request.args)
    return request


def _learn(model: Model, request: Request, out: "GenerateOutput", measured: bool) -> None:
    """After a decode: its measurement into `auto`'s ledger (an auto call's, or plain greedy's: a
    `--compare` run teaches greedy's rate for free) where it `measured` the setting (nothing
    compiled beside it: `_quiet`), then, for an auto call, the next setting to try compiled in the
    background (`jaxspec.runtime.background`) for the next request of this shape."""
    (learning,) = request.shape
    if request.auto is None and (request.name != "autoregressive" or learning.lookahead_only):
        return
    label = request.auto.label if request.auto is not None else "autoregressive"
    steps = int(np.sum(out.steps))
    tokens = sum(len(t) for t in (out.tokens if request.batched else [out.tokens]))
    # (a plain greedy call is learned in memory only: research code's loops of calls write no file;
    # the next auto call stores it)
    if measured:
        auto.record(model, learning.batch, label, steps, tokens, out.seconds, save=request.auto is not None,
                    **learning.ledger())
    if request.auto is None:
        return
    ready = learning.ready(model)
    candidate = auto.to_try(model, learning.batch, lookahead_only=learning.lookahead_only, ready=ready,
                            **learning.ledger())
    if candidate is None:
        return
    arguments = {k: v for k, v in request.arguments.items() if k != "window" or learning.lookahead_only}
    # (as a choice of auto's: the request's shapes are auto's cache rungs, as the later request's)
    as_chosen = auto.Choice(method=candidate.method, options=dict(candidate.options), reason="", candidates=())

    def compile_it():  # and run once: on a CPU a program's first run costs several of its later ones
        tried = prepare(model, **arguments, _choice=as_chosen)
        if request.arguments.get("conversation"):
            state, step_fn, _, _ = _stream_programs(model, tried, chunk_steps=1)
            jax.block_until_ready(step_fn(*tried.args[:2], state, tried.args[5], jnp.int32(1)))
        else:
            program, _ = compile_cache.compiled_into(model.compiled, tried.compile_key("decode"), decode, tried.args,
                                                     tried.statics)
            jax.block_until_ready(program(*tried.args))

    _background(model).submit((candidate.label, learning), compile_it)


def _compiled_memory(model: Model, key: tuple, program) -> dict:
    """XLA's memory analysis of a compiled program (empty where the backend gives none), read
    once per program: it costs ~13 ms on CPU, twice a small model's whole decode."""
    cache_key = ("compiled", key)
    if cache_key not in model.memory_estimates:
        try:
            m = program.memory_analysis()
        except Exception:  # noqa: BLE001  (not every backend implements it)
            m = None
        model.memory_estimates[cache_key] = {} if m is None else {
            "temp_bytes": int(m.temp_size_in_bytes), "argument_bytes": int(m.argument_size_in_bytes),
            "output_bytes": int(m.output_size_in_bytes)}
    return dict(model.memory_estimates[cache_key])


def _host(x) -> np.ndarray:
    """A decode output on the host. Rows split over a `data` axis that spans processes are not
    all in this one: they are gathered from every process (each calls this, in the same order)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def _output(model: Model, request: Request, state, stats: dict, seconds: float, compile_seconds: float,
            compiled_memory: dict, stops: tuple[str, ...] = ()) -> GenerateOutput:
    num = _host(state.num_generated)
    tokens = [row[:n].tolist() for row, n in zip(_host(state.tokens), num)]
    steps = _host(state.steps).tolist()
    compression = [n / s for n, s in zip(num.tolist(), steps)]
    one = (lambda x: x) if request.batched else (lambda x: x[0])  # per-row values, unwrapped for one prompt
    extras = {k: one(_host(v).tolist()) for k, v in stats.items()}
    eos = set(request.statics["eos_ids"])
    finish = ["stop" if t and t[-1] in eos else "length" for t in tokens]
    text = None
    if model.tokenizer is not None:
        text = [model.tokenizer.decode(t) for t in tokens]
        for i, row in enumerate(tokens):  # (decoded past a stop string: the loop runs on the device)
            hit = stop_strings.cut(model.tokenizer.decode, row, stops) if stops else None
            if hit is not None:
                (tokens[i], text[i]), finish[i] = hit, "stop"
    logprobs = None
    if state.logprobs is not None:
        logprobs = [token_logprobs(state.logprobs, i, ids) for i, ids in enumerate(tokens)]
    return GenerateOutput(
        tokens=one(tokens), steps=one(steps), compression=one(compression), seconds=seconds,
        tokens_per_second=float(num.sum()) / max(seconds, 1e-9),
        method=request.name, compile_seconds=compile_seconds, text=None if text is None else one(text),
        logprobs=None if logprobs is None else one(logprobs),
        options=request.options.as_dict(), extras=extras,
        memory={**request.memory.as_dict(), "compiled": compiled_memory},
        auto=None if request.auto is None else request.auto.as_dict(), finish_reason=one(finish),
    )


def token_logprobs(logprobs, row: int, tokens: list[int]) -> list[dict]:
    """One row's per-token log-probabilities from a decode state's `TokenLogprobs`, as dicts."""
    chosen, ids, top = (_host(x)[row] for x in (logprobs.chosen, logprobs.top_ids, logprobs.top))
    return [{"token": t, "logprob": float(chosen[j]),
             "top_logprobs": [(int(i), float(v)) for i, v in zip(ids[j], top[j])]} for j, t in enumerate(tokens)]


def generate(model: Model, prompt, max_new_tokens: int = 128, method: str = "autoregressive",
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
             stop_at_eos: bool = True, stop_ids: Sequence[int] = (), *, min_p: float = 0.0,
             repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
             logprobs: int | None = None, stop: str | Sequence[str] | None = None,
             **method_options) -> GenerateOutput:
    """Generate with any registered method; the whole loop is one compiled `lax.while_loop`.

    `stop_ids`: token ids that end a row besides the model's EOS ids (e.g. a chat's end of turn).
    `stop`: up to 4 strings (OpenAI's `stop`): the text ends before the first one found, the tokens
    with the one that completed it, and `finish_reason` is "stop" (`generate` decodes on to the end
    of its loop on the device and cuts after; `stream` stops at the chunk that completes it).
    `min_p` (sampling) and the penalties `repetition_penalty` (1 = off), `presence_penalty` and
    `frequency_penalty` (0 = off) follow vLLM's definitions and apply identically in every
    method, so each equals autoregressive decoding with the same values (greedy: token for token).
    `logprobs=k` (0-20) reports each token's log-probability under the target and its k most likely
    tokens (`.logprobs`).
    `method="auto"` picks the method and its options that decode fastest on this device, greedy
    unless another is measured to be clearly faster; `method="lookahead", window="auto"` picks
    (W, N, G); `.auto` of the output says what was chosen and why (`jaxspec.runtime.auto`).
    `method="lookahead"` or `"hybrid"` with `lp_devices=D` splits each step over the first D devices (lookahead
    parallelism, greedy only; see docs/scaling.md); in a multi-process run every process
    calls this with the same arguments and gets the same output.
    """
    stops = _stops(model, stop)
    request = prepare(model, prompt, max_new_tokens, method, temperature, top_k, top_p, seed, stop_at_eos,
                      stop_ids, min_p=min_p, repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                      frequency_penalty=frequency_penalty, logprobs=logprobs, **method_options)
    key = request.compile_key("decode")
    with progress.phase(f"compiling {request.name}", when=key not in model.compiled):
        program, compile_seconds = compile_cache.compiled_into(model.compiled, key, decode, request.args,
                                                               request.statics)
    quiet = _quiet(model)
    t0 = time.perf_counter()
    state, stats = program(*request.args)
    jax.block_until_ready(state.tokens)
    seconds = time.perf_counter() - t0
    out = _output(model, request, state, stats, seconds, compile_seconds, _compiled_memory(model, key, program),
                  stops)
    _learn(model, request, out, measured=quiet and _quiet(model))
    return out


def _quiet(model: Model) -> bool:
    """Whether nothing compiles in the background beside the caller now (a compile takes cores from a
    decode: one that ran beside it measures less than the setting's rate)."""
    return model.background is None or not model.background.busy()


def _stops(model: Model, stop) -> tuple[str, ...]:
    stops = stop_strings.check(stop)
    if stops and model.tokenizer is None:
        raise GenerationError(f"stop strings need a tokenizer; {model.source} has none (stop_ids ends on ids)")
    return stops


def _reference() -> str:
    """The options of each method and the fields of the output, for `help(jaxspec.generate)`
    (built from the option dataclasses and `GenerateOutput`, so it never drifts from them)."""
    lines = ["", "    Method options (keyword arguments; one left out takes the model's default, e.g. lookahead's",
             "    window from configs/lookahead.toml, a drafter's draft_len from its files):"]
    for name, method in METHODS.items():
        fields = dataclasses.fields(method.options)
        described = ", ".join(f"{f.name}={f.default!r}" for f in fields) or "none"
        lines.append(f"      {name}: {described}")
    lines.append("      auto: none (it chooses the method and its options); aliases: "
                 + ", ".join(f"{a} = {m}" for a, m in ALIASES.items()))
    lines += ["", "    Returns a GenerateOutput (per prompt where a batch was given):"]
    lines += [f"      {f.name}: {f.type}" for f in dataclasses.fields(GenerateOutput)]
    return "\n".join(lines)


@dataclasses.dataclass
class StreamChunk:
    tokens: list[int]  # ids generated since the previous chunk
    text: str | None  # their text (None without a tokenizer); a character split over chunks comes whole, later


class Stream:
    """`for chunk in jaxspec.stream(model, prompt, ...)`: `StreamChunk`s as the loop produces them;
    afterwards `.result` is the same `GenerateOutput` `generate` returns (the same tokens)."""

    def __init__(self, model: Model, request: Request, chunk_steps: int, stops: tuple[str, ...] = ()):
        self.model, self.request, self.chunk_steps, self.stops = model, request, chunk_steps, stops
        self.result: GenerateOutput | None = None

    def __iter__(self) -> Iterator[StreamChunk]:
        request, model = self.request, self.model
        graphdef, params, sampling = request.args[0], request.args[1], request.args[5]
        cold = not all(request.compile_key(p) in model.compiled for p in ("begin", "advance"))
        with progress.phase(f"compiling {request.name} (streamed)", when=cold):
            state, step_fn, self._compile_seconds, seconds = _stream_programs(model, request, self.chunk_steps)
        chunk = jnp.int32(self.chunk_steps)
        tokenizer = model.tokenizer
        modes, plain_fn = self._step_modes(state)
        acceptance = Acceptance(1)
        sent, text, steps, plain_steps = 0, "", 0, 0
        quiet_all = True  # (nothing compiled beside any chunk: the decode measured its setting)
        while True:
            mode = "drafted"
            if modes is not None:
                plain_fn = plain_fn or model.compiled.get(request.compile_key("advance-plain"))
                mode = modes.pick(1, {"drafted", "plain"} if plain_fn is not None else {"drafted"},
                                  acceptance.expected([0]))
            quiet = _quiet(model)
            t0 = time.perf_counter()
            state = (step_fn if mode == "drafted" else plain_fn)(graphdef, params, state, sampling, chunk)
            # The one host sync per chunk; copies, since the next chunk reuses the donated buffers.
            host = jax.device_get((state.decode.tokens, state.decode.num_generated, state.decode.done,
                                   state.decode.steps))
            row, num, done = np.array(host[0][0]), int(host[1][0]), bool(host[2][0])
            new = row[sent:num].tolist()
            elapsed = time.perf_counter() - t0
            seconds += elapsed
            quiet = quiet and _quiet(model)
            quiet_all = quiet_all and quiet
            if modes is not None:  # (a chunk measured only when nothing compiled beside it)
                ran = int(host[3][0]) - steps
                modes.ran(mode, num - sent)
                if mode == "drafted":
                    acceptance.add(0, num - sent, ran)
                else:
                    acceptance.aged(0)
                if quiet:
                    modes.record(1, mode, ran, num - sent, elapsed)
                plain_steps += ran if mode == "plain" else 0
            steps = int(host[3][0])
            piece = None
            if tokenizer is not None:
                kept, held, stopped = stop_strings.settled(tokenizer.decode, row[:num].tolist(), self.stops, done)
                if stopped:  # the rest is not wanted: the stream ends here
                    new, done = new[:max(len(kept) - sent, 0)], True
                piece, text = held[len(text):], held
            sent = num
            if new or piece:
                yield StreamChunk(tokens=new, text=piece)
            if done:
                break
        decoded, stats = finish(request.engine, state)
        self.result = _output(model, request, decoded, stats, seconds, self._compile_seconds,
                              _compiled_memory(model, request.compile_key("advance"), step_fn), self.stops)
        if modes is not None:  # which steps ran drafted, which plain (`jaxspec.runtime.step_modes`)
            self.result.auto["step_modes"] = {**modes.as_dict(), "plain_steps": plain_steps}
        _learn(model, request, self.result, measured=quiet_all)

    def _step_modes(self, state) -> tuple[StepModes | None, Any]:
        """Where `auto` chose a drafted setting that can also step plain over its state
        (`Engine.steps_plain`): each chunk drafted or plain, whichever this device measured faster
        for one row (the server's rule, `jaxspec.runtime.step_modes`), and the plain `advance`
        program (None until compiled: it compiles in the background, the stream goes on drafted)."""
        request, model = self.request, self.model
        if request.auto is None or not request.engine.steps_plain:
            return None, None
        key = request.compile_key("advance-plain")
        if key not in model.compiled:
            statics = request.program.step_statics
            shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
            args = (request.args[0], request.args[1], shapes, request.args[5], jnp.int32(self.chunk_steps))
            _background(model).submit(key, lambda: compile_cache.compiled_into(
                model.compiled, key, advance, args, {**statics, "plain": True}, donate_argnames=("state",)))
        return StepModes(model, request.auto.label, kind="stream-chunk", announce=False), model.compiled.get(key)


def _stream_programs(model: Model, request: Request, chunk_steps: int):
    """A stream's two programs (`begin`, then `advance` from the state it returns), compiled into
    `model.compiled` when missing; the state after `begin`, the `advance` program, the seconds
    compiling took and the seconds `begin` ran."""
    statics = request.statics
    advance_statics = request.program.step_statics
    graphdef, params, sampling = request.args[0], request.args[1], request.args[5]
    begin_fn, compiling = compile_cache.compiled_into(model.compiled, request.compile_key("begin"), begin,
                                                      request.args, statics)
    t0 = time.perf_counter()  # (after compiling: decoding alone)
    state = begin_fn(*request.args)
    seconds = time.perf_counter() - t0
    # The state is donated: each chunk updates the cache and buffers in place.
    step_fn, more = compile_cache.compiled_into(model.compiled, request.compile_key("advance"), advance,
                                                (graphdef, params, state, sampling, jnp.int32(chunk_steps)),
                                                advance_statics, donate_argnames=("state",))
    return state, step_fn, compiling + more, seconds


def stream(model: Model, prompt, max_new_tokens: int = 128, method: str = "autoregressive",
           temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
           stop_at_eos: bool = True, stop_ids: Sequence[int] = (), chunk_steps: int = 4, *, min_p: float = 0.0,
           repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
           logprobs: int | None = None, stop: str | Sequence[str] | None = None, **method_options) -> Stream:
    """Like `generate` for one prompt, but iterable: tokens come back every `chunk_steps` steps
    (one host sync per chunk). The tokens equal `generate`'s for the same arguments."""
    steps = int_arg("chunk_steps", chunk_steps, "an integer >= 1", lambda n: n >= 1)
    stops = _stops(model, stop)
    request = prepare(model, prompt, max_new_tokens, method, temperature, top_k, top_p, seed, stop_at_eos,
                      stop_ids, min_p=min_p, repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                      frequency_penalty=frequency_penalty, logprobs=logprobs, conversation=True, **method_options)
    if request.batched:
        raise PromptError("stream takes one prompt; use generate for a batch")
    return Stream(model, request, steps, stops)


generate.__doc__ += _reference()
stream.__doc__ += _reference().replace("Returns a GenerateOutput", "Its `.result`, once iterated, is a GenerateOutput")
