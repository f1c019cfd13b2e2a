"""The engine's events as LlamaIndex `ChatResponse`s: `OoOSpec`'s stream, and the reply `chat` returns.

Each streamed ChatResponse carries the whole message so far (and its `logprobs` so far); a reasoning
target's reasoning is a `ThinkingBlock`, its new piece in `additional_kwargs["thinking_delta"]`, as
llama-index-llms-ollama and -openai give them. The last response, and `chat`'s, is `final_response`.
"""
from __future__ import annotations

from contextlib import closing
from dataclasses import asdict
from typing import Iterator, List, Optional

import pydantic_core
from llama_index.core.base.llms.types import ChatResponse, ChatResponseGen, LogProb
from oospec_agents import Generation, LogprobsDelta, ReasoningDelta, TextDelta, ToolCallDelta
from oospec_agents.engine import Event
from oospec_agents.frontend import CallsSoFar, ParallelToolCalls, Usage

from .messages import assistant_message


def responses(events: Iterator[Event], parallel: ParallelToolCalls) -> ChatResponseGen:
    """One ChatResponse per engine event, each carrying the whole message so far: its reasoning (a
    ThinkingBlock; the new piece in `additional_kwargs["thinking_delta"]`, where LlamaIndex's agents
    read it), its text, and a ToolCallBlock per call begun, whose `tool_kwargs` grow as argument
    fragments arrive. The last one (`final_response`) carries the validated calls and the raw reply."""
    # Closed with this generator, so that a stream abandoned early releases the engine at once.
    with closing(events):
        thought, content, calls, scored = "", "", CallsSoFar(), []
        for event in events:
            if isinstance(event, Generation):
                yield final_response(event, parallel, delta="")
                return
            if not isinstance(event, (ReasoningDelta, TextDelta, LogprobsDelta, ToolCallDelta)):
                continue  # CallPredicted, ToolCallReady: nothing the message shows
            delta, extra = "", {}
            if isinstance(event, ReasoningDelta):
                thought, extra = thought + event.text, {"thinking_delta": event.text}
            elif isinstance(event, TextDelta):
                content, delta = content + event.text, event.text
            elif isinstance(event, LogprobsDelta):
                scored += event.content
            elif isinstance(event, ToolCallDelta):
                call = calls.feed(event)
                call["kwargs"] = _partial_kwargs(call["arguments"], call.get("kwargs", {}))
            so_far = [dict(c, arguments=c["kwargs"]) for c in calls.calls]
            yield ChatResponse(message=assistant_message(content, parallel.first(so_far), thought),
                               delta=delta, logprobs=_logprobs(scored) if scored else None,
                               additional_kwargs=extra)


def final_response(generation: Generation, parallel: ParallelToolCalls, delta: Optional[str] = None) -> ChatResponse:
    """The reply as `chat` returns it and `stream_chat` ends with. Its calls are classed as LlamaIndex's
    OpenAI LLM reads OpenAI's: each whose arguments parse is a ToolCallBlock, a schema misfit too, whose
    problem is in `message.additional_kwargs["tool_call_problems"]` ({"id", "name", "error"}, present
    when a call of the message has one); a call whose arguments do not parse is left out of the
    message, reported in `raw["invalid_tool_calls"]` with the reason. The reasoning is a ThinkingBlock
    before the text, as the stream's last message has it."""
    # without allow_parallel_tool_calls, the first call only, as llama-index-llms-openai's
    # force_single_tool_call keeps one
    calls = parallel.first(generation.tool_calls)
    ids = {c["id"] for c in calls}
    problems = [p for p in generation.tool_call_problems if p["id"] in ids]
    usage = Usage.of(generation)
    raw = {
        "usage": {**asdict(usage), "total_tokens": usage.total_tokens},
        "finish_reason": generation.finish_reason,
        "text": generation.text,
        "invalid_tool_calls": generation.invalid_tool_calls,
        "stats": generation.stats.to_dict(),
        "sidecar": generation.stats.sidecar,
    }
    logprobs = None if generation.logprobs is None else _logprobs(generation.logprobs)
    message = assistant_message(generation.content, calls, generation.reasoning)
    if problems:
        message.additional_kwargs["tool_call_problems"] = problems
    return ChatResponse(message=message, delta=delta, raw=raw, logprobs=logprobs)


def _logprobs(entries: List[dict]) -> List[List[LogProb]]:
    """OpenAI's logprobs entries as LlamaIndex's: per token, its `top_logprobs` alternatives (as
    llama-index-llms-openai converts them), or the chosen token alone when no alternatives were asked for."""
    def one(entry: dict) -> LogProb:
        return LogProb(token=entry["token"], logprob=entry["logprob"], bytes=entry["bytes"])
    return [[one(alt) for alt in entry["top_logprobs"]] or [one(entry)] for entry in entries]


def _partial_kwargs(arguments: str, before: dict) -> dict:
    """The arguments an unfinished JSON text holds so far, an unfinished string value included.

    pydantic-core's partial mode, not LlamaIndex's `parse_partial_json` (which llama-index-llms-openai
    uses): that one reads `{"city": "San` as an unfinished key and gives `{"city": None}` until the
    string closes, so a long argument would not be seen growing. Text that does not parse (nothing
    yet, or a model writing invalid JSON) keeps the arguments the call had."""
    try:
        parsed = pydantic_core.from_json(arguments, allow_partial="trailing-strings")
    except ValueError:
        return before
    return parsed if isinstance(parsed, dict) else before
