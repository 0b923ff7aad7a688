"""Chat templates: a checkpoint's jinja template that turns a list of messages into prompt text.

Rendered the way `transformers` renders them (`PreTrainedTokenizerBase.apply_chat_template`,
`transformers.utils.chat_template_utils`), so a prompt built here is the prompt the model was tuned
on, to the character:

- a sandboxed, immutable jinja environment with `trim_blocks` and `lstrip_blocks` on and the
  `loopcontrols` extension (`{% break %}`, `{% continue %}`);
- a `tojson` filter that does not HTML-escape and keeps non-ASCII text (`json.dumps(...,
  ensure_ascii=False)`), and the globals `raise_exception(message)` and `strftime_now(format)`;
- the template sees `messages`, `add_generation_prompt`, `tools` and `documents` (None), the named
  special tokens (`bos_token`, `eos_token`, `unk_token`, `pad_token`, ...) and any extra keyword
  given to `render`; extra keywords win over special tokens of the same name.

Rendering is bounded (a template comes with a checkpoint, and a server renders it for every
request): at most `RENDER_SECONDS` and `RENDER_CHARS` of output, checked as the output is
produced and at every step of a `range` loop, so a template of nested long loops fails with a
PromptError instead of holding the thread.
"""

from __future__ import annotations

import json
import threading
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from jaxspec.errors import ConfigError, JaxspecError, PromptError

# Names a message's reasoning may be given under; transformers copies it to the first (which
# templates read) and to "thinking" (which gpt-oss templates read). We do the same.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


RENDER_SECONDS = 2.0
RENDER_CHARS = 1 << 22
_deadline = threading.local()  # this thread's render deadline (time.monotonic())


class _TemplateTooSlow(Exception):
    """The template ran past `RENDER_SECONDS` or `RENDER_CHARS`."""


def _check_deadline() -> None:
    if time.monotonic() > getattr(_deadline, "at", float("inf")):
        raise _TemplateTooSlow(f"rendering took more than {RENDER_SECONDS:g} s")


class _TemplateRaised(Exception):
    """The template called `raise_exception(message)`: it rejects these messages."""


def _one_line(text: object, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


@lru_cache(maxsize=32)
def _compile(source: str):
    """The compiled jinja template for `source` (compiled once per distinct source)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise _TemplateRaised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes <, >, & and ' for HTML; chat templates want the plain JSON.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    sandbox_range = env.globals["range"]

    def bounded_range(*args):  # the sandbox's range (at most MAX_RANGE items), checking the deadline
        for i, item in enumerate(sandbox_range(*args)):
            if i % 1024 == 0:
                _check_deadline()
            yield item

    env.globals["range"] = bounded_range
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"the chat template does not compile (line {e.lineno}: {_one_line(e.message)}); "
                          "fix the chat_template of the tokenizer") from None


def _checked_messages(messages: Any) -> list[dict]:
    """Plain copies of `messages`, or PromptError naming what is wrong with them."""
    expected = "expected a list of dicts with str 'role' and str 'content', e.g. [{'role': 'user', 'content': 'Hi'}]"
    if isinstance(messages, (str, bytes)) or not isinstance(messages, (list, tuple)):
        raise PromptError(f"messages must be a list, got {type(messages).__name__}; {expected}")
    if not messages:
        raise PromptError(f"messages is empty; {expected}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise PromptError(f"messages[{i}] is a {type(message).__name__}, not a dict; {expected}")
        for key in ("role", "content"):
            if key not in message:
                raise PromptError(f"messages[{i}] has no {key!r}; {expected}")
            if not isinstance(message[key], str):
                raise PromptError(f"messages[{i}][{key!r}] is a {type(message[key]).__name__}, not a str; {expected}")
        # Keys set to None are dropped, as transformers does (templates treat a missing key well,
        # a None one often badly).
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


@dataclass(frozen=True)
class ChatTemplate:
    """A jinja chat template (`source`) and the special token strings it may refer to
    (`{"bos_token": "<s>", "eos_token": "</s>", ...}`)."""

    source: str
    special_tokens: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if not isinstance(self.source, str) or not self.source.strip():
            raise ConfigError(f"a chat template must be a non-empty str, got {self.source!r:.60}")
        # Read-only, so the frozen dataclass cannot be changed through it.
        object.__setattr__(self, "special_tokens", types.MappingProxyType(
            {k: v for k, v in dict(self.special_tokens).items() if isinstance(v, str)}))

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for `messages`; with `add_generation_prompt`, ending in the header that
        starts the assistant's reply. `extra` reaches the template as variables (e.g. a
        `system_message` or `enable_thinking` some templates read)."""
        import jinja2

        messages = _checked_messages(messages)
        template = _compile(self.source)
        variables = {"tools": None, "documents": None, **self.special_tokens, **extra}
        _deadline.at = time.monotonic() + RENDER_SECONDS
        try:
            pieces, size = [], 0
            for piece in template.generate(messages=messages, add_generation_prompt=bool(add_generation_prompt),
                                           **variables):
                size += len(piece)
                if size > RENDER_CHARS:
                    raise _TemplateTooSlow(f"the rendered prompt passed {RENDER_CHARS} characters")
                _check_deadline()
                pieces.append(piece)
            return "".join(pieces)
        except _TemplateTooSlow as e:
            raise PromptError(f"the chat template did not finish: {e}; the template loops too long for "
                              "these messages") from None
        except _TemplateRaised as e:
            raise PromptError(f"the chat template rejected these messages: {_one_line(e)}") from None
        except JaxspecError:
            raise
        except jinja2.TemplateError as e:
            raise PromptError(f"the chat template failed on these messages ({type(e).__name__}: {_one_line(e)}); "
                              "check the roles and contents it expects") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as e:
            raise PromptError(f"the chat template failed on these messages ({type(e).__name__}: {_one_line(e)}); "
                              "check the roles and contents it expects") from None
        finally:
            _deadline.at = float("inf")


def chat_template_source(value: Any) -> str | None:
    """The template source from a `chat_template` setting: a str, or transformers' list of named
    templates (`[{"name": "default", "template": ...}, ...]`, the "default" one is used) or a dict of
    them. None when there is none."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, (list, tuple)):
        try:
            value = {t["name"]: t["template"] for t in value}
        except (TypeError, KeyError):
            raise ConfigError("chat_template is a list but not of {'name': ..., 'template': ...} entries; "
                              "fix tokenizer_config.json") from None
    if isinstance(value, Mapping):
        return chat_template_source(value.get("default"))
    if value is None:
        return None
    raise ConfigError(f"chat_template must be a str, got {type(value).__name__}; fix tokenizer_config.json")

