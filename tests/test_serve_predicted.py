"""`oospec serve`'s opt-in `oospec` request extension (#55, serve/extension.py): the sidecar's predicted
call as an early stream chunk (`choices: []`, never a `tool_calls` delta), and the speculative tools'
latencies passed to the engine.

Driven by the official `openai` SDK (its raw SSE lines through `with_streaming_response`, its parsed
stream, its `chat.completions.stream` / `responses.stream` helpers) against a real uvicorn server on a
`Scripted` engine whose scripted sidecar predicts each call (`CallPredicted`); one test, marked slow, on the
embedded pair (a real sidecar, whose prediction may or may not come in time).
"""
from __future__ import annotations

import json
import re

import openai
import pytest
from serve_testing import API_KEY, running

from oospec_agents import CallPredicted, ToolCallReady
from oospec_agents.serve import create_app
from oospec_agents.testing import Scripted

MODEL = "m"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
FLAT_WEATHER = {"type": "function", **WEATHER["function"]}  # the Responses API's shape
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = 'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PREDICTED = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
ON = {"oospec": {"predicted_calls": True}}


class Engine(Scripted):
    """The scripted engine, refilled per test (`reply_with`), whose sidecar predicts what each reply is
    given, that records the `speculative_tools` each request reaches it with, and can drop events of the
    types in `drop` (to show they change nothing)."""

    def __init__(self):
        super().__init__(predictions={})
        self.drop: tuple = ()
        self.speculative: list = []

    def reply_with(self, *replies: str, predicted: list | None = PREDICTED, drop: tuple = ()) -> None:
        """The next replies (those left are dropped), each predicted `predicted`."""
        self.script.replies.clear()
        self.script.add(*replies, predicted=predicted)
        self.drop = drop

    def stream(self, request, **kw):
        events = super().stream(request, **kw)  # bad input raises here, eagerly, as the engine's does
        self.speculative.append(request.speculative_tools)
        return (e for e in events if not isinstance(e, self.drop))


@pytest.fixture(scope="module")
def served():
    engine = Engine()
    with running(create_app(engine, model=MODEL, api_key=API_KEY)) as url:
        yield engine, openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)


def raw_chat(client, extra: dict | None = None, **kw) -> list[str]:
    """The SSE lines of a streamed chat completion, as the SDK's raw stream reads them."""
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=ASK, tools=[WEATHER], stream=True, extra_body=extra, **kw) as r:
        return [line for line in r.iter_lines() if line]


def raw_responses(client, extra: dict | None = None) -> list[str]:
    with client.responses.with_streaming_response.create(
            model=MODEL, input="Weather in Paris?", tools=[FLAT_WEATHER], stream=True, extra_body=extra) as r:
        return [line for line in r.iter_lines() if line]


def same_bytes(lines: list[str]) -> list[str]:
    """`lines` with what differs between two identical requests made the same: ids (a call's, `call_<reply>_<i>`,
    to its index), timestamps and the stats' seconds."""
    text = "\n".join(lines)
    text = re.sub(r"\bcall_[0-9a-f]{12}_(\d+)", r"call_ID_\1", text)
    text = re.sub(r"chatcmpl-[0-9a-f]{24}", "chatcmpl-ID", text)
    text = re.sub(r"\b(resp|msg|fc|rs)_[0-9a-f]{32}", r"\1_ID", text)
    text = re.sub(r'"(created|created_at|completed_at)": \d+', r'"\1": 0', text)
    text = re.sub(r'"(\w+_s)": [-+.\deE]+', r'"\1": 0', text)
    return text.split("\n")


def chunks(lines: list[str]) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def is_prediction(chunk: dict) -> bool:
    return chunk["choices"] == [] and "predicted_calls" in chunk.get("oospec", {})


def without_predictions(lines: list[str]) -> list[str]:
    """A stream with the extension, less what the extension adds: its chunks, and `predictions` in the
    last chunk's `oospec`."""
    out = []
    for line in lines:
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if is_prediction(chunk):
                continue
            if chunk.get("oospec"):
                del chunk["oospec"]["predictions"]
            line = "data: " + json.dumps(chunk, ensure_ascii=False)
        out.append(line)
    return out


