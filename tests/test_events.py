"""The engine's event stream: what `Engine.stream` yields between the first round and the Generation.

The unit tests feed `ReplyEvents` a reply one character at a time (the finest rounds a decoder can
have); the model test decodes a reply that mixes text, two calls and a stop string.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

from oospec_testing import check_events, greedy, joined, replay, tiny_model, trace_stream
from oospec_agents import CallPredicted, Engine, TextDelta, ToolCallDelta, ToolCallReady
from oospec_agents.events import ReplyEvents, read_call
from oospec_agents.formats import HermesFormat, Llama3JsonFormat

HERMES_REPLY = ('Let me check that.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}'
                '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>')


@pytest.mark.parametrize("fmt,text", [
    (HermesFormat(), HERMES_REPLY),
    (HermesFormat(), '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n\nAnd some text after it.'),
    (Llama3JsonFormat(), '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "g", "parameters": {"x": [1, {"y": null}]}}'),
    (Llama3JsonFormat(), '<|python_tag|>{"name": "f", "parameters": {"q": "a \\"quoted\\" word"}}'),
    (Llama3JsonFormat(), "No call here, just an answer."),
])
def test_joined_events_equal_the_parsed_reply(fmt, text):
    events = replay(fmt, text)
    content, calls = fmt.parse(text)
    got_content, got_calls = joined(events)
    assert got_content == content
    assert [c["name"] for c in got_calls.values()] == [c["name"] for c in calls]
    assert [json.loads(c["arguments"]) for c in got_calls.values()] == [c["arguments"] for c in calls]
    assert [c["id"] for c in got_calls.values()] == [f"call_{i}" for i in range(len(calls))]


def test_a_call_is_announced_by_name_then_streams_its_arguments():
    events = [e for e in replay(HermesFormat(), HERMES_REPLY) if isinstance(e, ToolCallDelta)]
    first = [e for e in events if e.index == 0]
    assert first[0] == ToolCallDelta(0, "call_0", "get_weather", "")
    assert all(e.id is None and e.name is None and e.arguments for e in first[1:])
    assert len(first) > 10  # character rounds: one fragment per committed character of the arguments


def test_markup_is_never_shown_as_text_and_whitespace_the_content_strips_waits():
    events = replay(HermesFormat(), HERMES_REPLY)
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert "".join(texts) == "Let me check that."
    assert not any("<" in t for t in texts)


def test_text_that_may_open_a_call_waits_until_it_is_decided():
    fmt = HermesFormat()
    events = ReplyEvents(fmt, str)
    assert events.feed("Sure <tool") == [TextDelta("Sure")]
    assert events.feed("Sure <toolbox> is") == [TextDelta(" <toolbox> is")]


@pytest.mark.parametrize("escaped", ['\\"', "\\\\", "\\u00e9", "\\n"])
def test_an_unfinished_string_escape_waits_for_its_end(escaped):
    text = '<tool_call>\n{"name": "f", "arguments": {"s": "a' + escaped + 'b"}}\n</tool_call>'
    start, end_of_args = text.index('{"s"'), text.index("}}") + 1
    events = ReplyEvents(HermesFormat(), str)
    sent = ""
    for end in range(1, len(text) + 1):
        sent += "".join(e.arguments for e in events.feed(text[:end]) if isinstance(e, ToolCallDelta))
        assert not re.search(r"(?<!\\)(\\\\)*\\(u[0-9a-f]{0,3})?$", sent), f"half an escape sent: {sent!r}"
        assert len(sent) >= min(end, end_of_args) - start - 5  # held back: at most an escape's width
    assert json.loads(sent) == {"s": json.loads('"a' + escaped + 'b"')}


@pytest.mark.parametrize("raw,name,args,closed", [
    ('{"name": "f", "arguments": {"a": 1}}', "f", '{"a": 1}', True),
    ('{"arguments": {"a": [1, "}"]}, "name": "f"}', "f", '{"a": [1, "}"]}', True),
    ('{"name": "f", "arguments": null}', "f", "null", True),
    ('{"name": "f", "arguments": {"a": "x', "f", '{"a": "x', False),
    ('{"name": "f\\u00e9"', "f\u00e9", None, False),
    ('{"nam', None, None, False),
    ("not json", None, None, False),
])
def test_read_call_finds_the_name_and_the_arguments_span(raw, name, args, closed):
    so_far = read_call(raw, ("arguments",))
    assert so_far.name == name and so_far.closed == closed
    end = so_far.args_end if so_far.args_end is not None else so_far.safe_end
    assert (raw[so_far.args_start:end] if so_far.args_start is not None else None) == args


def test_an_invalid_calls_fragments_are_its_raw_arguments(tiny_engine):
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}
    # six tokens cannot close the forced call: it ends unterminated, so invalid
    events = list(tiny_engine.stream([{"role": "user", "content": "hi"}], [tool], tool_choice="f",
                                     max_new_tokens=6, method="toolspec"))
    (bad,) = events[-1].invalid_tool_calls
    assert "unterminated" in bad["error"]
    assert "".join(e.arguments for e in events[:-1] if isinstance(e, ToolCallDelta)) == bad["arguments"]


# ---------------------------------------------------------------- a real decode: text, two calls, a stop string

SCRIPT = ('Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>\nDone. STOP and more')
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {k: {"type": "string"}}, "required": [k]}}}
    for n, k in (("get_weather", "city"), ("get_time", "tz"))]
ASK = [{"role": "user", "content": "Weather and time in Paris?"}]


@pytest.fixture(scope="module")
def parrot(smollm2_tokenizer):
    """A tiny random Llama trained for a few seconds to say SCRIPT after ASK: a real model whose
    greedy reply mixes text, two calls and a stop string."""
    engine = Engine(tiny_model("llama", smollm2_tokenizer, seed=3), smollm2_tokenizer)
    prompt = engine.prompt_ids(ASK, TOOLS)
    target = smollm2_tokenizer.encode(SCRIPT, add_special_tokens=False) + [smollm2_tokenizer.eos_token_id]
    ids = torch.tensor([prompt + target])
    labels = torch.tensor(target)
    model = engine.target.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(200):
        # logits only where the script is predicted: the vocabulary projection is most of the cost
        logits = model(input_ids=ids, logits_to_keep=len(target) + 1).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.02:
            break
    model.eval()
    return engine


@pytest.mark.parametrize("method", ["ar", "toolspec", "oospec"])
def test_a_reply_with_text_two_calls_and_a_stop_string(parrot, method):
    hint = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    kw = dict(max_new_tokens=80, method=method, stop=["STOP"], hint=hint if method == "oospec" else None)
    events, committed = trace_stream(parrot, ASK, TOOLS, **kw)
    gen = events[-1][1]
    reference = greedy(parrot, parrot.prompt_ids(ASK, TOOLS), 80)
    assert gen.token_ids == reference[:len(gen.token_ids)]
    assert gen.text == SCRIPT[:SCRIPT.index("STOP")], "the tiny model did not learn its script"
    assert [c["name"] for c in gen.tool_calls] == ["get_weather", "get_time"]
    assert gen.content == HermesFormat().parse(gen.text)[0] and gen.content.endswith("Done.")
    assert gen.finish_reason == "tool_calls"
    check_events(parrot, "", events, committed)
    texts = [e.text for _, e in events[:-1] if isinstance(e, TextDelta)]
    assert not any("STOP" in t or "<" in t for t in texts)
    if method == "oospec":
        assert gen.stats.accepted_by_source["hint"] > 0


# ---------------------------------------------------------------- speculative tools' events (#55)

@pytest.mark.parametrize("method", ["toolspec", "oospec"])
def test_a_call_is_ready_to_run_before_the_reply_ends(parrot, method):
    """`ToolCallReady` comes in the round a call's arguments close: the first of two parallel calls
    is ready before the second is announced, each before the Generation, with its parsed arguments."""
    events, _ = trace_stream(parrot, ASK, TOOLS, max_new_tokens=80, method=method, stop=["STOP"])
    gen = events[-1][1]
    ready = [(k, r, e) for k, (r, e) in enumerate(events) if isinstance(e, ToolCallReady)]
    assert [e for _, _, e in ready] == [ToolCallReady(i, c["id"], c["name"], c["arguments"])
                                        for i, c in enumerate(gen.tool_calls)]
    second = next(k for k, (_, e) in enumerate(events) if isinstance(e, ToolCallDelta) and e.index == 1)
    assert ready[0][0] < second
    assert ready[0][1] < ready[1][1] < events[-1][0]  # rounds: the first call well before the reply's end


def test_the_hint_is_predicted_as_calls_in_the_round_it_is_read(parrot):
    hint = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    events, _ = trace_stream(parrot, ASK, TOOLS, max_new_tokens=80, method="oospec", stop=["STOP"], hint=hint)
    predicted = [(r, e) for r, e in events if isinstance(e, CallPredicted)]
    assert predicted == [(1, CallPredicted([{"name": "get_weather", "arguments": {"city": "Lyon"}}]))]
    first_call = next(k for k, (_, e) in enumerate(events) if isinstance(e, ToolCallDelta))
    assert events.index(predicted[0]) < first_call  # before the target has written the call
    gen = events[-1][1]
    assert gen.token_ids == greedy(parrot, parrot.prompt_ids(ASK, TOOLS), 80)[:len(gen.token_ids)]
    assert gen.stats.prediction_exact is False  # Lyon is not what the target wrote


@pytest.mark.parametrize("method,hint", [("ar", None), ("toolspec", None), ("oospec", "no call in this hint")])
def test_no_prediction_without_a_predicted_call(parrot, method, hint):
    events = list(parrot.stream(ASK, TOOLS, max_new_tokens=80, method=method, stop=["STOP"], hint=hint))
    assert not any(isinstance(e, CallPredicted) for e in events)
    assert events[-1].stats.prediction_exact is (None if hint is None else False)


def test_a_prediction_that_is_the_call_written_is_exact(parrot):
    hint = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'  # the second call
    gen = parrot.generate(ASK, TOOLS, max_new_tokens=80, method="oospec", stop=["STOP"], hint=hint)
    assert gen.stats.prediction_exact is True
