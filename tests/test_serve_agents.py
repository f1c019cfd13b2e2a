"""Agent frameworks drive `oospec serve` on the embedded default through their own OpenAI clients:
the official `openai` SDK, LangChain's `ChatOpenAI` (bind_tools, a `create_agent` loop) and
LlamaIndex's `OpenAILike` in a `FunctionAgent`. Nothing here imports our integrations."""
from __future__ import annotations

import json

import httpx
import openai
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.llms.openai_like import OpenAILike

pytestmark = pytest.mark.slow

QUESTION = "What is the current weather in Paris?"
WEATHER = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given city.",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}


def chat_openai(url: str, **kw) -> ChatOpenAI:
    return ChatOpenAI(model="embedded", base_url=url + "/v1", api_key="unused", max_tokens=48, max_retries=0, **kw)


def test_openai_forced_call_is_valid_and_verified(embedded_server):
    client = openai.OpenAI(base_url=embedded_server + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="embedded", messages=[{"role": "user", "content": QUESTION}],
                                       tools=[WEATHER], max_tokens=48,
                                       tool_choice={"type": "function", "function": {"name": "get_current_weather"}})
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_current_weather"
    assert "Paris" in json.loads(call.function.arguments)["location"]
    assert r.choices[0].finish_reason == "tool_calls"
    extra = r.model_extra["oospec"]
    assert extra["schema_failures"] == []
    assert extra["stats"]["target_forwards"] < r.usage.completion_tokens  # drafts were accepted
    metrics = httpx.get(embedded_server + "/metrics").text
    hints = sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("oospec_hints_total{"))
    assert hints >= 1  # the sidecar was asked for a hint, in time or late


def test_chat_openai_bind_tools_invoke(embedded_server):
    calls = []

    def get_current_weather(location: str) -> str:
        """Get the current weather in a given city."""
        calls.append(location)
        return f"It is 22 degrees Celsius and sunny in {location}."

    reply = chat_openai(embedded_server).bind_tools([get_current_weather]).invoke(QUESTION)
    assert reply.tool_calls and reply.tool_calls[0]["name"] == "get_current_weather"
    assert "Paris" in reply.tool_calls[0]["args"]["location"]
    assert reply.response_metadata["finish_reason"] == "tool_calls"


def test_chat_openai_structured_output_with_a_json_schema(embedded_server):
    """ChatOpenAI's `with_structured_output(method="json_schema")` sends the schema as
    `response_format`: the reply is decoded under its grammar and parses into the model."""
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        city: str = Field(max_length=24)
        temperature_celsius: int

    structured = chat_openai(embedded_server).with_structured_output(Weather, method="json_schema", strict=True,
                                                                     include_raw=True)
    out = structured.invoke("It is 22 degrees Celsius in Paris today. Give the city and its temperature.")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Weather), out
    assert json.loads(out["raw"].content) == out["parsed"].model_dump()
    assert out["raw"].response_metadata["finish_reason"] == "stop"


def test_openai_parse_with_tools_calls_then_answers_in_the_schema(embedded_server):
    """Tools and a response_format together, as OpenAI serves them: under `auto` the reply is calls
    or the schema's JSON. The 135M calls the tool first; the turn after the tool's result, with
    tool_choice="none", is the JSON, parsed by the SDK."""
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        city: str = Field(max_length=24)
        temperature_celsius: int

    strict_tool = {"type": "function", "function": {**WEATHER["function"], "strict": True, "parameters": {
        **WEATHER["function"]["parameters"], "additionalProperties": False}}}  # parse() takes strict tools only
    client = openai.OpenAI(base_url=embedded_server + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.parse(model="embedded", messages=messages, tools=[strict_tool],
                                          response_format=Weather, max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "get_current_weather"
    messages += [first.choices[0].message.model_dump(include={"role", "content", "tool_calls"}),
                 {"role": "tool", "tool_call_id": call.id, "content": "It is 22 degrees Celsius and sunny in Paris."}]
    second = client.chat.completions.parse(model="embedded", messages=messages, tools=[strict_tool], tool_choice="none",
                                           response_format=Weather, max_tokens=64)
    assert second.choices[0].message.parsed == Weather(city="Paris", temperature_celsius=22)


def test_chat_openai_create_agent_calls_the_tool_then_answers(embedded_server):
    calls = []

    def get_current_weather(location: str) -> str:
        """Get the current weather in a given city."""
        calls.append(location)
        return f"It is 22 degrees Celsius and sunny in {location}."

    agent = create_agent(chat_openai(embedded_server), tools=[get_current_weather])
    messages = agent.invoke({"messages": [HumanMessage(QUESTION)]}, {"recursion_limit": 6})["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage], \
        [m.pretty_repr() for m in messages]
    assert calls and "Paris" in calls[0]
    assert "sunny" in messages[2].content
    assert not messages[3].tool_calls and messages[3].content.strip()


@pytest.mark.parametrize("streaming", [True, False])
async def test_llamaindex_openai_like_function_agent(embedded_server, streaming):
    seen = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers and return the product."""
        seen.append((a, b))
        return a * b

    llm = OpenAILike(model="embedded", api_base=embedded_server + "/v1", api_key="unused", temperature=0.0,
                     max_tokens=48, context_window=8192, is_chat_model=True, is_function_calling_model=True)
    agent = FunctionAgent(tools=[multiply], llm=llm, streaming=streaming)
    handler = agent.run("What is 6 times 7?", max_iterations=4)
    events = [event async for event in handler.stream_events()]
    response = await handler
    assert seen == [(6, 7)]
    assert [e.tool_output.content for e in events if isinstance(e, ToolCallResult)] == ["42"]
    assert "42" in str(response)
