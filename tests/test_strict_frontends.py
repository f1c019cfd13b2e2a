"""Strict tool calls from every front-end (#19): LangChain's `bind_tools(strict=True)` and
`with_structured_output(strict=True)`, LlamaIndex's `OoOSpec(strict=True)`, and the server honouring
a tool's `"strict": true`.

On a tiny random model: unconstrained it writes garbage, so calls that always validate show that the
grammar is on. The tokens a front-end got are recorded at the engine and compared with greedy
decoding of the target masked by the grammar (`engine.logits_processor`)."""
from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.utils.function_calling import convert_to_openai_tool
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field
import oospec_testing
from serve_testing import API_KEY, running

from langchain_oospec import ChatOoOSpec
from llama_index.llms.oospec import OoOSpec
from oospec_agents import Generation
from oospec_agents.serve import create_app

N = 48
ASK = "Wake me at 7 on Monday."
#: one tiny model family is enough here (test_strict.py runs both): the session's llama engine
llama = pytest.mark.parametrize("tiny_engine", ["llama"], indirect=True)


# Tools a random model can finish: bounded integers, booleans and enums end; strings would ramble on.
class SetAlarm(BaseModel):
    """Set an alarm."""
    hour: int = Field(ge=0, le=23)
    day: Literal["mon", "tue"]
    loud: bool = False


class Dim(BaseModel):
    """Dim the lights."""
    level: int = Field(ge=0, le=10)
    room: Literal["hall", "den"] = "hall"


SCHEMAS = {m.__name__: m for m in (SetAlarm, Dim)}


def set_alarm(hour: int, day: str, loud: bool = False) -> str:
    return f"alarm at {hour} on {day}"


def dim(level: int, room: str = "hall") -> str:
    return f"{room} at {level}"


LLAMA_TOOLS = [FunctionTool.from_defaults(fn=set_alarm, name="SetAlarm", description="Set an alarm.",
                                          fn_schema=SetAlarm),
               FunctionTool.from_defaults(fn=dim, name="Dim", description="Dim the lights.", fn_schema=Dim)]


@pytest.fixture
def recorded(tiny_engine, monkeypatch):
    """Every request the front-end makes of `tiny_engine`: (messages, tools, keywords, Generation)."""
    return oospec_testing.record_requests(monkeypatch, tiny_engine)


_references: dict[str, list[int]] = {}


def masked_reference(engine, messages, tools, tool_choice, n=N) -> list[int]:
    """Greedy decoding of the target masked by the request's grammar (transformers' `generate` is
    slow on this CPU, so each distinct request is decoded once)."""
    key = json.dumps([engine.model_name, messages, tools, tool_choice, n], sort_keys=True)
    if key not in _references:
        _references[key] = oospec_testing.masked_reference(engine, messages, tools, tool_choice, n)
    return _references[key]


def assert_strict_request(engine, request, reference: bool = True) -> Generation:
    """The request reached the engine with every tool flagged strict, its calls are all valid (but
    one that max_new_tokens cut off), and (with `reference`) its tokens are the masked reference's."""
    messages, tools, kw, gen = request
    assert tools and all(t["function"]["strict"] is True for t in tools), tools
    assert gen is not None
    if reference:
        assert gen.token_ids == masked_reference(engine, messages, tools, kw["tool_choice"], kw["max_new_tokens"])
    cut = [c for c in gen.invalid_tool_calls if c["error"].startswith("unterminated")]
    assert gen.invalid_tool_calls == cut and len(cut) <= (gen.finish_reason == "length"), gen.invalid_tool_calls
    assert gen.tool_call_problems == [], gen.tool_call_problems  # strict: every call fits its schema
    return gen


def assert_valid(calls):
    """Each call (name, arguments) satisfies its pydantic model, checked here, not by the engine."""
    assert calls
    for name, args in calls:
        SCHEMAS[name].model_validate(args, strict=True)
        jsonschema.validate(args, SCHEMAS[name].model_json_schema())


# ------------------------------------------------------------------ LangChain

