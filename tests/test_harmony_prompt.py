"""gpt-oss's harmony prompt: the engine's rendering is openai-harmony's (offline), and the chat template's
(a test copy of gpt-oss's) where openai-harmony is not installed or cannot load its vocabulary."""
from __future__ import annotations

import pytest

from oospec_agents.tools import normalize_tools
from harmony_testing import ASK, FMT, HARMONY_TEMPLATE, PING, TIME, WEATHER

pytestmark = pytest.mark.usefixtures("harmony_vocabulary")  # openai-harmony offline


def _calls(*calls):
    return [{"id": f"c{i}", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]


TURN = [{"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
         "tool_calls": _calls(("get_weather", {"city": "Paris"}))},
        {"role": "tool", "tool_call_id": "c0", "content": '{"sky": "sunny"}'}]
ANSWERED = TURN + [{"role": "assistant", "content": "Sunny.", "reasoning_content": "Say it."},
                   {"role": "user", "content": "And Rome?"}]
TWO_CALLS = [{"role": "assistant", "content": "", "reasoning_content": "Both.",
              "tool_calls": _calls(("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"}))},
             {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
             {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]
PREAMBLE = [{"role": "assistant", "content": "Checking.", "tool_calls": _calls(("get_weather", {"city": "Paris"}))},
            {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]


def _expected(h, effort, instructions, tools, turns):
    """What openai-harmony renders, built message by message (`turns(h)`: after the system and developer ones)."""
    system = h.SystemContent.new().with_reasoning_effort(
        {"low": h.ReasoningEffort.LOW, "medium": h.ReasoningEffort.MEDIUM, "high": h.ReasoningEffort.HIGH}[effort])
    msgs = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]
    if instructions or tools:
        dev = h.DeveloperContent.new()
        dev = dev.with_instructions(instructions) if instructions else dev
        dev = dev.with_function_tools([h.ToolDescription.new(t["function"]["name"], t["function"]["description"],
                                                             parameters=t["function"]["parameters"])
                                       for t in tools]) if tools else dev
        msgs.append(h.Message.from_role_and_content(h.Role.DEVELOPER, dev))
    return h.Conversation.from_messages(msgs + turns(h))


def _user(h, text):
    return h.Message.from_role_and_content(h.Role.USER, text)


def _said(h, text, channel):
    return h.Message.from_role_and_content(h.Role.ASSISTANT, text).with_channel(channel)


def _call(h, name, args):
    return _said(h, args, "commentary").with_recipient("functions." + name).with_content_type("<|constrain|>json")


def _result(h, name, text):
    return h.Message.from_author_and_content(h.Author.new(h.Role.TOOL, "functions." + name), text) \
        .with_channel("commentary").with_recipient("assistant")


Q = ASK[1]["content"]
PROMPTS = {  # name: (messages, tools, reasoning_effort, (instructions, the harmony messages after the developer's))
    "tools and system": (ASK, [WEATHER, PING], None, ("Be brief.", lambda h: [_user(h, Q)])),
    "no system, no tools": (ASK[1:], None, None, ("", lambda h: [_user(h, Q)])),
    "effort low": (ASK, [WEATHER], "low", ("Be brief.", lambda h: [_user(h, Q)])),
    "effort high": (ASK, [WEATHER], "high", ("Be brief.", lambda h: [_user(h, Q)])),
    "a call and its result, the analysis kept": (ASK + TURN, [WEATHER, PING], "high", ("Be brief.", lambda h: [
        _user(h, Q), _said(h, "Need the weather.", "analysis"), _call(h, "get_weather", '{"city": "Paris"}'),
        _result(h, "get_weather", '{"sky": "sunny"}')])),
    "after a final answer, the analysis dropped": (ASK + ANSWERED, [WEATHER], None, ("Be brief.", lambda h: [
        _user(h, Q), _call(h, "get_weather", '{"city": "Paris"}'), _result(h, "get_weather", '{"sky": "sunny"}'),
        _said(h, "Sunny.", "final"), _user(h, "And Rome?")])),
    "two calls, results by id": (ASK + TWO_CALLS, [WEATHER, TIME], None, ("Be brief.", lambda h: [
        _user(h, Q), _said(h, "Both.", "analysis"), _call(h, "get_weather", '{"city": "Paris"}'),
        _call(h, "get_time", '{"tz": "CET"}'), _result(h, "get_time", "12:00"), _result(h, "get_weather", "sunny")])),
    "a preamble before the call": (ASK + PREAMBLE, [WEATHER], None, ("Be brief.", lambda h: [
        _user(h, Q), _said(h, "Checking.", "commentary"), _call(h, "get_weather", '{"city": "Paris"}'),
        _result(h, "get_weather", "sunny")])),
}
#: where the test template renders what openai-harmony does (it names a result by the last call, and
#: drops a preamble before calls)
TEMPLATE_AGREES = [n for n in PROMPTS if n not in ("two calls, results by id", "a preamble before the call")]


def _rendered(harmony, enc, name):
    messages, tools, effort, (instructions, turns) = PROMPTS[name]
    convo = _expected(harmony, effort or "medium", instructions, tools, turns)
    return enc.decode(enc.render_conversation_for_completion(convo, harmony.Role.ASSISTANT))


@pytest.mark.parametrize("name", list(PROMPTS))
def test_the_engines_harmony_prompt_is_openai_harmonys_rendering(name, encoding, harmony_engine):
    harmony, enc = encoding
    messages, tools, effort, _ = PROMPTS[name]
    ids = harmony_engine.prompt_ids(messages, tools, reasoning_effort=effort)
    expected = _rendered(harmony, enc, name)
    assert harmony_engine.tokenizer.decode(ids) == expected
    assert ids == harmony_engine.tokenizer.encode(expected, add_special_tokens=False)


@pytest.fixture
def without_openai_harmony(monkeypatch):
    """The engine as where openai-harmony is not installed: its import fails."""
    import sys

    from oospec_agents.formats import harmony as module
    monkeypatch.setitem(sys.modules, "openai_harmony", None)
    monkeypatch.setattr(module, "_encoding", [])
    yield
    module._encoding.clear()


@pytest.mark.parametrize("name", TEMPLATE_AGREES)
def test_without_openai_harmony_the_chat_template_renders_the_same_prompt(name, encoding, harmony_engine,
                                                                          without_openai_harmony, caplog):
    harmony, enc = encoding
    messages, tools, effort, _ = PROMPTS[name]
    with caplog.at_level("DEBUG", logger="oospec_agents.formats.harmony"):
        first = harmony_engine.prompt_ids(messages, tools, reasoning_effort=effort)
        assert harmony_engine.prompt_ids(messages, tools, reasoning_effort=effort) == first
    assert [r.message for r in caplog.records].count(
        "openai-harmony is not installed: harmony prompts are rendered by the chat template") == 1
    assert harmony_engine.tokenizer.decode(first) == _rendered(harmony, enc, name)


def test_the_fallback_is_the_chat_template_where_they_differ(harmony_engine, without_openai_harmony):
    """Without openai-harmony, the test template names both results by the last call (its own rule)."""
    text = harmony_engine.tokenizer.decode(harmony_engine.prompt_ids(ASK + TWO_CALLS, [WEATHER, TIME]))
    assert text.count("<|start|>functions.get_time to=assistant") == 2


def test_where_openai_harmony_cannot_load_its_vocabulary_the_template_renders(harmony_engine, monkeypatch,
                                                                              caplog):
    import openai_harmony

    from oospec_agents.formats import harmony as module

    def offline(name):
        raise openai_harmony.HarmonyError("error downloading or loading vocab file")
    monkeypatch.setattr(openai_harmony, "load_harmony_encoding", offline)
    monkeypatch.setattr(module, "_encoding", [])
    with caplog.at_level("WARNING", logger="oospec_agents.formats.harmony"):
        text = harmony_engine.tokenizer.decode(harmony_engine.prompt_ids(ASK + TWO_CALLS, [WEATHER, TIME]))
        harmony_engine.prompt_ids(ASK, [WEATHER])
    assert text.count("<|start|>functions.get_time to=assistant") == 2       # the template's rendering
    assert len([r for r in caplog.records if "cannot load its gpt-oss encoding" in r.message]) == 1


def test_a_tool_result_with_no_call_before_it_is_an_error(harmony_engine, encoding):
    from oospec_agents.errors import ChatFormatError
    with pytest.raises(ChatFormatError, match=r"messages\[2\]: a tool result with no call before it"):
        harmony_engine.prompt_ids(ASK + [{"role": "tool", "tool_call_id": "x", "content": "sunny"}], [WEATHER])


def test_a_template_argument_openai_harmony_does_not_take_is_an_error(harmony_engine, encoding):
    from oospec_agents.errors import TemplateArgumentError
    with pytest.raises(TemplateArgumentError, match="'instructions' is not taken where openai-harmony renders") as e:
        harmony_engine.prompt_ids(ASK, [WEATHER], chat_template_kwargs={"instructions": "x"})
    assert e.value.param == "chat_template_kwargs"
    low = harmony_engine.prompt_ids(ASK, [WEATHER], chat_template_kwargs={"reasoning_effort": "low"})
    assert low == harmony_engine.prompt_ids(ASK, [WEATHER], reasoning_effort="low")


def test_model_identity_and_the_current_date_as_gpt_oss_template_writes_them(encoding):
    """gpt-oss's own template reads `model_identity` and writes `Current date: ` (its `strftime_now`)."""
    from datetime import datetime

    from oospec_agents.chat import normalize_messages
    from oospec_agents.formats.harmony import render_harmony_prompt
    msgs = normalize_messages(ASK)
    plain = render_harmony_prompt(msgs, [], {}, HARMONY_TEMPLATE)
    assert "Current date" not in plain
    dated = render_harmony_prompt(msgs, [], {"model_identity": "You are Oss."},
                                  '{{- "Current date: " + strftime_now("%Y-%m-%d") }}')
    today = datetime.now().strftime("%Y-%m-%d")
    assert dated.startswith(f"<|start|>system<|message|>You are Oss.\nKnowledge cutoff: 2024-06\nCurrent date: {today}"
                            "\n\nReasoning: medium\n\n")
    assert dated.split("<|end|>", 1)[1] == plain.split("<|end|>", 1)[1]


def test_the_formats_own_tool_prompt_is_openai_harmonys_namespace(encoding):
    """For a template that drops `tools=`, the format's system prompt declares them as harmony does."""
    harmony, enc = encoding
    rich = {"type": "function", "function": {"name": "t", "description": "T", "parameters": {
        "type": "object", "required": ["n"], "properties": {
            "n": {"type": "integer"}, "x": {"type": "number", "description": "X"}, "b": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "u": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "o": {"type": "object", "properties": {"a": {"type": "string"}}}, "any": {}}}}}
    tools = [WEATHER, TIME, PING, rich]
    developer = harmony.DeveloperContent.new().with_function_tools(
        [harmony.ToolDescription.new(t["function"]["name"], t["function"]["description"],
                                     parameters=t["function"]["parameters"]) for t in tools])
    rendered = enc.decode(enc.render(harmony.Message.from_role_and_content(harmony.Role.DEVELOPER, developer)))
    assert rendered == "<|start|>developer<|message|>" + FMT.system_prompt(normalize_tools(tools)) + "<|end|>"
