"""OpenAI request bodies -> validated jobs; bad input -> `openai.ApiError` (OpenAI's error shape).

Every check a request can fail raises `ApiError` (an HTTP status and OpenAI's
`{"error": {"message", "type", "param", "code"}}`); nothing a client sends reaches the
scheduler unchecked. `Requests.parse` checks a body field group by field group (the fields and
the model, the answer's form, the prompt and its budget, sampling, stops, the method), each
field with the checks of `fields`. Fields OpenAI defines that jaxspec does not implement are
accepted at their neutral value and refused otherwise; so are vLLM's own fields
(`VLLM_NEUTRAL`: accepted where they change nothing, and named in the answer's `Warning`
header); unknown fields are refused, as OpenAI's API does.
`n` choices decode in n slots; the penalties, `min_p` and `logprobs` apply identically under
every method (`jaxspec.decoding.sampling`), so each answer is the one autoregressive decoding gives.

Extensions (beside OpenAI's fields): vLLM's `top_k`, `min_p`, `repetition_penalty`,
`stop_token_ids`, `ignore_eos`, and `method` + `method_options` (a decoding method for this
request, otherwise the server's).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jaxspec.stop_strings import MAX_STOPS
from jaxspec.chat import chat_prompt
from jaxspec.errors import GenerationError, JaxspecError, MemoryLimitError, shown
from jaxspec.inputs import normalize_prompts
from jaxspec.checkpoint.method_defaults import SHIPPED_DRAFTERS
from jaxspec.decoding.methods import ALIASES, METHODS
from jaxspec.runtime.plan import DecodePlan, plan_decode
from jaxspec.decoding.sampling import MAX_LOGPROBS, SERVER_TEMPERATURE, SamplingParams, penalized
from jaxspec.serving.fields import chat_messages, integer, neutral_only, number, same, typed
from jaxspec.serving.openai import ApiError, bad
from jaxspec.serving.scheduler import random_seed
from jaxspec.serving.slots import corner_share

COMMON_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "n",
                 "stream", "stream_options", "user", "presence_penalty", "frequency_penalty", "logprobs",
                 "logit_bias", "ignore_eos", "method", "method_options", "min_p", "repetition_penalty"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                               "tool_choice", "parallel_tool_calls"}
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "echo", "best_of", "suffix"}
# vLLM's own request fields (its extra sampling and request parameters) that change nothing here at
# the values listed (null: not set, always neutral; a type: any value of it): accepted there and ignored, the
# answer naming them in a `Warning` header (`app`); at any other value refused with a 400 naming the
# field, since jaxspec would not do what they ask.
VLLM_NEUTRAL: dict[str, Any] = {
    "use_beam_search": (False,), "length_penalty": (1.0,), "include_stop_str_in_output": (False,),
    "min_tokens": (0,), "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (), "allowed_token_ids": (), "bad_words": ([],), "prompt_logprobs": (),
    "logits_processors": (), "return_tokens_as_token_ids": (False,), "guided_json": (), "guided_regex": (),
    "guided_choice": (), "guided_grammar": (), "structural_tag": (), "guided_decoding_backend": (),
    "guided_whitespace_pattern": (), "priority": (0,), "request_id": str, "cache_salt": str,  # (no prefix cache)
    "vllm_xargs": ({},), "mm_processor_kwargs": ({},)}
# OpenAI's chat fields about storage, billing, reasoning and output kinds, which change nothing in a
# text answer here: accepted and named in the `Warning` header, as vLLM does.
OPENAI_CHAT_NEUTRAL: dict[str, Any] = {
    "store": bool, "metadata": dict, "service_tier": str, "reasoning_effort": str, "verbosity": str,
    "modalities": (["text"],), "prediction": dict}
VLLM_CHAT_NEUTRAL: dict[str, Any] = {
    **VLLM_NEUTRAL, **OPENAI_CHAT_NEUTRAL, "echo": (False,), "best_of": (1,), "add_generation_prompt": (True,),
    "continue_final_message": (False,), "add_special_tokens": (False,), "documents": (), "chat_template": (),
    "chat_template_kwargs": ({},)}
VLLM_COMPLETION_NEUTRAL: dict[str, Any] = {**VLLM_NEUTRAL, "add_special_tokens": (True,)}
MAX_CHOICES = 8  # n: each choice takes a slot
BOOL_OPTIONS = ("pool_from_prompt", "verify_window", "target_features")  # method options that are true/false


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """What the server was started with (`jaxspec serve` flags)."""

    model_id: str
    slots: int = 8
    context: int = 2048
    chunk_steps: int = 4
    method: str = "autoregressive"  # "auto" is resolved at start-up into a method + options
    method_options: tuple = ()  # ((name, value), ...)
    temperature: float = 0.0  # for requests that give none (0 = greedy: lossless against greedy)
    max_groups: int = 4
    max_plans: int = 8  # distinct (method, options, greedy, ignore_eos) the server compiles in its life
    max_waiting: int = 256  # choices waiting for a slot; past it a request gets 503 + Retry-After
    drafters: tuple = ()  # ((name, folder), ...): drafter folders the operator offers besides the shipped ones
    special_tokens: bool = False  # chat content may spell special tokens (off: such content is refused)
    # `auto` chose a drafted method whose slots pick drafted or plain steps per chunk (greedy requests
    # that name no method; `jaxspec.runtime.step_modes`)
    step_modes: bool = False


@dataclasses.dataclass
class Parsed:
    """A checked request: what the scheduler needs, and how to answer."""

    prompt: list[int]
    limit: int
    seed: int
    sampling: SamplingParams
    plan: DecodePlan
    stop_strings: tuple[str, ...]
    stop_ids: frozenset
    stream: bool
    include_usage: bool
    chat: bool
    continuous_usage: bool = False  # vLLM's stream_options.continuous_usage_stats: usage in every chunk
    n: int = 1  # choices, each decoded in its own slot (seeds seed, seed + 1, ...)
    logprobs: int | None = None  # top tokens reported per token (None: no logprobs)


def ignored_fields(body: dict, chat: bool) -> list[str]:
    """The vLLM fields of `body` that are accepted and ignored (`VLLM_NEUTRAL`); one at a value
    that would change the answer is a 400 naming it."""
    neutral = VLLM_CHAT_NEUTRAL if chat else VLLM_COMPLETION_NEUTRAL
    out = []
    for name in sorted(set(body) & set(neutral)):
        value, allowed = body[name], neutral[name]
        if value is None or (isinstance(allowed, type) and isinstance(value, allowed)
                             and (allowed is bool or not isinstance(value, bool))) or \
                (isinstance(allowed, tuple) and any(same(value, v) for v in allowed)):
            out.append(name)
            continue
        what = f"any {allowed.__name__}" if isinstance(allowed, type) else " or ".join(
            ["null", *(json.dumps(v) for v in allowed)])
        raise bad(f"{name}={json.dumps(value)[:100]} is not supported: jaxspec takes this vLLM field only where "
                  f"it changes nothing ({what})", name, "unsupported_parameter")
    return out


def json_body(raw: bytes):
    """A request body's JSON (any value: the routes check its shape); not JSON is a 400."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # (JSONDecodeError, bad UTF-8, an int past the digit limit)
        raise ApiError(400, f"the request body is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None


# ---------------------------------------------------------------------------- field groups
def _known_fields(body: Any, chat: bool, model_id: str) -> None:
    """A JSON object of known fields (vLLM's neutral ones included), naming the served model."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unknown = sorted(set(body) - allowed - set(ignored_fields(body, chat)))
    if unknown:
        raise bad(f"unrecognized request argument supplied: {shown(unknown[0])}", unknown[0], "unknown_parameter")
    name = typed(body, "model", str, "a str")
    if name is None:
        raise bad("you must provide a model parameter", "model")
    if name != model_id:
        raise ApiError(404, f"the model {name!r} does not exist; this server serves {model_id!r}", "model",
                       "model_not_found")


def _logprobs(body: dict, chat: bool) -> int | None:
    """The top tokens to report per token, None for no logprobs: chat's `logprobs` (true/false)
    + `top_logprobs`, a completion's `logprobs` (a count, as OpenAI's legacy API)."""
    if chat:
        wanted = typed(body, "logprobs", bool, "true or false", False)
        top = integer(body, "top_logprobs", None, 0, MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]")
        if top is not None and not wanted:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
        return (top or 0) if wanted else None
    return integer(body, "logprobs", None, 0, MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]")


def _unimplemented(body: dict) -> None:
    """OpenAI's fields jaxspec does not implement, at their neutral values only."""
    for field, neutral, why in (("echo", False, "the prompt is not echoed"), ("best_of", 1, "one candidate"),
                                ("suffix", "", "no insertion"), ("logit_bias", {}, "logits are not biased"),
                                ("tools", [], "no tool calls"), ("tool_choice", "none", "no tool calls")):
        neutral_only(body, field, neutral, why)
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise bad("response_format: only {'type': 'text'} is supported", "response_format",
                  "unsupported_parameter")


