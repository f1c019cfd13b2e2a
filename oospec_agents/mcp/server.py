"""A real MCP server (the MCP SDK's FastMCP) of declared tools, for the MCP tests and `oospec bench --agent --mcp`.

    python oospec_agents/mcp/server.py SPEC.json [--http]

SPEC.json: {"name": server name, "log": a file every received call is appended to (JSON lines),
"tools": [{"name", "description", "inputSchema": JSON Schema, "annotations": MCP ToolAnnotations (or
null: none declared), "latency": seconds, "result": text (default: a JSON echo of the call),
"error": true (the call answers with an MCP tool error), "exit": true (the server process dies
mid-call)}], "page_size": n (optional: `tools/list` answers n tools a page, with a cursor to the next)}.
The tools are listed exactly as declared (FastMCP's `list_tools` / `call_tool` overridden: a schema
is the one given, not one derived from a Python signature).

A call whose request `_meta` carries `{"oospec": {"latency": s, "result": text, ...}}` sleeps that
latency and returns that result instead (the agent bench draws them per episode, so every method gets
the same); the whole `oospec` object is logged with the call (the bench marks its early calls there).
The log line of a call is written when the call arrives, and a second line when it is cancelled
(`notifications/cancelled`) before it ends; each line has the time it was written (`t`, epoch seconds).

stdio by default; `--http` serves streamable HTTP on 127.0.0.1 on an ephemeral port and prints
`PORT <n>` (then `http://127.0.0.1:<n>/mcp` is the endpoint). Run by path, not `-m`: it imports only
the SDK, not oospec_agents (and its torch), so a client that starts one process per call (the
LangChain and LlamaIndex adapters over stdio) does not pay for the engine's imports each time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import ListToolsRequest, ListToolsResult, TextContent, Tool, ToolAnnotations


class DeclaredServer(FastMCP):
    """FastMCP serving the tools of a spec as declared: their schemas and annotations verbatim."""

    def __init__(self, spec: dict):
        super().__init__(spec.get("name", "oospec-test"), log_level="CRITICAL")
        self.spec_tools = {t["name"]: t for t in spec["tools"]}
        self.log_path = spec.get("log")
        self.page_size = spec.get("page_size")
        if self.page_size:
            self._mcp_server.list_tools()(self.list_page)  # tools/list answered a page at a time

    async def list_page(self, request: ListToolsRequest) -> ListToolsResult:
        """One page of `tools/list`: `page_size` tools from the cursor (the index of the page's first tool).
        The SDK's own lookups call it with no request: the first page."""
        tools = await self.list_tools()
        start = int(request.params.cursor or 0) if request is not None and request.params else 0
        end = start + self.page_size
        return ListToolsResult(tools=tools[start:end], nextCursor=str(end) if end < len(tools) else None)

    async def list_tools(self) -> list[Tool]:
        return [Tool(name=t["name"], description=t.get("description", ""),
                     inputSchema=t.get("inputSchema") or {"type": "object", "properties": {}},
                     annotations=None if t.get("annotations") is None else ToolAnnotations(**t["annotations"]))
                for t in self.spec_tools.values()]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> list[TextContent]:
        tool = self.spec_tools.get(name)
        if tool is None:
            raise ToolError(f"unknown tool {name!r}")
        request = self.get_context().request_context
        meta = (getattr(request.meta, "model_extra", None) or {}).get("oospec") or {} if request.meta else {}
        entry = {"tool": name, "arguments": arguments, "request_id": request.request_id, "oospec": meta,
                 "t": time.time()}
        self._log(entry)
        if tool.get("exit"):
            os._exit(3)  # the server dies mid-call: the client sees its connection end
        try:
            await asyncio.sleep(float(meta.get("latency", tool.get("latency", 0.0))))
        except asyncio.CancelledError:
            self._log(entry | {"cancelled": True, "t": time.time()})
            raise
        if tool.get("error"):
            raise ToolError(f"{name} failed: the server answers this tool with an error")
        result = meta.get("result", tool.get("result"))
        if result is None:
            result = json.dumps({"tool": name, "arguments": arguments}, sort_keys=True, ensure_ascii=False)
        return [TextContent(type="text", text=result)]

    def _log(self, entry: dict) -> None:
        if self.log_path:
            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")


async def serve_http(server: DeclaredServer) -> None:
    """Streamable HTTP on 127.0.0.1, on a port the OS picks, announced on stdout."""
    import uvicorn
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn serves: the port works once announced
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    await uvicorn.Server(config).serve(sockets=[sock])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="the server's JSON spec (see this module's docstring)")
    p.add_argument("--http", action="store_true", help="streamable HTTP on 127.0.0.1:<ephemeral> instead of stdio")
    args = p.parse_args(argv)
    with open(args.spec, encoding="utf-8") as f:
        server = DeclaredServer(json.load(f))
    if args.http:
        asyncio.run(serve_http(server))
    else:
        server.run("stdio")


if __name__ == "__main__":
    sys.exit(main())
