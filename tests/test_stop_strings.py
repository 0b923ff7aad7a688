"""`stop=` in the library: the same rule as the server's `stop` (jaxspec.stop_strings), whatever
the entry point: the text ends before the first stop string, the tokens with the one that
completed it, and the finish reason says "stop"."""

from __future__ import annotations

import pytest

import jaxspec
from jaxspec import stop_strings

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def model():
    return jaxspec.load()


@pytest.fixture(scope="module")
def plain(model):
    return jaxspec.generate(model, PROMPT, max_new_tokens=40, stop_at_eos=False)


def test_generate_and_stream_cut_at_the_first_stop_string(model, plain):
    assert plain.finish_reason == "length" and len(plain.tokens) == 40
    # a stop string taken from the middle of the greedy text, and one that never occurs
    stop = plain.text[12:15]
    first = plain.text.find(stop)
    assert first > 0
    out = jaxspec.generate(model, PROMPT, max_new_tokens=40, stop_at_eos=False, stop=[stop, "\u2603never"])
    assert out.text == plain.text[:first] and out.finish_reason == "stop"
    assert out.tokens == plain.tokens[:len(out.tokens)] and len(out.tokens) < 40
    assert stop in model.tokenizer.decode(out.tokens) and stop not in model.tokenizer.decode(out.tokens[:-1])
    for chunk_steps in (1, 3):
        s = jaxspec.stream(model, PROMPT, max_new_tokens=40, stop_at_eos=False, stop=stop, chunk_steps=chunk_steps)
        chunks = list(s)
        assert "".join(c.text for c in chunks) == out.text  # nothing sent that is taken back
        assert [t for c in chunks for t in c.tokens] == out.tokens
        assert s.result.tokens == out.tokens and s.result.finish_reason == "stop"


def test_a_stop_string_that_never_occurs_changes_nothing(model, plain):
    out = jaxspec.generate(model, PROMPT, max_new_tokens=40, stop_at_eos=False, stop="\u2603")
    assert out.tokens == plain.tokens and out.text == plain.text and out.finish_reason == "length"


def test_a_stream_holds_back_what_may_grow_into_a_stop_string():
    assert stop_strings.sendable("abc", ("cd",)) == "ab"
    assert stop_strings.sendable("abc", ("xy",)) == "abc"
    assert stop_strings.sendable("ab\ufffd", ()) == "ab"
    assert stop_strings.cut(lambda ids: "".join(map(str, ids)), [1, 2, 3, 4], ("23",)) == ([1, 2, 3], "1")


def test_settled_is_what_a_stream_may_send_so_far():
    def decode(ids):  # one character per id; 0 stands for half a character
        return "".join("\ufffd" if i == 0 else chr(i) for i in ids)

    ids = [ord(c) for c in "abcEN"]
    assert stop_strings.settled(decode, ids, ("END",), done=False) == (ids, "abc", False)
    assert stop_strings.settled(decode, ids, ("END",), done=True) == (ids, "abcEN", False)
    assert stop_strings.settled(decode, ids + [0], (), done=False) == (ids + [0], "abcEN", False)
    more = [ord(c) for c in "abcENDxy"]
    assert stop_strings.settled(decode, more, ("END", "y"), done=False) == (more[:6], "abc", True)


@pytest.mark.parametrize("stop", ["", ["a", 3], ["a"] * 5, 7])
def test_bad_stop_strings_are_refused(model, stop):
    with pytest.raises(jaxspec.GenerationError, match="stop must be"):
        jaxspec.generate(model, PROMPT, max_new_tokens=4, stop=stop)


def test_chat_and_chat_stream_take_stop_strings(model):
    import copy
    import dataclasses

    from jaxspec.checkpoint.chat_template import ChatTemplate

    tokenizer = copy.copy(model.tokenizer)
    tokenizer.chat_template = ChatTemplate("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    chat_model = dataclasses.replace(model, tokenizer=tokenizer)
    messages = [{"role": "user", "content": PROMPT}]
    whole = jaxspec.chat(chat_model, messages, max_new_tokens=30)
    stop = whole.text[8:11]
    reply = jaxspec.chat(chat_model, messages, max_new_tokens=30, stop=stop)
    assert reply.text == whole.text[:whole.text.find(stop)] and reply.finish_reason == "stop"
    assert reply.messages[-1]["content"] == reply.text
    streamed = jaxspec.chat_stream(chat_model, messages, max_new_tokens=30, stop=stop)
    assert "".join(streamed) == reply.text and streamed.reply.finish_reason == "stop"


def test_the_cli_takes_stop_and_one_compare_rule(plain, capsys):
    import json

    from jaxspec.cli import main

    stop = plain.text[12:15]
    code = main(["generate", "--prompt", PROMPT, "--max-new-tokens", "40", "--no-eos-stop", "--stop", stop,
                 "--stop", "\u2603", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["text"] == plain.text[:plain.text.find(stop)] and out["finish_reason"] == "stop"
    # --compare and --no-compare on both commands (generate: on by default, chat: off)
    code = main(["generate", "--prompt", PROMPT, "--max-new-tokens", "4", "--method", "prompt-lookup", "--compare",
                 "--quiet"])
    assert code == 0 and "identical to greedy: yes" in capsys.readouterr().err
    code = main(["generate", "--prompt", PROMPT, "--max-new-tokens", "4", "--method", "prompt-lookup",
                 "--no-compare", "--quiet"])
    assert code == 0 and "identical to greedy" not in capsys.readouterr().err
