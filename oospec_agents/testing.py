"""TEST DOUBLE: `ScriptedEngine` replays scripted raw replies instead of decoding with a model.

Only the decoding is faked. Requests are checked, replies are cut into events, parsed and validated
by the engine's own code, so front-end tests (LangChain, LlamaIndex, the server) exercise the real
event stream without loading a model. Replies are committed in `step`-character rounds, as a real
engine commits them in tokens.

The sampling keywords (`temperature`, `top_p`, `top_k`, `min_p`, `seed`, `logprobs`) are checked as the
engine checks them (a `SamplingError` naming the field, before any event) and recorded in `requests`;
the reply is the scripted one whatever they are. With `logprobs`, each "token" (a `step`-character
piece; the last takes the rest) gets a made-up entry in OpenAI's shape, sent as a `LogprobsDelta` in
its round, as the engine sends them.

Given a `Reasoning` (formats/reasoning.py), replies reason as a `<think>` template's do: the block
streams as `ReasoningDelta`s and lands in `Generation.reasoning`; content and calls are read after it.
`chat_template_kwargs` and `reasoning_effort` are recorded in `requests`, not checked (there is no
template to check them against).
"""
from __future__ import annotations

from typing import Iterator

from .engine import Engine, Event, Generation
from .events import CallPredicted, LogprobsDelta, ReplyEvents
from .formats import HermesFormat, Reasoning
from .sampling import Sampling, check_logprobs
from .stats import DecodeStats
from .tools import check_calls


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


class ScriptedEngine(Engine):
    def __init__(self, *replies: str, step: int = 4, model_name: str = "scripted-test-double",
                 reasoning: Reasoning | None = None, predictions: dict[int, list[dict]] | None = None,
                 predict_round: int = 1):
        # no super().__init__: there is no model to load
        self.fmt = HermesFormat()
        self.reasoning = reasoning  # how replies reason (None: they do not)
        self.native_tools = False
        self.model_name = model_name
        self.context_window = 4096
        self.replies = list(replies)
        self.step = step
        self.requests: list[dict] = []
        # reply k (in the order replayed) -> the calls its `CallPredicted` names, sent in round `predict_round`
        # (a method other than "oospec" gets none, as the engine's: only oospec runs the sidecar)
        self.predictions = dict(predictions or {})
        self.predict_round = predict_round
        self._replayed = 0

    def prepare(self, messages, tools=None, tool_choice="auto", max_new_tokens: int = 256, stop=None):
        from .chat import normalize_messages
        from .tools import normalize_tools, resolve_tool_choice
        msgs, offered = normalize_messages(messages), normalize_tools(tools)
        resolve_tool_choice(tool_choice, offered)
        return msgs, offered

    def stream(self, messages, tools=None, *, tool_choice="auto", max_new_tokens=256, method="oospec",
               stop=None, temperature=None, top_p=None, top_k=None, min_p=None, seed=None, logprobs=None,
               **kw) -> Iterator[Event]:
        _, offered = self.prepare(messages, tools, tool_choice, max_new_tokens, stop)
        Sampling(temperature, top_p, top_k, min_p, seed)  # bad settings raise here, as the engine's do
        top_logprobs = check_logprobs(logprobs)
        sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p, "seed": seed,
                    "logprobs": logprobs}
        self.requests.append({"messages": messages, "tools": tools, "tool_choice": tool_choice,
                              "max_new_tokens": max_new_tokens, "method": method, "stop": stop,
                              **{k: v for k, v in kw.items() if k in ("response_format", "prediction",
                                                                      "chat_template_kwargs", "reasoning_effort")},
                              **{k: v for k, v in sampling.items() if v is not None}})
        text = self.replies.pop(0)
        cuts = [i for s in stop or [] if (i := text.find(s)) >= 0]
        text = text[:min(cuts)] if cuts else text
        predicted = self.predictions.get(self._replayed) if method == "oospec" else None
        self._replayed += 1
        return self._replay(text, offered, method, top_logprobs, predicted)

    def _replay(self, text: str, offered, method: str, top_logprobs: int | None = None,
                predicted: list[dict] | None = None) -> Iterator[Event]:
        events = ReplyEvents(self.fmt, lambda i: f"call_scripted_{i}", self.reasoning)
        n = max(1, len(text) // self.step)
        pieces = [text[i * self.step:(i + 1) * self.step] for i in range(n - 1)] + [text[(n - 1) * self.step:]]
        scored = [] if top_logprobs is None else [_entry(piece, top_logprobs) for piece in pieces]
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
        thought, answer = events.read(text, final=True)
        content, parsed = self.fmt.parse(answer)
        calls, invalid, problems = check_calls(events.settle(answer, parsed), offered, id_prefix="call_scripted")
        yield from events.ready_for(calls)
        stats = DecodeStats(method, prompt_tokens=11, new_tokens=n, target_forwards=3,
                            accepted_by_source={"schema": 5, "retrieval": 0, "hint": 2}, hint_bytes=40)
        yield Generation(text=text, token_ids=list(range(n)), tool_calls=calls, invalid_tool_calls=invalid,
                         stats=stats, content=content, finish_reason="tool_calls" if calls or invalid else "stop",
                         prompt_tokens=11, logprobs=None if top_logprobs is None else scored,
                         tool_call_problems=problems, reasoning=None if thought is None else thought.strip())


def _entry(token: str, top: int) -> dict:
    """A made-up logprobs entry in OpenAI's shape: the token at -0.25, and `top` alternatives."""
    def one(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
    return one(token, -0.25) | {"top_logprobs": [one(token if k == 0 else f"alt{k}", -0.25 * (k + 1))
                                                 for k in range(top)]}
