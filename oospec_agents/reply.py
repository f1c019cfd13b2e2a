"""One reply while it decodes, in one object: start here to see what a request carries on its way down.

A `Reply` is built once, when its request starts decoding (`decode.Decoder.reply`), from the checked and
rendered request (`Prepared`): its prompt and committed ids and text, its own `DrafterStack` (the drafters,
the hint, the retrieval pool, the accepted drafts per source), the sidecar's hint session, the grammar
guide and how it picks tokens, its events, its stats, its seat at the target and its KV cache. What is
shared across requests (the call memory, the prefix cache) was handed to it then; nothing outside sets
its fields afterwards. `commit` is the one place its tokens are written (stop strings, `max_new_tokens`,
logprobs, events); the decode loop's steps (decode.py) take a `Reply` and return what they decided.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Generator, Iterator

from . import deterministic as det
from .drafters import DrafterStack, ReplyState, ReplyText
from .events import LogprobsDelta, ReasoningDelta, ReplyEvents, TextDelta, ToolCallDelta
from .formats import ToolFormat
from .request import Event, Prepared
from .sampling import Choice, TokenLogprob
from .sidecar.session import HintSession
from .stats import DecodeStats

__all__ = ["Reading", "Reply", "partial_stop", "stop_at"]


@dataclass(frozen=True)
class Reading:
    """How an engine reads its replies: the target's tokenizer and tool-call format, token ids to text,
    and the ids that end a reply."""
    tokenizer: object
    fmt: ToolFormat
    text: ReplyText
    eos: frozenset[int]


@dataclass(eq=False)
class Reply:
    """One reply while it decodes (see the module's docstring). Built once; the fields below the
    divider are its own running account, written by its methods alone."""
    req: Prepared
    reading: Reading
    stack: DrafterStack             # its drafters, over `state`: prompt + committed ids, text, hint, pool
    events: ReplyEvents             # the stream's events, read from the committed text
    stats: DecodeStats
    call_id_prefix: str             # the reply's calls are `{call_id_prefix}_{i}`
    seat: object                    # its place at the target (batching.Seat)
    cache: object                   # its KV cache (from the prefix cache, or new)
    hit: int = 0                    # prompt tokens `cache` holds already
    choose: Choice | None = None    # what picks the tokens (None: the plain argmax); it holds their logprobs
    hints: HintSession | None = None  # the sidecar's hint for this reply, while it may come
    hint_text: str | None = None    # a fixed hint the caller gave in place of the sidecar's
    cancel: threading.Event | None = None
    shapes: det.Shapes | None = None  # deterministic mode: the shapes of its decode forwards
    # ---- its own account
    finish: str | None = field(default=None, init=False)  # "stop" | "length" once the reply is over
    logprobs: list[dict] = field(default_factory=list, init=False)  # OpenAI's entry per committed token
    predictions: list[dict] = field(default_factory=list, init=False)  # every call its hints predicted

    @property
    def state(self) -> ReplyState:
        return self.stack.state

    @property
    def method(self) -> str:
        return self.req.method

    @property
    def guide(self):
        return self.req.guide

    @property
    def new(self) -> list[int]:
        """The committed new tokens (a copy of the tail of `state.ids`)."""
        return self.state.new

    @property
    def n_new(self) -> int:
        return len(self.state.ids) - self.state.n_prompt

    @property
    def text(self) -> str:
        """The committed text, cut at a stop string once one appears."""
        return self.state.text

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def predicted(self, calls: list[dict]) -> None:
        """A hint read this round predicts these calls (judged against the reply's calls at the end)."""
        self.predictions += calls

    def commit(self, pending: list[int], logits) -> Generator[Event, None, int]:
        """Commit what the last forward decided, check every stop condition, and yield the new events;
        returns how many of `pending` were committed (`max_new_tokens` or an end of sequence may cut it).
        `logits` are the rows that chose the last of `pending`; the tokens before them (and all of them
        when `logits` is None) were forced by the grammar: their margin is infinite, their logprob 0."""
        req, ids = self.req, self.state.ids
        self._margins(pending, logits)
        before = len(ids)
        for t in pending[:req.max_new_tokens - self.n_new]:
            ids.append(t)
            if t in self.reading.eos:
                self.finish = "stop"
                break
        scored = self._logprobs(pending, len(ids) - before, logits is not None)
        text = req.prefix + self.reading.text(ids[self.state.n_prompt:])
        cut = stop_at(text, req.stop, len(req.prefix))
        if cut is not None:
            self.state.text, self.finish = text[:cut], "stop"
        else:
            self.state.text = text
            if self.finish is None and self.n_new >= req.max_new_tokens:
                self.finish = "length"
            if self.finish is None:
                # Hold back text that may still start a stop string, and a UTF-8 character cut in half.
                yield from self.events.feed(text[:len(text) - partial_stop(text, req.stop)].rstrip("\ufffd"))
        if scored:
            yield LogprobsDelta(scored)
        return len(ids) - before

    def _margins(self, pending: list[int], logits) -> None:
        """The top-2 logit margin of each token (when asked for): infinite for a forced one."""
        margins = self.stats.margins
        if margins is None:
            return
        rows = 0 if logits is None else len(logits)
        margins += [float("inf")] * max(0, len(pending) - rows)
        if rows:
            top2 = logits.float().topk(2, dim=-1).values
            margins += (top2[:, 0] - top2[:, 1]).tolist()[:len(pending)]

    def _logprobs(self, pending: list[int], kept: int, chosen: bool) -> list[dict]:
        """OpenAI's logprobs entries of the `kept` tokens just committed (when asked for): what `choose`
        recorded for the tokens it chose, 0 for the tokens a grammar forced before them."""
        if self.req.top_logprobs is None:
            return []
        taken = self.choose.take() if chosen else []
        entries = [TokenLogprob(t, 0.0) for t in pending[:len(pending) - len(taken)]] + taken
        scored = [e.openai(lambda t: self.reading.tokenizer.decode([t])) for e in entries[:kept]]
        self.logprobs += scored
        return scored

    def close(self) -> Iterator[ReasoningDelta | TextDelta | ToolCallDelta]:
        """The reply is over: everything still held back is decided."""
        yield from self.events.feed(self.text, final=True)


def stop_at(text: str, stops: list[str], start: int) -> int | None:
    """Where the first stop string found in `text` from `start` begins (None: none is there)."""
    hits = [i for s in stops if s and (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def partial_stop(text: str, stops: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    return max((k for s in stops for k in range(len(s) - 1, 0, -1) if text.endswith(s[:k])), default=0)
