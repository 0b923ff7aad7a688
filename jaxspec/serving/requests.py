"""OpenAI request bodies -> validated jobs, and bad input -> OpenAI's error shape.

Every check a request can fail raises `ApiError` (an HTTP status and OpenAI's
`{"error": {"message", "type", "param", "code"}}`); nothing a client sends reaches the
scheduler unchecked. Fields OpenAI defines that jaxspec does not implement are accepted at
their neutral value and refused otherwise; so are vLLM's own fields (`VLLM_NEUTRAL`: accepted
where they change nothing, and named in the answer's `Warning` header); unknown fields are
refused, as OpenAI's API does.
`n` choices decode in n slots; the penalties, `min_p` and `logprobs` apply identically under
every method (`jaxspec.decoding.sampling`), so each answer is the one autoregressive decoding gives.

Extensions (beside OpenAI's fields): vLLM's `top_k`, `min_p`, `repetition_penalty`,
`stop_token_ids`, `ignore_eos`, and `method` + `method_options` (a decoding method for this
request, otherwise the server's).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from jaxspec.stop_strings import MAX_STOPS
from jaxspec.chat import chat_prompt
from jaxspec.errors import GenerationError, JaxspecError, MemoryLimitError, shown
from jaxspec.inputs import normalize_prompts
from jaxspec.checkpoint.method_defaults import SHIPPED_DRAFTERS
from jaxspec.decoding.methods import ALIASES, METHODS
from jaxspec.runtime.plan import DecodePlan, plan_decode
from jaxspec.decoding.sampling import MAX_LOGPROBS, SamplingParams, penalized
from jaxspec.serving.scheduler import random_seed

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


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        # (what a client sent is echoed escaped: a lone surrogate in a key cannot be encoded as UTF-8)
        message, param = (None if x is None else x.encode("utf-8", "backslashreplace").decode("utf-8")
                          for x in (message, param))
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


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


def _typed(body: dict, name: str, kinds, what: str, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise bad(f"{name} must be {what}, got a boolean", name)
    if not isinstance(value, kinds):
        raise bad(f"{name} must be {what}, got {type(value).__name__}", name)
    return value


def _number(body: dict, name: str, default: float, low: float, high: float, what: str) -> float:
    value = _typed(body, name, (int, float), what, default)
    # (the range first: Python compares a long integer with a float exactly, and float() of it overflows)
    if not (low <= value <= high and math.isfinite(value)):
        raise bad(f"{name} must be {what}, got {shown(value)}", name)
    return float(value)


def _integer(body: dict, name: str, default, low: int, high: int, what: str):
    value = _typed(body, name, int, what, default)
    if value is not None and not low <= value <= high:
        raise bad(f"{name} must be {what}, got {shown(value)}", name)
    return value


def _same(value, neutral) -> bool:
    """`value == neutral`, with true/false never equal to 1/0."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    if isinstance(neutral, (int, float)):
        return isinstance(value, (int, float)) and value == neutral
    return type(value) is type(neutral) and value == neutral


def ignored_fields(body: dict, chat: bool) -> list[str]:
    """The vLLM fields of `body` that are accepted and ignored (`VLLM_NEUTRAL`); one at a value
    that would change the answer is a 400 naming it."""
    neutral = VLLM_CHAT_NEUTRAL if chat else VLLM_COMPLETION_NEUTRAL
    out = []
    for name in sorted(set(body) & set(neutral)):
        value, allowed = body[name], neutral[name]
        if value is None or (isinstance(allowed, type) and isinstance(value, allowed)
                             and (allowed is bool or not isinstance(value, bool))) or \
                (isinstance(allowed, tuple) and any(_same(value, v) for v in allowed)):
            out.append(name)
            continue
        what = f"any {allowed.__name__}" if isinstance(allowed, type) else " or ".join(
            ["null", *(json.dumps(v) for v in allowed)])
        raise bad(f"{name}={json.dumps(value)[:100]} is not supported: jaxspec takes this vLLM field only where "
                  f"it changes nothing ({what})", name, "unsupported_parameter")
    return out


def _neutral(body: dict, name: str, neutral, why: str) -> None:
    value = body.get(name)
    if value is not None and value != neutral and not (neutral == 0 and value == 0.0):
        raise bad(f"{name}={value!r} is not supported: {why}", name, "unsupported_parameter")


