"""A FunctionAgent on MCP tools (#65): `McpToolSpec` over `BasicMCPClient`, stdio and streamable HTTP,
the servers real FastMCP processes (oospec_agents/mcp/server.py); `OoOSpecSpeculativeTools` marks the
tools a trusted server declares read-only (`llama_index.llms.oospec.mcp.read_only_tools`, which reads
the annotations from each client's `list_tools`: McpToolSpec's FunctionTools carry none).

The embedded model (float32, its sidecar predicting) runs the agent over both transports; a
`Scripted` engine (the real engine on a scripted model) writes replies that call the destructive, the
untrusted, the erring and the dying tools. Every run is compared with the same agent without speculation.
"""
import asyncio
import re
import sys
import time

import pytest
from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.tools.mcp import BasicMCPClient, McpToolSpec
from oospec_agents.errors import ToolSchemaError
from oospec_agents.mcp.session import HttpServer, server_command
from oospec_agents.testing import Scripted

from llama_index.llms.oospec import OoOSpec, OoOSpecSpeculativeTools
from llama_index.llms.oospec.mcp import read_only_tools
from scripted_replies import reply_text

sys.path.append(str(__import__("pathlib").Path(__file__).resolve().parents[3] / "tests"))
from mcp_testing import calls, embedded_float32, travel_and_mail, write_spec  # noqa: E402

QUESTION = "What is the current weather in Paris?"
PARIS = {"location": "Paris"}


@pytest.fixture
def servers():
    running = []
    yield running
    for server in running:
        server.stop()


def client(spec, transport, servers):
    """A BasicMCPClient of server `spec` (a spec file; for "http", or an HttpServer already running)."""
    if transport == "stdio":
        command, args = server_command(spec)
        return BasicMCPClient(command, args=args)
    if not isinstance(spec, HttpServer):
        spec = HttpServer(spec)
        servers.append(spec)
    return BasicMCPClient(spec.url)


async def agent_run(llm, clients, trust=None):
    """(what the run shows, or the exception it raised; the speculative helper or None)."""
    tools = [t for c in clients.values() for t in await McpToolSpec(client=c).to_tool_list_async()]
    spec = None
    if trust is not None:
        spec = OoOSpecSpeculativeTools(tools, speculative=await read_only_tools(clients, trust=trust), llm=llm)
        tools = spec.tools
    try:
        handler = FunctionAgent(tools=tools, llm=llm).run(QUESTION, max_iterations=4)
        events = [event async for event in handler.stream_events()]
        return transcript(await handler, events), spec
    except Exception as error:  # noqa: BLE001  the same error with and without speculation is the check
        return error, spec
    finally:
        if spec is not None:
            spec.close()


