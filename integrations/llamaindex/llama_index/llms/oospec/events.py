"""The speculative tools' events, as LlamaIndex instrumentation events.

`OoOSpec` dispatches them through LlamaIndex's instrumentation dispatcher (`llama_index.core.instrumentation`)
while a reply decodes, so any `BaseEventHandler` attached to the root dispatcher sees them, beside the
LLM's own start/end events. They say nothing the returned `ChatResponse`s do not say by the reply's end:
they say it earlier, so that an agent can start a read-only tool before the reply is written
(speculative.py). Each carries `llm_id`, `id()` of the OoOSpec that dispatched it, so that a handler can
keep to one LLM's replies.

- `CallPredictedEvent`: the sidecar's predicted call(s) (oospec_agents.events.CallPredicted). A
  prediction, never a verified call: the target may write another.
- `ToolCallReadyEvent`: a verified call whose arguments' JSON has closed, before the reply ends
  (oospec_agents.events.ToolCallReady), named as LlamaIndex's `ToolSelection` names a call. Only for the
  calls the message keeps: without `allow_parallel_tool_calls`, the first.
- `ReplyEndEvent`: the reply is over; its verified calls as the message keeps them, as
  `get_tool_calls_from_response` gives them (what an agent runs next).

`dispatching` dispatches them from the engine's event stream.
"""
from __future__ import annotations

from contextlib import closing
from typing import Any, Dict, Iterator, List, Optional

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.llms.llm import ToolSelection
from oospec_agents import CallPredicted, Generation, ToolCallReady
from oospec_agents.engine import Event
from oospec_agents.frontend import ParallelToolCalls

#: The dispatcher OoOSpec dispatches these events through; they propagate to the root dispatcher too.
dispatcher = get_dispatcher(__name__)


class CallPredictedEvent(BaseEvent):
    """The sidecar's predicted call(s), in the round its hint is first read; not a verified call."""

    calls: List[Dict[str, Any]] = Field(description='The predicted calls, each {"name", "arguments": dict}.')
    confidence: Optional[float] = Field(
        default=None, description="The wave's calibrated probability that the whole call is exact, or None.")
    llm_id: int = Field(description="id() of the OoOSpec whose reply this is.")

    @classmethod
    def class_name(cls) -> str:
        return "CallPredictedEvent"


class ToolCallReadyEvent(BaseEvent):
    """A verified call whose arguments are complete, dispatched before the reply ends."""

    index: int = Field(description="The call's place in the reply (0 for the first).")
    tool_id: str = Field(description="The call's id, as its ToolCallBlock's tool_call_id.")
    tool_name: str = Field(description="The tool called.")
    tool_kwargs: Dict[str, Any] = Field(description="The call's arguments, parsed.")
    llm_id: int = Field(description="id() of the OoOSpec whose reply this is.")

    @classmethod
    def class_name(cls) -> str:
        return "ToolCallReadyEvent"


class ReplyEndEvent(BaseEvent):
    """A reply is over: the verified calls its message keeps (none for a reply that calls no tool)."""

    tool_calls: List[ToolSelection] = Field(default_factory=list, description="The reply's tool calls.")
    llm_id: int = Field(description="id() of the OoOSpec whose reply this is.")

    @classmethod
    def class_name(cls) -> str:
        return "ReplyEndEvent"


def dispatching(events: Iterator[Event], parallel: ParallelToolCalls, llm_id: int) -> Iterator[Event]:
    """The engine's events, passed on unchanged, with these events dispatched on the way (as OoOSpec
    `llm_id`'s), each before the engine event it comes from is passed on: the reply's ReplyEndEvent
    before its Generation. Of the ToolCallReadys (one per `Generation.tool_calls` entry, in order),
    those of the calls the message keeps: all, or the first."""
    with closing(events):
        ready = 0
        for event in events:
            if isinstance(event, CallPredicted):
                dispatcher.event(CallPredictedEvent(calls=event.calls, confidence=event.confidence, llm_id=llm_id))
            elif isinstance(event, ToolCallReady):
                if parallel.allowed or ready == 0:
                    dispatcher.event(ToolCallReadyEvent(index=event.index, tool_id=event.id, tool_name=event.name,
                                                        tool_kwargs=event.arguments, llm_id=llm_id))
                ready += 1
            elif isinstance(event, Generation):
                calls = [ToolSelection(tool_id=c["id"], tool_name=c["name"], tool_kwargs=c["arguments"])
                         for c in parallel.first(event.tool_calls)]
                dispatcher.event(ReplyEndEvent(tool_calls=calls, llm_id=llm_id))
            yield event
