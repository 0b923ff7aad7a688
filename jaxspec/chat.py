"""`jaxspec.chat`: a conversation through the model's chat template, with any decoding method.

The prompt is the template rendered with `add_generation_prompt=True` and tokenized without
extra special tokens (the template writes them), as transformers' `apply_chat_template`
does; the reply ends at the tokenizer's end-of-turn / end-of-sequence ids.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from jaxspec.errors import PromptError
from jaxspec.generate import GenerateOutput, Stream, generate, stream
from jaxspec.checkpoint.loading import Model


@dataclasses.dataclass
class ChatReply:
    text: str
    messages: list[dict]  # the conversation, the reply appended as an assistant message
    finish_reason: str  # "stop" (the turn ended) | "length" (max_new_tokens reached first): the server's words
    output: GenerateOutput  # tokens, steps, compression, tokens/s of the reply
    prompt_ids: list[int]  # the rendered conversation, tokenized
    stop_ids: tuple[int, ...]  # the ids that end a turn


def chat_prompt(model: Model, messages: list[dict]) -> list[int]:
    """The prompt ids of `messages` (the template asks the assistant for the next turn)."""
    if model.tokenizer is None or model.tokenizer.chat_template is None:
        raise PromptError(f"{model.source} has no chat template; chat needs an instruction-tuned model "
                          "(e.g. smollm2-135m-instruct), or use generate with a plain prompt")
    return model.tokenizer.encode_chat(messages, add_generation_prompt=True)


def stop_ids(model: Model) -> tuple[int, ...]:
    """What ends a reply (a chat's, a server's): the model's EOS ids and its tokenizer's end-of-turn
    ids. The one rule; `generate` alone stops at the EOS ids (and the `stop_ids` it is given)."""
    turn_ends = tuple(model.tokenizer.eos_ids) if model.tokenizer is not None else ()
    return tuple(dict.fromkeys(tuple(model.config.eos_token_ids) + turn_ends))


def _reply(model: Model, messages: list[dict], prompt_ids: list[int], out: GenerateOutput) -> ChatReply:
    stops = stop_ids(model)
    ended = bool(out.tokens) and out.tokens[-1] in stops
    # (the end of turn's own text left out; a `stop` string's cut is the output's text)
    text = model.tokenizer.decode(out.tokens[:-1]) if ended else out.text
    return ChatReply(text=text, messages=[*messages, {"role": "assistant", "content": text}],
                     finish_reason=out.finish_reason, output=out, prompt_ids=prompt_ids, stop_ids=stops)


def chat(model: Model, messages: list[dict], max_new_tokens: int = 256, **generate_options) -> ChatReply:
    """The assistant's next turn. `generate_options`: `method`, its options, sampling, `stop`
    strings, as for `jaxspec.generate`."""
    ids = chat_prompt(model, messages)
    out = generate(model, ids, max_new_tokens=max_new_tokens, stop_ids=stop_ids(model), **generate_options)
    return _reply(model, messages, ids, out)


class ChatStream:
    """`for piece in jaxspec.chat_stream(model, messages)`: the reply's text as it is generated;
    afterwards `.reply` is the `ChatReply` `chat` returns."""

    def __init__(self, model: Model, messages: list[dict], prompt_ids: list[int], inner: Stream):
        self.model, self.messages, self.prompt_ids, self._inner = model, messages, prompt_ids, inner
        self.reply: ChatReply | None = None

    def __iter__(self) -> Iterator[str]:
        for chunk in self._inner:
            if chunk.text:  # (the end-of-turn token is special: decode drops its text)
                yield chunk.text
        self.reply = _reply(self.model, self.messages, self.prompt_ids, self._inner.result)


def chat_stream(model: Model, messages: list[dict], max_new_tokens: int = 256, chunk_steps: int = 4,
                **generate_options) -> ChatStream:
    ids = chat_prompt(model, messages)
    inner = stream(model, ids, max_new_tokens=max_new_tokens, stop_ids=stop_ids(model), chunk_steps=chunk_steps,
                   **generate_options)
    return ChatStream(model, messages, ids, inner)
