"""Join a wave's row outputs into one call, and the compact payload that carries it to the target.

    payload = {"f": "get_weather", "a": {"city": "Paris"}}   compact JSON, its size is `hint_bytes`

The target side reads the payload back and renders it in the target's own tool-call format.
"""
from __future__ import annotations

import json

from ..formats import ToolFormat
from ..tools import Tool
from .rows import Row, parse_value


class JoinError(ValueError):
    """The wave's output does not make a usable call (garbage, no call, or an unknown function)."""


class NoCall(JoinError):
    """The function row answered `null`: the sidecar predicts a text reply. Under tool_choice="auto"
    that is a prediction, not a fault; there is simply no hint."""


def join(rows: list[Row], texts: list[str], tools: list[Tool], tool_choice: tuple[str, str | None]) -> dict:
    """{"name", "arguments"}: the predicted function and its slots that are not null."""
    if not isinstance(texts, list) or len(texts) != len(rows) or not all(isinstance(t, str) for t in texts):
        raise JoinError(f"the wave returned {str(texts)[:80]!r} for {len(rows)} rows; expected one str per row")
    mode, named = tool_choice
    by_kind = {(r.tool, r.param): parse_value(t) for r, t in zip(rows, texts)}
    name = named if mode == "named" else by_kind.get((None, None))
    offered = {t.name: t for t in tools}
    if name is None:
        if mode == "auto" and texts[0].strip() == "null":
            raise NoCall("the sidecar predicts a text reply")
        raise JoinError("the sidecar predicted no call")
    if name not in offered:
        raise JoinError(f"the sidecar predicted unknown function {name!r}; offered tools: {sorted(offered)}")
    args = {p: v for p in offered[name].properties if (v := by_kind.get((name, p))) is not None}
    return {"name": name, "arguments": args}


def encode_payload(call: dict) -> bytes:
    return json.dumps({"f": call["name"], "a": call["arguments"]}, ensure_ascii=False,
                      separators=(",", ":")).encode()


def render_payload(payload: bytes, fmt: ToolFormat) -> str:
    """The payload's call as text in the target's tool-call format."""
    obj = json.loads(payload)
    return fmt.render_call(obj["f"], obj["a"])
