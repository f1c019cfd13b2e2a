"""`oospec serve` speaks OpenAI's Responses API (`POST /v1/responses`): driven by the official `openai`
SDK (`client.responses.create`, `.stream`, `.parse`), raw HTTP, and the OpenAI Agents SDK (its
`OpenAIResponsesModel` and its `OpenAIChatCompletionsModel`) against a real uvicorn server.

The mechanics run on `Scripted` (the real engine on a model scripted to write given replies) and on
the tiny random model (a real decode: token counts, max_output_tokens, sampling, disconnects). Reasoning
(#47: the `reasoning` output item, its stream events, `reasoning.effort`, input `reasoning` items) runs on
scripted replies and on a tiny random qwen3 under a Qwen3-style `<think>` template, made to reason and
then call (`ScriptedTarget`), through the real engine.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

import httpx
import openai
import pytest
from serve_testing import API_KEY, running

from oospec_agents import Engine
from oospec_agents.formats import Reasoning
from oospec_agents.frontend import join_text_parts
from oospec_agents.serve import create_app
from oospec_agents.testing import BOOK_TABLE, CALL_REPLIES, Scripted
from oospec_testing import (AMX_BF16_FLAW, TEMPLATES, ScriptedTarget, chat_template, greedy, record_requests, tiny_model,
                            tiny_qwen3)

MODEL = "m"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "description": "Local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_TIME = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>'
ANSWER = "It is 22 C and sunny in Paris."
THOUGHT = "Two cities: Paris first, then Rome."
THINK = "<think>\n" + THOUGHT + "\n</think>\n\n"


@contextmanager
def scripted(*replies: str, reasoning: Reasoning | None = None):
    """A server on a `Scripted` engine that writes `replies` (under a `<think>` template, given a
    `Reasoning`): yields (sync client, base URL, engine)."""
    engine = Scripted(*replies, reasoning=reasoning)
    with running(create_app(engine, model=MODEL, api_key=API_KEY)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0), url, engine


def post(url, body, *, key=API_KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/v1/responses", json=body, headers=headers, timeout=60, **kw)


def items(response) -> list[dict]:
    """The output items without their generated ids; a call's `call_id` (its reply's own, `call_<reply>_<i>`)
    as its index i."""
    return [{k: v.rsplit("_", 1)[1] if k == "call_id" else v for k, v in item.model_dump(exclude_none=True).items()
             if k != "id"} for item in response.output]


# ----------------------------------------------------------------------------- the openai SDK

def test_a_text_reply_is_a_completed_message():
    with scripted(ANSWER) as (client, _, engine):
        r = client.responses.create(model=MODEL, input="Weather in Paris?")
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status == "completed" and r.incomplete_details is None and r.error is None
    assert r.output_text == ANSWER
    assert items(r) == [{"type": "message", "role": "assistant", "status": "completed",
                         "content": [{"type": "output_text", "text": ANSWER, "annotations": [], "logprobs": []}]}]
    assert r.output[0].id.startswith("msg_")
    assert r.usage.input_tokens == len(engine.prompt_ids([{"role": "user", "content": "Weather in Paris?"}]))
    assert r.usage.output_tokens == len(engine.tokenizer.encode(ANSWER)) + 1  # and the end of sequence
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.store is False and r.previous_response_id is None
    assert r.model_extra["oospec"]["stats"]["method"] == "oospec" and r.model_extra["oospec"]["replica"]
    assert engine.requests[0]["messages"] == [{"role": "user", "content": "Weather in Paris?"}]


def test_a_tool_call_then_its_output_then_the_answer():
    """The SDK's own loop: send the response's output back as input, with a function_call_output."""
    with scripted("Let me look.\n" + CALL, ANSWER, CALL) as (client, _, engine):
        conversation = [{"role": "user", "content": "Weather in Paris?"}]
        first = client.responses.create(model=MODEL, input=conversation, tools=[WEATHER], tool_choice="auto",
                                        instructions="Use the tools.")
        message, call = first.output
        assert message.type == "message" and message.content[0].text == "Let me look."
        assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
        assert json.loads(call.arguments) == {"city": "Paris"}
        assert call.id.startswith("fc_") and call.call_id and call.call_id != call.id
        assert first.tool_choice == "auto" and [t.name for t in first.tools] == ["get_weather"]
        conversation += [item.model_dump(exclude_none=True) for item in first.output]
        conversation.append({"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"})
        second = client.responses.create(model=MODEL, input=conversation, tools=[WEATHER],
                                         instructions="Use the tools.")
        # a call required: the engine puts the call's opener in the prompt, so the reply is the call alone
        required = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                           tool_choice="required")
    assert second.output_text == ANSWER and [i.type for i in second.output] == ["message"]
    assert required.tool_choice == "required" and [i.type for i in required.output] == ["function_call"]
    tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    assert engine.requests[0]["tools"] == [tool] and engine.requests[0]["tool_choice"] == "auto"
    assert engine.requests[2]["tools"] == [tool] and engine.requests[2]["tool_choice"] == "required"
    assert engine.requests[1]["messages"] == [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [{
            "id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "22 C, sunny"}]


def test_input_items_become_the_chat_they_say():
    """Text parts join; a developer message is a system message (the engine's rule); two calls of one
    turn are one assistant message, answered in either order."""
    calls = [{"type": "function_call", "call_id": c, "name": "get_weather", "arguments": json.dumps({"city": city})}
             for c, city in (("a", "Paris"), ("b", "Rome"))]
    conversation = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris"},
                                                         {"type": "input_text", "text": "and Rome?"}]},
        *calls,
        {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "function_call_output", "call_id": "a", "output": "sun"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sun and rain."}]},
        {"role": "user", "content": "Thanks"}]
    with scripted(ANSWER) as (client, _, engine):
        client.responses.create(model=MODEL, input=conversation, tools=[WEATHER])
    messages = engine.requests[0]["messages"]
    assert [m["role"] for m in messages] == ["developer", "user", "assistant", "tool", "tool", "assistant", "user"]
    assert messages[1]["content"] == join_text_parts(["Paris", "and Rome?"])
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["a", "b"]
    assert [(m["tool_call_id"], m["content"]) for m in messages[3:5]] == [("b", "rain"), ("a", "sun")]


@pytest.mark.parametrize("replies, kinds", [
    ((ANSWER,), ["message"]),
    (("Checking both.\n" + CALL + "\n" + CALL_TIME,), ["message", "function_call", "function_call"]),
    ((CALL,), ["function_call"]),
])
def test_the_stream_adds_up_to_the_response(replies, kinds):
    with scripted(*replies, *replies, *replies) as (client, _, _engine):
        kw = dict(model=MODEL, input="Weather in Paris, time in Rome?", tools=[WEATHER, TIME])
        whole = client.responses.create(**kw)
        events = list(client.responses.create(**kw, stream=True))
        with client.responses.stream(**kw) as stream:   # the SDK's accumulator checks every event's place
            helper = stream.get_final_response()
    assert [i.type for i in whole.output] == kinds
    check_stream(events, whole)
    assert items(events[-1].response) == items(helper)


def check_stream(events, whole, scripted: bool = True) -> None:
    """`events` (one streamed response, as the SDK reads them) add up to `whole` (the same request not
    streamed): numbered, opened and closed as OpenAI's are, each item's events in its place, each
    item's deltas joined its text (or arguments), and the last event's response equal to `whole` but for
    the calls' `call_id`s (new each reply: `items` keeps their index). A scripted engine keeps no prefix cache, so the usage is equal
    too; on a real one (`scripted=False`) the later request finds its prompt cached (`cached_tokens`)."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    done = events[-1]
    assert done.type == "response.completed" and done.response.status == "completed"
    assert items(done.response) == items(whole)
    if scripted:
        assert done.response.usage == whole.usage
    else:
        counts = ("input_tokens", "output_tokens", "total_tokens")
        assert [getattr(done.response.usage, k) for k in counts] == [getattr(whole.usage, k) for k in counts]
    # each item: added, its deltas, its done events, then output_item.done, before the next is added
    expected = []
    for index, item in enumerate(done.response.output):
        expected.append(("response.output_item.added", index))
        if item.type == "message":
            deltas = [("response.output_text.delta", index)] if item.content[0].text else []  # none: an empty one
            expected += [("response.content_part.added", index), *deltas,
                         ("response.output_text.done", index), ("response.content_part.done", index)]
        elif item.type == "reasoning":
            expected += [("response.content_part.added", index), ("response.reasoning_text.delta", index),
                         ("response.reasoning_text.done", index), ("response.content_part.done", index)]
        else:
            expected += [("response.function_call_arguments.delta", index),
                         ("response.function_call_arguments.done", index)]
        expected.append(("response.output_item.done", index))
    seen = [(e.type, e.output_index) for e in events[2:-1]]
    assert [pair for i, pair in enumerate(seen) if i == 0 or pair != seen[i - 1]] == expected  # deltas repeat
    by_item = {}
    for e in events:
        if e.type in ("response.output_text.delta", "response.function_call_arguments.delta",
                      "response.reasoning_text.delta"):
            by_item[e.output_index] = by_item.get(e.output_index, "") + e.delta
    for index, item in enumerate(done.response.output):
        if item.type == "message":
            assert by_item.get(index, "") == item.content[0].text
        elif item.type == "reasoning":
            assert by_item[index] == item.content[0].text and item.summary == []
            part_events = [e for e in events if e.type.startswith(("response.content_part", "response.reasoning_text"))
                           and e.output_index == index]
            assert {(e.item_id, e.content_index) for e in part_events} == {(item.id, 0)}
            assert [e.part.type for e in part_events if e.type.startswith("response.content_part")] == \
                ["reasoning_text", "reasoning_text"]
            finished = next(e for e in part_events if e.type == "response.reasoning_text.done")
            assert finished.text == item.content[0].text
            added = next(e for e in events if e.type == "response.output_item.added" and e.output_index == index)
            assert added.item.status == "in_progress" and added.item.content == []
        else:
            assert by_item[index] == item.arguments
            finished = next(e for e in events if e.type == "response.function_call_arguments.done"
                            and e.output_index == index)
            assert (finished.name, finished.arguments, finished.item_id) == (item.name, item.arguments, item.id)
            added = next(e for e in events if e.type == "response.output_item.added" and e.output_index == index)
            assert added.item.status == "in_progress" and added.item.call_id == item.call_id


@pytest.mark.parametrize("reply", list(CALL_REPLIES))
def test_stream_and_non_stream_give_the_same_response_on_calls_with_problems(reply):
    """Issue 48 on /v1/responses: a schema misfit, an unparseable call and two calls are the same
    function_call items streamed and not, the response completed, and each call with a problem named in
    `oospec.schema_failures` beside it."""
    with scripted(*[CALL_REPLIES[reply]] * 2) as (client, _, _engine):
        kw = dict(model=MODEL, input="Book a table for 4 people at Da Michele at 19:30.", tools=[_flat(BOOK_TABLE)])
        whole = client.responses.create(**kw)
        done = list(client.responses.create(**kw, stream=True))[-1]
    assert done.type == "response.completed" and whole.status == "completed"
    assert items(done.response) == items(whole)
    calls = [i for i in whole.output if i.type == "function_call"]
    assert len(calls) == (2 if reply == "two_calls" else 1)
    failures = whole.model_extra["oospec"]["schema_failures"]
    assert [f["id"] for f in failures] == [calls[f["index"]].call_id for f in failures]  # the reply's own ids
    assert [{**f, "id": None} for f in done.response.model_extra["oospec"]["schema_failures"]] == \
        [{**f, "id": None} for f in failures]
    assert [f["index"] for f in failures] == {"misfit": [0], "unparseable": [0], "two_calls": [1]}[reply]


def _flat(tool: dict) -> dict:
    """A chat completions tool as the Responses API writes it: the function's fields at the top."""
    return {"type": "function", **tool["function"]}


def test_raw_stream_has_event_lines_and_no_done_marker():
    with scripted(ANSWER) as (_, url, _engine):
        with httpx.stream("POST", url + "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True},
                          headers={"Authorization": f"Bearer {API_KEY}"}) as r:
            lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    pairs = list(zip(lines[::2], lines[1::2]))
    assert all(e.startswith("event: ") and d.startswith("data: ") for e, d in pairs) and len(lines) % 2 == 0
    assert all(json.loads(d[6:])["type"] == e[7:] for e, d in pairs)
    assert lines[-2] == "event: response.completed"


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_the_first_call(stream):
    with scripted(CALL + "\n" + CALL_TIME) as (client, _, _engine):
        kw = dict(model=MODEL, input="Both?", tools=[WEATHER, TIME], parallel_tool_calls=False)
        if stream:
            events = list(client.responses.create(**kw, stream=True))
            r = events[-1].response
            assert not any(getattr(e, "output_index", 0) > 0 for e in events)
        else:
            r = client.responses.create(**kw)
    assert [(i.type, i.name) for i in r.output] == [("function_call", "get_weather")]
    assert r.parallel_tool_calls is False


def test_structured_output_through_the_sdks_parse():
    """`text.format` (a JSON Schema) is chat completions' response_format; the SDK parses the text."""
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        celsius: int

    with scripted('{"city": "Paris", "celsius": 22}') as (client, _, engine):
        r = client.responses.parse(model=MODEL, input="Weather in Paris?", text_format=Weather)
    assert r.output_parsed == Weather(city="Paris", celsius=22)
    fmt = engine.requests[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Weather"
    assert fmt["json_schema"]["strict"] is True and "celsius" in fmt["json_schema"]["schema"]["properties"]


def test_the_sdk_raises_bad_request_naming_the_field():
    with scripted() as (client, _, _engine):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert err.value.body["param"] == "previous_response_id"
    assert "stores no responses" in err.value.body["message"]


UNSERVED = [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
    ({"conversation": "conv_1"}, "conversation", "stores no responses"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "'web_search' is not served"),
    ({"tools": [WEATHER, {"type": "file_search", "vector_store_ids": ["vs"]}]}, "tools[1].type", "'file_search'"),
    ({"tools": [{"type": "function", "function": WEATHER}]}, "tools[0].name", "flat"),
    ({"tools": [{**WEATHER, "strict": "yes"}]}, "tools[0].strict", "expected a boolean"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "is not served"),
    ({"input": [{"type": "file_search_call", "id": "fs_1"}]}, "input[0].type", "'file_search_call' are not served"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "id": "rs_1", "summary": [],
                                                    "encrypted_content": "gAAAA"}]},
     "input[1].encrypted_content", "no encrypted reasoning"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "output_text", "text": "x"}]}]},
     "input[0].content[0]", "reasoning_text"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": "think"}]}, "input[0].summary", "must be a list"),
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "reasoning", "id": "rs_1", "summary": []}]},
     "input", "No tool output found for function call c1"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "stores no items"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input[0].content[0]", "'input_image' parts are not served"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "expected one of"),
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"}]},
     "input", "No tool output found for function call c1"),
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"role": "user", "content": "and?"}]}, "input", "No tool output found for function call c1"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "c9", "output": "x"}]},
     "input[1].call_id", "No tool call found for function call output with call_id c9"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "function_call", "name": "f", "arguments": "{}"}]},
     "input[1].call_id", "must be a non-empty string"),
    ({"input": []}, "input", "input is required"),
    ({"background": True}, "background", "not served"),
    ({"reasoning": {"context": "all_turns"}}, "reasoning.context", "not served"),
    ({"reasoning": {"effort": "low", "summary": "verbose"}}, "reasoning.summary", "must be one of"),
    ({"truncation": "auto"}, "truncation", "never truncated"),
    ({"top_logprobs": 3}, "top_logprobs", "logprobs are not served"),
    ({"include": ["message.output_text.logprobs"]}, "include", "logprobs are not served"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format", "not served"),
    ({"max_output_tokens": 0}, "max_output_tokens", "greater than or equal to 1"),
]


