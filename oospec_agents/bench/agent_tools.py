"""The agent benchmark's simulated tools: what each call returns, and how long it takes.

A call's result is the dataset's own where the data recorded one (a `tool` message answering the same
call, by name and canonical arguments, anywhere in the same conversation: ToolTalk's later records
carry the responses to the earlier calls, API-Bank's and ACEBench's histories theirs), else a
deterministic canned answer: a JSON echo of the name and arguments. So every method gets the same tool
message for the same call, and the transcripts can be compared.

A call's latency comes from `--tool-latency`: a fixed number of seconds, or `lognormal:MEDIAN` (a
log-normal with that median, sigma 0.5 unless `lognormal:MEDIAN:SIGMA`) drawn from a generator seeded
by the record, the step and the call, so every method sees the same latencies and a speculative run
of the right call sleeps as long as the verified call would.

With `--mcp`, `McpTools` serves the same tools from a real MCP server process (oospec_agents/mcp/
server.py, FastMCP; stdio or streamable HTTP on 127.0.0.1), so every call is a `tools/call` and the
figures include the MCP round trip. The bench draws each call's latency and result as above and sends
them in the request's `_meta`; the server sleeps that latency and answers that result, so every method
still gets the same. The server annotates each tool by one stated rule (`annotations_for`): a name
whose first word is a write verb (`WRITE_VERBS`: create, update, delete, send, book, ...) is
destructive, any other read-only; the bench trusts that server, so the read-only ones, and only they,
are started early.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable

from ..speculative import call_key

#: a log-normal latency's sigma (of the log) unless `lognormal:MEDIAN:SIGMA` says another
LOGNORMAL_SIGMA = 0.5


@dataclass(frozen=True)
class Latency:
    """A tool's simulated latency: `median` seconds, fixed (`sigma` 0) or log-normal."""
    median: float
    sigma: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Latency":
        """`0.25`, `1`, `2`, or `lognormal:0.5` / `lognormal:0.5:0.8`; anything else is a ValueError naming it."""
        spec = str(text).strip()
        kind, _, rest = spec.partition(":")
        try:
            if kind == "lognormal":
                median, _, sigma = rest.partition(":")
                out = cls(float(median), float(sigma) if sigma else LOGNORMAL_SIGMA)
                if not (out.median > 0 and out.sigma > 0):
                    raise ValueError
                return out
            if rest:
                raise ValueError
            out = cls(float(kind))
        except ValueError:
            out = None
        if out is None or not math.isfinite(out.median) or out.median < 0 or not math.isfinite(out.sigma):
            raise ValueError(f"--tool-latency: expected seconds >= 0 (0.25, 1, 2) or 'lognormal:MEDIAN' "
                             f"(median seconds > 0, optionally ':SIGMA' > 0), got {text!r}")
        return out

    @property
    def expected(self) -> float:
        """The mean latency in seconds: what the engine's pay-back rule is told before any run is measured."""
        return self.median * math.exp(self.sigma ** 2 / 2)

    def draw(self, *seed) -> float:
        """The latency of one call, the same for the same `seed` (record, step, call) in every method."""
        if not self.sigma:
            return self.median
        digest = hashlib.sha256(json.dumps(seed, sort_keys=True, default=str).encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big")).lognormvariate(math.log(self.median), self.sigma)

    def __str__(self) -> str:
        return f"lognormal:{self.median:g}:{self.sigma:g}" if self.sigma else f"{self.median:g}"


def canned_result(name: str, arguments: dict) -> str:
    """The answer of a call the dataset recorded none for: a JSON echo of its name and arguments."""
    return json.dumps({"name": name, "arguments": arguments, "status": "success"}, sort_keys=True, ensure_ascii=False)


def conversation(rec: dict) -> tuple[str, str]:
    """The conversation a record belongs to: its `meta.conversation_id` (ToolTalk), else its own id."""
    meta = rec.get("meta") or {}
    return rec.get("source", ""), str(meta.get("conversation_id") or rec.get("id"))


def recorded_results(records: list[dict]) -> dict[tuple, dict[tuple[str, str], str]]:
    """{conversation: {call key: the tool message's content}} from every record's history: an assistant
    call, then the `tool` message with its id (or, where the data has no ids, the next one in order). A
    recorded call whose arguments are no JSON object is left out: no verified call can equal it."""
    out: dict[tuple, dict[tuple[str, str], str]] = {}
    for rec in records:
        known = out.setdefault(conversation(rec), {})
        waiting: list[tuple[str | None, tuple[str, str] | None]] = []  # (call id, key), in call order
        for m in rec.get("messages") or []:
            if m.get("role") == "assistant":
                waiting += [(c.get("id"), _recorded_key(c.get("function") or c)) for c in m.get("tool_calls") or []]
            elif m.get("role") == "tool" and waiting:
                i = next((i for i, (cid, _) in enumerate(waiting) if cid and cid == m.get("tool_call_id")), 0)
                _, k = waiting.pop(i)
                content = m.get("content")
                if k is not None and content is not None:
                    known.setdefault(k, content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
    return out


def _recorded_key(fn: dict) -> tuple[str, str] | None:
    try:
        return call_key(fn.get("name"), fn.get("arguments") or {})
    except ValueError:
        return None


class Simulator:
    """The simulated tools of one benchmark run. `call(name, arguments)` sleeps the call's latency and
    returns its result (a plain function, as the agent runs a tool after the reply); `acall` is the same
    as a coroutine, the form given to the speculative runner, which can cancel a wasted run of it (a
    running thread cannot be stopped, and would hold one of the runner's workers for its whole latency).

    `at(record, step)` says which record and step the calls belong to (the seed of their latencies,
    the conversation of their results). The agent sets it before each model request, so a speculative
    run started during the request draws the same latency as the verified call it may stand for."""

    def __init__(self, latency: Latency, results: dict | None = None):
        self.latency = latency
        self.results = results or {}
        self._where: tuple = ("", 0)
        self._conversation: tuple = ("", "")
        self._lock = threading.Lock()

    def at(self, rec: dict, step: int) -> None:
        with self._lock:
            self._where, self._conversation = (rec["id"], step), conversation(rec)

    def answer(self, name: str, arguments: dict) -> tuple[float, str]:
        """(the call's latency in seconds, its result) at the current record and step."""
        k = call_key(name, arguments)
        with self._lock:
            where, known = self._where, self.results.get(self._conversation, {})
        return self.latency.draw(*where, *k), known.get(k) or canned_result(name, arguments)

    def call(self, name: str, arguments: dict) -> str:
        seconds, out = self.answer(name, arguments)
        time.sleep(seconds)
        return out

    async def acall(self, name: str, arguments: dict) -> str:
        seconds, out = self.answer(name, arguments)
        await asyncio.sleep(seconds)
        return out

    def speculative(self, names) -> dict[str, Callable[[dict], Awaitable[str]]]:
        """{name: async tool} for `SpeculativeTools`: every simulated tool is read-only and idempotent."""
        def tool(name: str):
            async def run(arguments: dict) -> str:
                return await self.acall(name, arguments)
            return run
        return {name: tool(name) for name in names}


#: a tool whose name's first word is one of these writes: the MCP bench server declares it destructive
WRITE_VERBS = frozenset((
    "add", "apply", "approve", "archive", "assign", "book", "buy", "cancel", "change", "clear", "close", "create",
    "delete", "deposit", "disable", "edit", "enable", "execute", "forward", "insert", "install", "invite", "log",
    "login", "logout", "make", "mark", "modify", "move", "open", "order", "pay", "place", "play", "post", "publish",
    "purchase", "put", "register", "reject", "remove", "rename", "replace", "reply", "request", "reschedule",
    "reserve", "reset", "restart", "run", "save", "schedule", "send", "set", "share", "start", "stop", "submit",
    "transfer", "turn", "uninstall", "unsubscribe", "update", "upload", "withdraw", "write"))


def annotations_for(name: str) -> dict:
    """The MCP bench server's annotations of tool `name`: destructive when the first word of its last
    dotted part (`spotify.play` -> `play`; words split at `_`, `-`, spaces and lower-to-upper case
    changes) is in WRITE_VERBS, else read-only."""
    first = re.split(r"[_\-\s]+|(?<=[a-z0-9])(?=[A-Z])", name.strip().rsplit(".", 1)[-1])[0].lower()
    if first in WRITE_VERBS:
        return {"readOnlyHint": False, "destructiveHint": True}
    return {"readOnlyHint": True, "destructiveHint": False}


class McpTools:
    """The simulated tools of one benchmark run, served by a real MCP server process that this starts
    (`transport` "stdio" or "http") and `close` stops. `tools`: {name: OpenAI function dict}. Each call
    carries `{"oospec": {"latency", "result", "method", "early"}}` in its `_meta`; the server logs them,
    which `counts` reads back: the calls each method made, and how many of them started early."""

    SERVER = "bench"

    def __init__(self, sim: Simulator, tools: dict[str, dict], transport: str = "stdio"):
        from ..mcp import early_tools, listed
        from ..mcp.session import HttpServer, McpSession, server_command
        if transport not in ("stdio", "http"):
            raise ValueError(f"--mcp: expected stdio or http, got {transport!r}")
        self.sim, self.transport = sim, transport
        self.folder = Path(tempfile.mkdtemp(prefix="oospec-bench-mcp-"))
        self.log = self.folder / "calls.jsonl"
        spec = self.folder / "server.json"
        spec.write_text(json.dumps({"name": self.SERVER, "log": str(self.log), "tools": [
            {"name": name, "description": fn.get("description") or "", "annotations": annotations_for(name),
             "inputSchema": fn.get("parameters") or {"type": "object", "properties": {}}}
            for name, fn in tools.items()]}))
        self.server = HttpServer(spec) if transport == "http" else None
        command, args = server_command(spec)
        self.session = (McpSession(self.SERVER, url=self.server.url) if self.server
                        else McpSession(self.SERVER, command=command, args=args))
        #: what the server declares read-only, as the client reads it: the only tools started early
        self.read_only = early_tools(listed(self.SERVER, self.session.list_tools()), trust=[self.SERVER])
        self.received: list[dict] = []

    def call(self, name: str, arguments: dict, method: str) -> str:
        """The agent's execution of a verified call: a `tools/call`, its result's text."""
        from ..mcp.session import text_of
        return text_of(self.session.call(name, arguments, self._meta(name, arguments, method, early=False)))

    def speculative(self, method: str) -> dict[str, Callable[[dict], Awaitable[str]]]:
        """{name: async tool} of the read-only tools, for method `method`'s runner: each run a `tools/call`
        marked early; cancelling it cancels the request on the server."""
        from ..mcp.session import text_of

        def tool(name: str):
            async def run(arguments: dict) -> str:
                meta = self._meta(name, arguments, method, early=True)
                return text_of(await self.session.acall(name, arguments, meta))
            return run
        return {name: tool(name) for name in self.read_only}

    def _meta(self, name: str, arguments: dict, method: str, early: bool) -> dict:
        seconds, out = self.sim.answer(name, arguments)
        return {"oospec": {"latency": seconds, "result": out, "method": method, "early": early}}

    def counts(self, methods) -> dict[str, dict]:
        """Per method: `mcp_calls` (tools/call requests the server received), `early_calls` (of those, the
        runs the speculative runner started) and `unsafe_early` (early calls of a tool the server did not
        declare read-only: must be 0)."""
        out = {m: {"mcp_calls": 0, "early_calls": 0, "unsafe_early": 0} for m in methods}
        for row in self.received:
            meta = row.get("oospec") or {}
            if row.get("cancelled") or meta.get("method") not in out:
                continue
            count = out[meta["method"]]
            count["mcp_calls"] += 1
            if meta.get("early"):
                count["early_calls"] += 1
                count["unsafe_early"] += row["tool"] not in self.read_only
        return out

    def close(self) -> None:
        """End the session and the server; keep what the server logged (`received`)."""
        self.session.close()
        if self.server is not None:
            self.server.stop()
        if self.log.exists():
            self.received = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        shutil.rmtree(self.folder, ignore_errors=True)
