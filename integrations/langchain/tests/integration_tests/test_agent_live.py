"""A real LangChain agent loop on the embedded default: call a Python tool, then answer.

The embedded target calls tools on its own (tool_choice="auto") only with the tool-calling LoRA
adapter in oospec_agents/adapters/smollm2-target; without it these tests fail, by design.
"""
from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage

from langchain_oospec import ChatOoOSpec
from oospec_agents import Engine

pytestmark = pytest.mark.slow

QUESTION = "What is the current weather in Paris?"
# A looping agent fails fast instead of running the default 25 steps.
CONFIG = {"recursion_limit": 6}

calls: list[str] = []


def get_current_weather(location: str) -> str:
    """Get the current weather in a given city."""
    calls.append(location)
    return f"It is 22 degrees Celsius and sunny in {location}."


@pytest.fixture(scope="module")
def agent():
    return create_agent(ChatOoOSpec(max_tokens=48), tools=[get_current_weather])


@pytest.fixture(scope="module")
def invoked(agent) -> list:
    calls.clear()
    return agent.invoke({"messages": [HumanMessage(QUESTION)]}, CONFIG)["messages"]


def test_the_second_model_call_prefills_only_what_the_first_did_not(agent):
    """An agent loop resends the conversation: the call after the tool result reuses the KV of the
    first call's prompt (the prefix cache), so it prefills only the call and the tool result."""
    Engine.shared("embedded").clear_prefix_cache()  # the first call starts cold, whatever ran before
    messages = agent.invoke({"messages": [HumanMessage(QUESTION)]}, CONFIG)["messages"]
    first, second = [m for m in messages if isinstance(m, AIMessage)]
    assert first.tool_calls and not second.tool_calls
    assert "input_token_details" not in first.usage_metadata  # nothing cached yet
    cached = second.usage_metadata["input_token_details"]["cache_read"]
    assert first.usage_metadata["input_tokens"] <= cached < second.usage_metadata["input_tokens"]
    # what the second call prefilled: the call and the tool result only (counted, not timed: a loaded
    # machine makes a time comparison flaky; oospec bench --agent-loop measures the seconds)
    assert second.usage_metadata["input_tokens"] - cached < first.usage_metadata["input_tokens"]
    assert second.response_metadata["prefill_s"] > 0


def test_agent_calls_the_tool_then_answers(invoked):
    assert [type(m) for m in invoked] == [HumanMessage, AIMessage, ToolMessage, AIMessage], \
        f"expected question, call, tool result, answer; got {[m.pretty_repr() for m in invoked]}"
    call = invoked[1].tool_calls[0]
    assert call["name"] == "get_current_weather"
    assert "Paris" in call["args"]["location"]
    assert calls == [call["args"]["location"]]
    assert "sunny" in invoked[2].content
    answer = invoked[3]
    assert not answer.tool_calls and answer.content.strip()


@pytest.fixture(scope="module")
def streamed(agent) -> list:
    """The messages of the same run, streamed with stream_mode="messages"."""
    events = agent.stream({"messages": [HumanMessage(QUESTION)]}, CONFIG, stream_mode="messages")
    return [message for message, _metadata in events]


def test_agent_streams_messages(streamed, invoked):
    tool_results = [i for i, m in enumerate(streamed) if isinstance(m, ToolMessage)]
    assert len(tool_results) == 1, f"expected one tool result in the stream, got {len(tool_results)}"
    tool_at = tool_results[0]
    call_chunks = [m for m in streamed[:tool_at] if isinstance(m, AIMessageChunk)]
    answer_chunks = [m for m in streamed[tool_at + 1:] if isinstance(m, AIMessageChunk)]
    assert any(m.tool_call_chunks for m in call_chunks)
    assert [m.chunk_position for m in call_chunks][-1] == "last"
    streamed_call = sum(call_chunks[1:], call_chunks[0]).tool_calls
    assert [(c["name"], c["args"]) for c in streamed_call] == \
        [(c["name"], c["args"]) for c in invoked[1].tool_calls]
    assert sum(1 for m in answer_chunks if m.content) > 1, "the answer should stream in several deltas"
    assert "".join(m.content for m in answer_chunks) == invoked[3].content


def test_agent_stream_shows_the_call_name_before_its_arguments_end(streamed):
    pieces = [(n, piece) for n, m in enumerate(streamed) if isinstance(m, AIMessageChunk)
              for piece in m.tool_call_chunks]
    named_at = [n for n, piece in pieces if piece["name"] == "get_current_weather"]
    arguments_at = [n for n, piece in pieces if piece["args"]]
    assert named_at and arguments_at, f"expected the call's name and arguments in the stream, got {pieces}"
    assert named_at[0] < arguments_at[-1], f"the name came with or after the arguments' end: {pieces}"
