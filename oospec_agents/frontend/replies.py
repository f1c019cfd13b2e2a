"""What every front-end reads off a reply: its token counts (`Usage`), its calls as they grow (`CallsSoFar`),
the `parallel_tool_calls=False` rule (`ParallelToolCalls`), and its calls' problems (`call_problems`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from ..events import ToolCallDelta
from ..request import Generation

T = TypeVar("T")


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    accepted_prediction_tokens: int = 0  # of a `prediction`'s tokens, those in the reply (in order) ...
    rejected_prediction_tokens: int = 0  # ... and those not: OpenAI's two counts

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, gen: Generation) -> "Usage":
        s = gen.stats
        return cls(gen.prompt_tokens, len(gen.token_ids), s.cached_prompt_tokens, s.prediction_matched,
                   s.prediction_tokens - s.prediction_matched)

    @classmethod
    def of_choices(cls, gens: list[Generation]) -> "Usage":
        """Several choices of one prompt (`n`): the prompt counted once (the first choice's, with its
        cached tokens), the completion tokens and the prediction counts summed."""
        each = [cls.of(gen) for gen in gens]
        return cls(each[0].prompt_tokens, sum(u.completion_tokens for u in each), each[0].cached_prompt_tokens,
                   sum(u.accepted_prediction_tokens for u in each), sum(u.rejected_prediction_tokens for u in each))

    def openai(self) -> dict:
        """OpenAI's `usage` object."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_prompt_tokens},
                "completion_tokens_details": {"accepted_prediction_tokens": self.accepted_prediction_tokens,
                                              "rejected_prediction_tokens": self.rejected_prediction_tokens}}


class CallsSoFar:
    """Tool calls as they grow: feed it every `ToolCallDelta`; read `calls` at any time."""

    def __init__(self) -> None:
        self.calls: list[dict] = []   # per index: {"id", "name", "arguments": JSON text so far}

    def feed(self, delta: ToolCallDelta) -> dict:
        """Fold one delta in; returns the call it belongs to."""
        while len(self.calls) <= delta.index:
            self.calls.append({"id": None, "name": None, "arguments": ""})
        call = self.calls[delta.index]
        if delta.id is not None:
            call["id"] = delta.id
        if delta.name is not None:
            call["name"] = delta.name
        call["arguments"] += delta.arguments
        return call


@dataclass
class ParallelToolCalls:
    """The `parallel_tool_calls=False` rule, for every front-end: a reply keeps its first tool call only,
    in its stream and in its final message (OpenAI's `parallel_tool_calls`, which the server and
    ChatOoOSpec take; LlamaIndex's `allow_parallel_tool_calls`). One per reply: it remembers the id
    of the reply's first call as the stream shows it.

    - `keeps(delta)`: whether a stream sends a `ToolCallDelta` (those of the call at index 0).
    - `first(calls)`: of calls in the reply's order, the first (the calls so far, or a Generation's valid ones).
    - `shown(calls)`: of a Generation's calls, valid or invalid, the one the stream showed (by its id).
    With `allowed`, each keeps every call.
    """
    allowed: bool = True
    first_id: str | None = field(default=None, init=False)   # the id of the reply's first call, once seen

    @classmethod
    def openai(cls, parallel_tool_calls: bool | None) -> "ParallelToolCalls":
        """OpenAI's parameter: only False keeps one call (None, unset, keeps them all)."""
        return cls(parallel_tool_calls is not False)

    def keeps(self, delta: ToolCallDelta) -> bool:
        if delta.index == 0 and delta.id is not None:
            self.first_id = delta.id
        return self.allowed or delta.index == 0

    def first(self, calls: list[T]) -> list[T]:
        return calls if self.allowed else calls[:1]

    def shown(self, calls: list[dict]) -> list[dict]:
        return calls if self.allowed else [c for c in calls if c["id"] == self.first_id]


def call_problems(gen: Generation) -> list[dict]:
    """{"id", "name", "error"} per call of the reply that has a problem, in the reply's order: a tool call
    that misfits its schema (`Generation.tool_call_problems`), or an invalid call (why it cannot be read).
    Each front-end reports them beside the message's calls; the ids are the calls' own."""
    failed = gen.tool_call_problems + [{k: c[k] for k in ("id", "name", "error")} for c in gen.invalid_tool_calls]
    return sorted(failed, key=lambda c: int(c["id"].rsplit("_", 1)[1]))  # check_calls numbers them <prefix>_<i>
