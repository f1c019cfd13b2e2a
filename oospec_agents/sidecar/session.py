"""One request's view of its sidecar, behind a fuse: whatever the sidecar does, the target decodes on.

    hints = HintSession.open(sidecar, request, target=place, faults=...)
    text = hints.poll(reply)       non-blocking; a hint's text the first time it is ready, else None
    hints.confidence               that hint's `Hint.confidence` (the engine's CallPredicted carries it)
    outcome = hints.close()        late / declined accounting, cancel the wave, give the cores back

The engine copies the `Outcome` into the reply's stats; nothing here writes them.

A follow-up wave (`follow_up=True`): once the first wave has answered, and the call the target has
begun names a function (its name string closed) that the hint does not call, the session asks the
sidecar once more, for that function's slot rows alone (tool_choice named: the rows a named request
decodes). Its hint replaces the first when it is ready. The function row is the part of the wave
that unseen tool sets get wrong most; the target's own name settles it. And the moment the reply
goes on past a call it closed and the hint has no call after it (a parallel reply), the session
asks for the next call. A follow-up asked after the reply closed calls gets them as an assistant turn
after the conversation, and its hint says it follows them (`HintText.after_calls`), so the hint
drafter offers its call at the reply's next call (drafters/hint.py). At most MAX_FOLLOW_UPS per request, each name once.

A fault (an exception, a hang, a late or unusable hint) becomes `Outcome.error` and a warning logged
once per kind, never an exception in the decode loop. While a wave on the target's own CPU runs, the
target lends it cores (cores.lend) and takes them back when it ends. Words: docs/glossary.md.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass

from ..drafters.base import HintText
from ..jsonscan import call_name
from . import cores
from .protocol import HintRequest, Sidecar

log = logging.getLogger("oospec_agents.engine")

#: the most follow-up waves one request asks for (one per function name the target writes)
MAX_FOLLOW_UPS = 4
#: how `Outcome.error` begins for a hint that was not ready when the reply was complete (a late hint,
#: which /metrics counts apart from the other faults)
LATE = "sidecar hint late"


@dataclass
class Outcome:
    """What the sidecar did for one reply (the engine copies it into `DecodeStats`)."""
    error: str | None = None          # the first fault; the target decoded on without the hint
    declined: bool = False            # the wave predicts a text reply: no hint, and no fault
    hint_ready_s: float | None = None
    hint_bytes: int | None = None
    profile: dict | None = None       # where the first wave's time went
    cached_prompt_tokens: int | None = None  # of the wave's shared prefix
    follow_ups: int = 0


class HintSession:
    """One reply's sidecar, from the engine's side: the request's ticket, its hint once ready, and the
    reply's `Outcome`.

    `open` submits the request (lending the wave cores where it shares the target's CPU); the decode
    loop calls `poll` each round, which never blocks and never raises: it returns the hint's text the
    round it is first ready (then, with `follow_up`, a follow-up wave's for the function the reply
    names), else None. `close` ends it: a hint that never came is counted late, the waves are
    cancelled and the cores given back. Every fault (an exception, an error, a late hint) becomes
    `Outcome.error`, logged once per kind in `faults` (shared by the engine's sessions).
    """

    def __init__(self, ticket, faults: set[str], loan: cores.Loan, *, sidecar: Sidecar | None = None,
                 request: HintRequest | None = None, follow_up: bool = False, lend=None):
        self.ticket = ticket
        self.outcome = Outcome()
        self.text: str | None = None
        self.name: str | None = None     # the function the current hint calls
        #: the current hint's confidence (`Hint.confidence`: the probability its whole call is exact)
        self.confidence: float | None = None
        self.declined = False
        self._faults = faults
        self._loan = loan
        self._sidecar, self._request = sidecar, request
        self._follow_up = follow_up and sidecar is not None and request is not None
        self._lend = lend                # () -> Loan for a follow-up wave
        self._asked: set[str] = set()    # the names a follow-up wave was asked for
        self._next = None                # the follow-up wave's ticket while it runs
        self._closed: list[dict] = []    # the reply's closed calls when the last follow-up was asked

    @classmethod
    def open(cls, sidecar: Sidecar, request: HintRequest, *, target: cores.Place, faults: set[str],
             lend_cores: bool = True, follow_up: bool = False) -> "HintSession":
        """Submit the request. A submit that fails is the session's fault: it polls no hint."""
        shares = cores.shares_cpu(sidecar.device, sidecar.cores, target)
        lend = (lambda: cores.lend(sidecar.threads)) if lend_cores and shares else cores.Loan
        try:
            ticket = sidecar.submit(request)
        except Exception as e:  # a sidecar fault never reaches the target's answer
            session = cls(None, faults, cores.Loan())
            session.fault(f"sidecar submit failed: {type(e).__name__}: {e}")
            return session
        return cls(ticket, faults, lend(), sidecar=sidecar, request=request, follow_up=follow_up, lend=lend)

    def poll(self, reply: str | None = None) -> str | None:
        """A hint's text the first time it is ready (the first wave's, then a follow-up's); None
        before, between, after, and on any fault. `reply`: the reply's text so far, which a
        follow-up wave is asked from."""
        if self.ticket is None or self.outcome.error is not None:
            return None
        if self.text is None and not self.declined:
            hint = self._first()
            if hint is not None or not self.declined:
                return hint  # the first hint; or its wave still runs, or just failed
        if reply is None or not self._follow_up or self.outcome.error is not None:
            return None
        return self._follow(reply)

    def _first(self) -> str | None:
        hint = self._read()
        if hint is not None or self.outcome.error or self.declined:
            self._loan.give_back()  # the wave is over
        if hint is None or not isinstance(hint.text, str):
            return None
        out = self.outcome
        out.hint_ready_s, out.hint_bytes, out.profile = hint.ready_s, hint.payload_bytes, hint.profile
        out.cached_prompt_tokens = (hint.profile or {}).get("cached_prefix_tokens")
        return self._take(hint)

    def _take(self, hint) -> HintText:
        """`hint` is now the current one: its text, the function it calls and its confidence; its text
        returned as a `HintText` that carries the confidence and the runner-up calls to the drafter."""
        self.confidence = getattr(hint, "confidence", None)  # a third-party sidecar's Hint may lack it
        self.text = HintText(hint.text, self.confidence, getattr(hint.text, "alternatives", ()),
                             getattr(hint.text, "after_calls", 0))
        self.name = _call_name(self._request, hint.text)
        return self.text

    def _follow(self, reply: str) -> str | None:
        """Ask a follow-up wave for the function the reply's open call names, or for the call after the
        ones it has closed; or read the one asked."""
        if self._next is not None:
            return self._read_next()
        fmt = self._request.fmt
        body = fmt.open_call_json(reply)
        closed = _calls(fmt, reply, body is not None)
        skip = getattr(self.text, "after_calls", 0)
        hinted = _calls(fmt, self.text or "")
        if self._goes_on(reply, closed, skip + len(hinted)):
            return self._submit(closed, self._request.tool_choice)
        name = call_name(body) if body else None
        at = max(0, min(len(closed) - skip, len(hinted) - 1))  # the hint's call for the reply's open call
        if (name is None or name == (hinted[at]["name"] if hinted else self.name)
                or name in self._asked or self.outcome.follow_ups >= MAX_FOLLOW_UPS
                or name not in {t.name for t in self._request.tools}):
            return None
        self._asked.add(name)
        return self._submit(closed, ("named", name))

    def _goes_on(self, reply: str, closed: list[dict], hinted: int) -> bool:
        """Whether to ask for the reply's next call: it has gone on past a closed call (not just closed
        one, which may be its last), the hint holds no call for it, and none was asked after as many."""
        fmt = self._request.fmt
        return (bool(closed) and not fmt.calls_in_one_list and not reply.endswith(fmt.call_end.strip())
                and len(closed) >= hinted and len(closed) > len(self._closed)
                and self.outcome.follow_ups < MAX_FOLLOW_UPS)

    def _submit(self, closed: list[dict], tool_choice) -> str | None:
        """Submit a follow-up wave (after the reply's `closed` calls, as an assistant turn); its hint at
        once where it is ready at once (a sidecar that has the target wait for its waves), else None
        until a later poll reads it."""
        self._closed = closed
        messages = self._request.messages + ([{"role": "assistant", "content": "", "tool_calls": closed}]
                                             if closed else [])
        request = dataclasses.replace(self._request, messages=messages, tool_choice=tool_choice,
                                      arrived=time.perf_counter())
        try:
            self._next = self._sidecar.submit(request)
        except Exception as e:
            self.fault(f"sidecar submit failed: {type(e).__name__}: {e}")
            return None
        self.outcome.follow_ups += 1
        if not self._loan.threads:
            self._loan = self._lend()  # the follow-up's wave runs: lend it the cores again, as the first
        return self._read_next()

    def _read_next(self) -> str | None:
        try:
            hint = self._next.poll()
            error, declined = self._next.error, bool(self._next.declined)
        except Exception as e:
            hint, error, declined = None, f"sidecar poll failed: {type(e).__name__}: {e}", False
        if hint is None and not error and not declined:
            return None  # still running
        self._next = None
        self._loan.give_back()
        if error:
            self.fault(error)
        if error or declined or hint is None or not isinstance(hint.text, str):
            return None
        if self._closed:  # its call goes after the calls the reply had closed
            hint = dataclasses.replace(hint, text=HintText(hint.text, alternatives=getattr(hint.text, "alternatives", ()),
                                                           after_calls=len(self._closed)))
        return self._take(hint)

    def close(self, abandoned: bool = False) -> Outcome:
        """The reply is complete (or abandoned): account for a hint that never helped, stop the wave."""
        try:
            if self.ticket is None:
                return self.outcome
            if not abandoned and self.declined:
                self.outcome.declined = True  # it predicted a text reply: no hint, no fault (a follow-up
                # may still have brought the call the target wrote)
            elif not abandoned and self.text is None and self.outcome.error is None:
                if self._read() is not None:
                    self.fault(f"{LATE}: it arrived after the reply was complete (reported, not used)")
                elif self.declined:
                    self.outcome.declined = True
                elif self.outcome.error is None:
                    self.fault(f"{LATE}: not ready when the reply was complete")
            for ticket in (self.ticket, self._next):
                try:
                    if ticket is not None:
                        ticket.cancel()
                except Exception as e:
                    log.warning("sidecar cleanup failed: %s", e)
        finally:
            self._loan.give_back()
        return self.outcome

    def _read(self):
        """Poll the ticket; a ticket that raises, or breaks the protocol, is a fault like any other."""
        try:
            hint = self.ticket.poll()
            error, self.declined = self.ticket.error, bool(self.ticket.declined)
        except Exception as e:
            hint, error = None, f"sidecar poll failed: {type(e).__name__}: {e}"
        if error and self.outcome.error is None:
            self.fault(error)
        return hint if error is None else None

    def fault(self, message: str) -> None:
        """Record a fault: the outcome's error (the target decodes on without the hint), and a warning
        logged the first time its kind (what `message` says before its first colon) is seen."""
        self.outcome.error = message
        kind = message.split(":")[0]
        if kind not in self._faults:  # logged once per kind, always visible in stats
            self._faults.add(kind)
            log.warning("%s (the target decodes on without the hint)", message)


def _calls(fmt, text: str, open_last: bool = False) -> list[dict]:
    """The calls `text` holds that read as calls ({"name", "arguments"}), the last left out where
    `open_last` (it is still being written)."""
    try:
        pieces = [piece for kind, piece in fmt.segments(text) if kind == "call"]
    except Exception:
        return []
    out = []
    for piece in pieces[:len(pieces) - 1] if open_last else pieces:
        try:
            call = json.loads(piece)
        except ValueError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get(fmt.args_key), dict):
            out.append({"name": call["name"], "arguments": call[fmt.args_key]})
    return out


def _call_name(request: HintRequest | None, text: str) -> str | None:
    """The function a hint's text calls: its first call's name, read by the one name reader (jsonscan)."""
    if request is None:
        return None
    try:
        body = next((piece for kind, piece in request.fmt.segments(text) if kind == "call"), None)
    except Exception:
        return None
    return None if body is None else call_name(body)


def follows_up(setting: bool | None, shares: bool) -> bool:
    """Whether a request asks follow-up waves: `setting` (`Engine(hint_follow_up=...)`), or when it is
    None, only where the sidecar has cores of its own. On the target's CPU a follow-up wave takes
    a core from the target for 0.1-0.8 s of one thread (callnavi, nestful) to save about 7% of the
    target's forwards at best (docs/sidecar.md, "Follow-up waves"): a loss there."""
    return (not shares) if setting is None else bool(setting)
