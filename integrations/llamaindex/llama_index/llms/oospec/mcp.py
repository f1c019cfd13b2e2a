"""MCP tools for OoOSpecSpeculativeTools: the tools a trusted MCP server declares read-only.

```python
from llama_index.tools.mcp import BasicMCPClient, McpToolSpec
from llama_index.llms.oospec.mcp import read_only_tools

clients = {"travel": BasicMCPClient("http://127.0.0.1:8000/mcp")}
tools = [t for c in clients.values() for t in await McpToolSpec(client=c).to_tool_list_async()]
speculative = await read_only_tools(clients, trust=["travel"])
with OoOSpecSpeculativeTools(tools, speculative=speculative, llm=llm) as spec:
    agent = FunctionAgent(tools=spec.tools, llm=llm)
```

`McpToolSpec`'s FunctionTools carry no annotations, so `read_only_tools` reads them from each server's
`tools/list`, every page of it (`every_tool`), and returns the names `oospec_agents.mcp.early_tools`
allows: declared read-only by a server named in `trust`, or set by `overrides` (none: a warning says
why, and the agent runs as without speculation). Every listed tool's input schema is checked by the
engine's tool normaliser here: a schema it cannot take is an error naming the tool and its server.
`McpToolSpec` itself lists the first page only: for a server that pages its tools, give it a
`fetch_tools` that returns `await every_tool(client)` (docs/mcp.md).

A speculative run of an MCP tool is the FunctionTool's own `acall`: a real `tools/call`, in the session
`BasicMCPClient` opens for each call; a wasted run is cancelled like any other, and that session ends
with it (stdio: its server process is stopped; streamable HTTP: the request is abandoned).
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable, List, Mapping, Optional

from oospec_agents.mcp import ServerTool, early_tools, listed, openai_tool
from oospec_agents.mcp.session import every_tool as every_page

__all__ = ["every_tool", "read_only_tools"]


async def every_tool(client: Any) -> List[Any]:
    """Every tool an MCP client lists, all pages of `tools/list` (`mcp.types.Tool`s). `client`: an open
    `ClientSession` (its `list_tools` takes a cursor), or a `BasicMCPClient`, whose `list_tools()` reads
    the first page: when the server says there is more, one session of the client's own lists them all."""
    if "cursor" in inspect.signature(client.list_tools).parameters:
        return await every_page(client)
    first = await client.list_tools()
    if not getattr(first, "nextCursor", None):
        return list(first.tools)
    open_session = getattr(client, "_run_session", None)  # BasicMCPClient's session of its transport
    if open_session is None:
        raise TypeError(f"{type(client).__name__}.list_tools() takes no cursor and its server lists more than one "
                        "page of tools: give an open mcp ClientSession or a BasicMCPClient")
    async with open_session() as session:
        return await every_page(session)


async def read_only_tools(clients: Mapping[str, Any], trust: Iterable[str] = (),
                          overrides: Optional[Mapping[str, bool]] = None) -> List[str]:
    """The names of the tools that may start early, for `OoOSpecSpeculativeTools(speculative=...)`:
    those a server named in `trust` declares read-only (`readOnlyHint` true, `destructiveHint` not
    true), with `overrides` ({tool name: True/False}) deciding first. `clients`: {server name: its
    `BasicMCPClient`} (any client with an async `list_tools()`)."""
    if not isinstance(clients, Mapping):
        raise TypeError(f"clients must map a server name to its MCP client (BasicMCPClient), got {clients!r}")
    tools: List[ServerTool] = []
    for server, client in clients.items():
        if not callable(getattr(client, "list_tools", None)):
            raise TypeError(f"clients[{server!r}] must be an MCP client with list_tools() (BasicMCPClient), "
                            f"got {type(client).__name__}")
        for tool in listed(server, await every_tool(client)):
            openai_tool(tool)  # a schema the engine cannot take: an error naming tool and server, now
            tools.append(tool)
    return early_tools(tools, trust, overrides)
