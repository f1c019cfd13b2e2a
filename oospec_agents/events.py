"""What `Engine.stream` yields: typed events cut from the committed text, round by round.

The target commits tokens losslessly, so every committed character is final and can be sent the
moment it is committed. `ReplyEvents` turns the text committed so far into the events that are new:

- `ReasoningDelta`: the reasoning block's text, without its markers (formats/reasoning.py). A tail
  that may still become the closing marker is held back, and so is whitespace the reasoning strips.
  Content and calls are read from the text after the block, once it has closed.
- `TextDelta`: reply content outside tool calls. A tail that may still become a call opener is held
  back, and so is whitespace that the final content strips.
- `ToolCallDelta`: the first event of call `index` carries its `id` and complete `name`
  (`arguments=""`); every later one carries only a fragment of the arguments JSON text as the
  target wrote it. Only an unfinished JSON string escape is held back (an unfinished UTF-8
  character and a possible stop string never reach this module: `reply.Reply.commit` cuts them first).

Joined, the `ReasoningDelta`s equal `Generation.reasoning`, the `TextDelta`s equal
`Generation.content` and the fragments of call `i` equal its arguments text: `json.loads` of it is
`Generation.tool_calls[...]["arguments"]`, and for an invalid call it is the `arguments` string of
its `invalid_tool_calls` entry.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from .formats.reasoning import Reasoning
from .jsonscan import CallSoFar, read_call  # read_call: what an open call's JSON says so far (re-exported)


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    id: str | None
    name: str | None
    arguments: str = ""


@dataclass(frozen=True)
class CallPredicted:
    """The sidecar's predicted call(s), in the round its hint is first read (and again when a follow-up
    wave replaces it): `calls` as `{"name", "arguments": dict}`. A prediction, never a verified call:
    the target has not written it, and may write another. `confidence`: the wave's calibrated
    probability that the whole call is exact, or None where the sidecar gives none. Consumers that
    start work from it (speculative.py) must drop that work when the verified call differs."""
    calls: list
    confidence: float | None = None


@dataclass(frozen=True)
class ToolCallReady:
    """A verified call whose arguments' JSON has closed, in the round that commits its last argument
    token, before the reply ends: `arguments` parsed (a dict). One per entry of
    `Generation.tool_calls`, with the same `id`, `name` and `arguments`, in the same order; a reply cut
    off after the arguments but before the call's closing markup (`max_new_tokens`, a stop string) leaves
    that call unterminated, in `invalid_tool_calls`: settle speculative work with the Generation's calls."""
    index: int
    id: str
    name: str
    arguments: dict


@dataclass(frozen=True)
class LogprobsDelta:
    """With `logprobs` asked for: the committed tokens' log-probabilities, in OpenAI's shape (`{"token",
    "logprob", "bytes", "top_logprobs"}` each), in the round that commits them. Joined, they are
    `Generation.logprobs`."""
    content: list


