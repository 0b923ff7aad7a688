"""OpenAI's shapes: every JSON body the server answers with, built in one place.

The answer of `/v1/completions` and `/v1/chat/completions` (`completion`), a streamed chunk
(`chunk`, `usage_chunk`; sent as server-sent events by `sse`, the stream ending with `DONE`),
`usage`, `logprobs_body` (chat's shape and the legacy completions' one), the model cards of
`/v1/models`, and the error body (`ApiError`: `{"error": {"message", "type", "param", "code"}}`).
Beside OpenAI's fields every answer carries a `jaxspec` object (`extension`): the method and its
options, the seed, the token ids, the model steps, S (tokens per step), the time to the first
token. Nothing here does I/O or knows HTTP: `app` sends what these build, `guard` and `requests`
raise `ApiError`. `parsed` is always a `requests.Parsed`, `finish` a `scheduler.Finish`.
"""

from __future__ import annotations

import itertools
import json
import time

DONE = "data: [DONE]\n\n"  # the last event of every stream


class ApiError(Exception):
    """A request refused or failed: an HTTP status, OpenAI's error body (`body`), and headers."""

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
    """A 400 (invalid_request_error) about the field `param`."""
    return ApiError(400, message, param, code)


def sse(payload: dict) -> str:
    """One server-sent event carrying `payload`."""
    return f"data: {json.dumps(payload)}\n\n"


def model_card(model_id: str, created: int, context: int) -> dict:
    """The served model as `/v1/models` lists it (vLLM's `max_model_len` beside OpenAI's fields)."""
    return {"id": model_id, "object": "model", "created": created, "owned_by": "jaxspec", "max_model_len": context}


def head(ident: str, model_id: str, chat: bool, chunk: bool) -> dict:
    """The fields an answer or a streamed chunk begins with."""
    kind = ("chat.completion" if chat else "text_completion") + (".chunk" if chunk and chat else "")
    return {"id": ident, "object": kind, "created": int(time.time()), "model": model_id}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def plain(options: dict) -> dict:
    """Method options as JSON values (a loaded drafter is named by its folder)."""
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v) for k, v in options.items()}


def extension(parsed, finish) -> dict:
    """The `jaxspec` object of one choice: how it was decoded."""
    return {"method": parsed.plan.name, "options": plain(parsed.plan.options.as_dict()), "seed": parsed.seed,
            "token_ids": finish.token_ids, "steps": finish.stats["steps"],
            "compression": finish.stats["compression"],
            "time_to_first_token": round(finish.stats["time_to_first_token"], 6),
            "seconds": round(finish.stats["seconds"], 6),
            "accept_histogram": finish.stats.get("accept_histogram", []),
            # steps without drafts (the server's auto: chunks its slots ran plain)
            "plain_steps": finish.stats.get("plain_steps", 0), "step_modes": parsed.plan.step_modes}


def token_pieces(tokenizer, context: list[int], ids: list[int], alternatives) -> list[tuple[str, list[str]]]:
    """Per token of `ids` (after `context`): the text it adds, and the text each of its
    `alternatives` row would have added in its place. Decoded after the few tokens before it, so
    a leading space or a character split over byte tokens comes out as in the whole text."""
    if tokenizer is None:
        return [(str(t), [str(int(a)) for a in alts]) for t, alts in zip(ids, alternatives)]
    tokens = list(context) + list(ids)
    out = []
    for j, (t, alts) in enumerate(zip(ids, alternatives)):
        before = tokens[max(0, len(context) + j - 4):len(context) + j]
        base = tokenizer.decode(before)
        piece = lambda x: tokenizer.decode(before + [int(x)])[len(base):]  # noqa: E731
        out.append((piece(t), [piece(a) for a in alts]))
    return out


def logprobs_body(tokenizer, parsed, ids: list[int], logprobs, context: list[int], offset: int = 0) -> dict | None:
    """OpenAI's logprobs object for `ids` (chat: `{"content": [...]}`; a completion: the
    legacy `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`), or None when the
    request asked for none. Each token's text is what it adds after the tokens before it."""
    if parsed.logprobs is None or logprobs is None:
        return None
    chosen, top_ids, top = logprobs
    k = parsed.logprobs
    pieces = token_pieces(tokenizer, context, ids, top_ids[:, :k])
    if parsed.chat:
        entry = lambda text, value: {"token": text, "logprob": float(value),  # noqa: E731
                                     "bytes": list(text.encode("utf-8"))}
        return {"content": [{**entry(text, chosen[j]), "top_logprobs": [entry(t, v) for t, v in zip(alts, top[j])]}
                            for j, (text, alts) in enumerate(pieces)]}
    offsets = list(itertools.accumulate([len(text) for text, _ in pieces], initial=offset))[:-1]
    return {"tokens": [text for text, _ in pieces], "token_logprobs": [float(v) for v in chosen],
            "top_logprobs": [{t: float(v) for t, v in zip(alts, top[j])} for j, (_, alts) in enumerate(pieces)],
            "text_offset": offsets}


def completion(ident: str, model_id: str, parsed, finishes: list, tokenizer) -> dict:
    """The whole answer once every choice has finished (`finishes`: the choices in order)."""
    choices = []
    for i, finish in enumerate(finishes):
        choice = {"index": i, "finish_reason": finish.reason,
                  "logprobs": logprobs_body(tokenizer, parsed, finish.token_ids, finish.logprobs, parsed.prompt)}
        if parsed.chat:
            choice["message"] = {"role": "assistant", "content": finish.text}
        else:
            choice["text"] = finish.text
        if len(finishes) > 1:  # (each choice's own; the top-level extension is the first's)
            choice["jaxspec"] = extension(parsed, finish)
        choices.append(choice)
    return {**head(ident, model_id, parsed.chat, False), "choices": choices,
            "usage": usage(len(parsed.prompt), sum(len(f.token_ids) for f in finishes)),
            "jaxspec": extension(parsed, finishes[0])}


def chunk(ident: str, model_id: str, parsed, index: int, text: str | None, reason: str | None = None,
          role: bool = False, logprobs=None, sent_tokens: int = 0, **extra) -> dict:
    """One streamed chunk of choice `index`: its new text (None: none, as in the last chunk), its
    finish reason once it ends, the role first (chat), and `extra` fields (the last chunk's
    `jaxspec`). `sent_tokens`: the tokens of every choice sent so far (vLLM's
    continuous_usage_stats puts them in every chunk's usage)."""
    if parsed.chat:
        delta = {} if text is None else {"content": text}
        if role:
            delta = {"role": "assistant", **delta}
        choice = {"index": index, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": reason, "logprobs": logprobs}
    if parsed.continuous_usage:
        extra["usage"] = usage(len(parsed.prompt), sent_tokens)
    return {**head(ident, model_id, parsed.chat, True), "choices": [choice], **extra}


def usage_chunk(ident: str, model_id: str, parsed, finishes: list) -> dict:
    """The chunk before `DONE` that `stream_options.include_usage` asks for."""
    return {**head(ident, model_id, parsed.chat, True), "choices": [],
            "usage": usage(len(parsed.prompt), sum(len(f.token_ids) for f in finishes))}