# The roles a chat message may have (OpenAI's); the template renders nothing else.
ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI message fields beside role and content: `name` is accepted and not rendered; the others
# (tools, reasoning, audio) only where they are empty, since they are not rendered either.
MESSAGE_FIELDS = {"name": str, "tool_calls": list, "tool_call_id": str, "function_call": dict, "refusal": str,
                  "reasoning_content": str, "reasoning": str, "audio": dict}


def _messages(value) -> list[dict]:
    """OpenAI messages (content as a str or a list of text parts) as the chat template takes them:
    a role among ROLES and the content, nothing else (a client's field never reaches the template
    unchecked: a role or an extra key could otherwise spell a turn of its own)."""
    if not isinstance(value, list) or not value:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}] must be an object with role and content", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise bad(f"messages[{i}].content: only text parts are supported", "messages")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(m.get("role"), str) or not isinstance(content, str):
            raise bad(f"messages[{i}] needs a str role and a str (or text parts) content", "messages")
        if m["role"] not in ROLES:
            raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {shown(m['role'])}", "messages",
                      "invalid_role")
        for key in sorted(set(m) - {"role", "content"}):
            kind = MESSAGE_FIELDS.get(key)
            if kind is None:
                raise bad(f"messages[{i}] has an unrecognized field {shown(key)}", "messages", "unknown_parameter")
            if m[key] is not None and not isinstance(m[key], kind):
                raise bad(f"messages[{i}].{key} must be a {kind.__name__}", "messages")
            if key != "name" and m[key]:
                raise bad(f"messages[{i}].{key} is not supported: this server renders text turns only", "messages",
                          "unsupported_parameter")
        out.append({"role": m["role"], "content": content})
    return out


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
                               cache_copies=1)  # (a chunk copies the rows and positions it reads: `slots._advance`)
            if step_modes and plan.engine.steps_plain:
                plan = dataclasses.replace(plan, step_modes=True)
            if plan.lp_devices > 1:
                raise GenerationError("lp_devices: jaxspec serve decodes on one device (no lookahead parallelism)")
            self._plans[key] = plan
        return self._plans[key]

    def parse(self, body: Any, chat: bool) -> Parsed:
        if not isinstance(body, dict):
            raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
        allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
        unknown = sorted(set(body) - allowed - set(ignored_fields(body, chat)))
        if unknown:
            raise bad(f"unrecognized request argument supplied: {shown(unknown[0])}", unknown[0], "unknown_parameter")
        s, model = self.settings, self.model
        name = _typed(body, "model", str, "a str")
        if name is None:
            raise bad("you must provide a model parameter", "model")
        if name != s.model_id:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {s.model_id!r}", "model",
                           "model_not_found")
        n = _integer(body, "n", 1, 1, min(MAX_CHOICES, s.slots),
                     f"an integer in [1, {min(MAX_CHOICES, s.slots)}] (each choice takes a slot)")
        logprobs = self._logprobs(body, chat)
        for field, neutral, why in (("echo", False, "the prompt is not echoed"), ("best_of", 1, "one candidate"),
                                    ("suffix", "", "no insertion"), ("logit_bias", {}, "logits are not biased"),
                                    ("tools", [], "no tool calls"), ("tool_choice", "none", "no tool calls")):
            _neutral(body, field, neutral, why)
        response_format = body.get("response_format")
        if response_format is not None and response_format != {"type": "text"}:
            raise bad("response_format: only {'type': 'text'} is supported", "response_format",
                      "unsupported_parameter")
        stream = _typed(body, "stream", bool, "true or false", False)
        options = _typed(body, "stream_options", dict, "an object", {})
        if set(options) - {"include_usage", "continuous_usage_stats"} or not all(
                isinstance(options.get(k, False), bool) for k in ("include_usage", "continuous_usage_stats")):
            raise bad("stream_options takes include_usage and vLLM's continuous_usage_stats (true or false)",
                      "stream_options")
        if options and not stream:
            raise bad("stream_options is only allowed with stream: true", "stream_options")
        _typed(body, "user", str, "a str")

        try:
            if chat:
                messages = _messages(body.get("messages"))
                if not s.special_tokens:
                    self._no_special_tokens(messages)
                prompt = chat_prompt(model, messages)
            else:
                prompt = self._prompt(body.get("prompt"))
        except JaxspecError as e:
            raise bad(self._no_paths(str(e)), "messages" if chat else "prompt") from None

        room = s.context - len(prompt)
        if room < 1:
            raise bad(f"the prompt has {len(prompt)} tokens; this server's context is {s.context} tokens "
                      "(prompt + output)", "messages" if chat else "prompt", "context_length_exceeded")
        limit_field = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None \
            else "max_tokens"
        limit = _integer(body, limit_field, room if chat else min(16, room), 1, 2**31, "an integer >= 1")
        if limit > room:
            raise bad(f"{limit_field}={limit} does not fit: the prompt has {len(prompt)} tokens and the context "
                      f"is {s.context} (at most {room} new tokens)", limit_field, "context_length_exceeded")

        temperature = _number(body, "temperature", s.temperature, 0, 2, "a number in [0, 2]")
        top_p = _number(body, "top_p", 1.0, 1e-9, 1, "a number in (0, 1]")
        top_k = _integer(body, "top_k", 0, -1, 2**31 - 1, "an integer in [0, 2**31) (0 or vLLM's -1 = off)")
        top_k = max(top_k, 0)
        knobs = dict(min_p=_number(body, "min_p", 0.0, 0, 1, "a number in [0, 1] (0 = off)"),
                     repetition_penalty=_number(body, "repetition_penalty", 1.0, 1e-6, 100,
                                                "a number in (0, 100] (1 = off)"),
                     presence_penalty=_number(body, "presence_penalty", 0.0, -2, 2, "a number in [-2, 2]"),
                     frequency_penalty=_number(body, "frequency_penalty", 0.0, -2, 2, "a number in [-2, 2]"))
        seed = _integer(body, "seed", None, 0, 2**32 - 1, "an integer in [0, 2**32)")
        seed = random_seed() if seed is None else seed
        stops = body.get("stop")
        stops = [stops] if isinstance(stops, str) else ([] if stops is None else stops)
        if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(x, str) and x for x in stops):
            raise bad(f"stop must be a non-empty str or a list of up to {MAX_STOPS} of them", "stop")
        stop_ids = _typed(body, "stop_token_ids", list, "a list of token ids", [])
        vocab = model.config.vocab_size
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in stop_ids):
            raise bad(f"stop_token_ids must be token ids in [0, {vocab})", "stop_token_ids")
        ignore_eos = _typed(body, "ignore_eos", bool, "true or false", False)

        method = _typed(body, "method", str, "a method name", None)
        method_options = _typed(body, "method_options", dict, "an object of method options", {})
        bad_value = next((k for k, v in method_options.items()
                          if v is not None and not isinstance(v, (str, int, float, bool))), None)
        if bad_value is not None:
            raise bad(f"method_options.{bad_value} must be a number, a str or true/false", "method_options")
        for name in BOOL_OPTIONS:
            if method_options.get(name) is not None and not isinstance(method_options[name], bool):
                raise bad(f"method_options.{name} must be true or false, got {method_options[name]!r}",
                          "method_options")
        if method_options.get("drafter") is not None:
            method_options = {**method_options, "drafter": self._drafter(method_options["drafter"])}
        if method == "auto" and method_options:
            raise bad("method 'auto' takes no method_options (it is the server's measured choice)", "method_options")
        default = method is None or method == "auto"
        if default:
            method = s.method
            method_options = {**dict(s.method_options), **method_options}
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

    @staticmethod
    def _logprobs(body: dict, chat: bool) -> int | None:
        """The top tokens to report per token, None for no logprobs: chat's `logprobs` (true/false)
        + `top_logprobs`, a completion's `logprobs` (a count, as OpenAI's legacy API)."""
        if chat:
            wanted = _typed(body, "logprobs", bool, "true or false", False)
            top = _integer(body, "top_logprobs", None, 0, MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]")
            if top is not None and not wanted:
                raise bad("top_logprobs needs logprobs: true", "top_logprobs")
            return (top or 0) if wanted else None
        return _integer(body, "logprobs", None, 0, MAX_LOGPROBS, f"an integer in [0, {MAX_LOGPROBS}]")

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

    def _no_special_tokens(self, messages: list[dict]) -> None:
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
    backend = getattr(tokenizer, "_tok", None)
    if backend is not None and hasattr(backend, "get_added_tokens_decoder"):
        return [t.content for t in backend.get_added_tokens_decoder().values() if t.special]
    return [t for t in getattr(tokenizer, "special_tokens", {}).values() if isinstance(t, str)]
