"""The one scanner of unfinished JSON (`oospec_agents.jsonscan`): where a prefix stops, and the name
and arguments span of a call object that is still being written."""
from __future__ import annotations

import json

import pytest

from oospec_testing import joined, replay
from oospec_agents.formats import HermesFormat, Llama3JsonFormat, PythonicFormat
from oospec_agents.jsonscan import call_name, read_call, scan_json

CALL = {"name": "get_weather", "arguments": {"city": "Pa\"ris\\", "days": [1, {"x": "}]"}], "ok": None}}


def test_an_open_string_is_reported_raw_as_far_as_it_goes():
    st = scan_json('{"name": "get_wea')
    assert st.in_string == "get_wea" and not st.string_is_key and not st.done and not st.error
    st = scan_json('{"name": "f", "argu')
    assert st.in_string == "argu" and st.string_is_key
    st = scan_json('{"q": "say \\"hi\\" \\u00e')
    assert st.in_string == 'say \\"hi\\" \\u00e' and st.open_escape == len('{"q": "say \\"hi\\" ')


@pytest.mark.parametrize("tail,cut", [("\\", True), ('\\"', False), ("\\\\", False), ("\\u00", True),
                                      ("\\u00e9", False), ("\\n", False), ("\\\\\\", True)])
def test_an_unfinished_escape_holds_back_what_may_be_sent(tail, cut):
    raw = '{"name": "f", "arguments": {"s": "a' + tail
    so_far = read_call(raw, ("arguments",))
    assert so_far.safe_end == (raw.rindex("\\") if cut else len(raw))


def test_an_escaped_quote_or_bracket_does_not_end_anything():
    st = scan_json('{"a": "x\\"}", "b": ["]", "\\\\"]')
    assert [f.kind for f in st.stack] == ["obj"] and st.stack[0].keys == ["a", "b"] and st.stack[0].state == "after"


def test_nested_containers_are_tracked_and_closed_in_order():
    text = json.dumps(CALL)
    st = scan_json(text[:text.index('{"x"') + 3])
    assert [f.kind for f in st.stack] == ["obj", "obj", "arr", "obj"]
    assert st.stack[1].keys == ["city", "days"]
    assert st.stack[0].key == "arguments" and st.stack[1].key == "days"
    done = scan_json(text)
    assert done.done and done.closed and not done.error and not done.stack
    assert [m.key for m in done.members] == ["name", "arguments"]
    args = done.members[1]
    assert json.loads(text[args.start:args.end]) == CALL["arguments"]
    assert scan_json('{"a": [1}').error and scan_json('{"a": 1} x').error and not scan_json('{"a": 1}  \n').error


def test_every_prefix_of_a_call_reads_as_the_whole_call_says():
    text = json.dumps(CALL, indent=1)
    whole = read_call(text, ("arguments",))
    args = text[whole.args_start:whole.args_end]
    assert json.loads(args) == CALL["arguments"] and whole.closed and whole.name == CALL["name"]
    name_end = text.index('"get_weather"') + len('"get_weather"')
    for end in range(len(text) + 1):
        prefix = text[:end]
        assert not scan_json(prefix).error, prefix
        so_far = read_call(prefix, ("arguments",))
        assert so_far.name == (CALL["name"] if end >= name_end else None), prefix
        assert call_name(prefix) == so_far.name
        assert so_far.closed == (end == len(text))
        if so_far.args_start is not None:  # the arguments as far as they may be sent: a start of the whole
            assert so_far.args_start == whole.args_start
            assert args.startswith(prefix[so_far.args_start:so_far.args_end or so_far.safe_end])
            assert so_far.args_end in (None, whole.args_end)


@pytest.mark.parametrize("text,name", [
    ('{"name": "get_weather", "arguments": {city: Paris}}', "get_weather"),  # invalid JSON after the name
    ('{"name": "get_weather", "arguments": {"city": "Par', "get_weather"),  # unfinished after it
    ('  {"arguments": {"a": 1}, "name": "f\\u00e9"}', "f\u00e9"),            # decoded, wherever it stands
    ('{"name": "get_wea', None),                                              # the name itself unfinished
    ('{"nam', None),
    ('{"name": 3, "arguments": {}}', None),                                    # not a string
    ('{"arguments": {"name": "inner"}}', None),                               # only the outermost object's
    ('[{"name": "f"}]', None),                                                 # not a call object
    ('{"arguments": {a}, "name": "f"}', None),                                # gone wrong before the name
    ("get_weather(city='Paris')", None),
    ("", None),
])
def test_the_name_reader(text, name):
    assert call_name(text) == name
    assert read_call(text, ("arguments",)).name == name


def test_the_name_reader_stops_at_the_name():
    text = '{"name": "f", "arguments": {"a": [' + "1, " * 10_000
    st = scan_json(text, stop_after="name")
    assert [m.key for m in st.members] == ["name"] and len(st.stack) == 1 and st.stack[0].state == "after"
    assert call_name(text) == "f"


@pytest.mark.parametrize("fmt,text", [
    (HermesFormat(), '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>'),
    (HermesFormat(), '<tool_call>\n{"name": "get_wea'),
    (Llama3JsonFormat(), '{"name": "f", "parameters": {"a": tru e}}'),
    (PythonicFormat(), "[get_weather(city=Paris)]"),
    (PythonicFormat(), "[get_weather(city='Pa"),
])
def test_an_invalid_call_is_named_as_the_stream_announced_it(fmt, text):
    (call,) = fmt.parse(text)[1]
    assert "error" in call
    (streamed,) = joined(replay(fmt, text))[1].values()
    assert call["name"] == streamed["name"]
