"""Calls are classed as OpenAI classes them (issue 48), and the engine's stream says what its Generation
says: a call whose arguments parse is a tool call, its schema problem reported beside it; only arguments
that do not parse make an invalid call; `finish_reason` is "tool_calls" whenever the reply holds calls.

A real engine on a tiny model scripted to write each reply (`oospec_testing.ScriptedTarget`): every
method, `generate` and the joined `stream` events, on `testing.CALL_REPLIES`."""
from __future__ import annotations

import json

import pytest

from oospec_agents import Engine, TextDelta, ToolCallDelta
from oospec_agents.testing import BOOK_TABLE, CALL_REPLIES
from oospec_testing import ScriptedTarget, tiny_model

ASK = [{"role": "user", "content": "Book a table for 4 people at Da Michele at 19:30."}]

EXPECTED = {  # per reply: the tool calls' arguments, (call, words) per problem, how many invalid calls
    "misfit": ([{"restaurant": "Da Michele", "people": "4", "time": "19:30"}], [(0, "'4' is not of type 'integer'")], 0),
    "unparseable": ([], [], 1),
    "two_calls": ([{"restaurant": "Da Michele", "people": 4, "time": "19:30"},
                   {"restaurant": "Pizzeria Bella", "people": "two", "time": "20:00"}],
                  [(1, "'two' is not of type 'integer'")], 0),
}


@pytest.fixture(scope="module")
def scripted(smollm2_tokenizer):
    """(engine, script): `script(text)` makes the engine's next reply to ASK `text`."""
    engine = Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, model_name="tiny-scripted")
    target = ScriptedTarget(engine.target, smollm2_tokenizer)
    prompt = engine.prompt_ids(ASK, [BOOK_TABLE])
    return engine, lambda text: target.script(prompt, text)


@pytest.mark.parametrize("method", ["ar", "toolspec", "oospec"])
@pytest.mark.parametrize("reply", list(CALL_REPLIES))
def test_generate_and_the_joined_stream_class_calls_as_openai(scripted, reply, method):
    engine, script = scripted
    script(CALL_REPLIES[reply])
    kw = dict(tool_choice="auto", max_new_tokens=120, method=method)
    events = list(engine.stream(ASK, [BOOK_TABLE], **kw))
    gen, streamed = events[-1], events[:-1]
    assert gen.text == CALL_REPLIES[reply], "the scripted target did not write its script"
    args, problems, invalid = EXPECTED[reply]
    assert [c["arguments"] for c in gen.tool_calls] == args
    assert [(p["id"], p["name"]) for p in gen.tool_call_problems] == \
        [(gen.tool_calls[i]["id"], "book_table") for i, _ in problems]
    assert all(words in p["error"] for p, (_, words) in zip(gen.tool_call_problems, problems))
    assert len(gen.invalid_tool_calls) == invalid
    assert gen.finish_reason == "tool_calls"
    # the stream's message is the Generation's
    content, calls = _joined(streamed)
    valid, bad = _classed(calls)
    assert content == gen.content
    assert valid == gen.tool_calls
    assert bad == [{k: c[k] for k in ("id", "name", "arguments")} for c in gen.invalid_tool_calls]
    assert _message(engine.generate(ASK, [BOOK_TABLE], **kw)) == _message(gen)


def test_under_strict_the_calls_fit_their_schema(scripted):
    """`strict` remains the way to guarantee schema-valid calls: the grammar masks the misfit "4", the
    target writes a number instead, and there is no problem to report."""
    engine, script = scripted
    script(CALL_REPLIES["misfit"])
    gen = engine.generate(ASK, [BOOK_TABLE], tool_choice="auto", max_new_tokens=120, method="toolspec", strict=True)
    assert gen.text.startswith("Booking it.") and gen.tool_call_problems == []
    if gen.finish_reason != "length":  # the random model's own continuation may ramble inside a string
        (call,) = gen.tool_calls
        assert isinstance(call["arguments"]["people"], int) and gen.finish_reason == "tool_calls"


def _joined(events) -> tuple[str, list[dict]]:
    """The stream's message: its text, and per call its id, name and arguments text."""
    content, calls = "", []
    for e in events:
        if isinstance(e, TextDelta):
            content += e.text
        elif isinstance(e, ToolCallDelta):
            if e.index == len(calls):
                calls.append({"id": e.id, "name": e.name, "arguments": ""})
            calls[e.index]["arguments"] += e.arguments
    return content, calls


def _classed(calls: list[dict]) -> tuple[list[dict], list[dict]]:
    """Streamed calls classed as a client classes them: arguments that parse as an object make a call."""
    valid, invalid = [], []
    for c in calls:
        try:
            args = json.loads(c["arguments"])
        except json.JSONDecodeError:
            args = None
        if isinstance(args, dict):
            valid.append(dict(c, arguments=args))
        else:
            invalid.append(c)
    return valid, invalid


def _message(gen) -> tuple:
    """What a Generation says of its reply, each call id written as the call's place (ids are per reply)."""
    place = {c["id"]: f"call {c['id'].rsplit('_', 1)[1]}" for c in gen.tool_calls + gen.invalid_tool_calls}

    def placed(calls):
        return [dict(c, id=place[c["id"]]) for c in calls]
    return (gen.text, gen.content, placed(gen.tool_calls), placed(gen.invalid_tool_calls),
            placed(gen.tool_call_problems), gen.finish_reason)
