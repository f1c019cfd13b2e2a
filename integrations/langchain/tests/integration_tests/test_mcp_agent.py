"""A `create_agent` agent on MCP tools (#65): `MultiServerMCPClient` over stdio and streamable HTTP, the
servers real FastMCP processes (oospec_agents/mcp/server.py), `SpeculativeToolsMiddleware` marking the
tools a trusted server declares read-only (`langchain_oospec.mcp.read_only_tools`).

The embedded model (float32, its sidecar predicting) runs the agent end to end over both transports;
a `Scripted` engine (the real engine on a scripted model) writes replies that call the destructive, the
untrusted, the erring and the dying tools, so each case is exact. Every run is compared with the same agent without speculation.
"""
from __future__ import annotations

import asyncio
import sys
import time

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient

from langchain_oospec import ChatOoOSpec, SpeculativeToolsMiddleware
from langchain_oospec.mcp import read_only_tools
from mcp_testing import calls, embedded_float32, transcript, travel_and_mail, write_spec
from oospec_agents.errors import ToolSchemaError
from oospec_agents.mcp.session import HttpServer, server_command
from oospec_agents.testing import Scripted

QUESTION = "What is the current weather in Paris?"
CONFIG = {"recursion_limit": 8}
PARIS = {"location": "Paris"}


def connection(spec, transport: str, servers: list) -> dict:
    if transport == "stdio":
        command, args = server_command(spec)
        return {"transport": "stdio", "command": command, "args": args}
    server = HttpServer(spec)
    servers.append(server)
    return {"transport": "streamable_http", "url": server.url}


@pytest.fixture
def servers():
    running: list[HttpServer] = []
    yield running
    for server in running:
        server.stop()


class ToolSteps(AgentMiddleware):
    """Outermost middleware: when each tool step began (epoch seconds), by the call's tool name."""

    def __init__(self):
        self.began: list[tuple[str, float]] = []

    async def awrap_tool_call(self, request, handler):
        self.began.append((request.tool_call["name"], time.time()))
        return await handler(request)


async def agent_run(model, connections: dict, trust=None, steps: ToolSteps | None = None):
    """(messages or the exception the run raised, the middleware or None): one agent run on every tool
    of the servers; with `trust`, SpeculativeToolsMiddleware on the trusted servers' read-only tools."""
    client = MultiServerMCPClient(connections)
    tools = await client.get_tools()
    middleware = [steps] if steps else []
    speculative = None
    if trust is not None:
        speculative = SpeculativeToolsMiddleware(speculative=await read_only_tools(client, trust=trust))
        middleware.append(speculative)
    agent = create_agent(model, tools=tools, middleware=middleware)
    try:
        with speculative if speculative else _nothing():
            return (await agent.ainvoke({"messages": [HumanMessage(QUESTION)]}, CONFIG))["messages"], speculative
    except Exception as error:  # noqa: BLE001  the same error with and without speculation is the check
        return error, speculative


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


# -- the embedded model, end to end ------------------------------------------------------------------

embedded = pytest.fixture(scope="module", name="embedded")(embedded_float32)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_embedded_agent_on_mcp_tools_hits_and_keeps_its_transcript(embedded, transport, servers, tmp_path):
    travel, travel_log, mail, mail_log = travel_and_mail(tmp_path)
    connections = {"travel": connection(travel, transport, servers), "mail": connection(mail, transport, servers)}
    model = ChatOoOSpec(engine=embedded, max_tokens=48)
    messages, speculative = asyncio.run(agent_run(model, connections, trust=["travel"]))
    assert speculative.runner.tools == ("get_current_weather",)
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage], messages
    stats = speculative.stats
    assert stats["hits"] + stats["ready_hits"] == 1, stats      # from the prediction, or a late hint's ready call
    weather = calls(travel_log, "get_current_weather")
    assert len(weather) == 1 + stats["wasted"]                  # a real tools/call per run, the verified one once
    assert calls(travel_log, "book_table") == [] and calls(mail_log) == []
    plain, _ = asyncio.run(agent_run(model, connections))
    assert transcript(messages) == transcript(plain)


# -- scripted replies: the destructive, the untrusted, the erring and the dying tools --------------------

def reply(*calls_: tuple[str, dict]) -> str:
    import json
    return "\n".join('<tool_call>\n' + json.dumps({"name": n, "arguments": a}) + '\n</tool_call>' for n, a in calls_)


BOOK = ("book_table", {"restaurant": "Da Michele", "people": 2})
MAIL = ("search_mail", {"query": "Paris"})
WEATHER = ("get_current_weather", PARIS)