# ----------------------------------------------------------------------------- off by default

@pytest.mark.parametrize("extra", [None, {"oospec": None}, {"oospec": {}}, {"oospec": {"predicted_calls": False}},
                                   {"oospec": {"speculative_tools": {"get_weather": 1.0}}}])
def test_off_by_default_the_stream_is_byte_for_byte_as_before(served, extra):
    """Before #55 the engine yielded neither CallPredicted nor ToolCallReady: a stream without the
    extension, whose engine yields both, is that stream, byte for byte (ids and timestamps aside)."""
    engine, client = served
    engine.reply_with(CALL, drop=(CallPredicted, ToolCallReady))
    before = raw_chat(client)
    engine.reply_with(CALL)
    now = raw_chat(client, extra)
    assert same_bytes(now) == same_bytes(before)
    assert not any("predicted_calls" in line or "\"predictions\"" in line for line in now)


@pytest.mark.parametrize("extra", [None, ON])
def test_tool_call_ready_changes_nothing_on_the_wire(served, extra):
    engine, client = served
    for raw in (raw_chat, raw_responses):
        engine.reply_with(CALL, drop=(ToolCallReady,))
        without = raw(client, extra)
        engine.reply_with(CALL)
        assert same_bytes(raw(client, extra)) == same_bytes(without)
    engine.reply_with(CALL, drop=(ToolCallReady,))
    without = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], extra_body=extra)
    engine.reply_with(CALL)
    with_ready = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], extra_body=extra)
    assert same_bytes([json.dumps([c.model_dump() for c in with_ready.choices]), json.dumps(with_ready.model_extra)]) == \
        same_bytes([json.dumps([c.model_dump() for c in without.choices]), json.dumps(without.model_extra)])


def test_responses_off_by_default_is_as_before(served):
    engine, client = served
    engine.reply_with(CALL, drop=(CallPredicted, ToolCallReady))
    before = raw_responses(client)
    engine.reply_with(CALL)
    assert same_bytes(raw_responses(client)) == same_bytes(before)


# ----------------------------------------------------------------------------- on: chat completions

def test_the_prediction_is_an_early_chunk_without_choices(served):
    engine, client = served
    engine.reply_with(CALL)
    off = raw_chat(client)
    engine.reply_with(CALL)
    on = raw_chat(client, ON)
    sent = chunks(on)
    predicted = [i for i, c in enumerate(sent) if is_prediction(c)]
    first_call = next(i for i, c in enumerate(sent) if c["choices"] and c["choices"][0]["delta"].get("tool_calls"))
    assert len(predicted) == 1 and 0 < predicted[0] < first_call  # after the role chunk, before the call
    chunk = sent[predicted[0]]
    assert chunk == {"id": sent[0]["id"], "object": "chat.completion.chunk", "created": sent[0]["created"],
                     "model": MODEL, "choices": [],
                     "oospec": {"index": 0, "predicted_calls": PREDICTED, "confidence": None}}
    assert sent[-1]["oospec"]["predictions"] == [{"predicted_calls": PREDICTED, "confidence": None}]
    assert same_bytes(without_predictions(on)) == same_bytes(off)  # nothing else changed


def test_a_stock_client_sees_nothing_new(served):
    """The SDK's parsed stream: the prediction's chunk has no choices, so whatever reads choices (the
    SDK's own stream helper among them) gets the same message; the chunk's `oospec` is in model_extra."""
    engine, client = served

    def read(extra):
        engine.reply_with(CALL)
        parsed = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], stream=True,
                                                     extra_body=extra))
        engine.reply_with(CALL)
        with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[WEATHER], extra_body=extra) as s:
            final = s.get_final_completion().choices[0].message
        deltas = [c.choices[0].delta.model_dump(exclude_none=True) for c in parsed if c.choices]
        return parsed, deltas, final

    parsed, deltas, final = read(ON)
    _, deltas_off, final_off = read(None)
    assert same_bytes([json.dumps(d) for d in deltas]) == same_bytes([json.dumps(d) for d in deltas_off])
    assert final.tool_calls[0].function.name == "get_weather" and final.content == "Checking."
    assert final.model_dump(exclude={"tool_calls"}) == final_off.model_dump(exclude={"tool_calls"})
    assert [(c.function.name, c.function.arguments) for c in final.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in final_off.tool_calls]
    early = [c for c in parsed if not c.choices and c.usage is None]
    assert [c.model_extra["oospec"]["predicted_calls"] for c in early] == [PREDICTED]