def by_call_id(value):
    """`value` with every list of tool calls or results in call-id order: FunctionAgent keeps a step's
    parallel results in the order they finish, with or without speculation."""
    if isinstance(value, dict):
        return {k: by_call_id(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [by_call_id(v) for v in value]
        if items and all(isinstance(v, dict) and "tool_id" in v for v in items):
            items.sort(key=lambda v: str(v["tool_id"]))
        return items
    return value


def transcript(response, events) -> str:
    steps, results = [], []
    for e in events:
        if isinstance(e, AgentOutput):
            steps.append(by_call_id((e.response.model_dump(), [c.model_dump() for c in e.tool_calls])))
        elif isinstance(e, ToolCallResult):
            out = e.tool_output
            results.append((len(steps), e.tool_id, e.tool_name, e.tool_kwargs, out.content, out.is_error))
    # the real engine draws each reply's call ids at random (call_<12 hex>_<index>)
    return re.sub(r"call_[0-9a-f]{12}_", "call_", repr((str(response), steps, sorted(results))))


embedded = pytest.fixture(scope="module", name="embedded")(embedded_float32)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_embedded_agent_on_mcp_tools_hits_and_keeps_its_transcript(embedded, transport, servers, tmp_path):
    travel, travel_log, mail, mail_log = travel_and_mail(tmp_path)
    if transport == "http":  # one server each, for both runs; each run has its own clients (BasicMCPClient's
        travel, mail = HttpServer(travel), HttpServer(mail)  # httpx client belongs to the loop that used it)
        servers += [travel, mail]
    clients = lambda: {"travel": client(travel, transport, servers), "mail": client(mail, transport, servers)}  # noqa: E731
    llm = OoOSpec(engine=embedded, max_new_tokens=48)
    shown, spec = asyncio.run(agent_run(llm, clients(), trust=["travel"]))
    assert not isinstance(shown, Exception), shown
    assert spec.runner.tools == ("get_current_weather",)
    stats = spec.stats
    assert stats["hits"] + stats["ready_hits"] == 1, stats
    assert len(calls(travel_log, "get_current_weather")) == 1 + stats["wasted"]
    assert calls(travel_log, "book_table") == [] and calls(mail_log) == []
    plain, _ = asyncio.run(agent_run(llm, clients()))
    assert shown == plain


# -- scripted replies --------------------------------------------------------------------------------

BOOK = ("book_table", {"restaurant": "Da Michele", "people": 2})
MAIL = ("search_mail", {"query": "Paris"})
WEATHER = ("get_current_weather", PARIS)


def scripted(*replies, predicted=()):
    engine = Scripted(*(reply_text(*r) for r in replies),
                      predictions={0: [{"name": n, "arguments": a} for n, a in predicted]})
    return OoOSpec(engine=engine)


def scripted_clients(folder, servers):
    travel, travel_log = write_spec(folder, "travel")
    mail, mail_log = write_spec(folder, "mail")
    return {"travel": client(travel, "http", servers), "mail": client(mail, "http", servers)}, travel_log, mail_log


def test_destructive_and_untrusted_tools_run_only_when_the_agent_runs_them(tmp_path, servers):
    replies = (("", [WEATHER, BOOK, MAIL]), ("Booked, and it is sunny.", []))
    clients, travel_log, mail_log = scripted_clients(tmp_path / "spec", servers)
    began = time.time()
    shown, spec = asyncio.run(agent_run(scripted(*replies, predicted=[WEATHER, BOOK, MAIL]), clients, trust=["travel"]))
    assert spec.runner.tools == ("get_current_weather", "get_local_time", "flaky_lookup", "crash_lookup")
    assert spec.stats["hits"] == 1 and spec.stats["not_speculative"] == 4  # book and mail: predicted, ready
    for log, (name, arguments) in ((travel_log, BOOK), (mail_log, MAIL)):
        assert [c["arguments"] for c in calls(log, name)] == [arguments]   # exactly the agent's call
    assert len(calls(travel_log, "get_current_weather")) == 1 and calls(travel_log)[0]["t"] >= began
    plain_clients, _, _ = scripted_clients(tmp_path / "plain", servers)
    plain, _ = asyncio.run(agent_run(scripted(*replies), plain_clients))
    assert shown == plain


def test_an_error_answer_reaches_the_agent_once_only_when_its_call_is_verified(tmp_path, servers):
    wasted, verified = ("flaky_lookup", {"location": "Oslo"}), ("flaky_lookup", PARIS)
    replies = (("", [verified]), ("The gazetteer is down.", []))
    clients, travel_log, _ = scripted_clients(tmp_path / "spec", servers)
    shown, spec = asyncio.run(agent_run(scripted(*replies, predicted=[wasted, verified]), clients, trust=["travel"]))
    assert spec.stats["hits"] == 1 and spec.stats["wasted"] == 1
    assert "flaky_lookup failed" in shown and "Oslo" not in shown  # the verified call's error; not the wasted one's
    plain_clients, _, _ = scripted_clients(tmp_path / "plain", servers)
    plain, _ = asyncio.run(agent_run(scripted(*replies), plain_clients))
    assert shown == plain


def test_a_server_that_dies_mid_run_gives_the_agent_the_normal_error(tmp_path, servers):
    """Over stdio, where a dead server ends the session (a streamable HTTP client waits for its read
    timeout, with or without speculation alike)."""
    crash = ("crash_lookup", PARIS)
    replies = (("", [crash]), ("unreached", []))

    def run(folder, **kw):
        spec, log = write_spec(folder, "travel")
        return asyncio.run(agent_run(scripted(*replies, **kw), {"travel": client(spec, "stdio", servers)},
                                     **({"trust": ["travel"]} if kw else {}))), log
    (early, spec), early_log = run(tmp_path / "spec", predicted=[crash])
    assert spec.stats["hits"] == 1
    (normal, _), plain_log = run(tmp_path / "plain")
    assert (type(early), str(early)) == (type(normal), str(normal))
    assert len(calls(early_log, "crash_lookup")) == len(calls(plain_log, "crash_lookup")) == 1


def test_a_schema_the_engine_cannot_take_is_an_error_naming_tool_and_server(tmp_path, servers):
    bad = [{"name": "get_rows", "description": "Rows.", "inputSchema": {"type": "array"}, "annotations": None}]
    spec, _ = write_spec(tmp_path, "sheets", bad)
    with pytest.raises(ToolSchemaError, match=r"MCP server 'sheets', tool 'get_rows': its input schema cannot be used"):
        asyncio.run(read_only_tools({"sheets": client(spec, "http", servers)}, trust=["sheets"]))


def test_read_only_tools_takes_clients_by_server_name():
    with pytest.raises(TypeError, match="clients must map a server name to its MCP client"):
        asyncio.run(read_only_tools([object()]))
    with pytest.raises(TypeError, match=r"clients\['travel'\] must be an MCP client with list_tools\(\)"):
        asyncio.run(read_only_tools({"travel": object()}))
