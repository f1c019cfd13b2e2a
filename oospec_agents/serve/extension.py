"""The `oospec` request extension: opt-in fields of our own on `/v1/chat/completions` and
`/v1/responses`, off by default, so a request without them is answered byte for byte as a plain OpenAI one.

    "oospec": {"predicted_calls": true, "speculative_tools": {"get_weather": 0.8, "search": null}}

- `predicted_calls` (a boolean): send the sidecar's predicted call(s) (the engine's `CallPredicted`)
  to the client as they are read, so a client can start a read-only tool before the verified call
  arrives. A prediction is never a verified call: it goes out as an object of ours, never as a
  `tool_calls` delta or a `function_call` item, and the target may write another call. On chat
  completions each prediction is a chunk whose `choices` is `[]` (stock clients, which read
  `choices`, see nothing); on the Responses API it is an event of type `oospec.predicted_calls`.
  Every `oospec` object that closes a reply (the stream's last chunk, the body, `response.completed`)
  lists them under `predictions`, so a non-streamed request gets them too.
- `speculative_tools` (an object: tool name -> expected seconds >= 0, or null where unknown): the tools
  the client starts early from a prediction, and their latency, for the engine's pay-back rule
  (`Engine.stream(..., speculative_tools=)`). Names the request does not offer play no part (the
  target cannot call them), as in the engine.

This module owns the extension's reading (`Extension.of`: a bad value is a 400 naming the field,
e.g. `oospec.predicted_calls`) and its wire shapes (`Predictions`); chat_output.py and responses_output.py send them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..events import CallPredicted
from .protocol import RequestError

#: the request field that holds the extension
FIELD = "oospec"
#: the type of the Responses API's event for one prediction
RESPONSES_EVENT = "oospec.predicted_calls"


@dataclass(frozen=True)
class Extension:
    """A request's `oospec` extension, checked. The default is the extension off."""
    predicted_calls: bool = False
    speculative_tools: dict[str, float | None] | None = None

    @classmethod
    def of(cls, request) -> "Extension":
        """The extension of a request model (`ChatCompletionRequest`, `ResponsesRequest`: both keep the
        fields they do not declare in `model_extra`). A bad value is a `RequestError` (a 400) naming it."""
        raw = (request.model_extra or {}).get(FIELD)
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise RequestError(f"{FIELD} must be an object (oospec's request extension: \"predicted_calls\", "
                               f"\"speculative_tools\"), got {_kind(raw)}", FIELD, "invalid_type")
        for key in raw:
            if key not in ("predicted_calls", "speculative_tools"):
                raise RequestError(f"{FIELD}.{key} is not a field of oospec's request extension; it has "
                                   "\"predicted_calls\" (a boolean) and \"speculative_tools\" (an object)",
                                   f"{FIELD}.{key}", "unknown_parameter")
        flag = raw.get("predicted_calls")
        if flag is not None and not isinstance(flag, bool):
            raise RequestError(f"{FIELD}.predicted_calls must be a boolean (true sends the sidecar's predicted calls "
                               f"as early stream chunks), got {_kind(flag)}", f"{FIELD}.predicted_calls",
                               "invalid_type")
        return cls(bool(flag), _speculative_tools(raw.get("speculative_tools")))


def _speculative_tools(tools: Any) -> dict[str, float | None] | None:
    """`speculative_tools` checked: an object of tool name -> expected seconds (a number >= 0) or null."""
    if tools is None:
        return None
    param = f"{FIELD}.speculative_tools"
    if not isinstance(tools, dict):
        raise RequestError(f"{param} must be an object of tool name -> expected seconds (a number >= 0, or null "
                           f"where unknown), got {_kind(tools)}", param, "invalid_type")
    for name, seconds in tools.items():
        if seconds is None:
            continue
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds < 0:
            raise RequestError(f"{param}.{name} must be the tool's expected seconds (a number >= 0) or null, got "
                               f"{seconds!r:.40}", f"{param}.{name}", "invalid_value")
    return dict(tools)


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__) + f" ({value!r:.40})"


@dataclass
class Predictions:
    """One request's predictions as the extension sends them, per choice (chat completions' `n`;
    a response has choice 0 only): `add` makes the object sent for one `CallPredicted`; `closing` is
    the list that every `oospec` object closing that choice carries under `predictions`."""
    by_choice: dict[int, list[dict]] = field(default_factory=dict)

    def add(self, choice: int, event: CallPredicted) -> dict:
        """`{"predicted_calls": [{"name", "arguments": an object}], "confidence": number or null}`."""
        sent = {"predicted_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in event.calls],
                "confidence": event.confidence}
        self.by_choice.setdefault(choice, []).append(sent)
        return sent

    def closing(self, choice: int, oospec: dict) -> dict:
        """`oospec` (a closing `oospec` object of `choice`) with `predictions`: what was sent, in order."""
        oospec["predictions"] = list(self.by_choice.get(choice, ()))
        return oospec

    def chunk(self, completion, choice: int, event: CallPredicted) -> dict:
        """The chat completions chunk for one prediction: the completion's id, created and model, no
        `choices` (so no `delta`, never a `tool_calls` one), and `oospec` = the prediction with the
        `index` of the choice being decoded."""
        return {"id": completion.id, "object": "chat.completion.chunk", "created": completion.created,
                "model": completion.model, "choices": [], "oospec": {"index": choice, **self.add(choice, event)}}
