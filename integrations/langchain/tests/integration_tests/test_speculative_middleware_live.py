"""SpeculativeToolsMiddleware on a real agent loop: the embedded default, create_agent, a Python tool.

The embedded sidecar predicts the call while the target writes it; the tool runs from that
prediction (or, if the hint comes too late on a loaded CPU, from the verified call's ToolCallReady,
before the reply ends), once, and the agent's transcript is the one it has without the middleware.
"""
from __future__ import annotations

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from langchain_oospec import ChatOoOSpec, SpeculativeToolsMiddleware
from mcp_testing import transcript

pytestmark = pytest.mark.slow

QUESTION = "What is the current weather in Paris?"
CONFIG = {"recursion_limit": 6}  # a looping agent fails fast


def agent_run(middleware=()) -> tuple[list, list[str]]:
    """The messages of one agent run, and the locations the tool was called with."""
    calls: list[str] = []

    def get_current_weather(location: str) -> str:
        """Get the current weather in a given city."""
        calls.append(location)
        return f"It is 22 degrees Celsius and sunny in {location}."

    agent = create_agent(ChatOoOSpec(max_tokens=48), tools=[get_current_weather], middleware=list(middleware))
    return agent.invoke({"messages": [HumanMessage(QUESTION)]}, CONFIG)["messages"], calls


def test_the_tool_runs_early_once_and_the_transcript_is_unchanged():
    speculative = SpeculativeToolsMiddleware(speculative=["get_current_weather"],
                                             tool_seconds={"get_current_weather": 1.0})
    try:
        messages, calls = agent_run([speculative])
    finally:
        speculative.close()
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    stats = speculative.stats
    # handed over from a run started early: by the sidecar's prediction, or (a late hint) by the verified call
    assert stats["hits"] + stats["ready_hits"] == 1, stats
    assert stats["not_speculative"] == 0
    # a prediction that is not exactly the verified call ran as well, its result dropped (wasted): the
    # sidecar's words are the 135M model's, so the test counts it rather than assume the prediction exact
    assert len(calls) == 1 + stats["wasted"], (calls, stats)
    plain, plain_calls = agent_run()
    assert len(plain_calls) == 1 and "Paris" in plain_calls[0] and plain_calls[0] in calls
    assert transcript(messages) == transcript(plain)
