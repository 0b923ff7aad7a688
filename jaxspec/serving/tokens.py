"""`POST /tokenize` and `POST /detokenize`, with vLLM's request and response shapes.

tokenize: `{"model"?, "prompt": str, "add_special_tokens"? (true), "return_token_strs"? (false)}`
or `{"model"?, "messages": [...], "add_generation_prompt"? (true), "add_special_tokens"? (false),
"return_token_strs"?}` -> `{"count", "max_model_len", "tokens"[, "token_strs"]}`: the ids a
completion (or chat completion) with that prompt decodes from, at the defaults.
detokenize: `{"model"?, "tokens": [ids]}` -> `{"prompt": text}` (special tokens left out, as
in answers). `model` may be left out (vLLM's default); given, it must be the served one.
Bad bodies are 400s in OpenAI's error shape (`ApiError`), as on the other routes.
"""

from __future__ import annotations

from typing import Any

from jaxspec.errors import JaxspecError, shown
from jaxspec.serving.fields import chat_messages, typed
from jaxspec.serving.openai import ApiError, bad

TOKENIZE_FIELDS = {"model", "prompt", "add_special_tokens", "return_token_strs"}
TOKENIZE_CHAT_FIELDS = {"model", "messages", "add_generation_prompt", "add_special_tokens", "return_token_strs"}
DETOKENIZE_FIELDS = {"model", "tokens"}


def _checked(body: Any, allowed: set[str], model_id: str) -> dict:
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(f"unrecognized request argument supplied: {shown(unknown[0])}", unknown[0], "unknown_parameter")
    name = typed(body, "model", str, "a str")
    if name is not None and name != model_id:
        raise ApiError(404, f"the model {name!r} does not exist; this server serves {model_id!r}", "model",
                       "model_not_found")
    return body


def _tokenizer(model):
    if model.tokenizer is None:
        raise bad(f"{model.source} has no tokenizer: this server takes and returns token ids only")
    return model.tokenizer


def token_strs(tokenizer, ids: list[int]) -> list[str]:
    """Each id's own vocabulary entry (a SentencePiece piece, a BPE token), as vLLM's
    `return_token_strs` gives them."""
    backend = getattr(tokenizer, "backend", None)
    if backend is not None and hasattr(backend, "id_to_token"):
        return [backend.id_to_token(int(i)) or "" for i in ids]
    piece = getattr(tokenizer, "piece", None)
    if piece is not None:
        return [piece(int(i)) or "" for i in ids]
    return [tokenizer.decode([int(i)]) for i in ids]


def tokenize(model, settings, body: Any, no_special_tokens=None) -> dict:
    """The answer to a tokenize body. `no_special_tokens(messages)`: the chat check of
    `Requests.no_special_tokens` (content that spells a special token is refused unless the
    server allows it)."""
    chat = isinstance(body, dict) and "messages" in body
    body = _checked(body, TOKENIZE_CHAT_FIELDS if chat else TOKENIZE_FIELDS, settings.model_id)
    want_strs = typed(body, "return_token_strs", bool, "true or false", False)
    special = typed(body, "add_special_tokens", bool, "true or false", not chat)
    tokenizer = _tokenizer(model)
    try:
        if chat:
            messages = chat_messages(body.get("messages"))
            generation = typed(body, "add_generation_prompt", bool, "true or false", True)
            if not settings.special_tokens and no_special_tokens is not None:
                no_special_tokens(messages)
            if tokenizer.chat_template is None:
                raise bad(f"{model.source} has no chat template; tokenize a plain prompt instead", "messages")
            if special:  # (the template writes BOS itself: vLLM's add_special_tokens adds them on top)
                ids = tokenizer.encode(tokenizer.chat_template.render(messages, add_generation_prompt=generation),
                                       add_special_tokens=True)
            else:  # (what a chat completion decodes from, with add_generation_prompt)
                ids = tokenizer.encode_chat(messages, add_generation_prompt=generation)
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise bad("prompt must be a str (or send messages)" if prompt is not None
                          else "you must provide a prompt (a str) or messages", "prompt")
            ids = tokenizer.encode(prompt, add_special_tokens=special)
    except JaxspecError as e:
        raise bad(str(e), "messages" if chat else "prompt") from None
    ids = [int(i) for i in ids]
    out = {"count": len(ids), "max_model_len": settings.context, "tokens": ids}
    if want_strs:
        out["token_strs"] = token_strs(tokenizer, ids)
    return out


def detokenize(model, settings, body: Any) -> dict:
    body = _checked(body, DETOKENIZE_FIELDS, settings.model_id)
    ids = body.get("tokens")
    vocab = model.config.vocab_size
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                            for t in ids):
        raise bad(f"tokens must be a list of token ids in [0, {vocab})", "tokens")
    tokenizer = _tokenizer(model)
    try:
        return {"prompt": tokenizer.decode(ids)}
    except (IndexError, ValueError, RuntimeError) as e:  # (an id the model has but its tokenizer does not)
        raise bad(f"these tokens cannot be decoded by the model's tokenizer: {type(e).__name__}: {e}",
                  "tokens") from None
