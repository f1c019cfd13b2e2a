"""LlamaIndex on real MCP server processes (oospec_agents/mcp/server.py): `read_only_tools` reads every
page of a server that pages `tools/list` (over `BasicMCPClient`, stdio and streamable HTTP, and over an
open `ClientSession`), a FunctionAgent reaches a read-only tool of a later page, and a wasted run
cancelled while `BasicMCPClient`'s stdio session opens ends quietly (nothing on stderr).

A `Scripted` engine (the real engine on a scripted model) writes the replies, its sidecar the predictions.
"""
import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.tools.mcp import BasicMCPClient, McpToolSpec
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from oospec_agents.mcp.session import HttpServer, server_command
from oospec_agents.testing import Scripted

from llama_index.llms.oospec import OoOSpec, OoOSpecSpeculativeTools
from llama_index.llms.oospec.mcp import every_tool, read_only_tools
from scripted_replies import reply_text

sys.path.append(str(Path(__file__).resolve().parents[3] / "tests"))
from mcp_testing import calls, travel_tools, write_spec  # noqa: E402

PARIS = {"location": "Paris"}


def paged(folder: Path):
    """The travel server, two tools a page, its weather lookup on page 2: (spec, log)."""
    tools = {t["name"]: t for t in travel_tools(latency=0.2)}
    order = ["convert_currency", "book_table", "get_local_time", "get_current_weather", "flaky_lookup", "crash_lookup"]
    return write_spec(folder, "travel", [tools[name] for name in order], page_size=2)


READ_ONLY = ["get_local_time", "get_current_weather", "flaky_lookup", "crash_lookup"]


@pytest.mark.parametrize("transport", ["stdio", "http", "session"])
def test_read_only_tools_reads_every_page(tmp_path, transport):
    spec, _ = paged(tmp_path)
    command, args = server_command(spec)

    async def listing(client):
        first = await client.list_tools()
        assert first.nextCursor == "2" and len(first.tools) == 2  # the server pages its tools
        assert len(await every_tool(client)) == 6
        return await read_only_tools({"travel": client}, trust=["travel"])

    async def over_a_session():
        async with stdio_client(StdioServerParameters(command=command, args=args)) as streams:
            async with ClientSession(*streams) as session:
                await session.initialize()
                return await listing(session)
    if transport == "session":
        assert asyncio.run(over_a_session()) == READ_ONLY
    elif transport == "stdio":
        assert asyncio.run(listing(BasicMCPClient(command, args=args))) == READ_ONLY
    else:
        with HttpServer(spec) as server:
            assert asyncio.run(listing(BasicMCPClient(server.url))) == READ_ONLY


class EveryPage(McpToolSpec):
    """McpToolSpec listing every page (its own `fetch_tools` reads the first), as docs/mcp.md shows."""

    async def fetch_tools(self):
        return await every_tool(self.client)


def test_an_agent_hits_a_read_only_tool_of_a_later_page(tmp_path):
    spec, log = paged(tmp_path)
    with HttpServer(spec) as server:
        async def run(speculative: bool):
            client = BasicMCPClient(server.url)
            tools = await EveryPage(client=client).to_tool_list_async()
            engine = Scripted(reply_text("", [("get_current_weather", PARIS)]), reply_text("Sunny.", []),
                              predictions={0: [{"name": "get_current_weather", "arguments": PARIS}]})
            llm = OoOSpec(engine=engine)
            if not speculative:
                return str(await FunctionAgent(tools=tools, llm=llm).run("Weather?", max_iterations=4)), None
            names = await read_only_tools({"travel": client}, trust=["travel"])
            with OoOSpecSpeculativeTools(tools, speculative=names, llm=llm) as spec_tools:
                shown = str(await FunctionAgent(tools=spec_tools.tools, llm=llm).run("Weather?", max_iterations=4))
                return shown, spec_tools.stats
        shown, stats = asyncio.run(run(True))
        assert stats["hits"] == 1, stats
        plain, _ = asyncio.run(run(False))
    assert shown == plain == "Sunny."
    assert len(calls(log, "get_current_weather")) == 2  # one per run: the hit's, then the agent's


#: one agent run per delay: the wasted run (Oslo) is cancelled that long after its prediction, while
#: BasicMCPClient's stdio session for it opens; stdout gets each run's stats as JSON
QUIET_CANCEL = """
import asyncio, json, sys, time
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.tools.mcp import BasicMCPClient, McpToolSpec
from llama_index.llms.oospec import OoOSpec, OoOSpecSpeculativeTools
from llama_index.llms.oospec.mcp import read_only_tools
from oospec_agents.events import CallPredicted
from oospec_agents.testing import Scripted
from scripted_replies import reply_text

class Slow(Scripted):
    def __init__(self, *replies, seconds, **kw):
        super().__init__(*replies, **kw)
        self.seconds = seconds
    def stream(self, *args, **kw):
        for event in super().stream(*args, **kw):
            yield event
            if isinstance(event, CallPredicted):
                time.sleep(self.seconds)

async def main(command, args, seconds):
    client = BasicMCPClient(command, args=args)
    tools = await McpToolSpec(client=client).to_tool_list_async()
    engine = Slow(reply_text("", [("get_local_time", {"location": "Paris"})]), reply_text("Noon.", []), seconds=seconds,
                  predictions={0: [{"name": "get_current_weather", "arguments": {"location": "Oslo"}}]})
    llm = OoOSpec(engine=engine)
    with OoOSpecSpeculativeTools(tools, speculative=["get_current_weather"], llm=llm) as spec:
        await FunctionAgent(tools=spec.tools, llm=llm).run("Time?", max_iterations=4)
        return spec.stats

command, args = sys.argv[1], sys.argv[2:]
for seconds in (0.1, 0.4, 1.0):
    print(json.dumps(asyncio.run(main(command, args, seconds))), flush=True)
"""


def test_a_wasted_run_cancelled_over_stdio_ends_quietly(tmp_path):
    """In a process of its own, as a user runs it: no "Task exception was never retrieved" (the stdio
    session torn down by the cancellation raising BrokenResourceError) reaches stderr."""
    tools = travel_tools(latency=0.5)
    tools[0]["latency"] = 5.0  # the wasted get_current_weather run is still in the call when each step ends, however
    spec, log = write_spec(tmp_path, "travel", tools)  # slow the machine: it is cancelled mid-call every time
    script = tmp_path / "quiet_cancel.py"
    script.write_text(textwrap.dedent(QUIET_CANCEL))
    command, args = server_command(spec)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, str(script), command, *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr
    stats = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(s["started"], s["wasted"], s["cancelled"]) for s in stats] == [(1, 1, 1)] * 3, stats
    assert "never retrieved" not in done.stderr and "BrokenResourceError" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert [c["arguments"] for c in calls(log, "get_local_time")] == [PARIS] * 3