class ReplyEvents:
    """Turns the committed text of a reply into its new events, one call of `feed` per round."""

    def __init__(self, fmt, call_id: Callable[[int], str], reasoning: Reasoning | None = None):
        self.fmt = fmt
        self.reasoning = reasoning         # the reply's reasoning block, when its template reasons
        self._call_id = call_id
        self._args_keys = tuple(dict.fromkeys((fmt.args_key, "arguments", "parameters")))
        self.thought = ""                  # reasoning sent so far
        self.content = ""                  # content sent so far
        self.calls: list[dict] = []        # per call: {"announced", "sent": args text sent, "done"}
        self.ready: dict[str, ToolCallReady] = {}  # the ToolCallReady sent, by call id

    def read(self, text: str, final: bool = False) -> tuple[str | None, str | None]:
        """(reasoning, answer) of `text`: `Reasoning.split`, or (None, text) for a template that does not reason."""
        return (None, text) if self.reasoning is None else self.reasoning.split(text, final)

    def feed(self, text: str, final: bool = False) -> list[ReasoningDelta | TextDelta | ToolCallDelta]:
        """The events that `text` (all the reply's committed text so far) adds. With `final`, the
        reply is over: everything left is sent, so the joins equal the final `Generation`."""
        events: list[ReasoningDelta | TextDelta | ToolCallDelta] = []
        thought, text = self.read(text, final)
        if thought is not None and (visible := thought.strip()).startswith(self.thought) \
                and len(visible) > len(self.thought):
            events.append(ReasoningDelta(visible[len(self.thought):]))
            self.thought = visible
        if text is None:  # still reasoning (or not yet known whether it will)
            return events
        segments = self.fmt.segments(text)
        held = 0 if final else self.fmt.undecided_tail(text)
        outside, index = "", 0
        for k, seg in enumerate(segments):
            if seg[0] == "text":
                outside += seg[1][:len(seg[1]) - held] if k == len(segments) - 1 else seg[1]
                visible = outside.strip() if final else outside.lstrip().rstrip()
                if visible.startswith(self.content) and len(visible) > len(self.content):
                    events.append(TextDelta(visible[len(self.content):]))
                    self.content = visible
            else:
                events += self._call(index, seg[1], final)
                index += 1
        return events

    def _call(self, index: int, raw: str, final: bool) -> list[ToolCallDelta]:
        if index == len(self.calls):
            self.calls.append({"announced": False, "sent": "", "done": False})
        state = self.calls[index]
        if state["done"]:  # a call whose arguments have all been sent: nothing to rescan each round
            return []
        so_far = read_call(raw, self._args_keys)
        args = self.arguments_text(raw, so_far, final)
        events = []
        if not state["announced"] and (so_far.name is not None or final):
            state["announced"] = True
            events.append(ToolCallDelta(index, self._call_id(index), so_far.name, ""))
        if state["announced"] and args.startswith(state["sent"]) and len(args) > len(state["sent"]):
            events.append(ToolCallDelta(index, None, None, args[len(state["sent"]):]))
            state["sent"] = args
        state["done"] = state["announced"] and so_far.args_end is not None and state["sent"] == args
        if state["done"] and so_far.name is not None:  # the arguments are final: the call is ready to run
            events += self._ready(ToolCallReady(index, self._call_id(index), so_far.name, _json_object(args)))
        return events

    def _ready(self, event: ToolCallReady) -> list[ToolCallReady]:
        if event.arguments is None or event.id in self.ready:
            return []
        self.ready[event.id] = event
        return [event]

    def ready_for(self, tool_calls: list[dict]) -> list[ToolCallReady]:
        """The `ToolCallReady`s of a finished reply's `tool_calls` that the rounds did not send (a call
        whose arguments were read only at the end, in a format the scanner does not read as JSON), so
        that each entry of `Generation.tool_calls` has had exactly one, before the `Generation`."""
        events = []
        for i, call in enumerate(tool_calls):
            index = int(call["id"].rsplit("_", 1)[1]) if call["id"].rsplit("_", 1)[-1].isdigit() else i
            events += self._ready(ToolCallReady(index, call["id"], call["name"], call["arguments"]))
        return events

    @staticmethod
    def arguments_text(raw: str, so_far: CallSoFar, final: bool) -> str:
        """The arguments text of one call: sendable so far, or (with `final`) what the call ends as."""
        if so_far.args_start is None:
            if not final:
                return ""
            # no arguments key: a closed call means no arguments; anything else stays raw text
            return "{}" if so_far.closed else raw.strip()
        end = so_far.args_end if so_far.args_end is not None else (len(raw) if final else so_far.safe_end)
        return raw[so_far.args_start:end]

    def settle(self, text: str, parsed: list[dict]) -> list[dict]:
        """`fmt.parse(text)`'s calls, each invalid one's arguments made the text its fragments joined
        to (what the target wrote for them), so the stream and the final Generation agree."""
        streamed = [self.arguments_text(seg[1], read_call(seg[1], self._args_keys), True)
                    for seg in self.fmt.segments(text) if seg[0] == "call"]
        if len(streamed) != len(parsed):
            return parsed
        return [dict(c, arguments=a) if "error" in c else c for c, a in zip(parsed, streamed)]



def _json_object(text: str) -> dict | None:
    """`text` parsed when it is a JSON object, else None (such a call is no runnable call)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
