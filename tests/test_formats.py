"""Tool-call formats: render -> parse round trips, malformed output, detection, histories."""
import json

import pytest

from oospec_agents.chat import normalize_messages, render_prompt
from oospec_agents.jsonscan import scan_json
from oospec_agents.formats import HermesFormat, Llama3JsonFormat, detect_format
from oospec_agents.tools import check_calls, normalize_tools

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "unit": {"type": "string", "enum": ["c", "f"]}},
                          "required": ["city"]}}}
CALLS = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
         {"name": "math.add", "arguments": {"a": 1, "b": [2, {"x": "é"}]}}]


@pytest.mark.parametrize("fmt", [HermesFormat(), Llama3JsonFormat()], ids=lambda f: f.name)
def test_round_trip_one_and_several_calls(fmt):
    for calls in (CALLS[:1], CALLS):
        content, parsed = fmt.parse(fmt.render_calls(calls))
        assert content == ""
        assert parsed == calls


def test_hermes_keeps_text_around_calls():
    fmt = HermesFormat()
    text = "Let me check.\n" + fmt.render_call("get_weather", {"city": "Oslo"}) + "\nDone."
    content, calls = fmt.parse(text)
    assert content == "Let me check.\n\nDone."
    assert calls == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]


def test_hermes_render_matches_qwen_layout():
    assert HermesFormat().render_call("f", {"a": 1}) == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert Llama3JsonFormat().render_call("f", {"a": 1}) == '{"name": "f", "parameters": {"a": 1}}'


@pytest.mark.parametrize("text, error", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', "unterminated"),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>', "not valid JSON"),
    ('<tool_call>\n{"arguments": {}}\n</tool_call>', "no string 'name'"),
    ('<tool_call>\n{"name": "get_weather", "arguments": "{bad"}\n</tool_call>', "arguments are not valid JSON"),
])
def test_malformed_hermes_lands_in_invalid_with_reason(text, error):
    _, parsed = HermesFormat().parse(text)
    valid, invalid, problems = check_calls(parsed, normalize_tools([WEATHER]))
    assert valid == [] and len(invalid) == 1 and problems == []
    assert error in invalid[0]["error"]
    assert isinstance(invalid[0]["arguments"], str)


def test_llama3_truncated_call_is_invalid():
    _, parsed = Llama3JsonFormat().parse('{"name": "get_weather", "parameters": {"city": "Pa')
    assert "unterminated" in parsed[0]["error"]


def test_schema_violations_and_unknown_tools_are_calls_with_the_validator_message_beside_them():
    """As OpenAI classes calls (issue 48): arguments that parse make a tool call, even one that misfits
    its schema or names a tool not offered; the problem is reported beside it, by the call's id."""
    tools = normalize_tools([WEATHER])
    parsed = [{"name": "get_weather", "arguments": {"unit": "kelvin"}},
              {"name": "nope", "arguments": {}},
              {"name": "get_weather", "arguments": {"city": "Rome"}}]
    valid, invalid, problems = check_calls(parsed, tools)
    assert [(c["name"], c["arguments"]) for c in valid] == [(c["name"], c["arguments"]) for c in parsed]
    assert invalid == []
    assert [p["id"] for p in problems] == [valid[0]["id"], valid[1]["id"]]
    assert [p["name"] for p in problems] == ["get_weather", "nope"]
    assert "'city' is a required property" in problems[0]["error"]
    assert "unknown tool 'nope'" in problems[1]["error"]
    assert len({c["id"] for c in valid}) == 3
    assert not check_calls(parsed, tools).all_fit and check_calls(parsed[2:], tools).all_fit


def test_arguments_that_are_no_object_make_an_invalid_call():
    (bad,) = check_calls([{"name": "get_weather", "arguments": ["Rome"]}], normalize_tools([WEATHER])).invalid_tool_calls
    assert bad["arguments"] == '["Rome"]' and "must be a JSON object" in bad["error"]


def test_format_detection_from_chat_templates(smollm2_tokenizer):
    assert detect_format(smollm2_tokenizer.chat_template).name == "hermes"
    assert detect_format("{% if tools %}<tool_call>{% endif %}<|im_start|>").name == "hermes"
    assert detect_format("<|start_header_id|>ipython<|end_header_id|><|eot_id|>").name == "llama3_json"