def test_langchain_bind_tools_strict_flags_every_tool_as_chat_openai_does():
    llm = ChatOoOSpec()  # loads nothing
    strict = llm.bind_tools([SetAlarm, set_alarm], strict=True).kwargs["tools"]
    assert strict == [convert_to_openai_tool(SetAlarm, strict=True), convert_to_openai_tool(set_alarm, strict=True)]
    assert all(t["function"]["strict"] is True and t["function"]["parameters"]["additionalProperties"] is False
               for t in strict)
    assert [t["function"].get("strict") for t in llm.bind_tools([SetAlarm], strict=False).kwargs["tools"]] == [False]
    assert "strict" not in llm.bind_tools([SetAlarm]).kwargs["tools"][0]["function"]
    flagged = dict(convert_to_openai_tool(Dim), function={**convert_to_openai_tool(Dim)["function"], "strict": True})
    assert llm.bind_tools([flagged]).kwargs["tools"][0]["function"]["strict"] is True  # None: as given
    # an OpenAI tool dict is made strict too (ChatOpenAI passes one through unchanged); the caller's is not changed
    given = convert_to_openai_tool(Dim)
    assert llm.bind_tools([given, {"name": "ping"}], strict=True).kwargs["tools"] == [
        convert_to_openai_tool(Dim, strict=True),
        convert_to_openai_tool({"name": "ping", "parameters": {"type": "object", "properties": {}}}, strict=True)]
    assert "strict" not in given["function"] and "additionalProperties" not in given["function"]["parameters"]
    with pytest.raises(ValueError, match="strict"):  # as in ChatOpenAI: a tool's own flag must agree
        llm.bind_tools([flagged], strict=False)
    with pytest.raises(TypeError, match="strict"):
        llm.bind_tools([SetAlarm], strict="yes")
    with pytest.raises(ValueError, match="json_mode"):
        llm.with_structured_output(SetAlarm, method="json_mode", strict=True)


@llama
def test_langchain_bind_tools_strict_calls_always_validate(tiny_engine, recorded):
    llm = ChatOoOSpec(engine=tiny_engine, max_tokens=N)
    free = llm.bind_tools([SetAlarm, Dim], tool_choice="required").invoke(ASK)
    assert not free.tool_calls  # unconstrained, the random model writes no valid call
    for method in ("oospec", "ar"):
        msg = llm.bind_tools([SetAlarm, Dim], tool_choice="required", strict=True).invoke(ASK, method=method)
        assert recorded[-1][2]["method"] == method
        gen = assert_strict_request(tiny_engine, recorded[-1])
        assert [(c["name"], c["args"]) for c in msg.tool_calls] == [(c["name"], c["arguments"]) for c in gen.tool_calls]
        assert_valid([(c["name"], c["args"]) for c in msg.tool_calls])
        assert msg.usage_metadata["output_tokens"] == len(gen.token_ids)


@llama
def test_langchain_with_structured_output_strict_parses(tiny_engine, recorded):
    llm = ChatOoOSpec(engine=tiny_engine, max_tokens=N)
    with pytest.raises(OutputParserException):
        llm.with_structured_output(SetAlarm).invoke(ASK)
    alarm = llm.with_structured_output(SetAlarm, strict=True).invoke(ASK)
    assert isinstance(alarm, SetAlarm)
    gen = assert_strict_request(tiny_engine, recorded[-1], reference=False)
    assert recorded[-1][2]["tool_choice"] == "SetAlarm"
    assert alarm == SetAlarm(**gen.tool_calls[0]["arguments"])


# ------------------------------------------------------------------ LlamaIndex

@llama
def test_llamaindex_strict_calls_always_validate(tiny_engine, recorded):
    plain = OoOSpec(engine=tiny_engine, max_new_tokens=N)
    free = plain.chat_with_tools(LLAMA_TOOLS, user_msg=ASK, tool_required=True)
    assert not plain.get_tool_calls_from_response(free, error_on_no_tool_call=False)  # unconstrained: no valid call
    llm = OoOSpec(engine=tiny_engine, max_new_tokens=N, strict=True)
    response = llm.chat_with_tools(LLAMA_TOOLS, user_msg=ASK, tool_required=True)
    gen = assert_strict_request(tiny_engine, recorded[-1], reference=False)  # LangChain's test decodes one
    selections = llm.get_tool_calls_from_response(response)
    assert [(s.tool_name, s.tool_kwargs) for s in selections] == [(c["name"], c["arguments"]) for c in gen.tool_calls]
    assert_valid([(s.tool_name, s.tool_kwargs) for s in selections])
    assert response.raw["text"] == gen.text


