"""A `create_agent` agent on the tools of one persistent MCP session, the servers real FastMCP processes
(oospec_agents/mcp/server.py over stdio): `async with client.session("travel") as session` and
`load_mcp_tools(session)`, langchain-mcp-adapters' own pattern for stateful servers. The session's
requests belong to the agent's event loop; `SpeculativeToolsMiddleware` runs its early calls there.

- the agent finishes (no hang), as fast as without speculation, with the same transcript;
- a server that dies mid-call fails the step at once, with the error the agent gets without speculation;
- `speculative=[]` (no tool of an unannotated server qualifies) warns why and runs as without speculation;
- `read_only_tools` reads every page of a server that pages `tools/list`.

A `Scripted` engine (the real engine on a scripted model) writes the replies, its sidecar the prediction,
so each case is exact.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

from langchain_oospec import ChatOoOSpec, SpeculativeToolsMiddleware
from langchain_oospec.mcp import read_only_tools
from mcp_testing import calls, transcript, travel_tools, write_spec
from oospec_agents.events import CallPredicted
from oospec_agents.mcp.session import server_command
from oospec_agents.speculative import NothingSpeculativeWarning
from oospec_agents.testing import Scripted

QUESTION = {"messages": [HumanMessage("What is the current weather in Paris?")]}
PARIS = {"location": "Paris"}
WEATHER = ("get_current_weather", PARIS)
#: the hang this guards against lasted until a 60 s timeout; every run here is bounded well below it
BOUND = 45.0


def reply(*calls_: tuple[str, dict]) -> str:
    return "\n".join('<tool_call>\n' + json.dumps({"name": n, "arguments": a}) + '\n</tool_call>' for n, a in calls_)


class PacedEngine(Scripted):
    """Replays its replies `seconds` apart per event, as a model takes time to write them (the tool
    time a prediction hides is the model's time after it)."""

    def __init__(self, *replies, seconds: float = 0.0, **kw):
        super().__init__(*replies, **kw)
        self.seconds = seconds

    def stream(self, *args, **kw):
        for event in super().stream(*args, **kw):
            yield event
            if not isinstance(event, CallPredicted):
                time.sleep(self.seconds)


def stdio(spec) -> dict:
    command, args = server_command(spec)
    return {"transport": "stdio", "command": command, "args": args}


async def session_run(spec, engine, speculative: list | None = None, trust=("travel",)):
    """One agent run on the tools of one persistent session of server `spec`: (messages, or the
    exception the run raised; its seconds; the middleware, or None without speculation). With
    `speculative` None, the middleware's list is what `read_only_tools` finds with `trust`."""
    client = MultiServerMCPClient({"travel": stdio(spec)})
    middleware = None
    if speculative is not None or trust:
        names = speculative if speculative is not None else await read_only_tools(client, trust=list(trust))
        middleware = SpeculativeToolsMiddleware(speculative=names)
    async with client.session("travel") as session:
        tools = await load_mcp_tools(session)
        agent = create_agent(ChatOoOSpec(engine=engine), tools=tools, middleware=[middleware] if middleware else [])
        began = time.perf_counter()
        try:
            outcome = (await asyncio.wait_for(agent.ainvoke(QUESTION, {"recursion_limit": 8}), BOUND))["messages"]
        except Exception as error:  # noqa: BLE001  the same error with and without speculation is the check
            outcome = error
        finally:
            seconds = time.perf_counter() - began
            if middleware is not None:
                middleware.close()
    return outcome, seconds, middleware


def weather_replies():
    return reply(WEATHER), "It is 22 degrees Celsius and sunny in Paris."


def test_a_persistent_session_agent_finishes_as_without_speculation(tmp_path):
    """The hit's run is a request of the agent's own session: it answers, the agent finishes, and its
    transcript is the one without speculation. Timed (several runs of each, alternating, on this
    loaded machine: reported, not compared tightly): the hang lasted until the 60 s timeout."""
    spec, log = write_spec(tmp_path, "travel", travel_tools(latency=0.3))
    names = asyncio.run(read_only_tools(MultiServerMCPClient({"travel": stdio(spec)}), trust=["travel"]))
    seconds = {"speculative": [], "plain": []}
    for _ in range(3):
        predicted = {0: [{"name": WEATHER[0], "arguments": PARIS}]}
        engine = PacedEngine(*weather_replies(), seconds=0.01, predictions=predicted)
        messages, took, middleware = asyncio.run(session_run(spec, engine, names))
        assert not isinstance(messages, BaseException), messages
        assert middleware.stats["hits"] == 1 and middleware.stats["wasted"] == 0, middleware.stats
        seconds["speculative"].append(took)
        plain, took, _ = asyncio.run(session_run(spec, PacedEngine(*weather_replies(), seconds=0.01), trust=()))
        seconds["plain"].append(took)
        assert transcript(messages) == transcript(plain)
        assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert len(calls(log, "get_current_weather")) == 6  # one tools/call per run: the hit's, or the agent's
    assert max(seconds["speculative"]) < BOUND / 3
    print("persistent session, seconds per agent run:", {k: [round(s, 3) for s in v] for k, v in seconds.items()},
          "ratio of medians:", round(sorted(seconds["speculative"])[1] / sorted(seconds["plain"])[1], 3))


class WaitsForTheCall(Scripted):
    """After its prediction, the reply waits (up to 30 s) until the server has received a call: the
    wasted run is dropped mid-call, whatever the processes' timing."""

    def __init__(self, *replies, log, **kw):
        super().__init__(*replies, **kw)
        self.log = log

    def stream(self, *args, **kw):
        for event in super().stream(*args, **kw):
            yield event
            deadline = time.time() + 30
            while isinstance(event, CallPredicted) and not calls(self.log) and time.time() < deadline:
                time.sleep(0.02)


def test_a_wasted_run_is_dropped_mid_call_and_the_session_goes_on(tmp_path):
    """The prediction (Oslo) is wrong: its request, in flight on the agent's session, is abandoned when
    the step settles; the session serves the verified call (Paris) and the agent finishes as without
    speculation."""
    spec, log = write_spec(tmp_path, "travel", travel_tools(latency=1.0))
    oslo = {"name": WEATHER[0], "arguments": {"location": "Oslo"}}
    engine = WaitsForTheCall(*weather_replies(), log=log, predictions={0: [oslo]})
    messages, took, middleware = asyncio.run(session_run(spec, engine, ["get_current_weather"]))
    assert not isinstance(messages, BaseException), messages
    assert middleware.stats["wasted"] == 1 and middleware.stats["cancelled"] == 1, middleware.stats
    assert [c["arguments"]["location"] for c in calls(log)] == ["Oslo", "Paris"]
    plain, _, _ = asyncio.run(session_run(spec, Scripted(*weather_replies()), trust=()))
    assert transcript(messages) == transcript(plain)


def test_a_server_that_dies_mid_call_fails_the_step_at_once(tmp_path):
    """The session's server exits when the predicted call arrives: the claimed run fails with the
    session's error at once (no wait for a timeout), the same error the agent gets without speculation."""
    crash = ("crash_lookup", PARIS)
    replies = (reply(crash), "unreached")

    def run(folder, speculative: bool):
        spec, log = write_spec(folder, "travel")
        predictions = {0: [{"name": crash[0], "arguments": PARIS}]} if speculative else {}
        outcome, took, middleware = asyncio.run(session_run(spec, Scripted(*replies, predictions=predictions),
                                                            trust=("travel",) if speculative else ()))
        return outcome, took, middleware, log
    early, took, middleware, early_log = run(tmp_path / "spec", speculative=True)
    assert middleware.stats["hits"] == 1
    normal, _, _, plain_log = run(tmp_path / "plain", speculative=False)
    assert type(early).__name__ == "McpError" and "Connection closed" in str(early), repr(early)
    assert (type(early), str(early)) == (type(normal), str(normal))
    assert took < BOUND / 3
    assert len(calls(early_log, "crash_lookup")) == len(calls(plain_log, "crash_lookup")) == 1


def test_no_tool_qualifies_the_agent_runs_as_without_speculation(tmp_path):
    """The notes server is not trusted (the default), or its one read-only tool is overridden and the
    other declares nothing: `read_only_tools` finds nothing and says why; the middleware takes the
    empty list with a warning; the agent's run is the run without it, the tool called once, by the agent."""
    notes = ("read_note", {"title": "Paris"})
    spec, log = write_spec(tmp_path, "notes")
    client = MultiServerMCPClient({"notes": stdio(spec)})
    with pytest.warns(NothingSpeculativeWarning, match=r"no MCP tool may start early: trust names no server"):
        assert asyncio.run(read_only_tools(client)) == []
    with pytest.warns(NothingSpeculativeWarning, match=r"of the tools of the trusted servers \['notes'\]: set False "
                      r"in overrides \['list_notes'\]; no annotations \(or malformed ones\) \['read_note'\]"):
        assert asyncio.run(read_only_tools(client, trust=["notes"], overrides={"list_notes": False})) == []

    async def run(speculative: bool):
        async with client.session("notes") as session:
            tools = await load_mcp_tools(session)
            predicted = {0: [{"name": notes[0], "arguments": notes[1]}]}
            engine = Scripted(reply(notes), "Noted.", predictions=predicted)
            middleware = []
            if speculative:
                with pytest.warns(NothingSpeculativeWarning, match="SpeculativeToolsMiddleware: speculative names no"):
                    middleware = [SpeculativeToolsMiddleware(speculative=[])]
            agent = create_agent(ChatOoOSpec(engine=engine), tools=tools, middleware=middleware)
            messages = (await asyncio.wait_for(agent.ainvoke(QUESTION), BOUND))["messages"]
            return messages, middleware
    messages, (middleware,) = asyncio.run(run(True))
    assert middleware.stats["not_speculative"] == 2 and middleware.stats["started"] == 0  # predicted, ready
    middleware.close()
    plain, _ = asyncio.run(run(False))
    assert transcript(messages) == transcript(plain)
    assert [c["arguments"] for c in calls(log, "read_note")] == [notes[1]] * 2  # once per run, by the agent


def test_read_only_tools_reads_every_page(tmp_path):
    """A server that lists two tools a page: the read-only ones of every page, as the client's tools are."""
    spec, _ = write_spec(tmp_path, "travel", page_size=2)
    client = MultiServerMCPClient({"travel": stdio(spec)})
    assert len(asyncio.run(client.get_tools())) == 6
    assert asyncio.run(read_only_tools(client, trust=["travel"])) == [
        "get_current_weather", "get_local_time", "flaky_lookup", "crash_lookup"]  # pages 1, 1, 3, 3


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
