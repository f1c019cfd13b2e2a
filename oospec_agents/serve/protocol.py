"""The OpenAI Chat Completions request as we accept it, and the bodies we answer with.

This module owns the wire format: the request model, the checks that answer a 400 before the engine
runs (`refuse_sampling`, `refuse_unserved`, `check_tools`, `check_tool_messages`), and `Reply`, which
turns the engine's events into chunks and the same reply's body. Which tool calls a reply keeps
(`parallel_tool_calls`) is the front-ends' one rule, `frontend.ParallelToolCalls`.

Fields we do not use (`user`, `seed`, `metadata`, `store`, ...) are accepted and ignored. Fields that
would ask for something other than the target's greedy decoding are refused by `refuse_sampling`:
the server never alters the tokens the target commits.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engine import METHODS
from ..frontend import CallsSoFar, ParallelToolCalls, Usage

#: stats not worth a line in every response
_HIDDEN_STATS = ("margins", "sidecar_profile", "rounds")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None          # refused with logprobs
    reasoning_effort: str | None = None      # refused: no reasoning mode is served
    response_format: dict[str, Any] | None = None
    functions: list[Any] | None = None       # refused, by name (`refuse_unserved`)
    function_call: Any = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    prediction: Any = None   # OpenAI's Predicted Outputs; the engine checks it and names what is wrong
    #: oospec's own field: the decoding method (all three give the same tokens; only the speed differs)
    method: Literal[METHODS] | None = None  # type: ignore[valid-type]


class RequestError(ValueError):
    """A request the server understands but will not serve; `param` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


def refuse_sampling(req: ChatCompletionRequest) -> None:
    """Only greedy decoding is served: anything that would change the tokens is a 400."""
    neutral = {"temperature": (0,), "top_p": (1,), "presence_penalty": (0,), "frequency_penalty": (0,),
               "n": (1,)}
    for field, values in neutral.items():
        value = getattr(req, field)
        if value is not None and value not in values:
            raise RequestError(f"{field}={value!r} is not served: the reply is the target's greedy decoding, "
                               f"so {field} must be absent or {values[0]}", field)
    if req.logit_bias:
        raise RequestError("logit_bias is not served: it would change the target's greedy tokens", "logit_bias")
    if req.logprobs:
        raise RequestError("logprobs=true is not supported", "logprobs")
    if req.top_logprobs is not None:
        raise RequestError(f"top_logprobs={req.top_logprobs!r} is not supported: this server returns no logprobs",
                           "top_logprobs")


def refuse_unserved(req: ChatCompletionRequest) -> None:
    """What OpenAI serves and this server does not is a 400 that says so, never a reply without it."""
    if req.functions is not None or req.function_call is not None:
        param = "functions" if req.functions is not None else "function_call"
        raise RequestError(f"{param} is OpenAI's deprecated form of tools and is not served; send tools "
                           "(and tool_choice) instead", param)
    if req.audio is not None or (req.modalities and set(req.modalities) - {"text"}):
        raise RequestError(f"modalities={req.modalities!r}: audio output is not served; this server writes text",
                           "modalities" if req.audio is None else "audio")
    if req.reasoning_effort is not None:
        raise RequestError(f"reasoning_effort={req.reasoning_effort!r} is not served: the target decodes its chat "
                           "template's reply as it is, with no reasoning mode to set", "reasoning_effort",
                           "unsupported_parameter")
    if req.web_search_options is not None:
        raise RequestError("web_search_options is not served: the model has no web search here", "web_search_options")


def check_tool_messages(req: ChatCompletionRequest) -> None:
    """OpenAI's rules for the tool turns of a conversation, with its messages and params
    (`messages.[i].tool_call_id`, `messages.[i].role`): each assistant tool call has an id; a tool
    message carries the `tool_call_id` of a call of the assistant message before it; and every such
    call is answered before the conversation goes on. The template would render anything; a history
    that breaks them is a client's bug, which OpenAI answers with a 400 and so does this server."""
    pending: dict[str, None] = {}   # ids of the latest assistant message's calls not yet answered
    opened = None                   # index of that assistant message, while its tool messages follow
    for i, m in enumerate(req.messages):
        role = m.get("role")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise RequestError(f"Missing parameter 'tool_call_id': messages with role 'tool' must have a "
                                   f"'tool_call_id' (messages[{i}]).", f"messages.[{i}].tool_call_id")
            if opened is None:
                raise RequestError(f"Invalid parameter: messages with role 'tool' must be a response to a "
                                   f"preceding message with 'tool_calls' (messages[{i}]).", f"messages.[{i}].role")
            if call_id not in pending:
                raise RequestError(f"Invalid parameter: messages[{i}] answers tool_call_id {call_id!r}, which is "
                                   f"not an unanswered call of messages[{opened}]'s 'tool_calls'.",
                                   f"messages.[{i}].tool_call_id")
            del pending[call_id]
            continue
        _unanswered(pending, opened)
        opened, pending = None, {}
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls and isinstance(calls, list):
            for j, call in enumerate(calls):
                call_id = call.get("id") if isinstance(call, dict) else None
                if not isinstance(call_id, str) or not call_id:
                    raise RequestError(f"Missing required parameter: 'messages[{i}].tool_calls[{j}].id'.",
                                       f"messages.[{i}].tool_calls.[{j}].id", "missing_required_parameter")
                pending[call_id] = None
            opened = i
    _unanswered(pending, opened)


