"""One request's view of its sidecar, behind a fuse: whatever the sidecar does, the target decodes on.

    hints = HintSession.open(sidecar, request, stats, target_device=..., faults=...)
    text = hints.poll()          non-blocking; the hint's text once it is ready, else None
    hints.close()                late / declined accounting, cancel the wave, give the cores back

A fault (an exception, a hang, a late or unusable hint) becomes `stats.sidecar_error` and a warning
logged once per kind, never an exception in the decode loop. This module also owns the torch thread
count while a CPU wave runs: the target lends the wave its cores and takes them back when it ends.
"""
from __future__ import annotations

import logging

import torch

from .base import HintRequest, Sidecar

log = logging.getLogger("oospec_agents.engine")


class HintSession:
    def __init__(self, ticket, stats, faults: set[str], lent: int = 0):
        self.ticket = ticket
        self.stats = stats
        self.text: str | None = None
        self.declined = False
        self._faults = faults
        self._lent = lent

    @classmethod
    def open(cls, sidecar: Sidecar | None, request: HintRequest, stats, *, target_device: torch.device,
             faults: set[str], lend_cores: bool = True) -> "HintSession | None":
        """Submit the request; None when there is no sidecar or the submit itself failed."""
        if sidecar is None:
            return None
        try:
            ticket = sidecar.submit(request)
        except Exception as e:  # a sidecar fault never reaches the target's answer
            _fault(stats, faults, f"sidecar submit failed: {type(e).__name__}: {e}")
            return None
        return cls(ticket, stats, faults, _lend_cores(sidecar, target_device) if lend_cores else 0)

    def poll(self) -> str | None:
        """The hint's text the first time it is ready; None before, after, and on any fault."""
        if self.text is not None:
            return None
        hint = self._read()
        if self._lent and (hint is not None or self.stats.sidecar_error or self.declined):
            self._give_back_cores()  # the wave is over
        if hint is None or not isinstance(hint.text, str):
            return None
        self.stats.hint_ready_s, self.stats.hint_bytes = hint.ready_s, hint.payload_bytes
        self.stats.sidecar_profile = hint.profile
        self.stats.sidecar_cached_prompt_tokens = (hint.profile or {}).get("cached_prefix_tokens")
        self.text = hint.text
        return hint.text

    def close(self, abandoned: bool = False) -> None:
        """The reply is complete (or abandoned): account for a hint that never helped, stop the wave."""
        try:
            if not abandoned and self.text is None and self.stats.sidecar_error is None:
                if self._read() is not None:
                    self._fault("sidecar hint late: it arrived after the reply was complete (reported, not used)")
                elif self.declined:
                    self.stats.sidecar_declined = True  # it predicted a text reply: no hint, no fault
                elif self.stats.sidecar_error is None:
                    self._fault("sidecar hint late: not ready when the reply was complete")
            try:
                self.ticket.cancel()
            except Exception as e:
                log.warning("sidecar cleanup failed: %s", e)
        finally:
            self._give_back_cores()

    def _read(self):
        """Poll the ticket; a ticket that raises, or breaks the protocol, is a fault like any other."""
        try:
            hint = self.ticket.poll()
            error, self.declined = self.ticket.error, bool(self.ticket.declined)
        except Exception as e:
            hint, error = None, f"sidecar poll failed: {type(e).__name__}: {e}"
        if error and self.stats.sidecar_error is None:
            self._fault(error)
        return hint if error is None else None

    def _fault(self, message: str) -> None:
        _fault(self.stats, self._faults, message)

    def _give_back_cores(self) -> None:
        if self._lent:
            torch.set_num_threads(torch.get_num_threads() + self._lent)
            self._lent = 0


def _fault(stats, logged: set[str], message: str) -> None:
    stats.sidecar_error = message
    kind = message.split(":")[0]
    if kind not in logged:  # logged once per kind, always visible in stats
        logged.add(kind)
        log.warning("%s (the target decodes on without the hint)", message)


def shares_cores(sidecar, target_device: torch.device) -> bool:
    """Whether the sidecar's wave runs on the CPU the target decodes on."""
    side_dev = getattr(sidecar, "device", None)
    return target_device.type == "cpu" and side_dev is not None and torch.device(side_dev).type == "cpu"


def _lend_cores(sidecar, target_device: torch.device) -> int:
    """While a CPU sidecar's wave runs, leave it its own cores: oversubscribed cores slow both
    models several-fold. Returns how many threads the target gave up."""
    side_threads = getattr(sidecar, "threads", None) or 0
    if not shares_cores(sidecar, target_device):
        return 0
    mine = torch.get_num_threads()
    lent = min(side_threads, mine - 1)
    if lent > 0:
        torch.set_num_threads(mine - lent)
    return max(lent, 0)
