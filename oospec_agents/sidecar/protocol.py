"""The contract between the target's decode loop and a sidecar (words: docs/glossary.md).

    ticket = sidecar.submit(request)    returns at once; the sidecar's wave runs elsewhere
    ticket.poll() -> Hint | None        never blocks
    ticket.cancel()                     the reply is over: drop the work still running for it

Only text crosses this line, so a sidecar may use any model and any tokenizer. Besides `submit`, a
sidecar declares what the engine asks of it: its `name`, the `device` its wave runs on, the `cores`
of that device it keeps to itself (a CPU core set; None: it shares the CPU), the `threads` a wave on
a shared CPU takes, `estimate` (a wave's expected seconds, for the pay-back rule), `clear_prefix_cache`,
`wait_idle`, `load_adapter` (the hot swap) and `close`. `SidecarBase` gives each of them a default that
does nothing (`load_adapter`'s refuses: there is no adapter to swap).

`Ticket` is the one mailbox every host posts into: a wave's outcome crosses it once, and `poll`
renders the compact payload in the target's format.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from ..errors import AdapterError
from ..formats import ToolFormat
from ..tools import Tool
from .join import render_payload


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
    confidence: float | None = None   # the calibrated probability that the whole call is exact (confidence.py)


class HintTicket(Protocol):
    error: str | None                 # set when the sidecar failed; the target carries on without it
    declined: bool                    # set when the sidecar predicts no call (tool_choice="auto"): no hint, no fault

    def poll(self) -> Hint | None:
        """The hint if it is ready, else None. Never blocks."""

    def cancel(self) -> None:
        """The request is finished; drop any work still running for it."""


@runtime_checkable
class Sidecar(Protocol):
    name: str
    device: torch.device              # where the wave runs
    cores: frozenset[int] | None      # the CPU cores it keeps to itself; None: it shares the CPU
    threads: int | None               # threads a wave on a shared CPU takes (the target lends them)

    def submit(self, request: HintRequest) -> HintTicket: ...

    def estimate(self, request: HintRequest) -> float | None:
        """Seconds this request's wave is expected to take; None: no estimate (the wave runs)."""

    def clear_prefix_cache(self) -> None: ...

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until no wave runs; False on timeout."""

    def describe(self) -> dict:
        """What a report says of it: its placement and wave settings (JSON-able)."""

    def load_adapter(self, adapter) -> str:
        """Swap its LoRA adapter for the one in directory `adapter`: waves that begin from now use it,
        a running one ends on the old. Returns its new `name`; a bad adapter raises AdapterError and
        the old one stays."""

    def close(self) -> None: ...


class SidecarBase:
    """The `Sidecar` protocol with a default for everything but `submit`: a sidecar of unknown
    place (no device: never costed as sharing the target's cores), no estimate, nothing to clear,
    wait for or close."""
    name: str = ""                    # "": stats call it by its class
    device = torch.device("meta")
    cores: frozenset[int] | None = None
    threads: int | None = None

    def submit(self, request: HintRequest) -> HintTicket:
        raise NotImplementedError

    def estimate(self, request: HintRequest) -> float | None:
        return None

    def clear_prefix_cache(self) -> None:
        pass

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        return True

    def describe(self) -> dict:
        return {}

    def load_adapter(self, adapter) -> str:
        raise AdapterError(f"the sidecar {self.name or type(self).__name__!r} has no adapter to swap: it is "
                           "not a model that oospec loaded")

    def close(self) -> None:
        pass


def check_sidecar(sidecar) -> Sidecar:
    """`sidecar` itself, once it is known to implement the whole protocol; a TypeError naming what
    it lacks otherwise (a sidecar written for the older submit-only contract: subclass SidecarBase)."""
    missing = [m for m in ("submit", "estimate", "clear_prefix_cache", "wait_idle", "describe", "close", "name",
                           "device", "cores", "threads") if not hasattr(sidecar, m)]
    if missing:
        raise TypeError(f"the sidecar {type(sidecar).__name__} does not implement the Sidecar protocol: it has no "
                        f"{', '.join(missing)} (subclass oospec_agents.sidecar.SidecarBase for their defaults)")
    return sidecar


class Ticket:
    """One request's mailbox. A host posts a wave's outcome once; the target's poll reads it without
    locking. `on_cancel` tells the host (a wave thread's event, a worker's pipe, an actor)."""
    _ids = itertools.count()

    def __init__(self, request: HintRequest, timeout_s: float, on_cancel=None):
        self.id = next(self._ids)
        self.error: str | None = None
        self.declined = False   # the wave finished and predicts no call: there is no hint, and no fault
        self.cancelled = threading.Event()
        self._on_cancel = on_cancel
        self._request = request
        self._deadline = request.arrived + timeout_s
        self._timeout_s = timeout_s
        self._mailbox: queue.SimpleQueue = queue.SimpleQueue()
        self._hint: Hint | None = None

    def post(self, *, payload: bytes | None = None, error: str | None = None, profile: dict | None = None,
             declined: bool = False, confidence: float | None = None) -> None:
        self._mailbox.put((payload, time.perf_counter() - self._request.arrived, error, profile, declined, confidence))

    def poll(self) -> Hint | None:
        if self._hint is not None or self.error is not None or self.declined:
            return self._hint
        try:
            payload, ready_s, error, profile, declined, confidence = self._mailbox.get_nowait()
        except queue.Empty:
            if time.perf_counter() > self._deadline:
                self.expire()
            return None
        if error is not None:
            self.error = error
            return None
        if declined:
            self.declined = True
            return None
        try:
            self._hint = Hint(render_payload(payload, self._request.fmt), len(payload), ready_s, profile, confidence)
        except Exception as e:
            self.error = f"sidecar gave no usable call: cannot render payload {payload[:80]!r}: {e}"
        return self._hint

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            if self._on_cancel is not None:
                try:
                    self._on_cancel(self)
                except Exception:  # the host is gone: nothing runs to cancel
                    pass

    def expire(self) -> None:
        """The deadline passed with no hint."""
        self.error = f"sidecar timeout: no hint after {self._timeout_s:g}s; the wave is abandoned"
        self.cancel()


def wait_for_wave(ticket: HintTicket, timeout_s: float) -> HintTicket:
    """`ticket` once its wave has answered (a hint, an error or a decline), or after `timeout_s`."""
    deadline = time.perf_counter() + timeout_s
    while (ticket.poll() is None and not getattr(ticket, "error", None) and not getattr(ticket, "declined", False)
           and time.perf_counter() < deadline):
        time.sleep(0.002)
    return ticket


class HintFirst:
    """A measuring aid (`oospec bench --hint-first`), not a way to serve: `submit` returns only once
    the wrapped sidecar's wave has answered (a hint, an error or a decline; at most `timeout_s`), so the
    target's first poll finds it ready. The target forwards a reply then takes are those of a sidecar
    fast enough to be always in time (on its own accelerator), whatever this machine's cores do; the
    wall clock is not a speed figure, since the target waited for the wave. Everything else is the
    wrapped sidecar's."""

    def __init__(self, sidecar, timeout_s: float = 120.0):
        self.inner, self.timeout_s = check_sidecar(sidecar), timeout_s

    def submit(self, request: HintRequest) -> HintTicket:
        return wait_for_wave(self.inner.submit(request), self.timeout_s)

    def describe(self) -> dict:
        return {**self.inner.describe(), "hint_first": True}

    def __getattr__(self, name):
        return getattr(self.inner, name)


class FixedHint(SidecarBase):
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

    def poll(self) -> Hint:
        return self.hint

    def cancel(self) -> None:
        pass
