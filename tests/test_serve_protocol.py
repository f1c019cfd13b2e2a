"""`oospec serve` speaks OpenAI Chat Completions: driven by the official `openai` client (sync and async)
and raw HTTP against a real uvicorn server on 127.0.0.1, serving a tiny random model.

The tiny model's words are noise, so these tests check the protocol, not the answers: a forced call
is named as forced, streamed deltas add up to the non-streamed reply, every error has its status and
names what was wrong, and load never loses a request.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
from serve_testing import API_KEY, running

from oospec_agents import Engine
from oospec_agents.serve import create_app
from oospec_agents.testing import BOOK_TABLE, CALL_REPLIES, Scripted
from oospec_testing import load_records, spread, tiny_model

MODEL = "tiny"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_BODY = 256 * 1024


@pytest.fixture(scope="module")
def engine(smollm2_tokenizer):
    return Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, model_name="tiny-llama")


@pytest.fixture(scope="module")
def url(engine):
    with running(create_app(engine, model=MODEL, api_key=API_KEY, max_body_bytes=MAX_BODY)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture
def aclient(url):
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)


def post(url, body, *, key=API_KEY, timeout=60, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout, **kw)


def collect(chunks) -> dict:
    """Aggregate streamed chunks the way an OpenAI client does; keeps the order deltas came in."""
    out = {"role": None, "content": "", "calls": {}, "finish_reason": None, "usage": None, "oospec": None,
           "order": []}
    for chunk in chunks:
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        extra = chunk.model_extra or {}
        if extra.get("oospec"):
            out["oospec"] = extra["oospec"]
        for choice in chunk.choices:
            d = choice.delta
            out["role"] = out["role"] or d.role
            out["content"] += d.content or ""
            for tc in d.tool_calls or []:
                call = out["calls"].setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                if tc.id:  # a call's first delta: its id and name
                    call["id"], call["name"] = tc.id, tc.function.name
                    out["order"].append(("name", tc.index))
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
                    out["order"].append(("args", tc.index))
            out["finish_reason"] = choice.finish_reason or out["finish_reason"]
    return out


# ----------------------------------------------------------------------------- the openai client

def test_forced_named_call(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], max_tokens=12,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_time" and calls[0].type == "function"
    assert calls[0].id.startswith("call_")
    assert r.choices[0].finish_reason in ("tool_calls", "length")
    assert r.model == MODEL and r.object == "chat.completion"


def test_forced_required_call(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       max_tokens=12)
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_tool_choice_none_calls_nothing(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none",
                                       max_tokens=8)
    assert r.choices[0].message.tool_calls is None
    assert isinstance(r.choices[0].message.content, str)


def test_history_with_tool_results(client):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C and sunny"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > 40


def test_usage_counts_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5


def test_oospec_object(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       max_tokens=10, extra_body={"method": "toolspec"})
    extra = r.model_extra["oospec"]
    assert extra["stats"]["method"] == "toolspec"
    assert extra["stats"]["target_forwards"] >= 1
    assert set(extra["stats"]["accepted_by_source"]) == {"schema", "retrieval", "hint", "grammar", "prediction"}
    assert extra["replica"]
    # a call cut off at max_tokens cannot satisfy its schema: the failure names the call and says why
    if r.choices[0].finish_reason == "length":
        failure = extra["schema_failures"][0]
        assert failure["index"] == 0 and failure["name"] == "get_weather" and failure["error"]


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_stream_adds_up_to_the_reply(client, tool_choice):
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice=tool_choice, max_tokens=24)
    whole = client.chat.completions.create(**kw)
    streamed = collect(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    message = whole.choices[0].message
    assert streamed["role"] == "assistant"
    assert streamed["content"] == (message.content or "")
    calls = [streamed["calls"][i] for i in sorted(streamed["calls"])]
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    assert all(c["id"] for c in calls)
    assert streamed["finish_reason"] == whole.choices[0].finish_reason
    assert streamed["usage"].completion_tokens == whole.usage.completion_tokens
    assert streamed["oospec"]["stats"]["new_tokens"] == whole.model_extra["oospec"]["stats"]["new_tokens"]
    for index in streamed["calls"]:  # each call is named before any of its argument fragments
        kinds = [kind for kind, i in streamed["order"] if i == index]
        assert kinds[0] == "name" and "name" not in kinds[1:]
    if tool_choice == "required":
        assert calls and len([k for k, _ in streamed["order"] if k == "args"]) >= 1


def test_stream_usage_chunk_comes_last(url):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        lines = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and "oospec" in chunks[-2]


async def test_async_client_forced_call_and_stream(aclient):
    r = await aclient.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=10,
                                              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    stream = await aclient.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=10,
                                                   tool_choice="required", stream=True)
    chunks = [c async for c in stream]
    assert collect(chunks)["calls"][0]["name"] == "get_weather"


def test_models_health_metrics(url, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL
    client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2)
    text = httpx.get(url + "/metrics").text
    for name in ("oospec_requests_total{status=\"200\"}", "oospec_prompt_tokens_total", "oospec_generated_tokens_total",
                 "oospec_target_forwards_total", "oospec_accepted_tokens_total{source=\"schema\"}",
                 "oospec_hints_total{arrival=\"in_time\"}", "oospec_hints_total{arrival=\"late\"}",
                 "oospec_sidecar_faults_total", "oospec_queue_depth", "oospec_time_to_first_token_seconds_bucket",
                 "oospec_request_seconds_bucket"):
        assert name in text, f"{name} missing from /metrics"


@pytest.mark.parametrize("error, ready_s, counted", [
    (None, 0.2, ("in_time", 0)),
    ("sidecar hint late: not ready when the reply was complete", None, ("late", 0)),
    ("sidecar hint late: it arrived after the reply was complete (reported, not used)", 1.5, ("late", 0)),
    ("sidecar worker died: exit code -9", None, (None, 1)),
])
def test_metrics_count_a_late_hint_as_late_and_a_fault_as_a_fault(error, ready_s, counted):
    """The session reports a late hint in `stats.sidecar_error` as it reports faults; /metrics counts it
    under `oospec_hints_total{arrival="late"}`, not as a sidecar fault."""
    from types import SimpleNamespace

    from oospec_agents.serve.metrics import Metrics
    m = Metrics()
    m.record(SimpleNamespace(stats={"sidecar_error": error, "hint_ready_s": ready_s, "target_forwards": 3},
                             prompt_tokens=10, token_ids=[1, 2, 3]), hint_asked=True)
    text = m.exposition().decode()
    value = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("oospec_")}
    arrival, faults = counted
    for label in ("in_time", "late"):
        assert value[f'oospec_hints_total{{arrival="{label}"}}'] == (label == arrival)
    assert value["oospec_sidecar_faults_total"] == faults


# ----------------------------------------------------------------------------- scripted replies

TWO_CALLS = ('Let me check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"city": 7}}\n</tool_call>')


def scripted_reply(*, stream: bool, **body):
    """One request to a server whose engine replays TWO_CALLS (content, a valid call, an invalid one)."""
    with running(create_app(Scripted(TWO_CALLS), model=MODEL)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], stream=stream, **body)
        return collect(r) if stream else r


def test_content_and_two_calls_stream_like_the_reply():
    whole = scripted_reply(stream=False).choices[0]
    streamed = scripted_reply(stream=True)
    assert whole.message.content == streamed["content"] == "Let me check both."
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == \
        [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == \
        [("get_weather", '{"city": "Paris"}'), ("get_time", '{"city": 7}')]
    assert whole.finish_reason == streamed["finish_reason"] == "tool_calls"


def test_schema_failures_carry_the_validators_message():
    failures = scripted_reply(stream=False).model_extra["oospec"]["schema_failures"]
    assert len(failures) == 1
    assert failures[0]["index"] == 1 and failures[0]["name"] == "get_time"
    assert "7 is not of type 'string'" in failures[0]["error"]


BOOK_ASK = [{"role": "user", "content": "Book a table for 4 people at Da Michele at 19:30."}]
SCHEMA_FAILURES = {  # per scripted reply: (index, words of the error) of each call with a problem
    "misfit": [(0, "'4' is not of type 'integer'")],
    "unparseable": [(0, "not valid JSON")],
    "two_calls": [(1, "'two' is not of type 'integer'")],
}


@pytest.mark.parametrize("reply", list(CALL_REPLIES))
def test_stream_and_non_stream_give_the_same_message(reply):
    """Issue 48, through the openai SDK: a schema misfit, an unparseable call and two calls come as the
    same message streamed and not, `finish_reason` "tool_calls" (the message holds calls), and each call
    with a problem named in `oospec.schema_failures` (the misfit stays a call, as OpenAI's would)."""
    with running(create_app(Scripted(*[CALL_REPLIES[reply]] * 2), model=MODEL)) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        kw = dict(model=MODEL, messages=BOOK_ASK, tools=[BOOK_TABLE])
        whole = client.chat.completions.create(**kw)
        streamed = collect(client.chat.completions.create(**kw, stream=True))
    message = whole.choices[0].message
    assert streamed["content"] == (message.content or "")
    assert [(c["name"], c["arguments"]) for c in streamed["calls"].values()] == \
        [(c.function.name, c.function.arguments) for c in message.tool_calls]
    # each reply's calls are `call_<reply's own>_<i>`: the same i, in the same order
    assert [c["id"].rsplit("_", 1)[1] for c in streamed["calls"].values()] == \
        [c.id.rsplit("_", 1)[1] for c in message.tool_calls] == [str(i) for i in range(len(message.tool_calls))]
    assert whole.choices[0].finish_reason == streamed["finish_reason"] == "tool_calls"
    failures = whole.model_extra["oospec"]["schema_failures"]
    assert [{**f, "id": f["id"].rsplit("_", 1)[1]} for f in streamed["oospec"]["schema_failures"]] == \
        [{**f, "id": f["id"].rsplit("_", 1)[1]} for f in failures]  # the same, but for the reply's own call ids
    assert [(f["index"], f["id"]) for f in failures] == [(i, message.tool_calls[i].id) for i, _ in SCHEMA_FAILURES[reply]]
    assert all(words in f["error"] for f, (_, words) in zip(failures, SCHEMA_FAILURES[reply]))


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_the_first_call(stream):
    r = scripted_reply(stream=stream, parallel_tool_calls=False)
    calls = [c["name"] for c in r["calls"].values()] if stream else \
        [c.function.name for c in r.choices[0].message.tool_calls]
    assert calls == ["get_weather"]


# ----------------------------------------------------------------------------- errors name the problem

BAD_REQUESTS = {
    "bad tool schema": ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
                        "'f'"),
    "duplicate tool names": ({"tools": [WEATHER, WEATHER]}, "duplicate tool name 'get_weather'"),
    "unknown tool_choice": ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                            "'nope'"),
    "bad role": ({"messages": [{"role": "robot", "content": "hi"}]}, "'robot'"),
    "no messages": ({"messages": []}, "messages"),
    "over context": ({"messages": [{"role": "user", "content": "word " * 3000}]}, "context window"),
    "temperature": ({"temperature": -0.7}, "temperature must be a number from 0 to 2"),
    "top_p": ({"top_p": 1.5}, "top_p must be a number in (0, 1], got 1.5"),
    "n": ({"n": 9}, "n must be an integer from 1 to 8"),
    "frequency_penalty": ({"frequency_penalty": 0.5}, "frequency_penalty=0.5 is not served"),
    "logit_bias": ({"logit_bias": {"42": 5}}, "logit_bias is not served"),
    "wrong type": ({"max_tokens": "ten"}, 'max_tokens: Input should be a valid integer, unable to parse string as an '
                                          'integer (got "ten")'),
    "unknown method": ({"method": "beam"}, "method"),
    "empty stop": ({"stop": ["\nObservation:", ""]}, "stop[1] is ''"),
    "response_format type": ({"response_format": {"type": "xml"}}, "response_format.type is 'xml'"),
    "response_format schema": ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
                               "response_format.json_schema.schema"),
    "prediction type": ({"prediction": {"type": "text", "content": "x"}}, "prediction.type is 'text'"),
    "legacy functions": ({"functions": [WEATHER["function"]]}, "functions is OpenAI's deprecated form of tools"),
    "legacy function_call": ({"function_call": "auto"}, "function_call is OpenAI's deprecated form of tools"),
    "audio output": ({"modalities": ["text", "audio"]}, "audio output is not served"),
    "web search": ({"web_search_options": {}}, "web_search_options is not served"),
    "reasoning effort": ({"reasoning_effort": "low"}, "this chat template takes no reasoning_effort"),
    "chat_template_kwargs": ({"chat_template_kwargs": {"enable_thinking": False}},
                             "'enable_thinking' is not an argument of this chat template"),
    "top_logprobs": ({"top_logprobs": 3}, "top_logprobs=3 needs logprobs=true"),
    "prediction content": ({"prediction": {"type": "content", "content": 5}}, "prediction.content must be"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_is_a_400_naming_it(url, case):
    change, named = BAD_REQUESTS[case]
    r = post(url, {"model": MODEL, "messages": ASK, "max_tokens": 4, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert named in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_bad_response_format_names_its_param(url):
    r = post(url, {"model": MODEL, "messages": ASK, "response_format": {"type": "json_schema"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


def test_structured_outputs_through_the_openai_clients_parse(client):
    """`client.chat.completions.parse(response_format=Model)`: the SDK sends the model's strict JSON
    Schema, the reply is decoded under its grammar, and the SDK parses it -- from a random model.
    Streamed, the content deltas add up to the same JSON."""
    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        city: str = Field(max_length=10)
        days: int = Field(ge=1, le=7)
        sunny: bool

    r = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Forecast, max_tokens=80)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "stop" and message.tool_calls in (None, [])
    assert isinstance(message.parsed, Forecast) and 1 <= message.parsed.days <= 7
    assert json.loads(message.content) == message.parsed.model_dump()
    body = {"type": "json_schema", "json_schema": {"name": "Forecast", "strict": True,
                                                   "schema": openai.lib._pydantic.to_strict_json_schema(Forecast)}}
    streamed = collect(client.chat.completions.create(model=MODEL, messages=ASK, response_format=body,
                                                      max_tokens=80, stream=True))
    assert streamed["content"] == message.content and streamed["finish_reason"] == "stop"


def test_a_developer_message_is_a_system_message(client):
    """OpenAI's `developer` role (the system role's successor, which the SDK and agent frameworks send
    for newer models) instructs the model as a system message does: the same reply, token for token."""
    def reply(role):
        r = client.chat.completions.create(model=MODEL, max_tokens=12, tools=[WEATHER], tool_choice="required",
                                           messages=[{"role": role, "content": "Answer with one call."}] + ASK)
        return r.choices[0].message.tool_calls[0].function.arguments, r.usage.prompt_tokens
    assert reply("developer") == reply("system")


def test_a_bad_prediction_names_its_param(url):
    r = post(url, {"model": MODEL, "messages": ASK, "prediction": ["not", "an", "object"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prediction", r.text


@pytest.mark.parametrize("stream", [False, True])
def test_predicted_outputs_through_the_openai_client(client, engine, stream):
    """OpenAI's Predicted Outputs: `prediction` drafts the reply, which stays the same tokens, and usage
    reports how many of the prediction's tokens the reply has (accepted) and has not (rejected)."""
    engine.clear_call_memory()
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, extra_body={"method": "toolspec"})
    text = plain.choices[0].message.content
    prediction = {"type": "content", "content": [{"type": "text", "text": text[:20]}, {"type": "text", "text": text[20:]}]}
    engine.clear_call_memory()  # retrieval would draft the first reply: the prediction alone drafts it here
    kw = dict(model=MODEL, messages=ASK, max_tokens=40, prediction=prediction, extra_body={"method": "toolspec"})
    if stream:
        streamed = collect(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
        content, usage, extra = streamed["content"], streamed["usage"], streamed["oospec"]
    else:
        r = client.chat.completions.create(**kw)
        content, usage, extra = r.choices[0].message.content, r.usage, r.model_extra["oospec"]
    assert content == text
    details, stats = usage.completion_tokens_details, extra["stats"]
    predicted = len(engine.tokenizer.encode(text, add_special_tokens=False))
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == predicted
    assert details.accepted_prediction_tokens == stats["prediction_matched"] > predicted // 2
    assert stats["accepted_by_source"]["prediction"] > 0
    assert stats["target_forwards"] < plain.model_extra["oospec"]["stats"]["target_forwards"]
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0  # no prediction: nothing to count


def test_chat_openai_passes_a_prediction_through(url, engine):
    from langchain_openai import ChatOpenAI
    model = ChatOpenAI(model=MODEL, base_url=url + "/v1", api_key=API_KEY, max_tokens=24, max_retries=0)
    engine.clear_call_memory()
    text = model.invoke(ASK).content
    engine.clear_call_memory()
    reply = model.invoke(ASK, prediction={"type": "content", "content": text})
    assert reply.content == text
    assert reply.response_metadata["token_usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="duplicate tool name"):
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, WEATHER])


_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
_TIME_CALL = {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}
_CALLED = {"role": "assistant", "content": None, "tool_calls": [_CALL]}
BAD_TOOL_TURNS = {  # OpenAI's 400s for a history whose tool turns do not pair up, with its params
    "tool message without tool_call_id": (
        ASK + [_CALLED, {"role": "tool", "content": "22 C"}], "messages.[2].tool_call_id", "Missing parameter"),
    "tool message after no call": (
        ASK + [{"role": "tool", "tool_call_id": "call_1", "content": "22 C"}], "messages.[1].role",
        "must be a response to a preceding message with 'tool_calls'"),
    "tool message answering another id": (
        ASK + [_CALLED, {"role": "tool", "tool_call_id": "call_9", "content": "22 C"}],
        "messages.[2].tool_call_id", "'call_9'"),
    "the same call answered twice": (
        ASK + [_CALLED, {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
               {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}], "messages.[3].tool_call_id", "'call_1'"),
    "a call left unanswered": (
        ASK + [{**_CALLED, "tool_calls": [_CALL, _TIME_CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "22"},
               {"role": "user", "content": "And?"}], "messages.[1].role",
        "did not have response messages: call_2"),
    "the history ends on a call": (ASK + [_CALLED], "messages.[1].role", "did not have response messages: call_1"),
    "a call without an id": (
        ASK + [{**_CALLED, "tool_calls": [{k: v for k, v in _CALL.items() if k != "id"}]}],
        "messages.[1].tool_calls.[0].id", "Missing required parameter: 'messages[1].tool_calls[0].id'"),
}


@pytest.mark.parametrize("case", list(BAD_TOOL_TURNS))
def test_tool_turns_that_do_not_pair_up_are_openais_400s(client, case):
    messages, param, says = BAD_TOOL_TURNS[case]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME], max_tokens=4)
    assert err.value.param == param and says in err.value.message, err.value.body
    assert err.value.type == "invalid_request_error"


def test_two_calls_answered_in_either_order_are_served(client):
    history = ASK + [{**_CALLED, "tool_calls": [_CALL, _TIME_CALL]},
                     {"role": "tool", "tool_call_id": "call_2", "content": "10:00"},
                     {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER, TIME], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_malformed_json_is_a_400(url):
    r = httpx.post(url + "/v1/chat/completions", content=b'{"model": "tiny", "messages": [',
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize("key, says", [(None, "missing API key"), ("sk-wrong", "incorrect API key")])
def test_api_key_is_required(url, key, says):
    r = post(url, {"model": MODEL, "messages": ASK}, key=key)
    assert r.status_code == 401 and says in r.json()["error"]["message"]
    assert httpx.get(url + "/health").status_code == 200  # health stays open for probes


def test_a_model_is_retrieved_by_its_id_slash_and_all(client, engine):
    assert client.models.retrieve(MODEL).model_dump() == {"id": MODEL, "object": "model", "created": 0,
                                                          "owned_by": "oospec-agents"}
    with pytest.raises(openai.NotFoundError, match="unknown model 'gpt-4o'") as err:
        client.models.retrieve("gpt-4o")
    assert err.value.code == "model_not_found" and err.value.param == "model"
    with running(create_app(engine, model="org/tiny-llama", api_key=API_KEY)) as base:
        hub = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, max_retries=0)
        assert hub.models.retrieve("org/tiny-llama").id == "org/tiny-llama"
        with pytest.raises(openai.NotFoundError):
            hub.models.retrieve("org/other")


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError, match="unknown model 'gpt-4o'"):
        client.chat.completions.create(model="gpt-4o", messages=ASK)


def test_body_over_the_limit_is_a_413(url):
    big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    r = post(url, big)
    assert r.status_code == 413 and f"limit of {MAX_BODY} bytes" in r.json()["error"]["message"]
    chunked = httpx.post(url + "/v1/chat/completions", content=iter([json.dumps(big).encode()]),
                         headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert chunked.status_code == 413  # no Content-Length: counted as it arrives


class _Broken:
    """An engine whose decode crashes with internals in the message."""
    sidecar = None

    def stream(self, *args, **kwargs):
        def events():
            raise RuntimeError("secret internals at /srv/model")
            yield
        return events()


def test_loading_is_a_503_and_a_crash_a_bare_500():
    release = threading.Event()

    def loader():
        release.wait(30)
        return _Broken()

    with running(create_app(loader=loader, model=MODEL), ready_path=None) as base:
        assert httpx.get(base + "/health").status_code == 503
        r = post(base, {"model": MODEL, "messages": ASK})
        assert r.status_code == 503 and "still loading" in r.json()["error"]["message"]
        release.set()
        deadline = time.monotonic() + 10
        while httpx.get(base + "/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = post(base, {"model": MODEL, "messages": ASK})
        assert r.status_code == 500
        assert "secret" not in r.text and "Traceback" not in r.text
        assert "RuntimeError" in r.json()["error"]["message"]
        streamed = post(base, {"model": MODEL, "messages": ASK, "stream": True})
        assert streamed.status_code == 200 and "secret" not in streamed.text
        assert '"error"' in streamed.text and streamed.text.rstrip().endswith("data: [DONE]")


# ----------------------------------------------------------------------------- load

async def test_32_concurrent_clients_all_answered(aclient):
    async def ask(i):
        r = await aclient.chat.completions.create(model=MODEL, max_tokens=6,
                                                  messages=[{"role": "user", "content": f"Question {i}?"}])
        return r
    replies = await asyncio.gather(*(ask(i) for i in range(32)))
    assert len({r.id for r in replies}) == 32
    assert all(r.usage.completion_tokens >= 1 for r in replies)


@pytest.mark.parametrize("max_batch", [1, 2])
def test_full_queue_is_a_429_then_serves_the_next(engine, max_batch):
    """`max_batch` replies decode at once (their forwards shared), `max_queue` wait, the next gets 429."""
    long_body = {"model": MODEL, "messages": ASK, "max_tokens": 1500, "stream": True}
    short = {**long_body, "stream": False, "max_tokens": 2}
    with running(create_app(engine, model=MODEL, max_queue=1, max_batch=max_batch)) as base:
        with httpx.Client(timeout=60) as http, contextlib.ExitStack() as streams:
            kept = []  # the decoding streams' line iterators: dropping one would close its stream
            for _ in range(max_batch):
                first = streams.enter_context(http.stream("POST", base + "/v1/chat/completions", json=long_body))
                kept.append(first.iter_lines())
                next(kept[-1])
            assert engine.decoding == max_batch
            second = threading.Thread(target=httpx.post, args=(base + "/v1/chat/completions",),
                                      kwargs={"json": short, "timeout": 60})
            second.start()
            deadline = time.monotonic() + 20
            while httpx.get(base + "/health").json()["queue"] < 1:  # the next one waits
                assert time.monotonic() < deadline, "the request never queued"
                time.sleep(0.02)
            third = httpx.post(base + "/v1/chat/completions", json=short)
            assert third.status_code == 429, third.text
            assert third.json()["error"]["code"] == "queue_full"
            assert f"--max-queue 1, --max-batch {max_batch}" in third.json()["error"]["message"]
        # the first clients left; the waiting one runs, then the next one is served
        second.join(30)
        with httpx.Client(timeout=60) as http:
            r = http.post(base + "/v1/chat/completions", json=short)
            assert r.status_code == 200
            assert 'oospec_requests_total{status="429"} 1.0' in httpx.get(base + "/metrics").text


def test_disconnect_mid_stream_frees_the_engine(url, client):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 1900, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    t0 = time.perf_counter()
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3)
    waited = time.perf_counter() - t0
    assert reply.usage.completion_tokens == 3
    # 1900 tokens of the tiny model take far longer; a few tokens take well under a second
    assert waited < 2.5, f"the next request waited {waited:.1f}s: the abandoned stream held the engine"


def test_disconnect_while_waiting_for_a_whole_reply_frees_the_engine(url, client):
    with pytest.raises(httpx.ReadTimeout):  # the client gives up on a long non-streamed reply
        post(url, {"model": MODEL, "messages": ASK, "max_tokens": 1900}, timeout=0.5)
    t0 = time.perf_counter()
    assert client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3).usage.completion_tokens == 3
    waited = time.perf_counter() - t0
    assert waited < 2.5, f"the next request waited {waited:.1f}s: the abandoned reply held the engine"


# ----------------------------------------------------------------------------- the command line

def test_the_command_line_serves_and_shuts_down_cleanly_on_sigterm(tmp_path, smollm2_tokenizer):
    model_dir = tmp_path / "tiny"
    tiny_model("llama", smollm2_tokenizer).save_pretrained(model_dir)
    smollm2_tokenizer.save_pretrained(model_dir)
    proc = subprocess.Popen([sys.executable, "-m", "oospec_agents.cli", "serve", "--model", str(model_dir),
                             "--served-model-name", MODEL, "--port", "0", "--dtype", "float32",
                             "--prefix-cache-tokens", "0", "--no-sidecar"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        log = []
        for line in proc.stdout:
            log.append(line)
            if "Uvicorn running on" in line:
                base = line.split("running on ")[1].split()[0]
                break
        else:
            pytest.fail("the server did not start:\n" + "".join(log))
        deadline = time.monotonic() + 60
        while httpx.get(base + "/health").status_code != 200:
            assert time.monotonic() < deadline, "the model never loaded"
            time.sleep(0.2)
        for _ in range(2):  # the same prompt twice: with the prefix cache off, nothing is reused
            reply = post(base, {"model": MODEL, "messages": ASK, "max_tokens": 3}, key=None)
            assert reply.status_code == 200
            assert reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    log = "".join(log) + rest
    # uvicorn shuts down gracefully, then ends by the signal it caught (as systemd and k8s expect)
    assert proc.returncode in (0, -signal.SIGTERM), log
    assert "Traceback" not in log
    assert "Application shutdown complete" in log and "Finished server process" in log


@pytest.mark.parametrize("argv, says", [(["--replicas", "2"], "need --ray"), (["--max-queue", "-1"], "--max-queue"),
                                        (["--ray", "--autoscale", "3"], "MIN,MAX")])
def test_bad_serve_options_are_refused(argv, says, capsys):
    from oospec_agents.cli import main
    assert main(["serve", *argv]) == 2
    assert says in capsys.readouterr().err


def test_bench_server_measures_each_request(url, tmp_path):
    from oospec_agents.bench.server import run_server_bench, write
    results = run_server_bench(url + "/v1", spread(load_records("dev"), 3), method="toolspec", max_new_tokens=8,
                               api_key=API_KEY, progress=False)
    summary = results["server"]
    assert summary["n"] == 3 and summary["method"] == "toolspec"
    for key in ("wall_s", "engine_s", "overhead_s"):
        assert summary[key]["median"] <= summary[key]["p95"]
    assert all(r["wall_s"] >= r["engine_s"] > 0 for r in results["records"])
    paths = write(results, tmp_path)
    assert "| overhead |" in paths["report"].read_text()