def scripted(*replies, predicted=()) -> ChatOoOSpec:
    engine = Scripted(*replies, predictions={0: [{"name": n, "arguments": a} for n, a in predicted]})
    return ChatOoOSpec(engine=engine)


def scripted_servers(tmp_path, servers, transport="http"):
    travel, travel_log = write_spec(tmp_path, "travel")
    mail, mail_log = write_spec(tmp_path, "mail")
    return ({"travel": connection(travel, transport, servers), "mail": connection(mail, transport, servers)},
            travel_log, mail_log)


def test_destructive_and_untrusted_tools_run_only_when_the_agent_runs_them(tmp_path, servers):
    replies = (reply(WEATHER, BOOK, MAIL), "Booked, and it is sunny.")
    connections, travel_log, mail_log = scripted_servers(tmp_path / "spec", servers)
    steps = ToolSteps()
    messages, speculative = asyncio.run(agent_run(scripted(*replies, predicted=[WEATHER, BOOK, MAIL]), connections,
                                                  trust=["travel"], steps=steps))
    assert speculative.runner.tools == ("get_current_weather", "get_local_time", "flaky_lookup", "crash_lookup")
    # the booking and the mail search, each predicted and each verified (ready): counted, never started
    assert speculative.stats["hits"] == 1 and speculative.stats["not_speculative"] == 4
    began = dict(steps.began)
    for log, (name, arguments) in ((travel_log, BOOK), (mail_log, MAIL)):
        received = calls(log, name)
        assert [c["arguments"] for c in received] == [arguments]     # exactly the agent's call
        assert received[0]["t"] >= began[name]                       # and only once the agent ran it
    assert len(calls(travel_log, "get_current_weather")) == 1  # the hit: its run started from the prediction
    plain_connections, _, _ = scripted_servers(tmp_path / "plain", servers)
    plain, _ = asyncio.run(agent_run(scripted(*replies), plain_connections))
    assert transcript(messages) == transcript(plain)


def test_an_error_answer_reaches_the_agent_once_only_when_its_call_is_verified(tmp_path, servers):
    wasted = ("flaky_lookup", {"location": "Oslo"})
    verified = ("flaky_lookup", PARIS)
    replies = (reply(verified), "The gazetteer is down.")
    connections, travel_log, _ = scripted_servers(tmp_path / "spec", servers)
    messages, speculative = asyncio.run(agent_run(scripted(*replies, predicted=[wasted, verified]), connections,
                                                  trust=["travel"]))
    assert speculative.stats["hits"] == 1 and speculative.stats["wasted"] == 1
    errors = [m for m in messages if isinstance(m, ToolMessage)]
    assert len(errors) == 1 and errors[0].status == "error" and "flaky_lookup failed" in str(errors[0].content)
    plain_connections, _, _ = scripted_servers(tmp_path / "plain", servers)
    plain, _ = asyncio.run(agent_run(scripted(*replies), plain_connections))
    assert transcript(messages) == transcript(plain)


def test_a_server_that_dies_mid_run_gives_the_agent_the_normal_error(tmp_path, servers):
    """Over stdio, where a dead server ends the session (a streamable HTTP client waits for its read
    timeout, with or without speculation alike)."""
    crash = ("crash_lookup", PARIS)
    replies = (reply(crash), "unreached")

    def run(folder, **kw):
        spec, log = write_spec(folder, "travel")
        return asyncio.run(agent_run(scripted(*replies, **kw), {"travel": connection(spec, "stdio", servers)},
                                     **({"trust": ["travel"]} if kw else {}))), log
    (early, speculative), early_log = run(tmp_path / "spec", predicted=[crash])
    assert speculative.stats["hits"] == 1
    (normal, _), plain_log = run(tmp_path / "plain")
    assert isinstance(normal, Exception) and (type(early), str(early)) == (type(normal), str(normal))
    assert len(calls(early_log, "crash_lookup")) == len(calls(plain_log, "crash_lookup")) == 1


def test_a_schema_the_engine_cannot_take_is_an_error_naming_tool_and_server(tmp_path, servers):
    bad = [{"name": "get_rows", "description": "Rows.", "inputSchema": {"type": "array"}, "annotations": None}]
    spec, _ = write_spec(tmp_path, "sheets", bad)
    client = MultiServerMCPClient({"sheets": connection(spec, "http", servers)})
    with pytest.raises(ToolSchemaError, match=r"MCP server 'sheets', tool 'get_rows': its input schema cannot be used"):
        asyncio.run(read_only_tools(client, trust=["sheets"]))


def test_read_only_tools_takes_a_multi_server_client():
    with pytest.raises(TypeError, match="client must be a langchain_mcp_adapters MultiServerMCPClient, got dict"):
        asyncio.run(read_only_tools({"travel": {}}, trust=["travel"]))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