def _streaming(body: dict) -> tuple[bool, dict]:
    """`stream` and its `stream_options` (OpenAI's include_usage, vLLM's continuous_usage_stats)."""
    stream = typed(body, "stream", bool, "true or false", False)
    options = typed(body, "stream_options", dict, "an object", {})
    if set(options) - {"include_usage", "continuous_usage_stats"} or not all(
            isinstance(options.get(k, False), bool) for k in ("include_usage", "continuous_usage_stats")):
        raise bad("stream_options takes include_usage and vLLM's continuous_usage_stats (true or false)",
                  "stream_options")
    if options and not stream:
        raise bad("stream_options is only allowed with stream: true", "stream_options")
    return stream, options


def _limit(body: dict, chat: bool, prompt_tokens: int, context: int) -> int:
    """The new tokens asked for (`max_tokens`, chat's `max_completion_tokens`), within the context."""
    room = context - prompt_tokens
    if room < 1:
        raise bad(f"the prompt has {prompt_tokens} tokens; this server's context is {context} tokens "
                  "(prompt + output)", "messages" if chat else "prompt", "context_length_exceeded")
    limit_field = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    limit = integer(body, limit_field, room if chat else min(16, room), 1, 2**31, "an integer >= 1")
    if limit > room:
        raise bad(f"{limit_field}={limit} does not fit: the prompt has {prompt_tokens} tokens and the context "
                  f"is {context} (at most {room} new tokens)", limit_field, "context_length_exceeded")
    return limit