def test_what_is_not_served_is_a_400_naming_it():
    with scripted() as (_, url, engine):
        for change, param, says in UNSERVED:
            r = post(url, {"model": MODEL, "input": "Weather in Paris?", **change})
            assert r.status_code == 400, (change, r.text)
            error = r.json()["error"]
            assert error["param"] == param and says in error["message"], (change, error)
            assert error["type"] == "invalid_request_error"
        assert engine.requests == []  # refused before the engine ran


def test_the_key_the_model_and_a_bad_tool_choice():
    with scripted() as (_, url, _engine):
        assert post(url, {"model": MODEL, "input": "hi"}, key=None).status_code == 401
        assert post(url, {"model": MODEL, "input": "hi"}, key="wrong").status_code == 401
        r = post(url, {"model": "other", "input": "hi"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        r = post(url, {"model": MODEL, "input": "hi", "tools": [WEATHER],
                       "tool_choice": {"type": "function", "name": "nope"}})
        assert r.status_code == 400 and "nope" in r.json()["error"]["message"]


def test_store_is_accepted_and_nothing_is_stored():
    with scripted(ANSWER) as (client, url, _engine):
        r = client.responses.create(model=MODEL, input="hi", store=True, metadata={"run": "7"})
        assert r.store is False and r.metadata == {"run": "7"}
        retrieved = httpx.get(f"{url}/v1/responses/{r.id}", headers={"Authorization": f"Bearer {API_KEY}"})
        assert retrieved.status_code in (404, 405)


# ----------------------------------------------------------------------------- reasoning (#47), scripted

@pytest.mark.parametrize("reply, kinds", [
    (THINK + "Checking both.\n" + CALL + "\n" + CALL_TIME, ["reasoning", "message", "function_call", "function_call"]),
    (THINK + CALL, ["reasoning", "function_call"]),
    (THINK + ANSWER, ["reasoning", "message"]),
    (THINK, ["reasoning", "message"]),                         # nothing after the reasoning: an empty message
    ("<think>\n\n</think>\n\n" + ANSWER, ["message"]),        # an empty block: no reasoning item
])
def test_a_reasoning_reply_has_a_reasoning_item_first(reply, kinds):
    """OpenAI's `reasoning` item (`reasoning_text` content, an empty `summary`) before the message and
    the calls; streamed as `response.reasoning_text.delta`s in its own `reasoning_text` part, as OpenAI's
    open-weight models and vLLM stream it; the SDK's own event types and its accumulator take it."""
    from openai.types.responses import ResponseReasoningItem, ResponseReasoningTextDeltaEvent, \
        ResponseReasoningTextDoneEvent
    with scripted(reply, reply, reply, reasoning=Reasoning()) as (client, _, engine):
        kw = dict(model=MODEL, input="Weather in Paris, time in Rome?", tools=[WEATHER, TIME])
        whole = client.responses.create(**kw)
        events = list(client.responses.create(**kw, stream=True))
        with client.responses.stream(**kw) as stream:
            helper = stream.get_final_response()
    assert [i.type for i in whole.output] == kinds
    check_stream(events, whole)
    assert items(helper) == items(whole)
    thoughts = [i for i in whole.output if i.type == "reasoning"]
    if "reasoning" in kinds:
        (thought,) = thoughts
        assert isinstance(thought, ResponseReasoningItem) and thought.id.startswith("rs_")
        assert thought.content[0].text == THOUGHT and thought.status == "completed"
        assert any(isinstance(e, ResponseReasoningTextDeltaEvent) for e in events)
        assert any(isinstance(e, ResponseReasoningTextDoneEvent) for e in events)
    else:
        assert not any("reasoning" in e.type for e in events)
    message = [i for i in whole.output if i.type == "message"]
    assert whole.output_text == (message[0].content[0].text if message else "")
    assert THOUGHT not in whole.output_text


def test_input_reasoning_items_are_the_next_assistant_turns_reasoning_content():
    """A `reasoning` item (its `reasoning_text` content, else its summary) goes back as the
    `reasoning_content` of the assistant message or calls after it, as chat completions takes it; one
    that nothing of the assistant's follows is an assistant turn of its own; an empty one adds nothing."""
    def reasoning(content=(), summary=()):
        return {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_text", "text": t} for t in summary],
                "content": [{"type": "reasoning_text", "text": t} for t in content]}
    conversation = [
        {"role": "user", "content": "Weather in Paris?"},
        reasoning(["Paris: ask the tool."], ["Ask the tool."]),
        {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "a", "output": "sun"},
        reasoning(summary=["Sunny: say so."]),
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And Rome?"},
        reasoning(),
        {"role": "assistant", "content": "Rome?"},
        {"role": "user", "content": "Yes."},
        reasoning(["Rome next."]),
        {"role": "user", "content": "Go on."},
        reasoning(["Still thinking."]),
    ]
    with scripted(ANSWER) as (client, _, engine):
        client.responses.create(model=MODEL, input=conversation, tools=[WEATHER])
    call = {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert engine.requests[0]["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Paris: ask the tool.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a", "content": "sun"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "Sunny: say so."},
        {"role": "user", "content": "And Rome?"},
        {"role": "assistant", "content": "Rome?"},
        {"role": "user", "content": "Yes."},
        {"role": "assistant", "content": "", "reasoning_content": "Rome next."},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": "", "reasoning_content": "Still thinking."}]


def test_reasoning_effort_and_chat_template_kwargs_reach_the_engine():
    """`reasoning.effort` is the engine's `reasoning_effort`; `reasoning.summary` is accepted and
    ignored (no summary is written); both are echoed in the response; `chat_template_kwargs` (vLLM's
    extra field) goes to the engine as on chat completions."""
    with scripted(THINK + ANSWER, ANSWER, reasoning=Reasoning()) as (client, _, engine):
        r = client.responses.create(model=MODEL, input="hi", reasoning={"effort": "low", "summary": "auto"})
        plain = client.responses.create(model=MODEL, input="hi",
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert engine.requests[0]["reasoning_effort"] == "low" and engine.requests[0].get("chat_template_kwargs") is None
    assert (r.reasoning.effort, r.reasoning.summary) == ("low", "auto")
    assert r.output[0].summary == [] and r.output[0].content[0].text == THOUGHT
    assert engine.requests[1]["chat_template_kwargs"] == {"enable_thinking": False}
    assert engine.requests[1].get("reasoning_effort") is None and plain.reasoning is None


# ----------------------------------------------------------------------------- reasoning (#47), a real engine

ASK = "Weather in Paris, time in Rome?"
CONTENT = "Let me check both."
REPLY = THINK + CONTENT + "\n" + CALL + "\n" + CALL_TIME
N = 120  # enough for the scripted reply, which ends with its end-of-sequence token


def _chat_tool(tool: dict) -> dict:
    """A flat Responses tool as chat completions (and the engine) take it."""
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")}}


@pytest.fixture(scope="module")
def thinking(with_template):
    """A tiny qwen3 under the Qwen3-style template, made to write `REPLY` (it reasons, says a sentence,
    calls twice) to `ASK` with WEATHER and TIME offered, served: (engine, client, greedy's tokens)."""
    tok = with_template(TEMPLATES["qwen3"])
    engine = Engine(tiny_qwen3(tok), tok, model_name="tiny-qwen3-thinking")
    prompt = engine.prompt_ids([{"role": "user", "content": ASK}], [_chat_tool(WEATHER), _chat_tool(TIME)])
    ScriptedTarget(engine.target, tok).script(prompt, REPLY)
    reference = greedy(engine, prompt, N)
    with running(create_app(engine, model=MODEL, api_key=API_KEY)) as url:
        yield engine, openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0), reference


@pytest.mark.parametrize("method", ["oospec", "ar"])
def test_a_real_reasoning_reply_streamed_and_not(thinking, monkeypatch, method):
    """The reasoning item's text is the Generation's reasoning, and the streamed deltas join to it; the
    message and the calls are the Generation's; stream == non-stream; greedy's tokens both times."""
    engine, client, reference = thinking
    seen = record_requests(monkeypatch, engine)
    kw = dict(model=MODEL, input=ASK, tools=[WEATHER, TIME], max_output_tokens=N, extra_body={"method": method})
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    gen = seen[0][3]
    assert gen.token_ids == seen[1][3].token_ids == reference
    assert (gen.reasoning, gen.content) == (THOUGHT, CONTENT)
    assert [i.type for i in whole.output] == ["reasoning", "message", "function_call", "function_call"]
    assert whole.output[0].content[0].text == gen.reasoning and whole.output[0].summary == []
    assert whole.output_text == gen.content
    assert [(i.name, json.loads(i.arguments)) for i in whole.output[2:]] == \
        [(c["name"], c["arguments"]) for c in gen.tool_calls] == [("get_weather", {"city": "Paris"}),
                                                                  ("get_time", {"city": "Rome"})]
    check_stream(events, whole, scripted=False)
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == gen.reasoning
    assert len(deltas) > 1 or method == "oospec"  # ar commits a token a round: the reasoning in pieces
    reasoned = max(e.sequence_number for e in events if e.type == "response.reasoning_text.delta")
    assert reasoned < min(e.sequence_number for e in events if e.type in
                          ("response.output_text.delta", "response.function_call_arguments.delta"))


def test_the_reasoning_item_goes_back_to_the_template(thinking, monkeypatch):
    """The SDK's loop: the response's output (its reasoning item among it) sent back as input with the
    calls' outputs; the reasoning reaches the template as the assistant turn's `reasoning_content`,
    which the Qwen3-style template writes back into the prompt."""
    engine, client, _ = thinking
    seen = record_requests(monkeypatch, engine)
    first = client.responses.create(model=MODEL, input=ASK, tools=[WEATHER, TIME], max_output_tokens=N)
    calls = [i for i in first.output if i.type == "function_call"]
    conversation = [{"role": "user", "content": ASK}, *[i.model_dump(exclude_none=True) for i in first.output],
                    *[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls]]
    client.responses.create(model=MODEL, input=conversation, tools=[WEATHER, TIME], max_output_tokens=2)
    messages, tools = seen[-1][0], seen[-1][1]
    assert messages[1]["role"] == "assistant" and messages[1]["reasoning_content"] == THOUGHT
    assert messages[1]["content"] == CONTENT and len(messages[1]["tool_calls"]) == 2
    prompt = engine.tokenizer.decode(engine.prompt_ids(messages, tools))
    assert f"<think>\n{THOUGHT}\n</think>\n\n{CONTENT}" in prompt
    assert seen[-1][3].prompt_tokens == len(engine.prompt_ids(messages, tools))


def test_chat_template_kwargs_turn_the_reasoning_off(thinking, monkeypatch):
    engine, client, _ = thinking
    seen = record_requests(monkeypatch, engine)
    r = client.responses.create(model=MODEL, input=ASK, max_output_tokens=4,
                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert seen[-1][2]["chat_template_kwargs"] == {"enable_thinking": False} and seen[-1][3].reasoning is None
    assert [i.type for i in r.output] == ["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("change, param, says", [
    ({"reasoning": {"effort": "high"}}, "reasoning.effort", "this chat template takes no reasoning_effort"),
    ({"reasoning": {"effort": "max"}}, "reasoning.effort", "reasoning_effort must be one of ['low', 'medium', 'high']"),
    ({"extra_body": {"chat_template_kwargs": {"enable_thinkng": False}}}, "chat_template_kwargs",
     "'enable_thinkng' is not an argument of this chat template"),
    ({"extra_body": {"chat_template_kwargs": {"reasoning_effort": "high"}}}, "chat_template_kwargs",
     "this chat template takes no reasoning_effort"),
    ({"extra_body": {"chat_template_kwargs": {"enable_thinking": "yes"}}}, "chat_template_kwargs",
     "the chat template rejects enable_thinking='yes'"),
])
def test_a_bad_template_argument_is_openais_400_naming_it(thinking, change, param, says, stream):
    """The engine's TemplateArgumentError, before anything streams, named as the request gave it."""
    _, client, _ = thinking
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input=ASK, max_output_tokens=4, stream=stream, **change)
    body = raised.value.body
    assert raised.value.status_code == 400 and body["type"] == "invalid_request_error", body
    assert body["param"] == param and says in body["message"], body


def test_reasoning_effort_reaches_a_template_that_reads_it(with_template, monkeypatch):
    """Under a template with effort levels, `reasoning.effort` is in the prompt the reply is decoded
    from (its `Reasoning: high` line), streamed and not."""
    tok = with_template(chat_template(effort=True))
    engine = Engine(tiny_qwen3(tok, seed=1), tok, model_name="tiny-qwen3-effort")
    seen = record_requests(monkeypatch, engine)
    messages = [{"role": "user", "content": ASK}]
    with running(create_app(engine, model=MODEL, api_key=API_KEY)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        whole = client.responses.create(model=MODEL, input=ASK, max_output_tokens=3, reasoning={"effort": "high"})
        done = list(client.responses.create(model=MODEL, input=ASK, max_output_tokens=3, stream=True,
                                            reasoning={"effort": "high"}))[-1].response
        plain = client.responses.create(model=MODEL, input=ASK, max_output_tokens=3)
    prompt = engine.prompt_ids(messages, reasoning_effort="high")
    assert "Reasoning: high" in engine.tokenizer.decode(prompt)
    assert [entry[2].get("reasoning_effort") for entry in seen] == ["high", "high", None]
    assert [entry[3].prompt_tokens for entry in seen] == [len(prompt), len(prompt), len(engine.prompt_ids(messages))]
    assert whole.reasoning.effort == done.reasoning.effort == "high" and plain.reasoning is None
    assert whole.usage.input_tokens == len(prompt)


# ----------------------------------------------------------------------------- the tiny model: a real decode

@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    engine = Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, model_name="tiny-llama")
    with running(create_app(engine, model=MODEL, api_key=API_KEY)) as url:
        yield url, openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_max_output_tokens_is_an_incomplete_response(tiny, stream):
    _, client = tiny
    kw = dict(model=MODEL, input="Tell me a story.", max_output_tokens=5, tool_choice="none")
    if stream:
        events = list(client.responses.create(**kw, stream=True))
        assert events[-1].type == "response.incomplete"
        r = events[-1].response
    else:
        r = client.responses.create(**kw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.max_output_tokens == 5
    assert r.output[-1].status == "incomplete" and r.completed_at is None


def test_a_forced_call_has_the_chat_completions_tokens(tiny):
    """One engine, one translation: the response's call and text are chat completions' reply."""
    url, client = tiny
    for tool_choice in ({"type": "function", "name": "get_time"}, "none"):
        r = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER, TIME],
                                    tool_choice=tool_choice, max_output_tokens=12)
        chat_choice = tool_choice if tool_choice == "none" else {"type": "function", "function": {"name": "get_time"}}
        chat = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=12,
            tools=[{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
                   for t in (WEATHER, TIME)], tool_choice=chat_choice)
        message = chat.choices[0].message
        calls = [(i.name, i.arguments) for i in r.output if i.type == "function_call"]
        assert calls == [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        assert r.output_text == (message.content or "")
        assert r.usage.output_tokens == chat.usage.completion_tokens
        assert r.usage.input_tokens == chat.usage.prompt_tokens


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.7}, {"temperature": -1},
                                      {"top_p": 1}, {"top_p": 0.5}, {"top_p": 7}, {"temperature": 0.5, "top_p": 0.9}])
