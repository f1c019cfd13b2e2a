"""One request's view of its sidecar, behind a fuse: whatever the sidecar does, the target decodes on.

    hints = HintSession.open(sidecar, request, stats, target_device=..., faults=...)
    text = hints.poll(reply)     non-blocking; a hint's text the first time it is ready, else None
    hints.close()                late / declined accounting, cancel the wave, give the cores back

A follow-up wave (`follow_up=True`): once the first wave has answered, and the call the target has
begun names a function (its name string closed) that the hint does not call, the session asks the
sidecar once more, for that function's slot rows alone (tool_choice named: the rows a named request
decodes). Its hint replaces the first when it is ready. The function row is the part of the wave
that unseen tool sets get wrong most; the target's own name settles it. At most MAX_FOLLOW_UPS per
request, each name once.

A fault (an exception, a hang, a late or unusable hint) becomes `stats.sidecar_error` and a warning
logged once per kind, never an exception in the decode loop. This module also owns the torch thread
count while a CPU wave runs: the target lends the wave its cores and takes them back when it ends.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref

import torch

from ..events import read_call
from .base import HintRequest, Sidecar

log = logging.getLogger("oospec_agents.engine")

#: the most follow-up waves one request asks for (one per function name the target writes)
MAX_FOLLOW_UPS = 4
#: how `stats.sidecar_error` begins for a hint that was not ready when the reply was complete (a late
#: hint, which /metrics counts apart from the other faults)
LATE = "sidecar hint late"
#: threads a reply lent its wave and that another thread gave back (a stream closed, or collected,
#: off the thread that decoded it): per lending thread, what it takes back at its next request
_OWED: "weakref.WeakKeyDictionary[threading.Thread, int]" = weakref.WeakKeyDictionary()
_OWED_LOCK = threading.Lock()


class HintSession:
    def __init__(self, ticket, stats, faults: set[str], lent: int = 0, *, sidecar: Sidecar | None = None,
                 request: HintRequest | None = None, follow_up: bool = False, lend=None):
        self.ticket = ticket
        self.stats = stats
        self.text: str | None = None
        self.name: str | None = None     # the function the current hint calls
        self.declined = False
        self._faults = faults
        self._lent = lent
        self._lender = threading.current_thread()  # the thread whose count the loans lower
        self._sidecar, self._request = sidecar, request
        self._follow_up = follow_up and sidecar is not None and request is not None
        self._lend = lend                # () -> threads lent for a follow-up wave (0: none)
        self._asked: set[str] = set()    # the names a follow-up wave was asked for
        self._next = None                # the follow-up wave's ticket while it runs

    @classmethod
    def open(cls, sidecar: Sidecar | None, request: HintRequest, stats, *, target_device: torch.device,
             faults: set[str], lend_cores: bool = True, follow_up: bool = False) -> "HintSession | None":
        """Submit the request; None when there is no sidecar or the submit itself failed."""
        if sidecar is None:
            return None
        try:
            ticket = sidecar.submit(request)
        except Exception as e:  # a sidecar fault never reaches the target's answer
            _fault(stats, faults, f"sidecar submit failed: {type(e).__name__}: {e}")
            return None
        lend = (lambda: _lend_cores(sidecar, target_device)) if lend_cores else (lambda: 0)
        return cls(ticket, stats, faults, lend(), sidecar=sidecar, request=request, follow_up=follow_up, lend=lend)

    def poll(self, reply: str | None = None) -> str | None:
        """A hint's text the first time it is ready (the first wave's, then a follow-up's); None
        before, between, after, and on any fault. `reply`: the reply's text so far, which a
        follow-up wave is asked from."""
        if self.text is None and not self.declined and self.stats.sidecar_error is None:
            hint = self._first()
            if hint is not None or not self.declined:
                return hint  # the first hint; or its wave still runs, or just failed
        if reply is None or not self._follow_up or self.stats.sidecar_error is not None:
            return None
        return self._follow(reply)

    def _first(self) -> str | None:
        hint = self._read()
        if self._lent and (hint is not None or self.stats.sidecar_error or self.declined):
            self._give_back_cores()  # the wave is over
        if hint is None or not isinstance(hint.text, str):
            return None
        self.stats.hint_ready_s, self.stats.hint_bytes = hint.ready_s, hint.payload_bytes
        self.stats.sidecar_profile = hint.profile
        self.stats.sidecar_cached_prompt_tokens = (hint.profile or {}).get("cached_prefix_tokens")
        self.text, self.name = hint.text, _call_name(self._request, hint.text)
        return hint.text

    def _follow(self, reply: str) -> str | None:
        """Ask a follow-up wave for the function the reply's open call names, or read the one asked."""
        if self._next is not None:
            return self._read_next()
        fmt = self._request.fmt
        body = fmt.open_call_json(reply)
        name = read_call(body, (fmt.args_key,)).name if body else None
        if (name is None or name == self.name or name in self._asked or len(self._asked) >= MAX_FOLLOW_UPS
                or name not in {t.name for t in self._request.tools}):
            return None
        self._asked.add(name)
        request = dataclasses.replace(self._request, tool_choice=("named", name), arrived=time.perf_counter())
        try:
            self._next = self._sidecar.submit(request)
        except Exception as e:
            self._fault(f"sidecar submit failed: {type(e).__name__}: {e}")
            return None
        self.stats.hint_follow_ups += 1
        if self._lend is not None and not self._lent:
            self._lent = self._lend()  # the follow-up's wave runs: lend it the cores again, as the first
            self._lender = threading.current_thread()
        return None

    def _read_next(self) -> str | None:
        try:
            hint = self._next.poll()
            error, declined = self._next.error, bool(self._next.declined)
        except Exception as e:
            hint, error, declined = None, f"sidecar poll failed: {type(e).__name__}: {e}", False
        if hint is None and not error and not declined:
            return None  # still running
        self._next = None
        self._give_back_cores()
        if error:
            self._fault(error)
        if error or declined or hint is None or not isinstance(hint.text, str):
            return None
        self.text, self.name = hint.text, _call_name(self._request, hint.text)
        return hint.text

    def close(self, abandoned: bool = False) -> None:
        """The reply is complete (or abandoned): account for a hint that never helped, stop the wave."""
        try:
            if not abandoned and self.declined:
                self.stats.sidecar_declined = True  # it predicted a text reply: no hint, no fault (a
                # follow-up may still have brought the call the target wrote)
            elif not abandoned and self.text is None and self.stats.sidecar_error is None:
                if self._read() is not None:
                    self._fault(f"{LATE}: it arrived after the reply was complete (reported, not used)")
                elif self.declined:
                    self.stats.sidecar_declined = True
                elif self.stats.sidecar_error is None:
                    self._fault(f"{LATE}: not ready when the reply was complete")
            for ticket in (self.ticket, self._next):
                try:
                    if ticket is not None:
                        ticket.cancel()
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
        """`torch.set_num_threads` sets the calling thread's count: on another thread than the lender's,
        the loan is recorded for the lender to take back (`take_back_lent_cores`), not added here."""
        if self._lent:
            if threading.current_thread() is self._lender:
                torch.set_num_threads(torch.get_num_threads() + self._lent)
            else:
                with _OWED_LOCK:
                    _OWED[self._lender] = _OWED.get(self._lender, 0) + self._lent
            self._lent = 0


def take_back_lent_cores() -> None:
    """The calling thread takes back the threads it lent a wave and another thread gave back for it
    (the engine calls this as each request begins)."""
    if not _OWED:
        return
    with _OWED_LOCK:
        owed = _OWED.pop(threading.current_thread(), 0)
    if owed:
        torch.set_num_threads(torch.get_num_threads() + owed)


def _call_name(request: HintRequest | None, text: str) -> str | None:
    """The function a hint's text calls (its first call), as the target's format reads it."""
    if request is None:
        return None
    try:
        calls = request.fmt.parse(text)[1]
    except Exception:
        return None
    return calls[0].get("name") if calls else None


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


def follows_up(setting: bool | None, sidecar, target_device: torch.device) -> bool:
    """Whether a request asks follow-up waves: `setting` (`Engine(hint_follow_up=...)`), or when it is
    None, only where the sidecar has cores of its own. On the target's CPU a follow-up wave takes
    a core from the target for 0.1-0.8 s of one thread (callnavi, nestful) to save about 7% of the
    target's forwards at best (docs/sidecar.md, "Follow-up waves"): a loss there."""
    return (not shares_cores(sidecar, target_device)) if setting is None else bool(setting)


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
