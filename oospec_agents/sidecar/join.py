"""Join a wave's row outputs into one call, and the compact payload that carries it to the target.

    payload = {"f": "get_weather", "a": {"city": "Paris"}}   compact JSON, its size is `hint_bytes`

The target side reads the payload back and renders it in the target's own tool-call format.
"""
from __future__ import annotations

import json

from ..drafters.base import HintText
from ..formats import ToolFormat
from ..tools import Tool
from .rows import Row, forced_value, parse_value


class JoinError(ValueError):
    """The wave's output does not make a usable call (garbage, no call, or an unknown function)."""


class NoCall(JoinError):
    """The function row answered `null`: the sidecar predicts a text reply. Under tool_choice="auto"
    that is a prediction, not a fault; there is simply no hint."""


#: the function row's runner-up is offered (a further branch of the target's tree) where the choice it
#: made beat it by less than this many nats at the token where they part
RUNNER_UP_MARGIN = 2.0
#: the most runner-up calls one hint carries (each a short branch of the target's tree)
MAX_ALTERNATIVES = 3


def join(rows: list[Row], texts: list[str], tools: list[Tool], tool_choice: tuple[str, str | None],
         runner_ups: dict[int, tuple[str, float]] | None = None) -> dict:
    """{"name", "arguments"}: the predicted function and its slots that are not null; with the wave's
    `runner_ups` (`WaveResult.runner_ups`), also "alternatives": the call of the function row's runner-up
    where the row was unsure of its choice (its name; its forced arguments, as the wave decoded no slot
    of it to the end)."""
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
    forced = forced_arguments(offered[name])
    args = {p: v for p in offered[name].properties if (v := forced.get(p, by_kind.get((name, p)))) is not None}
    call = {"name": name, "arguments": args}
    if runner_ups:
        alternatives = runner_up_calls(rows, runner_ups, offered, call)
        if alternatives:
            call["alternatives"] = alternatives
    return call


def runner_up_calls(rows: list[Row], runner_ups: dict[int, tuple[str, float]], offered: dict[str, Tool],
                    call: dict) -> list[dict]:
    """The calls the wave nearly made, where a row's choice beat its runner-up by less than
    RUNNER_UP_MARGIN: the function row's runner-up (its name and forced arguments: the wave decoded
    none of its slots to the end), then the call without each slot whose row nearly answered null
    (the target leaves out an optional slot), at most MAX_ALTERNATIVES."""
    out = []
    for i, r in enumerate(rows):
        text, margin = runner_ups.get(i, (None, None))
        if margin is None or margin >= RUNNER_UP_MARGIN:
            continue
        if r.kind == "function" and isinstance(other := parse_value(text), str) and other in offered \
                and other != call["name"]:
            out.insert(0, {"name": other, "arguments": forced_arguments(offered[other])})
        elif r.kind == "slot" and r.tool == call["name"] and r.param in call["arguments"] and not r.required \
                and text.strip()[:1] == "n":
            out.append({"name": call["name"], "arguments": {p: v for p, v in call["arguments"].items() if p != r.param}})
    return out[:MAX_ALTERNATIVES]


def forced_arguments(tool: Tool) -> dict:
    """The arguments whose whole value the tool's schema forces (a const, an enum of one value), which
    the wave builds no row for (rows.forced_value): the call carries each of them."""
    return {p: forced[0] for p, spec in tool.properties.items() if (forced := forced_value(spec)) is not None and
            forced[0] is not None}


def encode_payload(call: dict) -> bytes:
    """The call's compact payload; its runner-up calls (`call["alternatives"]`, where the wave was unsure)
    ride along as "alt"."""
    obj = {"f": call["name"], "a": call["arguments"]}
    if call.get("alternatives"):
        obj["alt"] = [{"f": c["name"], "a": c["arguments"]} for c in call["alternatives"]]
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def render_payload(payload: bytes, fmt: ToolFormat) -> HintText:
    """The payload's call as text in the target's tool-call format (its runner-ups rendered alike)."""
    obj = json.loads(payload)
    return HintText(fmt.render_call(obj["f"], obj["a"]),
                    alternatives=[fmt.render_call(c["f"], c["a"]) for c in obj.get("alt") or ()])