@llama
def test_llamaindex_strict_reaches_every_tool_request(tiny_engine, recorded):
    llm = OoOSpec(engine=tiny_engine, max_new_tokens=N, strict=True)
    assert OoOSpec().strict is False

    def flags(llm, **kw):
        return [t["function"].get("strict") for t in llm._prepare_chat_with_tools(LLAMA_TOOLS, **kw)["tools"]]
    assert flags(llm) == [True, True]
    # a call's own strict wins, as in LlamaIndex's OpenAI LLM
    assert flags(llm, strict=False) == [False, False] and flags(OoOSpec(), strict=True) == [True, True]
    assert flags(OoOSpec()) == [None, None]  # not strict: the tools as LlamaIndex writes them
    # OpenAI tool dicts passed straight to chat() are strict too (the caller's dicts are not changed)
    given = [t.metadata.to_openai_tool() for t in LLAMA_TOOLS]
    response = llm.chat([ChatMessage(role="user", content=ASK)], tools=given, tool_choice="required")
    assert all("strict" not in t["function"] for t in given)
    gen = assert_strict_request(tiny_engine, recorded[-1], reference=False)
    assert response.raw["text"] == gen.text


# ------------------------------------------------------------------ the server

@pytest.fixture
def server(tiny_engine):
    with running(create_app(tiny_engine, model="tiny", api_key=API_KEY)) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)


@llama
def test_the_server_honours_a_strict_tool(tiny_engine, recorded, server):
    tools = [convert_to_openai_tool(SetAlarm, strict=False), convert_to_openai_tool(Dim, strict=False)]
    free = server.chat.completions.create(model="tiny", messages=[{"role": "user", "content": ASK}], tools=tools,
                                          tool_choice="required", max_tokens=N)
    # unconstrained, every call the random model writes fails its schema
    assert len(free.model_extra["oospec"]["schema_failures"]) == len(free.choices[0].message.tool_calls or [])
    # LangChain's strict tools, so that the masked reference is the one its test decoded
    flagged = ChatOoOSpec().bind_tools([SetAlarm, Dim], strict=True).kwargs["tools"]
    r = server.chat.completions.create(model="tiny", messages=[{"role": "user", "content": ASK}], tools=flagged,
                                       tool_choice="required", max_tokens=N)
    gen = assert_strict_request(tiny_engine, recorded[-1])
    failed = {f["index"] for f in r.model_extra["oospec"]["schema_failures"]}
    valid = [c for i, c in enumerate(r.choices[0].message.tool_calls) if i not in failed]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in valid] == \
        [(c["name"], c["arguments"]) for c in gen.tool_calls]
    assert_valid([(c["name"], c["arguments"]) for c in gen.tool_calls])
    assert r.usage.completion_tokens == len(gen.token_ids)
    null = dict(tools[0], function={**tools[0]["function"], "strict": None})  # null is OpenAI's "not strict"
    assert server.chat.completions.create(model="tiny", messages=[{"role": "user", "content": ASK}], tools=[null],
                                          max_tokens=1).choices


@pytest.mark.parametrize("value, got", [("yes", "a string"), (1, "an integer"), ({}, "an object")])
@llama
def test_a_strict_that_is_not_a_boolean_is_openais_400(tiny_engine, server, value, got):
    tool = convert_to_openai_tool(SetAlarm)
    tool["function"]["strict"] = value
    with pytest.raises(openai.BadRequestError) as raised:
        server.chat.completions.create(model="tiny", messages=[{"role": "user", "content": ASK}], tools=[tool])
    assert raised.value.status_code == 400
    assert raised.value.body == {
        "message": f"Invalid type for 'tools[0].function.strict': expected a boolean, but got {got} instead.",
        "type": "invalid_request_error", "param": "tools[0].function.strict", "code": "invalid_type"}
