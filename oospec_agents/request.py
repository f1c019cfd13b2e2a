"""A request's state, in one place: start here to see what a reply carries while it decodes.

`Prepared` is the request as `Engine.prepare` checked and rendered it (immutable). `RequestState` is
everything one reply's decode loop owns, built once when the reply starts (`decode.py`) and dropped
when it ends: the prepared request, the drafters' view of the reply (`state`, a `ReplyState`: the
prompt and committed ids, the text, the hint, the retrieval pool), the events it streams, its stats,
its hint session, its seat at the target, its KV cache, how it picks tokens, and the committed side
(`commit`: stop strings, `max_new_tokens`, logprobs, events). `Generation` is the finished reply.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Generator, Iterator, Union

from . import deterministic as det
from .drafters import ReplyState, ReplyText
from .events import CallPredicted, LogprobsDelta, ReasoningDelta, ReplyEvents, TextDelta, ToolCallDelta, ToolCallReady
from .formats import Reasoning
from .grammar import Guide
from .sampling import Choice, Sampling, TokenLogprob
from .sidecar.session import HintSession
from .stats import DecodeStats
from .tools import Tool

__all__ = ["Event", "Generation", "Prepared", "RequestState", "partial_stop", "stop_at"]


@dataclass
class Generation:
    """One reply. Its calls are classed as OpenAI classes them (`tools.CheckedCalls`): a call whose
    arguments parse as a JSON object is in `tool_calls`, even when it misfits its tool's schema or names
    a tool that was not offered, and that problem is reported beside it in `tool_call_problems`
    ({"id" of the call, "name", "error": the validator's message}); only a call that cannot be read
    (arguments that do not parse or are no object, a call cut off) is in `invalid_tool_calls`. Under
    `strict` the calls fit their schemas. `finish_reason` is "length" when `max_new_tokens` cut the
    reply off; else "tool_calls" when it holds any call (valid, misfit or invalid), else "stop".
    Where the template reasons, `reasoning` is the reply's reasoning block without its markers, and
    content and calls are read from the text after it (a reply cut off while reasoning has none)."""
    text: str                       # the whole assistant reply as generated, forced opener included
    token_ids: list[int]            # the new tokens only (after `Engine.prompt_ids`)
    tool_calls: list[dict]          # {"id", "name", "arguments": dict}, each checked against its schema
    invalid_tool_calls: list[dict]  # {"id", "name", "arguments": str, "error"}
    stats: DecodeStats
    content: str = ""               # the reply's text outside tool calls
    finish_reason: str = "stop"     # "stop" | "length" | "tool_calls"
    prompt_tokens: int = 0
    logprobs: list[dict] | None = None  # with `logprobs`: per new token, OpenAI's {"token", "logprob", ...}
    tool_call_problems: list[dict] = field(default_factory=list)  # {"id", "name", "error"} per misfit call
    reasoning: str | None = None    # the reasoning block's text; None when the reply has none


Event = Union[ReasoningDelta, TextDelta, ToolCallDelta, ToolCallReady, CallPredicted, LogprobsDelta, Generation]


@dataclass(frozen=True)
class Prepared:
    """A request checked and rendered: what the decode loop needs, and nothing it has to look up.
    Immutable: the decode loop keeps what changes in its `RequestState` (a strict reply's grammar
    state, `guide`, advances as the reply's tokens are committed)."""
    messages: list[dict]
    tools: list[Tool]
    choice: tuple[str, str | None]
    prefix: str                     # assistant text forced by tool_choice in the prompt (none after reasoning)
    prompt_ids: list[int]
    max_new_tokens: int
    stop: list[str] = field(default_factory=list)
    guide: Guide | None = None      # the reply's grammar state under strict (grammar.py), else None
    sampling: Sampling = field(default_factory=Sampling)  # greedy unless it has a temperature
    top_logprobs: int | None = None  # logprobs asked for: alternatives per token (None: none asked)
    reasoning: Reasoning | None = None  # how the reply reasons (formats/reasoning.py); None: it does not
    tool_s: float | None = None     # the mean expected seconds of the speculative tools on offer (None: none known)


@dataclass(eq=False)
class RequestState:
    """One reply while it decodes, owned by its decode loop (decode.py). The loop's steps take it and
    return what they decided; `commit` is the one place the reply's tokens are written."""
    req: Prepared
    method: str                     # "ar" | "toolspec" | "oospec"
    state: ReplyState               # what the drafters read: prompt + committed ids, text, hint, pool
    events: ReplyEvents             # the stream's events, read from the committed text
    stats: DecodeStats
    decode: ReplyText               # token ids -> the reply's text
    eos: set[int]
    call_id_prefix: str             # the reply's calls are `{call_id_prefix}_{i}`
    seat: object                    # its place at the target (batching.Seat)
    choose: Choice | None = None    # what picks the tokens (None: the plain argmax); it holds their logprobs
    hint_text: str | None = None    # a fixed hint the caller gave in place of the sidecar's
    cancel: threading.Event | None = None
    hints: HintSession | None = None  # the sidecar's hint for this reply, while it may come
    cache: object = None            # the reply's KV cache (from the prefix cache, or new)
    shapes: det.Shapes | None = None  # deterministic mode: the shapes of its decode forwards
    finish: str | None = None       # "stop" | "length" once the reply is over
    logprobs: list[dict] = field(default_factory=list)  # OpenAI's entry per committed token, when asked for
    predictions: list[dict] = field(default_factory=list)  # every call the reply's hints predicted

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

    def commit(self, pending: list[int], logits) -> Generator[Event, None, int]:
        """Commit what the last forward decided, check every stop condition, and yield the new events;
        returns how many of `pending` were committed (`max_new_tokens` or an end of sequence may cut it).
        `logits` are the rows that chose the last of `pending`; the tokens before them (and all of them
        when `logits` is None) were forced by the grammar: their margin is infinite, their logprob 0."""
        req, ids, stats = self.req, self.state.ids, self.stats
        if stats.margins is not None:
            rows = 0 if logits is None else len(logits)
            stats.margins += [float("inf")] * max(0, len(pending) - rows)
            if rows:
                top2 = logits.float().topk(2, dim=-1).values
                stats.margins += (top2[:, 0] - top2[:, 1]).tolist()[:len(pending)]
        before = len(ids)
        for t in pending[:req.max_new_tokens - self.n_new]:
            ids.append(t)
            if t in self.eos:
                self.finish = "stop"
                break
        scored = self._logprobs(pending, len(ids) - before, logits is not None)
        text = req.prefix + self.decode(ids[self.state.n_prompt:])
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

    def _logprobs(self, pending: list[int], kept: int, chosen: bool) -> list[dict]:
        """OpenAI's logprobs entries of the `kept` tokens just committed (when asked for): what `choose`
        recorded for the tokens it chose, 0 for the tokens a grammar forced before them."""
        if self.req.top_logprobs is None:
            return []
        taken = self.choose.take() if chosen else []
        entries = [TokenLogprob(t, 0.0) for t in pending[:len(pending) - len(taken)]] + taken
        scored = [e.openai(lambda t: self.decode.tokenizer.decode([t])) for e in entries[:kept]]
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