def test_sampling_is_answered_as_chat_completions_answers_it(tiny, sampling):
    url, _ = tiny
    headers = {"Authorization": f"Bearer {API_KEY}"}
    chat = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, **sampling})
    response = post(url, {"model": MODEL, "input": "Hi", "max_output_tokens": 3, **sampling})
    assert response.status_code == chat.status_code, (response.text, chat.text)
    if chat.status_code == 400:
        assert response.json()["error"] == chat.json()["error"]
    else:
        assert response.json()["usage"]["output_tokens"] == chat.json()["usage"]["completion_tokens"]


def test_a_client_leaving_mid_stream_frees_the_engine(tiny):
    url, client = tiny
    body = {"model": MODEL, "input": "Tell me a story.", "max_output_tokens": 1900, "stream": True,
            "tool_choice": "none"}
    with httpx.stream("POST", url + "/v1/responses", json=body, headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        lines = r.iter_lines()
        for _ in range(12):
            next(lines)
    t0 = time.perf_counter()
    reply = client.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    waited = time.perf_counter() - t0
    assert reply.usage.output_tokens == 3
    assert waited < 2.5, f"the next request waited {waited:.1f}s: the abandoned stream held the engine"


# ----------------------------------------------------------------------------- the OpenAI Agents SDK

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents, the dev extra) is not installed")


