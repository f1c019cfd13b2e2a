"""A chat completion as it is sent: the engine's events folded into OpenAI's chunks, and the same
replies' body (`ChatFold`, streaming.py's `Fold` for `/v1/chat/completions`).

`Completion` holds one request's `n` choices, one `Reply` each; a `Reply` turns its choice's events into
chunks and, from the same events, its part of the body. Which tool calls a reply keeps
(`parallel_tool_calls`) is the front-ends' one rule, `frontend.ParallelToolCalls`.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable

from .. import CallPredicted, Generation, LogprobsDelta, ReasoningDelta, TextDelta, ToolCallDelta
from ..frontend import CallsSoFar, ParallelToolCalls, Usage
from .errors import error_body
from .extension import Predictions
from .protocol import oospec_object
from .streaming import Fold


class Completion:
    """One request's replies, `n` choices of one id: each `Reply` folds its choice's events in. The
    stream's role chunks, its usage chunk, and the body with every choice are the completion's."""

    def __init__(self, model: str, replica: str, n: int = 1, parallel_tool_calls: bool | None = None,
                 logprobs: bool = False):
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model, self.replica = model, replica
        self.replies = [Reply(model, replica, ParallelToolCalls.openai(parallel_tool_calls), index=i,
                              logprobs=logprobs, completion=self) for i in range(n)]

    def first_chunks(self) -> list[dict]:
        return [reply.first_chunk() for reply in self.replies]

    def usage_chunk(self, gens: list) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": Usage.of_choices(gens).openai()}

    def body(self, gens: list) -> dict:
        """The whole reply: a choice per Generation, usage over them all (the prompt counted once), and
        the `oospec` object of choice 0, with one per choice under `"choices"` when there are several."""
        extra = oospec_object(gens[0], self.replies[0].calls, self.replica)
        if len(gens) > 1:
            extra["choices"] = [oospec_object(gen, reply.calls, self.replica)
                                for reply, gen in zip(self.replies, gens)]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [reply.choice(gen) for reply, gen in zip(self.replies, gens)],
                "usage": Usage.of_choices(gens).openai(), "oospec": extra}


class Reply:
    """One choice as it is sent: the chunks of a stream, or (aggregated from the same events) its part
    of the body. With `logprobs`, a streamed round's log-probabilities go in the chunk of that round's
    last text or call delta (`hold`/`logprobs`), as OpenAI sends a token's logprobs with its text."""

    def __init__(self, model: str, replica: str, parallel: ParallelToolCalls | None = None, *, index: int = 0,
                 logprobs: bool = False, completion: Completion | None = None):
        self.id = completion.id if completion else "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = completion.created if completion else int(time.time())
        self.model = model
        self.replica = replica
        self.index = index
        self.parallel = parallel or ParallelToolCalls()  # parallel_tool_calls=false: the first call only
        self.wants_logprobs = logprobs
        self.content = ""
        self.reasoning = ""                     # the reasoning sent so far
        self.logprobs_content: list[dict] = []  # every entry sent, with logprobs asked for
        self._calls = CallsSoFar()
        self._held: dict | None = None          # a chunk waiting for its round's logprobs

    @property
    def calls(self) -> list[dict]:
        """{"id", "name", "arguments": JSON text as generated} per call sent."""
        return self._calls.calls

    def chunk(self, delta: dict, finish_reason: str | None = None, **extra) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": self.index, "delta": delta, "finish_reason": finish_reason}], **extra}

    def first_chunk(self) -> dict:
        return self.chunk({"role": "assistant", "content": ""})

    def text(self, text: str) -> dict:
        self.content += text
        return self.chunk({"content": text})

    def reason(self, text: str) -> dict:
        self.reasoning += text
        return self.chunk({"reasoning_content": text})

    def tool_call(self, ev) -> dict | None:
        """The chunk for one ToolCallDelta (None when it belongs to a call that is not kept)."""
        if not self.parallel.keeps(ev):
            return None
        self._calls.feed(ev)
        if ev.id is not None:  # a call's first event: its id and whole name
            fn = {"name": ev.name or "", "arguments": ev.arguments}
            return self.chunk({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function", "function": fn}]})
        return self.chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]})

    def hold(self, chunk: dict | None) -> list[dict]:
        """The chunks to send now, given a text or call chunk: with logprobs asked for, the chunk is held
        until its round's `LogprobsDelta` (the one before it goes out); otherwise it goes at once."""
        if chunk is None:
            return []
        if not self.wants_logprobs:
            return [chunk]
        sent, self._held = self.release(), chunk
        return sent

    def logprobs(self, ev) -> list[dict]:
        """The chunk that carries a round's log-probabilities: the held chunk, or one with an empty delta."""
        self.logprobs_content += ev.content
        chunk, self._held = self._held or self.chunk({}), None
        chunk["choices"][0]["logprobs"] = {"content": ev.content, "refusal": None}
        return [chunk]

    def release(self) -> list[dict]:
        held, self._held = self._held, None
        return [] if held is None else [held]

    def last_chunk(self, gen) -> dict:
        return self.chunk({}, gen.finish_reason, oospec=oospec_object(gen, self.calls, self.replica))

    def choice(self, gen) -> dict:
        """This choice in the body: its message (with `reasoning_content` where the reply reasoned),
        finish_reason and logprobs."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or (None if self.calls else "")}
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        if self.calls:
            message["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"] or "", "arguments": c["arguments"]}}
                                     for c in self.calls]
        logprobs = {"content": gen.logprobs or [], "refusal": None} if self.wants_logprobs else None
        return {"index": self.index, "message": message, "finish_reason": gen.finish_reason, "logprobs": logprobs}


class ChatFold(Fold):
    """One chat request's engine events folded into its `Completion`: `apply(event)` returns the chunks
    to send now; `gens` collects the choices' Generations (choice i's events follow i of them).
    `first_token()` is called at the request's first reasoning, text or call event (the time-to-first-token
    metric). `predictions` is the `oospec.predicted_calls` extension's record (None: off, and a
    `CallPredicted` sends nothing, as a `ToolCallReady` never does: a stock client sees no new chunk).
    `usage`: the stream ends with the usage chunk (`stream_options.include_usage`)."""

    def __init__(self, completion: Completion, first_token: Callable[[], None] = lambda: None,
                 predictions: Predictions | None = None, usage: bool = False):
        super().__init__(len(completion.replies))
        self.completion, self.first_token, self.predictions, self.usage = completion, first_token, predictions, usage

    def apply(self, item) -> list[dict]:
        choice = len(self.gens)
        reply = self.completion.replies[choice]
        if isinstance(item, (ReasoningDelta, TextDelta, ToolCallDelta)):
            if not self.gens and not reply.reasoning and not reply.content and not reply.calls:
                self.first_token()
            if isinstance(item, ToolCallDelta):
                return reply.hold(reply.tool_call(item))
            return reply.hold(reply.text(item.text) if isinstance(item, TextDelta) else reply.reason(item.text))
        if isinstance(item, LogprobsDelta):
            return reply.logprobs(item)
        if isinstance(item, CallPredicted) and self.predictions is not None:
            return [self.predictions.chunk(self.completion, choice, item)]
        if not isinstance(item, Generation):  # ToolCallReady, an unasked CallPredicted: nothing on the wire
            return []
        self.gens.append(item)  # the choice's Generation
        last = reply.last_chunk(item)
        if self.predictions is not None:
            self.predictions.closing(choice, last["oospec"])
        return reply.release() + [last]

    def opening(self) -> list[dict]:
        return self.completion.first_chunks()

    def ending(self) -> list[dict]:
        return [self.completion.usage_chunk(self.gens)] if self.usage and self.complete else []

    def failed(self, message: str) -> list[dict]:
        return [error_body(500, message)]

    def trailer(self) -> list[str]:
        return ["[DONE]"]

    def encode(self, event: dict | str) -> str:
        return sse(event)

    def body(self) -> dict:
        """The non-streamed reply; with the extension, each choice's `oospec` object lists its predictions."""
        body = self.completion.body(self.gens)
        if self.predictions is not None:
            extra = body["oospec"]
            for choice, oospec in enumerate(extra.get("choices", [extra])):
                self.predictions.closing(choice, oospec)
            if "choices" in extra:
                self.predictions.closing(0, extra)
        return body


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"