def test_not_streamed_the_predictions_are_in_the_oospec_object(served):
    engine, client = served
    engine.reply_with(CALL)
    off = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    engine.reply_with(CALL)
    on = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], extra_body=ON)
    assert "predictions" not in off.model_extra["oospec"]
    assert on.model_extra["oospec"]["predictions"] == [{"predicted_calls": PREDICTED, "confidence": None}]
    assert on.choices[0].message.content == off.choices[0].message.content == "Checking."
    assert on.choices[0].message.tool_calls[0].function.arguments == '{"city": "Paris"}'


def test_several_choices_each_have_their_predictions(served):
    engine, client = served
    engine.reply_with(CALL, CALL)
    sent = chunks(raw_chat(client, ON, n=2))
    assert [c["oospec"]["index"] for c in sent if is_prediction(c)] == [0, 1]
    closing = [c["oospec"]["predictions"] for c in sent if c["choices"] and c["choices"][0]["finish_reason"]]
    assert closing == [[{"predicted_calls": PREDICTED, "confidence": None}]] * 2
    engine.reply_with(CALL, "No call.", predicted=None)
    engine.script.predictions[engine.script.begun] = PREDICTED  # choice 0 only
    body = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], n=2, extra_body=ON)
    extra = body.model_extra["oospec"]
    assert extra["predictions"] == extra["choices"][0]["predictions"] == [{"predicted_calls": PREDICTED,
                                                                           "confidence": None}]
    assert extra["choices"][1]["predictions"] == []


def test_no_prediction_no_chunk(served):
    """A method without a sidecar's wave (`toolspec`) predicts nothing: no chunk, `predictions: []`."""
    engine, client = served
    engine.reply_with(CALL)
    sent = chunks(raw_chat(client, {**ON, "method": "toolspec"}))
    assert not any(is_prediction(c) for c in sent) and sent[-1]["oospec"]["predictions"] == []


# ----------------------------------------------------------------------------- on: the Responses API

def test_responses_prediction_is_an_event_of_its_own(served):
    engine, client = served
    engine.reply_with(CALL)
    off = list(client.responses.create(model=MODEL, input="Weather in Paris?", tools=[FLAT_WEATHER], stream=True))
    engine.reply_with(CALL)
    events = list(client.responses.create(model=MODEL, input="Weather in Paris?", tools=[FLAT_WEATHER], stream=True,
                                          extra_body=ON))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    at = kinds.index("oospec.predicted_calls")
    added = [i for i, e in enumerate(events)
             if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert kinds.count("oospec.predicted_calls") == 1 and at < added[0]
    assert events[at].model_extra == {"predicted_calls": PREDICTED, "confidence": None}
    assert [k for k in kinds if k != "oospec.predicted_calls"] == [e.type for e in off]
    done = events[-1].response
    assert done.model_extra["oospec"]["predictions"] == [{"predicted_calls": PREDICTED, "confidence": None}]
    assert [i.model_dump(exclude={"id", "call_id"}) for i in done.output] == \
        [i.model_dump(exclude={"id", "call_id"}) for i in off[-1].response.output]
    engine.reply_with(CALL)  # the SDK's accumulating helper passes the event through and builds the same response
    with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[FLAT_WEATHER], extra_body=ON) as s:
        seen = [e.type for e in s]
        final = s.get_final_response()
    assert "oospec.predicted_calls" in seen and final.output[-1].name == "get_weather"
    engine.reply_with(CALL)
    whole = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[FLAT_WEATHER], extra_body=ON)
    assert whole.model_extra["oospec"]["predictions"] == done.model_extra["oospec"]["predictions"]


# ----------------------------------------------------------------------------- bad values; speculative_tools