def _sampling(body: dict, default_temperature: float) -> tuple[float, float, int, dict]:
    """(temperature, top_p, top_k, the other knobs: min_p and the penalties)."""
    temperature = number(body, "temperature", default_temperature, SERVER_TEMPERATURE)
    top_p = number(body, "top_p", 1.0)
    top_k = integer(body, "top_k", 0, -1, 2**31 - 1, "an integer in [0, 2**31) (0 or vLLM's -1 = off)")
    knobs = dict(min_p=number(body, "min_p", 0.0), repetition_penalty=number(body, "repetition_penalty", 1.0),
                 presence_penalty=number(body, "presence_penalty", 0.0),
                 frequency_penalty=number(body, "frequency_penalty", 0.0))
    return temperature, top_p, max(top_k, 0), knobs


def _stops(body: dict, vocab: int) -> tuple[list[str], list[int]]:
    """`stop` (up to MAX_STOPS strings) and vLLM's `stop_token_ids`."""
    stops = body.get("stop")
    stops = [stops] if isinstance(stops, str) else ([] if stops is None else stops)
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(x, str) and x for x in stops):
        raise bad(f"stop must be a non-empty str or a list of up to {MAX_STOPS} of them", "stop")
    stop_ids = typed(body, "stop_token_ids", list, "a list of token ids", [])
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in stop_ids):
        raise bad(f"stop_token_ids must be token ids in [0, {vocab})", "stop_token_ids")
    return stops, stop_ids


def _method_options(body: dict) -> dict:
    """`method_options`: an object of numbers, strs and true/false (true/false where BOOL_OPTIONS)."""
    options = typed(body, "method_options", dict, "an object of method options", {})
    bad_value = next((k for k, v in options.items() if v is not None and not isinstance(v, (str, int, float, bool))),
                     None)
    if bad_value is not None:
        raise bad(f"method_options.{bad_value} must be a number, a str or true/false", "method_options")
    for name in BOOL_OPTIONS:
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise bad(f"method_options.{name} must be true or false, got {options[name]!r}", "method_options")
    return options


