"""TEST DOUBLE: `ScriptedEngine` replays scripted raw replies instead of decoding with a model.

It is a `frontend.EngineLike`, as `Engine` is: front-end tests (LangChain, LlamaIndex, the server, the
bench) drive it through the same `stream`, without loading a model. Only the decoding is scripted
(and the stats, fixed numbers): requests are checked, replies are cut into events by the engine's
`ReplyEvents` and finished by its `finish.read_reply` (content, calls classed as OpenAI classes them,
`finish_reason`), so nothing of finishing is written twice. Replies are committed in `step`-character
rounds, as a real engine commits them in tokens; a scripted reply ends without an end-of-sequence token,
read as a reply cut at a stop string is.

The sampling keywords (`temperature`, `top_p`, `top_k`, `min_p`, `seed`, `logprobs`) are checked by
the engine's own `Sampling` and `check_logprobs` (a `SamplingError` naming the field, before any event)
and recorded in `requests`; the reply is the scripted one whatever they are. With `logprobs`, each
"token" (a `step`-character piece; the last takes the rest) gets a made-up `TokenLogprob` (-0.25; its
alternatives "alt1", "alt2", ... below it), in OpenAI's shape as the engine writes it, sent as a
`LogprobsDelta` in its round.

Given a `Reasoning` (formats/reasoning.py), replies reason as a `<think>` template's do: the block
streams as `ReasoningDelta`s and lands in `Generation.reasoning`; content and calls are read after it.
`chat_template_kwargs` and `reasoning_effort` are recorded in `requests`, not checked (there is no
template to check them against).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

from .chat import normalize_messages
from .engine import Event, Generation
from .events import CallPredicted, LogprobsDelta, ReplyEvents
from .finish import read_reply
from .formats import HermesFormat, Reasoning
from .request import ChatRequest
from .sampling import TokenLogprob, check_logprobs
from .stats import DecodeStats
from .tools import Tool, normalize_tools, resolve_tool_choice


#: Sampling settings every front-end refuses before decoding: (the field its error names, the settings,
#: a regex of its message). Each front-end's tests add what only it takes (`n`, penalties, ...).
BAD_SAMPLING = [
    ("temperature", {"temperature": -0.1}, r"temperature must be a number from 0 to 2 \(OpenAI's range.*, got -0.1"),
    ("temperature", {"temperature": 5}, r"temperature must be a number from 0 to 2 \(OpenAI's range.*, got 5"),
    ("top_p", {"top_p": 0}, r"top_p must be a number in \(0, 1\]"),
    ("top_k", {"top_k": -3}, "top_k must be >= 0"),
    ("min_p", {"min_p": 1.5}, r"min_p must be a number in \[0, 1\]"),
    ("seed", {"seed": 2 ** 64}, "seed must be an integer from"),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 21}, "top_logprobs must be an integer from 0 to 20"),
    ("top_logprobs", {"top_logprobs": 2}, "top_logprobs=2 needs logprobs=true"),
]

#: book_table(restaurant: str, people: int, time: str) as an OpenAI tool: the tool of `CALL_REPLIES`
BOOK_TABLE = {"type": "function", "function": {
    "name": "book_table", "description": "Book a table at a restaurant.",
    "parameters": {"type": "object", "properties": {"restaurant": {"type": "string"}, "people": {"type": "integer"},
                                                     "time": {"type": "string"}},
                   "required": ["restaurant", "people", "time"]}}}


def _book(arguments: str) -> str:
    return '<tool_call>\n{"name": "book_table", "arguments": ' + arguments + '}\n</tool_call>'


#: Replies (hermes text, as `ScriptedEngine` replays them) whose calls every front-end must class as
#: OpenAI does, and alike streamed and not: a call whose arguments parse but misfit the schema (a tool
#: call, its problem reported beside it), one whose arguments do not parse (an invalid call), and two
#: calls, the second a misfit.
CALL_REPLIES = {
    "misfit": "Booking it." + _book('{"restaurant": "Da Michele", "people": "4", "time": "19:30"}'),
    "unparseable": _book('{"restaurant": "Da Michele", "people": 4, "time": 19:30}'),
    "two_calls": _book('{"restaurant": "Da Michele", "people": 4, "time": "19:30"}') + "\n"
                 + _book('{"restaurant": "Pizzeria Bella", "people": "two", "time": "20:00"}'),
}


class ScriptedEngine:
    """Replays `replies`, one per request, in order (a `frontend.EngineLike`). `predictions`: reply k (in
    the order replayed) -> the calls its `CallPredicted` names, sent in round `predict_round` (a method
    other than "oospec" gets none, as the engine's: only oospec runs the sidecar)."""

    sidecar = None   # it has no sidecar (the server and the bench ask)
    max_batch = 1    # it replays one reply at a time

    def __init__(self, *replies: str, step: int = 4, model_name: str = "scripted-test-double",
                 reasoning: Reasoning | None = None, predictions: dict[int, list[dict]] | None = None,
                 predict_round: int = 1):
        self.fmt = HermesFormat()
        self.reasoning = reasoning  # how replies reason (None: they do not)
        self.model_name = model_name
        self.context_window = 4096
        self.replies = list(replies)
        self.step = step
        self.requests: list[dict] = []
        self.predictions = dict(predictions or {})
        self.predict_round = predict_round
        self._replayed = 0

    def stream(self, request, tools=None, *, hint: str | None = None, record_margins: bool = False, cancel=None,
               **settings) -> Iterator[Event]:
        """`Engine.stream`'s arguments; `cancel` is not polled (a scripted reply is replayed whole), and `hint`
        and `record_margins` change nothing (the replies are scripted; no margins are recorded)."""
        if not isinstance(request, ChatRequest):
            request = ChatRequest.build(request, tools, **settings)  # bad settings raise here, as the engine's do
        offered = _checked(request.messages, request.tools, request.tool_choice)
        top_logprobs = check_logprobs(request.logprobs)
        method, stop = request.method, request.stop
        sampling = {**dataclasses.asdict(request.sampling), "logprobs": request.logprobs}
        self.requests.append({"messages": request.messages, "tools": request.tools,
                              "tool_choice": request.tool_choice, "max_new_tokens": request.max_new_tokens,
                              "method": method, "stop": stop,
                              **{k: v for k in ("response_format", "prediction", "chat_template_kwargs",
                                                "reasoning_effort") if (v := getattr(request, k)) is not None},
                              **{k: v for k, v in sampling.items() if v is not None}})
        text = self.replies.pop(0)
        cuts = [i for s in stop or [] if (i := text.find(s)) >= 0]
        text = text[:min(cuts)] if cuts else text
        predicted = self.predictions.get(self._replayed) if method == "oospec" else None
        self._replayed += 1
        return self._replay(text, offered, method, top_logprobs, predicted)

    def _replay(self, text: str, offered: list[Tool], method: str, top_logprobs: int | None = None,
                predicted: list[dict] | None = None) -> Iterator[Event]:
        events = ReplyEvents(self.fmt, lambda i: f"call_scripted_{i}", self.reasoning)
        n = max(1, len(text) // self.step)
        pieces = [text[i * self.step:(i + 1) * self.step] for i in range(n - 1)] + [text[(n - 1) * self.step:]]
        scored = [] if top_logprobs is None else _scored(pieces, top_logprobs)
        if predicted is not None and self.predict_round == 0:
            yield CallPredicted(predicted)
        for round_, end in enumerate(range(self.step, len(text), self.step)):
            if predicted is not None and round_ + 1 == self.predict_round:
                yield CallPredicted(predicted)
            yield from events.feed(text[:end])
            if round_ < n - 1 and scored:
                yield LogprobsDelta([scored[round_]])
        yield from events.feed(text, final=True)
        if scored:
            yield LogprobsDelta([scored[-1]])
        read = read_reply(events, text, offered, "call_scripted", "stop")
        yield from events.ready_for(read["tool_calls"])
        stats = DecodeStats(method, prompt_tokens=11, new_tokens=n, target_forwards=3,
                            accepted_by_source={"schema": 5, "retrieval": 0, "hint": 2}, hint_bytes=40)
        yield Generation(text=text, token_ids=list(range(n)), stats=stats, prompt_tokens=11,
                         logprobs=None if top_logprobs is None else scored, **read)


def _checked(messages, tools, tool_choice) -> list[Tool]:
    """The request's checks that need no template, as the engine makes them; the tools offered."""
    normalize_messages(messages)
    offered = normalize_tools(tools)
    resolve_tool_choice(tool_choice, offered)
    return offered


def _scored(pieces: list[str], top: int) -> list[dict]:
    """A made-up logprobs entry per piece, as the engine writes one (`TokenLogprob.openai`): the piece at
    -0.25, and `top` alternatives, the piece itself and "alt1", "alt2", ... below it. The pieces are
    tokens 0..n-1 of the double's vocabulary, "alt<k>" token n+k."""
    n = len(pieces)
    text = lambda token: pieces[token] if token < n else f"alt{token - n}"  # noqa: E731
    return [TokenLogprob(i, -0.25, tuple((i if k == 0 else n + k, -0.25 * (k + 1)) for k in range(top))).openai(text)
            for i in range(n)]