BAD = [
    ({"oospec": True}, "oospec", "oospec must be an object"),
    ({"oospec": {"predicted_calls": "yes"}}, "oospec.predicted_calls", "oospec.predicted_calls must be a boolean"),
    ({"oospec": {"predicted_calls": 1}}, "oospec.predicted_calls", "got an integer"),
    ({"oospec": {"predicted": True}}, "oospec.predicted", "is not a field of oospec's request extension"),
    ({"oospec": {"speculative_tools": ["get_weather"]}}, "oospec.speculative_tools", "must be an object"),
    ({"oospec": {"speculative_tools": {"get_weather": -1}}}, "oospec.speculative_tools.get_weather",
     "expected seconds"),
    ({"oospec": {"speculative_tools": {"get_weather": "1s"}}}, "oospec.speculative_tools.get_weather",
     "expected seconds"),
    ({"oospec": {"speculative_tools": {"get_weather": True}}}, "oospec.speculative_tools.get_weather",
     "expected seconds"),
]


@pytest.mark.parametrize("extra,param,message", BAD, ids=[b[1] + ":" + json.dumps(b[0])[:30] for b in BAD])
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_bad_value_is_a_400_naming_it(served, extra, param, message, api):
    engine, client = served
    engine.reply_with(CALL)
    with pytest.raises(openai.BadRequestError) as e:
        if api == "chat":
            client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], stream=True, extra_body=extra)
        else:
            client.responses.create(model=MODEL, input="Hi", tools=[FLAT_WEATHER], stream=True, extra_body=extra)
    assert e.value.status_code == 400 and e.value.param == param
    assert message in e.value.body["message"] and e.value.body["type"] == "invalid_request_error"
    assert engine.script.replies == [CALL]  # refused before it reached the engine


def test_speculative_tools_reach_the_engine(served):
    engine, client = served
    engine.speculative.clear()
    tools = {"get_weather": 0.8, "search": None}  # a name not offered plays no part, as in the engine
    engine.reply_with(CALL, CALL, CALL, CALL)
    client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], extra_body={"oospec": {
        "speculative_tools": tools}})
    client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER])
    client.responses.create(model=MODEL, input="Hi", tools=[FLAT_WEATHER], extra_body={"oospec": {
        "speculative_tools": tools, "predicted_calls": True}})
    client.responses.create(model=MODEL, input="Hi", tools=[FLAT_WEATHER])
    assert engine.speculative == [tools, None, tools, None]


# ----------------------------------------------------------------------------- the embedded pair

@pytest.mark.slow
def test_the_embedded_pair_streams_the_same_reply_with_the_extension(embedded_server):
    """A real sidecar: its prediction may come before the call, during it, or not at all (a late or
    declined wave). Whatever came is a chunk without choices naming calls as objects, and the reply the
    client reads is the one it reads without the extension (greedy: the same tokens)."""
    client = openai.OpenAI(base_url=embedded_server + "/v1", api_key="unused", max_retries=0)
    kw = dict(model="embedded", messages=[{"role": "user", "content": "What is the current weather in Paris?"}],
              tools=[WEATHER], tool_choice="required", max_tokens=48, stream=True)

    def read(extra):
        """The chunks, and what a client joins from their choices (how the rounds cut it up is timing)."""
        parsed = list(client.chat.completions.create(**kw, extra_body=extra))
        deltas = [c.choices[0] for c in parsed if c.choices]
        calls = [t.function for d in deltas for t in d.delta.tool_calls or ()]
        return parsed, ("".join(d.delta.content or "" for d in deltas), [f.name for f in calls if f.name],
                        "".join(f.arguments or "" for f in calls), [d.finish_reason for d in deltas if d.finish_reason])

    parsed, reply = read(ON)
    assert reply == read(None)[1]
    assert reply[1] == ["get_weather"] and json.loads(reply[2])["city"] and reply[3] == ["tool_calls"]
    early = [c.model_extra["oospec"] for c in parsed if not c.choices and c.usage is None]
    closing = next(c.model_extra["oospec"] for c in parsed if c.choices and c.choices[0].finish_reason)
    assert closing["predictions"] == [{k: v for k, v in e.items() if k != "index"} for e in early]
    for e in early:
        assert e["index"] == 0 and e["predicted_calls"]
        assert all(isinstance(c["name"], str) and isinstance(c["arguments"], dict) for c in e["predicted_calls"])
