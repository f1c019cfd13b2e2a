"""MCP tools for SpeculativeToolsMiddleware: the tools a trusted MCP server declares read-only.

```python
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_oospec import ChatOoOSpec, SpeculativeToolsMiddleware
from langchain_oospec.mcp import read_only_tools

client = MultiServerMCPClient({"travel": {"transport": "streamable_http", "url": "http://127.0.0.1:8000/mcp"}})
tools = await client.get_tools()
with SpeculativeToolsMiddleware(speculative=await read_only_tools(client, trust=["travel"])) as speculative:
    agent = create_agent(ChatOoOSpec(), tools=tools, middleware=[speculative])
```

`read_only_tools` lists every server's tools from a session of its own (`tools/list`, the server's
word: the annotations LangChain keeps in each tool's `metadata` come from the same listing) and
returns the names `oospec_agents.mcp.early_tools` allows: declared read-only by a server in `trust`,
or set by `overrides`. Every listed tool's input schema is checked by the engine's tool normaliser
here, so a schema it cannot take is an error naming the tool and its server before the agent runs.

A speculative run of an MCP tool is the tool's own `ainvoke`: a real `tools/call` on the server, in a
session the adapter opens for that call. A wasted run is cancelled like any other: the adapter's
session ends with it (stdio: the server process the adapter started for that call is stopped;
streamable HTTP: the request is abandoned and the session deleted).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from oospec_agents.mcp import ServerTool, early_tools, listed, openai_tool
from oospec_agents.mcp.session import every_tool

__all__ = ["read_only_tools"]


async def read_only_tools(client: Any, trust: Iterable[str] = (), overrides: Mapping[str, bool] | None = None
                          ) -> list[str]:
    """The names (as the client's `get_tools()` names them) of the tools that may start early: those a
    server named in `trust` declares read-only (`readOnlyHint` true, `destructiveHint` not true), with
    `overrides` ({tool name: True/False}) deciding first. `client`: a `MultiServerMCPClient`."""
    connections = getattr(client, "connections", None)
    if not isinstance(connections, Mapping):
        raise TypeError(f"client must be a langchain_mcp_adapters MultiServerMCPClient, got {type(client).__name__}")
    prefix = bool(getattr(client, "tool_name_prefix", False))
    tools: list[ServerTool] = []
    for server in connections:
        async with client.session(server) as session:
            listing = await every_tool(session)
        for tool in listed(server, listing):  # outside the session: its task group would wrap our errors
            openai_tool(tool)  # a schema the engine cannot take: an error naming tool and server, now
            tools.append(ServerTool(tool.server, f"{server}_{tool.name}" if prefix else tool.name,
                                    tool.annotations, tool.input_schema, tool.description))
    return early_tools(tools, trust, overrides)

