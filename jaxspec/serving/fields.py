"""One field of a JSON request body, checked: its type, its range, chat messages.

Each check returns the field's value (or its default when the field is absent or null) and
raises a 400 naming the field (`openai.bad`) otherwise; `requests` (the completion routes) and
`tokens` (/tokenize, /detokenize) check their bodies with these.
"""

from __future__ import annotations


from jaxspec.decoding.sampling import SAMPLING_BOUNDS
from jaxspec.errors import shown
from jaxspec.serving.openai import bad

# The roles a chat message may have (OpenAI's); the template renders nothing else.
ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI message fields beside role and content: `name` is accepted and not rendered; the others
# (tools, reasoning, audio) only where they are empty, since they are not rendered either.
MESSAGE_FIELDS = {"name": str, "tool_calls": list, "tool_call_id": str, "function_call": dict, "refusal": str,
                  "reasoning_content": str, "reasoning": str, "audio": dict}


def typed(body: dict, name: str, kinds, what: str, default=None):
    """`body[name]` if it is one of `kinds` (true/false only where `bool` is among them), the
    default when absent or null; `what` says what it must be."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise bad(f"{name} must be {what}, got a boolean", name)
    if not isinstance(value, kinds):
        raise bad(f"{name} must be {what}, got {type(value).__name__}", name)
    return value


def number(body: dict, name: str, default: float, bounds=None) -> float:
    """A number within `bounds` (`jaxspec.decoding.sampling.Bounds`; the knob's own by default), as a float."""
    bounds = bounds or SAMPLING_BOUNDS[name]
    value = typed(body, name, (int, float), bounds.described, default)
    if not bounds.holds(value):
        raise bad(f"{name} must be {bounds.described}, got {shown(value)}", name)
    return float(value)


def integer(body: dict, name: str, default, low: int, high: int, what: str):
    """An integer in [low, high] (or the default, which may be None)."""
    value = typed(body, name, int, what, default)
    if value is not None and not low <= value <= high:
        raise bad(f"{name} must be {what}, got {shown(value)}", name)
    return value


def same(value, neutral) -> bool:
    """`value == neutral`, with true/false never equal to 1/0."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    if isinstance(neutral, (int, float)):
        return isinstance(value, (int, float)) and value == neutral
    return type(value) is type(neutral) and value == neutral


def neutral_only(body: dict, name: str, neutral, why: str) -> None:
    """A field jaxspec does not implement: absent, null or `neutral`; any other value is refused
    (`why`: what the server does instead)."""
    value = body.get(name)
    if value is not None and value != neutral and not (neutral == 0 and value == 0.0):
        raise bad(f"{name}={value!r} is not supported: {why}", name, "unsupported_parameter")


def chat_messages(value) -> list[dict]:
    """OpenAI messages (content as a str or a list of text parts) as the chat template takes them:
    a role among ROLES and the content, nothing else (a client's field never reaches the template
    unchecked: a role or an extra key could otherwise spell a turn of its own)."""
    if not isinstance(value, list) or not value:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    return [_message(i, m) for i, m in enumerate(value)]


def _message(i: int, m) -> dict:
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
    return {"role": m["role"], "content": content}
