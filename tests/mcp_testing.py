"""The MCP tests' servers: specs for oospec_agents/mcp/server.py (a FastMCP server of declared tools),
written to a temporary folder, each with its own call log.

"travel" (the one a test trusts): read-only lookups with a latency, an idempotent conversion, a
destructive booking, a read-only lookup the server answers with an error, and one that kills the
server mid-call. "mail": read-only by its own annotations, from a server no test trusts. "notes":
tools with no annotations and with malformed ones.
"""
from __future__ import annotations

import json
from pathlib import Path

READ_ONLY = {"readOnlyHint": True, "openWorldHint": False}
DESTRUCTIVE = {"readOnlyHint": False, "destructiveHint": True}
IDEMPOTENT = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": True}


def _schema(**properties: str) -> dict:
    return {"type": "object", "properties": {k: {"type": t} for k, t in properties.items()},
            "required": list(properties)}


def travel_tools(latency: float = 0.2) -> list[dict]:
    return [
        {"name": "get_current_weather", "description": "Get the current weather in a given city.",
         "inputSchema": _schema(location="string"), "annotations": READ_ONLY, "latency": latency,
         "result": "It is 22 degrees Celsius and sunny."},
        {"name": "get_local_time", "description": "Get the local time in a given city.",
         "inputSchema": _schema(location="string"), "annotations": READ_ONLY | {"idempotentHint": True},
         "latency": latency},
        {"name": "convert_currency", "description": "Convert an amount of money to another currency.",
         "inputSchema": _schema(amount="number", currency="string"), "annotations": IDEMPOTENT, "latency": latency},
        {"name": "book_table", "description": "Book a table at a restaurant.",
         "inputSchema": _schema(restaurant="string", people="integer"), "annotations": DESTRUCTIVE,
         "latency": latency},
        {"name": "flaky_lookup", "description": "Look a city up in a gazetteer that is down.",
         "inputSchema": _schema(location="string"), "annotations": READ_ONLY, "latency": latency, "error": True},
        {"name": "crash_lookup", "description": "Look a city up on a server that dies.",
         "inputSchema": _schema(location="string"), "annotations": READ_ONLY, "exit": True},
    ]


def mail_tools(latency: float = 0.1) -> list[dict]:
    return [{"name": "search_mail", "description": "Search the user's mailbox.", "inputSchema": _schema(query="string"),
             "annotations": READ_ONLY, "latency": latency}]


def notes_tools(latency: float = 0.05) -> list[dict]:
    return [{"name": "read_note", "description": "Read a note.", "inputSchema": _schema(title="string"),
             "annotations": None, "latency": latency},
            {"name": "list_notes", "description": "List the notes.", "inputSchema": _schema(),
             "annotations": {"readOnlyHint": "yes"}, "latency": latency}]


SERVERS = {"travel": travel_tools, "mail": mail_tools, "notes": notes_tools}


def write_spec(folder: Path, name: str, tools: list[dict] | None = None,
               page_size: int | None = None) -> tuple[Path, Path]:
    """(the spec file, its call log) of server `name` (one of SERVERS, or any name with `tools`); with
    `page_size`, its `tools/list` answers that many tools a page."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{name}.calls.jsonl"
    spec = folder / f"{name}.json"
    spec.write_text(json.dumps({"name": name, "log": str(log), "page_size": page_size,
                                "tools": tools if tools is not None else SERVERS[name]()}))
    return spec, log


def calls(log: Path, tool: str | None = None) -> list[dict]:
    """The calls a server received (not its cancellation lines), of `tool` or all, in order."""
    if not log.exists():
        return []
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [r for r in rows if not r.get("cancelled") and (tool is None or r["tool"] == tool)]


def cancelled(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("cancelled")]


def transcript(messages) -> list[dict]:
    """A LangChain agent's messages but for what differs between two runs of one conversation: message ids, call ids
    (numbered in order of appearance), the adapter's content-block ids (a fresh uuid per conversion),
    timings and usage."""
    ids: dict[str, str] = {}
    rows = []
    for message in messages:
        row = message.model_dump(exclude={"id", "response_metadata", "usage_metadata"})
        for call in row.get("tool_calls") or []:
            call["id"] = ids.setdefault(call["id"], f"call_{len(ids)}")
        if "tool_call_id" in row:
            row["tool_call_id"] = ids.get(row["tool_call_id"], row["tool_call_id"])
        if isinstance(row["content"], list):
            row["content"] = [{k: v for k, v in block.items() if k != "id"} if isinstance(block, dict) else block
                              for block in row["content"]]
        rows.append(row)
    return rows


def travel_and_mail(folder: Path, latency: float = 0.3) -> tuple[Path, Path, Path, Path]:
    """The end-to-end tests' two servers' specs: travel (its weather lookup and its booking) and mail:
    (travel spec, travel log, mail spec, mail log)."""
    tools = [t for t in travel_tools(latency=latency) if t["name"] in ("get_current_weather", "book_table")]
    travel, travel_log = write_spec(folder, "travel", tools)
    mail, mail_log = write_spec(folder, "mail", mail_tools())
    return travel, travel_log, mail, mail_log


def embedded_float32():
    """The embedded pair in float32 (a module fixture's body: `pytest.fixture(scope="module")(...)`)."""
    import torch

    from oospec_agents import Engine
    engine = Engine.from_pretrained("embedded", dtype=torch.float32)
    yield engine
    engine.close()
