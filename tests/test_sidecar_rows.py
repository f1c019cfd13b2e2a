"""The sidecar's rows (the one definition of what a wave computes) and the join of their answers into a call."""
from __future__ import annotations

import pytest

from sidecar_testing import ASK, TIME, WEATHER, hint_request
from oospec_agents.chat import normalize_messages
from oospec_agents.formats import HermesFormat, Llama3JsonFormat
from oospec_agents.sidecar.join import JoinError, encode_payload, join, render_payload
from oospec_agents.sidecar.rows import SUMMARY_CHARS, Row, expand_rows, parse_value, summarize, value_end
from oospec_agents.sidecar.runtime import wave_rows
from oospec_agents.tools import normalize_tools


# ---------------------------------------------------------------- rows: the one definition

def test_rows_are_exactly_the_function_row_then_one_slot_row_per_parameter():
    prefix, rows = expand_rows(normalize_messages(ASK), normalize_tools([WEATHER, TIME]),
                               {"name": "get_weather", "arguments": {"city": "Paris"}})
    assert prefix == ('<|im_start|>system\nCall one of these tools. Reply with the call as JSON.\n'
                      '- get_weather(city: string, unit?: "celsius"|"fahrenheit"): Get the current weather in a city\n'
                      '- get_time(tz: string, hours?: array<integer>)<|im_end|>\n'
                      '<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n'
                      '<|im_start|>assistant\n')
    opener = '<tool_call>\n{"name": "get_weather", "arguments": {'
    assert rows == [
        Row("function", None, None, '<tool_call>\n{"name":', ' "get_weather"'),
        Row("slot", "get_weather", "city", opener + '"city":', ' "Paris"', required=True),
        Row("slot", "get_weather", "unit", opener + '"unit":', " null"),
        Row("slot", "get_time", "tz", '<tool_call>\n{"name": "get_time", "arguments": {"tz":', None, required=True),
        Row("slot", "get_time", "hours", '<tool_call>\n{"name": "get_time", "arguments": {"hours":', None),
    ]
    assert "nobody needs" not in prefix  # only a description's first sentence: the shared prefix stays compact


@pytest.mark.parametrize("description, summary", [
    ("Calculate the area of a triangle. Uses Heron's formula.", "Calculate the area of a triangle"),
    ("Uses v2.0 of the API. More.", "Uses v2.0 of the API"),
    ("First line\nsecond line", "First line"),
    ("", ""),
    ("x" * 100, "x" * (SUMMARY_CHARS - 3) + "..."),
])
def test_a_tool_is_summarised_by_its_descriptions_first_sentence(description, summary):
    assert summarize(description) == summary


def test_rows_without_a_call_are_unlabelled_and_history_is_compact():
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 1000}, {"role": "user", "content": "And Rome?"}]
    prefix, rows = expand_rows(normalize_messages(history), normalize_tools([WEATHER]))
    assert all(r.target is None for r in rows)
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}<|im_end|>' in prefix
    assert "Tool result: " + "x" * 400 + "...<|im_end|>" in prefix
    assert prefix.endswith("And Rome?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("text, end, value", [
    (' "Paris"}', 8, "Paris"), (" 10,", 3, 10), (" 10", None, 10), (" 24.", None, 24), (" 24.5}", 5, 24.5),
    (" null,", 5, None), (" [1, 2]}", 7, [1, 2]), (' {"a": true}', 12, {"a": True}), (" true", 5, True),
    (" garbage", None, None), ("", None, None), (' "unterminated', None, None)])
def test_a_row_ends_at_the_end_of_its_json_value(text, end, value):
    assert value_end(text) == end
    assert parse_value(text) == value


# ---------------------------------------------------------------- join and payload

def test_join_keeps_the_predicted_function_and_its_non_null_slots():
    req = hint_request()
    rows, _, _ = wave_rows(req)
    texts = [' "get_weather"', ' "Paris"', " null", ' "UTC"', " [1]"]
    call = join(rows, texts, req.tools, req.tool_choice)
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}
    payload = encode_payload(call)
    assert payload == b'{"f":"get_weather","a":{"city":"Paris"}}'
    assert render_payload(payload, HermesFormat()) == \
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert render_payload(payload, Llama3JsonFormat()) == '{"name": "get_weather", "parameters": {"city": "Paris"}}'


def test_named_tool_choice_needs_only_that_tools_rows():
    req = hint_request(("named", "get_time"))
    rows, _, choices = wave_rows(req)
    assert [r.param for r in rows] == ["tz", "hours"] and choices == {}
    assert join(rows, [' "UTC"', " null"], req.tools, req.tool_choice) == {"name": "get_time", "arguments": {"tz": "UTC"}}


def test_the_function_row_may_choose_only_offered_tools():
    """...each with its lexical prior (tests/test_tool_prior.py): the question asks for the weather."""
    assert wave_rows(hint_request(("required", None)))[2] == {0: {' "get_weather"': 0.0, ' "get_time"': -1.0}}
    assert wave_rows(hint_request(("auto", None)))[2] == {0: {' "get_weather"': 0.0, ' "get_time"': -1.0, " null": 0.0}}


@pytest.mark.parametrize("texts, words", [
    ([' "launch_rockets"', ' "Paris"', " null", " null", " null"], "unknown function 'launch_rockets'"),
    ([" null"] * 5, "no call"), (["@@"] * 5, "no call"), ([' "get_weather"'], "5 rows"), (None, "5 rows")])
def test_join_refuses_what_is_not_a_call(texts, words):
    req = hint_request()
    rows, _, _ = wave_rows(req)
    with pytest.raises(JoinError, match=words):
        join(rows, texts, req.tools, req.tool_choice)
