"""MCP (Model Context Protocol) tools: which start early, and the sessions and test server that serve them.

    trust.py     annotations -> declared read-only; a tool starts early only from a trusted server
                 (or by the user's explicit per-tool overrides)
    session.py   `McpSession`: one MCP client session callable from sync code and any event loop
                 (cancellation sends `notifications/cancelled`); `HttpServer`: the test server over HTTP
    server.py    a FastMCP server of declared tools (latency, log, errors), run by path

The framework glue (LangChain's `MultiServerMCPClient`, LlamaIndex's `BasicMCPClient`) lives in the
integrations; this package imports the MCP SDK only inside session.py's functions (the `mcp` extra).
"""
from .trust import ServerTool, annotations_of, declares_read_only, early_tools, listed, openai_tool

__all__ = ["ServerTool", "annotations_of", "declares_read_only", "early_tools", "listed", "openai_tool"]