@pytest.mark.parametrize("model_class, streamed", [
    ("OpenAIResponsesModel", False), ("OpenAIResponsesModel", True), ("OpenAIChatCompletionsModel", False)])
async def test_an_openai_agents_agent_calls_the_tool_then_answers(model_class, streamed):
    agents.set_tracing_disabled(True)  # no traces sent to OpenAI
    seen = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        seen.append(city)
        return f"22 C and sunny in {city}"

    engine = Scripted(CALL, ANSWER)
    with running(create_app(engine, model=MODEL, api_key=API_KEY)) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        model = getattr(agents, model_class)(model=MODEL, openai_client=client)
        agent = agents.Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model)
        if streamed:
            result = agents.Runner.run_streamed(agent, "Weather in Paris?")
            kinds = {event.type async for event in result.stream_events()}
            assert "raw_response_event" in kinds
        else:
            result = await agents.Runner.run(agent, "Weather in Paris?")
    assert seen == ["Paris"]
    assert result.final_output == ANSWER
    first, second = engine.requests
    assert first["messages"] == [{"role": "system", "content": "Answer with the tool."},
                                 {"role": "user", "content": "Weather in Paris?"}]
    assert first["tools"][0]["function"]["name"] == "get_weather"
    assert first["tools"][0]["function"]["strict"] is True  # the SDK's strict schemas reach the engine
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert second["messages"][-1]["content"] == "22 C and sunny in Paris"


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_openai_agents_agent_sends_the_reasoning_back(streamed):
    """A reasoning reply through the Agents SDK's OpenAIResponsesModel: it keeps the reasoning item and
    sends it back with the call's output; the reasoning reaches the engine as `reasoning_content`."""
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"22 C and sunny in {city}"

    engine = Scripted(THINK + CALL, ANSWER, reasoning=Reasoning())
    with running(create_app(engine, model=MODEL, api_key=API_KEY)) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent = agents.Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model)
        if streamed:
            result = agents.Runner.run_streamed(agent, "Weather in Paris?")
            async for _ in result.stream_events():
                pass
        else:
            result = await agents.Runner.run(agent, "Weather in Paris?")
    assert result.final_output == ANSWER
    assert [type(item).__name__ for item in result.new_items] == \
        ["ReasoningItem", "ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    assert result.new_items[0].raw_item.content[0].text == THOUGHT
    assistant = engine.requests[1]["messages"][2]
    assert assistant["role"] == "assistant" and assistant["reasoning_content"] == THOUGHT
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"


@AMX_BF16_FLAW  # the two APIs' answers are two bf16 replies of one engine, warm and cold
@pytest.mark.slow
async def test_an_openai_agents_agent_on_the_embedded_model_through_either_api(embedded_server):
    """The embedded 135M, as the agent's model through each API: it calls the tool, reads its result
    and answers; one engine and one chat, so both APIs give the same answer."""
    agents.set_tracing_disabled(True)
    seen, answers = [], {}

    @agents.function_tool
    def get_current_weather(location: str) -> str:
        """Get the current weather in a given city."""
        seen.append(location)
        return f"It is 22 degrees Celsius and sunny in {location}."

    client = openai.AsyncOpenAI(base_url=embedded_server + "/v1", api_key="unused", max_retries=0)
    for model_class in ("OpenAIResponsesModel", "OpenAIChatCompletionsModel"):
        model = getattr(agents, model_class)(model="embedded", openai_client=client)
        agent = agents.Agent(name="weather", tools=[get_current_weather], model=model,
                             model_settings=agents.ModelSettings(max_tokens=48))
        result = await agents.Runner.run(agent, "What is the current weather in Paris?", max_turns=4)
        assert [type(item).__name__ for item in result.new_items] == \
            ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], model_class
        assert "Paris" in seen[-1] and result.final_output.strip()
        answers[model_class] = result.final_output
    assert answers["OpenAIResponsesModel"] == answers["OpenAIChatCompletionsModel"]
