# %% [markdown]
# # A LangChain agent on MCP tools, read-only ones started early
#
# An MCP server (Model Context Protocol) offers a read-only tool, a weather lookup, and a write, a table
# booking, and says which is which in each tool's `annotations`. A `create_agent` agent on `ChatOoOSpec`
# gets both through `langchain-mcp-adapters`; `SpeculativeToolsMiddleware` starts the tools that a
# server **you trust** declares read-only from the sidecar's predicted call, while the target is still
# writing it. The booking never starts early. Guide: docs/mcp.md. Needs `pip install "oospec-agents[mcp]"`.

# %% [markdown]
# The server, written with the MCP SDK's FastMCP. It runs as its own process, serving streamable HTTP
# on 127.0.0.1 (stdio works as well: `{"transport": "stdio", "command": ..., "args": [...]}`, outside
# Jupyter, whose stderr the stdio client cannot hand to a process). Every booking it receives is
# appended to a file, so we can see that none came early.

# %%
import asyncio
import atexit
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

with socket.socket() as s:  # a free port for the server
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
folder = Path(tempfile.mkdtemp(prefix="mcp-agent-"))
bookings = folder / "bookings.txt"
server = folder / "travel_server.py"
server.write_text(f'''
import time
from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

mcp = FastMCP("travel", host="127.0.0.1", port={port}, log_level="WARNING")


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=True, openWorldHint=False))
def get_current_weather(location: str) -> str:
    """Get the current weather in a given city."""
    time.sleep(0.5)  # a slow lookup: the time speculation can hide
    return f"It is 22 degrees Celsius and sunny in {{location}}."


@mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def book_table(restaurant: str, people: int) -> str:
    """Book a table at a restaurant."""
    with open({str(bookings)!r}, "a") as f:
        f.write(f"{{restaurant}} for {{people}}\\n")
    return f"Booked {{restaurant}} for {{people}}."


if __name__ == "__main__":
    mcp.run("streamable-http")
''')
process = subprocess.Popen([sys.executable, str(server)])
atexit.register(process.terminate)  # stopped however this ends
url = f"http://127.0.0.1:{port}/mcp"
for _ in range(600):  # until it accepts connections
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)

# %% [markdown]
# The client, and the tools that may start early: `read_only_tools` lists each server's tools and keeps
# the ones a server named in `trust` declares read-only (`readOnlyHint` true, `destructiveHint` not true).
# An untrusted server's claims count for nothing, and so do missing annotations.

# %%
from langchain_mcp_adapters.client import MultiServerMCPClient

from langchain_oospec.mcp import read_only_tools

client = MultiServerMCPClient({"travel": {"transport": "streamable_http", "url": url}})
tools = asyncio.run(client.get_tools())
early = asyncio.run(read_only_tools(client, trust=["travel"]))
print("tools:", [t.name for t in tools])
print("may start early:", early)
untrusted = asyncio.run(read_only_tools(client, trust=[]))
print("trusting no server:", untrusted)

# %% [markdown]
# The agent: `ChatOoOSpec` on the embedded model, the middleware with the read-only tools and their
# expected seconds (the engine's pay-back rule weighs them). MCP tools are async: `ainvoke`.

# %%
from langchain.agents import create_agent

from langchain_oospec import ChatOoOSpec, SpeculativeToolsMiddleware

model = ChatOoOSpec(model="embedded", max_tokens=48)
question = {"messages": [{"role": "user", "content": "What is the current weather in Paris?"}]}
with SpeculativeToolsMiddleware(speculative=early, tool_seconds=dict.fromkeys(early, 0.5)) as speculative:
    agent = create_agent(model, tools=tools, middleware=[speculative])
    result = asyncio.run(agent.ainvoke(question, {"recursion_limit": 6}))
for message in result["messages"]:
    message.pretty_print()

# %% [markdown]
# `hits`: verified calls handed the result of a run the prediction started (`ready_hits`: a run started
# by the verified call as soon as its JSON closed, before the reply ended). `wasted`: runs of a call the
# target did not write: real `tools/call` requests, discarded and cancelled. No booking was made early.

# %%
print(speculative.stats)
print("bookings:", bookings.read_text() if bookings.exists() else "none")
process.terminate()
process.wait()
