"""The contract between the target's decode loop and a sidecar: submit a request, poll for a hint.

Only text crosses this line, so a sidecar may use any model and any tokenizer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from ..formats import ToolFormat
from ..tools import Tool


@dataclass
class HintRequest:
    messages: list[dict]              # normalised chat (see chat.normalize_messages)
    tools: list[Tool]
    fmt: ToolFormat                   # the target's tool-call format: hints are rendered in it
    tool_choice: tuple[str, str | None]
    arrived: float = field(default_factory=time.perf_counter)


@dataclass
class Hint:
    text: str                         # the predicted call, rendered in the target's format
    payload_bytes: int                # size of the compact payload that crossed the mailbox
    ready_s: float                    # seconds from request arrival to the hint being posted
    profile: dict | None = None       # where the wave's time went (queued_s, wave_s, prefill_s, steps, ...)


class HintTicket(Protocol):
    error: str | None                 # set when the sidecar failed; the target carries on without it
    declined: bool                    # set when the sidecar predicts no call (tool_choice="auto"): no hint, no fault

    def poll(self) -> Hint | None:
        """The hint if it is ready, else None. Never blocks."""

    def cancel(self) -> None:
        """The request is finished; drop any work still running for it."""


class Sidecar(Protocol):
    def submit(self, request: HintRequest) -> HintTicket: ...


class FixedHint:
    """A sidecar whose hint is known up front (the oracle, and tests of the injection path)."""
    name = "fixed hint"

    def __init__(self, text: str):
        self.text = text

    def submit(self, request: HintRequest) -> "_Ready":
        return _Ready(Hint(self.text, len(self.text.encode()), time.perf_counter() - request.arrived))


class _Ready:
    error = None
    declined = False

    def __init__(self, hint: Hint):
        self.hint = hint

    def poll(self):
        return self.hint

    def cancel(self):
        pass
