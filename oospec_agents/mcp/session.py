"""A client session to one MCP server that sync code and any event loop can call, and the test/bench server's process.

`McpSession` holds one MCP SDK `ClientSession` (stdio: it starts the server command; or streamable
HTTP: a URL) open on its own event-loop thread, as the speculative runner holds its own loop: `call`
from plain code, `acall` from any event loop. A cancelled `acall` (a wasted speculative run the runner
cancels) ends the request on the client and sends MCP's `notifications/cancelled` for it, so the
server stops the tool where it can (the SDK's server cancels the handler).

`HttpServer` runs server.py (a FastMCP server of declared tools) over streamable HTTP on 127.0.0.1,
on an ephemeral port, and stops it; `server_command` is the same server's stdio command.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["HttpServer", "McpSession", "every_tool", "server_command", "text_of", "SERVER_SCRIPT"]

#: the declared-tools server (FastMCP); run by path, it imports the MCP SDK only
SERVER_SCRIPT = Path(__file__).with_name("server.py")


def server_command(spec_path: str | os.PathLike) -> tuple[str, list[str]]:
    """(command, args) that serve `spec_path`'s tools over stdio."""
    return sys.executable, [str(SERVER_SCRIPT), str(spec_path)]


async def every_tool(session: Any) -> list:
    """Every tool an open `ClientSession` lists, all pages of `tools/list`."""
    tools, cursor = [], None
    while True:
        page = await session.list_tools(cursor=cursor) if cursor else await session.list_tools()
        tools += page.tools
        cursor = page.nextCursor
        if not cursor:
            return tools


def text_of(result: Any) -> str:
    """A `CallToolResult`'s text: its text blocks joined (what an agent's tool message holds)."""
    return "\n".join(getattr(block, "text", "") for block in result.content if getattr(block, "type", "") == "text")


class HttpServer:
    """server.py serving `spec_path` over streamable HTTP on 127.0.0.1, on a port the OS picks.
    `.url` is the endpoint; `stop()` (or leaving the `with`) ends the process."""

    def __init__(self, spec_path: str | os.PathLike, timeout: float = 120.0):
        command, args = server_command(spec_path)
        self.process = subprocess.Popen([command, *args, "--http"], stdout=subprocess.PIPE, text=True)
        line = _read_line(self.process, timeout)
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"the MCP test server ({SERVER_SCRIPT}) did not announce its port, it wrote {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()

    def __enter__(self) -> HttpServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _read_line(process: subprocess.Popen, timeout: float) -> str:
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return out[0].strip() if out else ""


class McpSession:
    """One open MCP client session, on its own event-loop thread. Give `command` (+ `args`, `env`) for
    stdio, or `url` for streamable HTTP; `name` is the server's name in errors and trust lists."""

    def __init__(self, name: str, *, command: str | None = None, args: list[str] | None = None,
                 env: dict[str, str] | None = None, url: str | None = None, timeout: float = 120.0):
        if (command is None) == (url is None):
            raise ValueError(f"MCP server {name!r}: give either command (stdio) or url (streamable HTTP)")
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"oospec-mcp-{name}")
        self._thread.start()
        self._opened: concurrent.futures.Future = concurrent.futures.Future()
        self._stop: asyncio.Event | None = None
        self._held = asyncio.run_coroutine_threadsafe(self._hold(command, args or [], env, url), self._loop)
        try:
            self.session = self._opened.result(timeout)
        except BaseException:
            self.close()
            raise

    async def _hold(self, command, args, env, url) -> None:
        """Open the transport and the session, and keep them open in this one task until `close`
        (anyio's task groups inside them must be left by the task that entered them)."""
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client

        self._stop = asyncio.Event()
        try:
            if url is not None:
                transport = streamable_http_client(url)
            else:
                transport = stdio_client(StdioServerParameters(command=command, args=args,
                                                               env={**os.environ, **(env or {})}))
            async with transport as streams:
                async with _cancelling_session(ClientSession)(streams[0], streams[1]) as session:
                    await session.initialize()
                    self._opened.set_result(session)
                    await self._stop.wait()
        except BaseException as e:
            if not self._opened.done():
                self._opened.set_exception(RuntimeError(f"MCP server {self.name!r}: the session did not open: {e!r}"))
            elif not isinstance(e, (Exception, asyncio.CancelledError)):
                raise

    def list_tools(self) -> list:
        """Every tool the server lists (all pages), as `mcp.types.Tool`s."""
        return self._wait(every_tool(self.session))

    def call(self, name: str, arguments: dict, meta: dict | None = None):
        """`tools/call` from plain code: the `CallToolResult` (an `isError` one included)."""
        return self._wait(self.session.call_tool(name, arguments, meta=meta))

    async def acall(self, name: str, arguments: dict, meta: dict | None = None):
        """`tools/call` from any event loop; cancelling it cancels the request (and tells the server)."""
        future = asyncio.run_coroutine_threadsafe(self.session.call_tool(name, arguments, meta=meta), self._loop)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """End the session (a stdio server's process with it) and the loop thread. Idempotent."""
        if self._loop.is_closed():
            return
        if not self._opened.done():
            self._held.cancel()  # still opening: give up on it
        elif self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._held.result(30)
        except BaseException:  # a server that died, a session that never opened: nothing to close cleanly
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def __enter__(self) -> McpSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wait(self, coroutine, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)


def _cancelling_session(base: type) -> type:
    """`base` (the SDK's ClientSession), whose requests, when cancelled, send `notifications/cancelled`."""
    import anyio
    from mcp.types import CancelledNotification, CancelledNotificationParams, ClientNotification

    class CancellingSession(base):
        async def send_request(self, request, result_type, *args, **kwargs):
            request_id = self._request_id  # the id the base class gives this request
            try:
                return await super().send_request(request, result_type, *args, **kwargs)
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    params = CancelledNotificationParams(requestId=request_id, reason="speculative run discarded")
                    try:
                        await self.send_notification(ClientNotification(CancelledNotification(params=params)))
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        pass  # the session is gone: so is the request
                raise
    return CancellingSession