def _unanswered(pending: dict, opened: int | None) -> None:
    if pending:
        raise RequestError("An assistant message with 'tool_calls' must be followed by tool messages responding "
                           "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                           + ", ".join(pending), f"messages.[{opened}].role")


_JSON_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a decimal"), (str, "a string"),
               (list, "an array"), (dict, "an object"))


def check_tools(req: ChatCompletionRequest) -> None:
    """What OpenAI checks of each tool before the engine sees it: `function.strict` is a boolean
    (or null). Its error names the field as OpenAI's does: `tools[0].function.strict`."""
    for i, tool in enumerate(req.tools or ()):
        fn = tool.get("function")
        if not isinstance(fn, dict) or fn.get("strict") is None or isinstance(fn["strict"], bool):
            continue
        got = next((kind for t, kind in _JSON_KINDS if isinstance(fn["strict"], t)), type(fn["strict"]).__name__)
        param = f"tools[{i}].function.strict"
        raise RequestError(f"Invalid type for '{param}': expected a boolean, but got {got} instead.", param,
                           "invalid_type")


def usage(gen) -> dict:
    return Usage.of(gen).openai()


def oospec_object(gen, calls: list[dict], replica: str) -> dict:
    """The extra top-level object: speculation stats, the calls that failed their schema, the replica."""
    stats = {k: v for k, v in dict(gen.stats).items() if k not in _HIDDEN_STATS}
    index = {c["id"]: i for i, c in enumerate(calls)}
    failures = [{"index": index.get(c["id"]), "id": c["id"], "name": c["name"], "error": c["error"]}
                for c in gen.invalid_tool_calls]
    return {"replica": replica, "stats": json.loads(json.dumps(stats, default=str)), "schema_failures": failures}


class Reply:
    """One reply as it is sent: the chunks of a stream, or (aggregated from the same events) the body."""

    def __init__(self, model: str, replica: str, parallel: ParallelToolCalls | None = None):
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model
        self.replica = replica
        self.parallel = parallel or ParallelToolCalls()  # parallel_tool_calls=false: the first call only
        self.content = ""
        self._calls = CallsSoFar()

    @property
    def calls(self) -> list[dict]:
        """{"id", "name", "arguments": JSON text as generated} per call sent."""
        return self._calls.calls

    def chunk(self, delta: dict, finish_reason: str | None = None, **extra) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}

    def first_chunk(self) -> dict:
        return self.chunk({"role": "assistant", "content": ""})

    def text(self, text: str) -> dict:
        self.content += text
        return self.chunk({"content": text})

    def tool_call(self, ev) -> dict | None:
        """The chunk for one ToolCallDelta (None when it belongs to a call that is not kept)."""
        if not self.parallel.keeps(ev):
            return None
        self._calls.feed(ev)
        if ev.id is not None:  # a call's first event: its id and whole name
            fn = {"name": ev.name or "", "arguments": ev.arguments}
            return self.chunk({"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function", "function": fn}]})
        return self.chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]})

    def last_chunk(self, gen) -> dict:
        return self.chunk({}, gen.finish_reason, oospec=oospec_object(gen, self.calls, self.replica))

    def usage_chunk(self, gen) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage(gen)}

    def body(self, gen) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": self.content or (None if self.calls else "")}
        if self.calls:
            message["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"] or "", "arguments": c["arguments"]}}
                                     for c in self.calls]
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": gen.finish_reason,
                             "logprobs": None}],
                "usage": usage(gen), "oospec": oospec_object(gen, self.calls, self.replica)}


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"
