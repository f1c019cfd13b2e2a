"""Which MCP tools may start early: the server's annotations, only where the user trusts the server.

An MCP server may declare, per tool, `annotations` (ToolAnnotations): `readOnlyHint`, `destructiveHint`,
`idempotentHint`, `openWorldHint`. A tool is declared read-only when `readOnlyHint` is true and
`destructiveHint` is not true (the spec's defaults: readOnly false, destructive true, so a tool that
says nothing is a write). `idempotentHint` changes nothing here: it only qualifies a tool that is not
read-only, which never starts early (repeating a write is still a write). `openWorldHint` changes
nothing either: a read-only open-world tool (a web search) is started early like any other, and its
wasted runs are real requests to the outside world; leave such a tool out with `overrides`.

Annotations are the server's claim, not a guarantee: they decide only for the servers the user names
in `trust` (none by default). A tool without annotations, with annotations that are not a mapping of
those hints, or from a server not trusted, never starts early from its annotations. `overrides`,
the explicit per-tool list, decides before the annotations: `{name: True}` starts that tool early
(the user vouches for it, as `speculative=[...]` always did), `{name: False}` never.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..errors import ToolSchemaError
from ..speculative import NothingSpeculativeWarning
from ..tools import normalize_tools

__all__ = ["ServerTool", "annotations_of", "declares_read_only", "early_tools", "listed", "openai_tool"]

HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


@dataclass(frozen=True)
class ServerTool:
    """One tool as an MCP server lists it (`tools/list`): the server's name for itself, the tool's
    name, its annotations (None: none, or malformed) and its input schema."""
    server: str
    name: str
    annotations: Mapping[str, Any] | None
    input_schema: Mapping[str, Any] | None = None
    description: str = ""

    @property
    def read_only(self) -> bool:
        return declares_read_only(self.annotations)


def annotations_of(tool: Any) -> dict[str, Any] | None:
    """The annotations of a listed tool (an `mcp.types.Tool`, its dict, or the annotations themselves:
    a `ToolAnnotations` or a dict), as a dict of the four hints; None where there are none or they are
    malformed (a hint that is present and not a bool, or annotations that are no mapping)."""
    if isinstance(tool, Mapping):
        raw = tool.get("annotations") if "name" in tool or "inputSchema" in tool else tool
    else:
        raw = getattr(tool, "annotations", tool)
    if hasattr(raw, "model_dump"):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        return None
    hints = {h: raw.get(h) for h in HINTS}
    if all(v is None for v in hints.values()):
        return None
    if any(v is not None and not isinstance(v, bool) for v in hints.values()):
        return None  # "readOnlyHint": "yes" is no declaration we can read: the tool declares nothing
    return hints


def declares_read_only(annotations: Mapping[str, Any] | None) -> bool:
    """`readOnlyHint` is true (the bool) and `destructiveHint` is not true."""
    if not isinstance(annotations, Mapping):
        return False
    return annotations.get("readOnlyHint") is True and annotations.get("destructiveHint") is not True


def listed(server: str, tools: Iterable[Any]) -> list[ServerTool]:
    """`ServerTool`s of what `server` listed: `mcp.types.Tool`s (a `list_tools()` result's `.tools`)
    or their dicts."""
    if not isinstance(server, str) or not server:
        raise ValueError(f"an MCP server's name must be a non-empty string, got {server!r}")
    out = []
    for tool in tools:
        get = tool.get if isinstance(tool, Mapping) else lambda k, t=tool: getattr(t, k, None)
        name = get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"MCP server {server!r} listed a tool without a name: {tool!r}")
        out.append(ServerTool(server, name, annotations_of(tool), get("inputSchema"), get("description") or ""))
    return out


def early_tools(tools: Iterable[ServerTool], trust: Iterable[str] = (),
                overrides: Mapping[str, bool] | None = None) -> list[str]:
    """The names of the tools that may start early, in listed order: `overrides` first, then the tools
    a trusted server declares read-only. A name two servers list is early from annotations only when
    every server listing it is trusted and declares it read-only (an agent's call names a tool, not
    its server). `trust` names servers; `overrides` maps tool names to True/False. When no tool
    qualifies, a `NothingSpeculativeWarning` says why (the agent then runs as without speculation)."""
    if isinstance(trust, str):
        raise TypeError(f"trust must be a list of server names, got the string {trust!r}: write [{trust!r}]")
    tools, trusted = list(tools), set(trust)
    overrides = dict(overrides or {})
    for name, early in overrides.items():
        if not isinstance(early, bool):
            raise ValueError(f"overrides[{name!r}] must be True (start early) or False (never), got {early!r}")
    servers = {t.server for t in tools}
    unknown = sorted(trusted - servers)
    if unknown:
        raise ValueError(f"trust names {unknown}, which listed no tool here (servers: {sorted(servers)})")
    by_name: dict[str, list[ServerTool]] = {}
    for t in tools:
        by_name.setdefault(t.name, []).append(t)
    early = [name for name, same in by_name.items()
             if overrides.get(name, all(t.server in trusted and t.read_only for t in same))]
    early += [name for name, on in overrides.items() if on and name not in by_name]
    if not early:
        warnings.warn(f"no MCP tool may start early: {_why_none(tools, trusted, overrides)}; the agent runs every "
                      "tool when it runs the call, as without speculation", NothingSpeculativeWarning, stacklevel=3)
    return early


def _why_none(tools: list[ServerTool], trusted: set[str], overrides: Mapping[str, bool]) -> str:
    """Why `early_tools` found no tool that may start early, in words."""
    if not tools:
        return "the servers listed no tool"
    servers = sorted({t.server for t in tools})
    if not trusted:
        return (f"trust names no server (the default trust=()), and a server's annotations count only for the "
                f"servers named in trust (here: {servers})")
    ours = [t for t in tools if t.server in trusted]
    kinds = {"set False in overrides": [t.name for t in ours if overrides.get(t.name) is False]}
    ours = [t for t in ours if t.name not in overrides]
    kinds["no annotations (or malformed ones)"] = [t.name for t in ours if t.annotations is None]
    kinds["annotations not readOnlyHint true with destructiveHint not true"] = [
        t.name for t in ours if t.annotations is not None and not t.read_only]
    kinds["read-only, but an untrusted server lists the same name"] = [t.name for t in ours if t.read_only]
    parts = [f"{kind} {names}" for kind, names in kinds.items() if names]
    untrusted = sorted(set(servers) - trusted)
    return (f"of the tools of the trusted servers {sorted(trusted)}: " + "; ".join(parts)
            + (f" (servers not trusted: {untrusted})" if untrusted else ""))


def openai_tool(tool: ServerTool) -> dict:
    """The OpenAI function tool of a listed MCP tool, checked by the engine's tool normaliser; a schema
    it cannot take is a ToolSchemaError naming the tool and the server."""
    spec = {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": dict(tool.input_schema or {"type": "object",
                                                                                      "properties": {}})}}
    try:
        return normalize_tools([spec])[0].to_openai()
    except ToolSchemaError as e:
        raise ToolSchemaError(f"MCP server {tool.server!r}, tool {tool.name!r}: its input schema cannot be "
                              f"used: {e}") from None