class Requests:
    """Turns request bodies into `Parsed` jobs for one served model."""

    def __init__(self, model, settings: ServeSettings, eos_ids: tuple[int, ...]):
        self.model, self.settings, self.eos_ids = model, settings, eos_ids
        self._plans: dict[tuple, DecodePlan] = {}

    def plan(self, method: str, options: dict, greedy: bool, ignore_eos: bool, penalties: bool = False,
             logprobs: bool = False, step_modes: bool = False) -> DecodePlan:
        """The decoding plan (engine, weights), checked against the memory guard once per plan.

        At most `max_plans` distinct plans are ever made (each is a program compiled on the
        scheduler thread, which stalls the running streams while it compiles): past that a new
        one is refused before anything is resolved, loaded or compiled."""
        key = (method, tuple(sorted(options.items())), greedy, ignore_eos, penalties, logprobs, step_modes)
        if key not in self._plans and len(self._plans) >= self.settings.max_plans:
            raise ApiError(400, f"this server decodes with at most {self.settings.max_plans} method settings "
                           "(method, method_options, greedy or sampled, ignore_eos, penalties on or off, "
                           "logprobs or not) and has them all; use one "
                           "already in use or the server's default (no method)", "method_options",
                           "too_many_method_settings")
        if key not in self._plans:
            s = self.settings
            # (logprobs: one program reports the most a request may ask for; each answer keeps its own)
            plan = plan_decode(self.model, method, options, greedy=greedy, penalties=penalties,
                               logprobs=MAX_LOGPROBS if logprobs else -1, batch=s.slots, prompt_len=s.context,
                               max_new_tokens=0, eos_ids=() if ignore_eos else self.eos_ids,
                               where=f", context {s.context} (the server's slots x context)",
                               cache_copies=corner_share(self.model))
            if step_modes and plan.engine.steps_plain:
                plan = dataclasses.replace(plan, step_modes=True)
            if plan.lp_devices > 1:
                raise GenerationError("lp_devices: jaxspec serve decodes on one device (no lookahead parallelism)")
            self._plans[key] = plan
        return self._plans[key]

    def parse(self, body: Any, chat: bool) -> Parsed:
        """The checked job of a request body, its field groups checked in a fixed order (a body
        with several bad fields is refused for the first): the fields and the model, the
        answer's form, the prompt and its budget, sampling, stops, the method."""
        s = self.settings
        _known_fields(body, chat, s.model_id)
        n = integer(body, "n", 1, 1, min(MAX_CHOICES, s.slots),
                    f"an integer in [1, {min(MAX_CHOICES, s.slots)}] (each choice takes a slot)")
        logprobs = _logprobs(body, chat)
        _unimplemented(body)
        stream, options = _streaming(body)
        typed(body, "user", str, "a str")
        prompt = self._prompt_ids(body, chat)
        limit = _limit(body, chat, len(prompt), s.context)
        temperature, top_p, top_k, knobs = _sampling(body, s.temperature)
        seed = integer(body, "seed", None, 0, 2**32 - 1, "an integer in [0, 2**32)")
        seed = random_seed() if seed is None else seed
        stops, stop_ids = _stops(body, self.model.config.vocab_size)
        ignore_eos = typed(body, "ignore_eos", bool, "true or false", False)
        method, method_options, default = self._method(body)
        try:
            penalties = penalized(**{k: v for k, v in knobs.items() if k != "min_p"})
            plan = self.plan(method, method_options, temperature == 0, ignore_eos, penalties, logprobs is not None,
                             step_modes=default and s.step_modes)
            sampling = SamplingParams.create(temperature, top_k, top_p, **knobs)
        except MemoryLimitError as e:
            raise bad(f"not enough memory for this method on this server: {e}", "method",
                      "insufficient_memory") from None
        except JaxspecError as e:
            known = ALIASES.get(method, method) in METHODS
            raise bad(self._no_paths(str(e)), "method_options" if known else "method") from None
        return Parsed(prompt=prompt, limit=limit, seed=seed, sampling=sampling, plan=plan,
                      stop_strings=tuple(stops), stop_ids=frozenset(stop_ids), stream=stream,
                      include_usage=bool(options.get("include_usage", False)), chat=chat, n=n, logprobs=logprobs,
                      continuous_usage=bool(options.get("continuous_usage_stats", False)))

    def _prompt_ids(self, body: dict, chat: bool) -> list[int]:
        """The prompt's token ids: chat's `messages` rendered by the chat template, or a
        completion's `prompt`."""
        try:
            if chat:
                messages = chat_messages(body.get("messages"))
                if not self.settings.special_tokens:
                    self.no_special_tokens(messages)
                return chat_prompt(self.model, messages)
            return self._prompt(body.get("prompt"))
        except JaxspecError as e:
            raise bad(self._no_paths(str(e)), "messages" if chat else "prompt") from None

    def _method(self, body: dict) -> tuple[str, dict, bool]:
        """(the method, its options, whether they are the server's: the request named none or
        `auto`); a drafter is resolved to a folder the operator offers."""
        method = typed(body, "method", str, "a method name", None)
        options = _method_options(body)
        if options.get("drafter") is not None:
            options = {**options, "drafter": self._drafter(options["drafter"])}
        if method == "auto" and options:
            raise bad("method 'auto' takes no method_options (it is the server's measured choice)", "method_options")
        default = method is None or method == "auto"
        if default:
            method = self.settings.method
            options = {**dict(self.settings.method_options), **options}
        return method, options, default

    def _no_paths(self, message: str) -> str:
        """A library error as a client reads it: the server's folders (the model's, the offered
        drafters') named as the client knows them, never by their paths."""
        for name, folder in sorted(self.settings.drafters, key=lambda nf: -len(nf[1])):
            message = message.replace(folder, name)
        source = str(getattr(self.model, "source", "") or "")
        return message.replace(source, self.settings.model_id) if source else message

    def _drafter(self, value) -> str:
        """A request's drafter: a shipped drafter's name or one the operator listed
        (`--drafter-dir`), by name; never a path of the client's (nothing is read from a folder
        the operator did not offer, and the answer is the same whatever exists on disk)."""
        offered = dict(self.settings.drafters)
        if isinstance(value, str) and value in offered:
            return offered[value]
        if isinstance(value, str) and value in SHIPPED_DRAFTERS.values():
            return value
        names = sorted(set(SHIPPED_DRAFTERS.values()) | set(offered))
        raise bad(f"method_options.drafter must name a drafter this server offers: {', '.join(names)} "
                  "(the operator adds folders with --drafter-dir)", "method_options", "unknown_drafter")

    def no_special_tokens(self, messages: list[dict]) -> None:
        """Chat content that spells a special token (e.g. `<|im_end|>`) would become that token
        (the rendered template is tokenized whole, as transformers does), letting a user forge a
        turn: refused unless the operator allows it (`--allow-special-tokens`)."""
        tokenizer = self.model.tokenizer
        specials = getattr(tokenizer, "special_texts", None)
        if specials is None:
            specials = tuple(t for t in _special_texts(tokenizer) if t)
            try:
                tokenizer.special_texts = specials
            except AttributeError:
                pass
        for i, m in enumerate(messages):
            hit = next((t for t in specials if t in m["content"]), None)
            if hit is not None:
                raise bad(f"messages[{i}].content contains the special token {hit!r}; special tokens are not "
                          "accepted in chat content on this server", "messages", "special_token_in_content")

    def _prompt(self, prompt) -> list[int]:
        """A completion prompt: a str, a list of token ids, or a one-item list of either."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if prompt is None:
            raise bad("you must provide a prompt", "prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise bad("one prompt per request (send several requests: they are batched)", "prompt")
        if isinstance(prompt, list) and any(isinstance(t, bool) or not isinstance(t, int) for t in prompt):
            raise bad("prompt must be a str or a list of token ids", "prompt")
        if not isinstance(prompt, (str, list)):
            raise bad(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}", "prompt")
        if len(prompt) == 0:
            raise bad("prompt is empty; send at least one character or token id", "prompt")
        rows, _ = normalize_prompts(self.model, prompt)
        return rows[0]


def _special_texts(tokenizer) -> list[str]:
    """The text of every special (added) token a tokenizer parses out of plain text."""
    if tokenizer is None:
        return []
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "get_added_tokens_decoder"):
        return [t.content for t in backend.get_added_tokens_decoder().values() if t.special]
    return [t for t in getattr(tokenizer, "special_tokens", {}).values() if isinstance(t, str)]