def test_template_that_drops_tools_gets_the_format_system_prompt(smollm2_tokenizer):
    msgs = normalize_messages([{"role": "user", "content": "weather in Paris?"}])
    prompt = render_prompt(smollm2_tokenizer, HermesFormat(), msgs, normalize_tools([WEATHER]), native_tools=False)
    assert "<tools>" in prompt and '"get_weather"' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("arguments", [{"city": "Paris"}, '{"city": "Paris"}'])
def test_history_with_tool_calls_and_results(smollm2_tokenizer, arguments):
    msgs = normalize_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C, sunny"},
    ])
    prompt = render_prompt(smollm2_tokenizer, HermesFormat(), msgs, normalize_tools([WEATHER]), native_tools=False)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\n18C, sunny\n</tool_response>" in prompt
    assert prompt.index("Be brief.") < prompt.index("<tools>")


def test_native_template_receives_tools_and_dict_arguments():
    class Tok:  # a stand-in that records what a native tool-calling template would receive
        chat_template = "<tool_call>"

        def apply_chat_template(self, msgs, tools=None, **kw):
            self.seen = (msgs, tools)
            return "P"
    tok = Tok()
    msgs = normalize_messages([{"role": "user", "content": "x"},
                               {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather",
                                                                                  "arguments": '{"city": "A"}'}}]}])
    render_prompt(tok, HermesFormat(), msgs, normalize_tools([WEATHER]), native_tools=True)
    sent_msgs, sent_tools = tok.seen
    assert sent_tools[0]["function"]["name"] == "get_weather"
    assert sent_msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "A"}


def test_json_scanner_tracks_keys_and_strings():
    st = scan_json('{"name": "f", "arguments": {"city": "Par')
    assert [f.kind for f in st.stack] == ["obj", "obj"]
    assert st.stack[0].keys == ["name", "arguments"] and st.stack[1].key == "city"
    assert st.in_string == "Par" and not st.string_is_key
    assert scan_json(json.dumps({"a": [1, {"b": "}"}]})).done
    assert scan_json('{"a" 1').error


def _tool(name, props, required):
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in props}, "required": required}}}


def test_a_named_tools_arguments_are_drafted_in_the_layout_the_target_writes_and_as_far_as_the_fitting_tools_agree():
    """vLLM's named tool: the reply is the arguments object alone, its whitespace the target's choice. The
    forced text opens with the whitespace earlier replies wrote after `{` (else a draft right after `{`
    would miss the target's `\\n  ` at its first token), and while several tools fit what is written, the
    start their forced texts share is forced: a key's rest once the key's first letters pick one tool."""
    from oospec_agents.formats.vllm_json import Layout, VllmArgumentsFormat
    cd, mv, rm = (_tool("cd", ["folder"], ["folder"]), _tool("mv", ["source", "destination"], ["source", "destination"]),
                  _tool("rm", ["file_name"], ["file_name"]))
    tools = normalize_tools([cd, mv, rm])
    learnt = Layout()
    learnt.observe('{\n  "k": "v"\n}')
    fmt = VllmArgumentsFormat(layout=learnt)
    assert fmt.forced_next("{", tools[:1]) == '\n  "folder": '
    assert fmt.forced_next("{\n ", tools[:1]) == ' "folder": '  # the whitespace already written is kept
    assert VllmArgumentsFormat().forced_next("{", tools[:1]) == '"folder": '  # nothing seen: compact
    assert fmt.forced_next("{", tools) == '\n  "'  # three tools, each with a required first key
    assert fmt.forced_next('{\n  "', tools) == ""  # folder, source, file_name: no common start
    assert fmt.forced_next('{\n  "f', tools) == ""  # folder or file_name
    assert fmt.forced_next('{\n  "fo', tools) == 'lder": '  # cd's alone
    assert fmt.forced_next('{\n  "s', tools) == 'ource": '
    assert fmt.forced_next('{\n  "source": "a.txt"', tools) == ',\n  "destination": '
    assert fmt.forced_next('{\n  "source": "a.txt",', tools) == '\n  "destination": '  # the layout after ","
    assert VllmArgumentsFormat("rm", learnt).forced_next("{", tools) == '\n  "file_name": '
    # where the grammar leaves a key or the end, the draft takes the likelier: a first key, then the end
    ls = normalize_tools([_tool("ls", ["path", "all"], [])])
    assert fmt.forced_next("{", ls) == '\n  "'
    assert fmt.forced_next('{\n  "path": "/tmp"', ls) == "\n}"
