"""OpenAI's Responses API (`POST /v1/responses`) over the same engine and queue as chat completions.

This module owns the Responses wire format: the request as we accept it (`ResponsesRequest`), its
translation into a chat completions request (`to_chat`: input items to chat messages, flat function
tools to chat tools; what is not served is a 400 naming it), and `Output`, which turns the engine's
events into the Responses stream's events (with sequence numbers) and the same response's body.

A translated request takes the chat completions path from there (app.py's `start`): the same checks
(sampling among them), the same queue, the same cancellation when the client leaves.

Served: `input` (a string, or message / `function_call` / `function_call_output` / `reasoning`
items), `instructions`, function `tools`, `tool_choice`, `parallel_tool_calls`, `max_output_tokens`,
`temperature` / `top_p` (as chat completions serves them), `text.format` (JSON mode and JSON Schema,
as chat completions' `response_format`), `reasoning.effort` (the engine's `reasoning_effort`;
`reasoning.summary` is accepted and ignored: no summary is written, the whole reasoning is the item's
`content`), vLLM's `chat_template_kwargs`, `stream`, and our `method`. A reasoning target's reasoning
is a `reasoning` output item (`reasoning_text` content) before the message and the calls, as OpenAI's
open-weight models and vLLM give it; an input `reasoning` item is the `reasoning_content` of the
assistant turn that follows it, as chat completions takes it. Not served: storage (nothing is
stored, every response says `"store": false`; `previous_response_id`, `conversation` and
`item_reference` items are 400s), built-in tools (`web_search`, `file_search`, ...), images, files and
audio in the input, encrypted reasoning, `background`, prompt templates, logprobs, `truncation="auto"`.

Our opt-in `oospec` extension (extension.py) is served as on chat completions: its `speculative_tools`
go to the engine, and with `predicted_calls` each prediction is an `oospec.predicted_calls` event of
its own (never a `function_call` item), listed again under `oospec.predictions` in the response.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any, AsyncIterator, Callable, Literal

from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ..engine import METHODS, Generation
from ..errors import TemplateArgumentError
from ..events import CallPredicted, ReasoningDelta, TextDelta, ToolCallDelta
from ..frontend import CallsSoFar, ParallelToolCalls, Usage, join_text_parts
from .extension import RESPONSES_EVENT, Extension, Predictions
from .protocol import ChatCompletionRequest, RequestError, oospec_object

log = logging.getLogger("oospec.serve")

RESPONSES_PATH = "/v1/responses"
#: the input message roles (a `developer` message is a system message, as in chat completions)
ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
_TOOL_CHOICES = ("auto", "none", "required")
#: `reasoning`'s keys served (`summary` and its deprecated name accepted and ignored: no summary is written)
_REASONING_KEYS = ("effort", "summary", "generate_summary")
_SUMMARIES = ("auto", "concise", "detailed")


class ResponsesRequest(BaseModel):
    """`POST /v1/responses` as we accept it. Fields we do not use (`user`, `metadata`, `service_tier`,
    `prompt_cache_key`, `safety_identifier`, `max_tool_calls`, ...) are accepted and ignored."""
    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None          # refused: no logprobs in a response here
    text: dict[str, Any] | None = None       # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    store: bool | None = None                # nothing is stored, whatever it says
    previous_response_id: str | None = None  # refused: nothing is stored
    conversation: Any = None                 # refused: nothing is stored
    background: bool | None = None           # refused when true
    prompt: Any = None                       # refused: no stored prompt templates
    reasoning: dict[str, Any] | None = None  # {"effort": "low" | "medium" | "high", "summary": ignored}
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: arguments of the chat template
    include: list[str] | None = None
    truncation: str | None = None            # "disabled" (the default); "auto" is refused
    metadata: dict[str, Any] | None = None   # echoed in the response
    #: oospec's own field: the decoding method (all three give the same tokens; only the speed differs)
    method: Literal[METHODS] | None = None  # type: ignore[valid-type]


# ----------------------------------------------------------------------------- the request

def refuse_unserved(req: ResponsesRequest) -> None:
    """What the Responses API serves and this server does not is a 400 that names it."""
    stored = "this server stores no responses (every response says \"store\": false): send the whole " \
             "conversation as `input` items instead"
    if req.previous_response_id is not None:
        raise RequestError(f"previous_response_id is not served: {stored}", "previous_response_id",
                           "unsupported_parameter")
    if req.conversation is not None:
        raise RequestError(f"conversation is not served: {stored}", "conversation", "unsupported_parameter")
    if req.background:
        raise RequestError("background=true is not served: a response is answered on its request (stream it "
                           "instead)", "background", "unsupported_parameter")
    if req.prompt is not None:
        raise RequestError("prompt (a stored prompt template) is not served: send the prompt as `instructions` "
                           "and `input`", "prompt", "unsupported_parameter")
    check_reasoning(req.reasoning)
    if req.truncation not in (None, "disabled"):
        raise RequestError(f"truncation={req.truncation!r} is not served: the input is never truncated (an input "
                           "over the context is a 400, context_length_exceeded)", "truncation",
                           "unsupported_parameter")
    if req.top_logprobs is not None or "message.output_text.logprobs" in (req.include or ()):
        param = "top_logprobs" if req.top_logprobs is not None else "include"
        raise RequestError("logprobs are not served on /v1/responses (chat completions serves them)", param,
                           "unsupported_parameter")


def check_reasoning(reasoning: dict | None) -> None:
    """`reasoning`: `effort` goes to the engine (which checks its value against the chat template);
    `summary` (or its deprecated `generate_summary`) is one of OpenAI's values, accepted and ignored;
    any other key set is a 400 that names it."""
    for key, value in (reasoning or {}).items():
        if value is None:
            continue
        if key not in _REASONING_KEYS:
            raise RequestError(f"reasoning.{key}={value!r:.60} is not served: this server reads reasoning.effort (the "
                               "chat template's reasoning_effort) and accepts reasoning.summary", f"reasoning.{key}",
                               "unsupported_parameter")
        if key != "effort" and value not in _SUMMARIES:
            raise RequestError(f"reasoning.{key} must be one of {list(_SUMMARIES)}, got {value!r:.60}",
                               f"reasoning.{key}", "invalid_value")


def reasoning_effort(req: ResponsesRequest) -> Any:
    return (req.reasoning or {}).get("effort")


def to_messages(req: ResponsesRequest) -> list[dict]:
    """`instructions` and `input` as chat messages. Consecutive `function_call` items (after the
    assistant message they follow, if any) are one assistant message's `tool_calls`; each
    `function_call_output` is a tool message. A `reasoning` item starts an assistant turn: it is the
    `reasoning_content` of the assistant message or calls that follow it (an assistant message of its
    own, with empty content, when none follows). Tool turns must pair up as the Responses API requires
    (OpenAI's messages: "No tool output found for function call ...")."""
    if req.input is None or req.input == [] or req.input == "":
        raise RequestError("input is required: a string, or a list of input items", "input",
                           "missing_required_parameter")
    items = [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    messages: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    pending: dict[str, int] = {}   # call_id -> input index, for calls not answered yet
    answered: set[str] = set()
    thought: list[str] = []        # reasoning items' text, for the assistant turn that follows them

    def flush_thought() -> None:   # reasoning that no assistant message or call followed: a turn of its own
        if thought:
            messages.append({"role": "assistant", "content": "", "reasoning_content": "\n\n".join(thought)})
            thought.clear()

    def take_thought(message: dict) -> dict:
        if thought:
            message["reasoning_content"] = "\n\n".join(thought)
            thought.clear()
        return message

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object (an input item), got {type(item).__name__}", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            _unanswered(pending)
            role = item.get("role")
            if role not in ROLES:
                raise RequestError(f"{where}.role is {role!r}; expected one of {list(ROLES)}", f"{where}.role")
            if role != "assistant":
                flush_thought()
            messages.append(take_thought({"role": role, "content": _text(item.get("content"), f"{where}.content")}))
        elif kind == "function_call":
            call_id, name, arguments = (_string(item, key, where) for key in ("call_id", "name", "arguments"))
            if messages and messages[-1]["role"] == "tool":  # a new turn of calls: the last one's are answered
                _unanswered(pending)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if messages and messages[-1]["role"] == "assistant" and not thought:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append(take_thought({"role": "assistant", "content": "", "tool_calls": [call]}))
            pending[call_id] = i
        elif kind == "reasoning":
            _unanswered(pending)  # a new assistant turn: the last one's calls are answered
            text = _reasoning_text(item, where)
            if text:
                thought.append(text)
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            if call_id not in pending:
                again = " (it is answered already)" if call_id in answered else ""
                raise RequestError(f"No tool call found for function call output with call_id {call_id}{again}.",
                                   f"{where}.call_id")
            del pending[call_id]
            answered.add(call_id)
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _text(item.get("output"), f"{where}.output", required=True)})
        elif kind == "item_reference":
            raise RequestError(f"{where}: item_reference items are not served: this server stores no items; send "
                               "the item itself", f"{where}.type", "unsupported_parameter")
        else:
            raise RequestError(f"{where}: input items of type {kind!r} are not served; this server reads message, "
                               "function_call, function_call_output and reasoning items", f"{where}.type",
                               "unsupported_parameter")
    _unanswered(pending)
    flush_thought()
    return messages


def _reasoning_text(item: dict, where: str) -> str:
    """A reasoning item's text: its `reasoning_text` content, or (without content) its `summary_text`
    summary, parts joined. Encrypted reasoning cannot be read here: a 400."""
    if item.get("encrypted_content") is not None:
        raise RequestError(f"{where}.encrypted_content is not served: this server writes no encrypted reasoning and "
                           "cannot read it; send the reasoning as content ({\"type\": \"reasoning_text\", \"text\"})",
                           f"{where}.encrypted_content", "unsupported_parameter")
    texts = {}
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            parts = []
        if not isinstance(parts, list):
            raise RequestError(f"{where}.{key} must be a list of {part_type} parts, got {type(parts).__name__}",
                               f"{where}.{key}", "invalid_type")
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or part.get("type") != part_type or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.{key}[{j}] must be {{\"type\": \"{part_type}\", \"text\": ...}}, got "
                                   f"{part!r:.60}", f"{where}.{key}[{j}]", "invalid_value")
        texts[key] = "\n\n".join(part["text"] for part in parts)
    return texts["content"] or texts["summary"]


def _unanswered(pending: dict[str, int]) -> None:
    if pending:
        call_id, i = next(iter(pending.items()))
        raise RequestError(f"No tool output found for function call {call_id}: a function_call_output with its "
                           f"call_id must follow input[{i}] before the conversation goes on.", "input")


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (not value and key != "arguments"):
        raise RequestError(f"{where}.{key} must be a non-empty string, got {value!r:.80}", f"{where}.{key}",
                           "missing_required_parameter" if value is None else "invalid_type")
    return value


def _text(content: Any, where: str, required: bool = False) -> str:
    """A message's (or a tool output's) text: a string, or its text parts joined."""
    if content is None and not required:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind == "refusal" and isinstance(part.get("refusal"), str):
                parts.append(part["refusal"])
            else:
                what = f"{kind!r} parts are" if kind else f"{part!r:.60} is"
                raise RequestError(f"{where}[{j}]: {what} not served: this server reads text (input_text and "
                                   "output_text parts)", f"{where}[{j}]", "unsupported_parameter")
        return join_text_parts(parts)
    raise RequestError(f"{where} must be a string or a list of text parts, got {type(content).__name__}", where,
                       "invalid_type")


def to_chat_tools(tools: list[dict] | None) -> list[dict] | None:
    """Responses' flat function tools as chat tools. `strict` is passed on as it comes (absent: not
    strict, as in chat completions; OpenAI's Responses API defaults it to true)."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise RequestError(f"tools[{i}]: the tool type {kind!r} is not served: this server runs no tools of its "
                               "own (web_search, file_search, code_interpreter, mcp, ...); offer function tools",
                               f"tools[{i}].type", "unsupported_parameter")
        if "function" in tool and "name" not in tool:
            raise RequestError(f"tools[{i}] has chat completions' shape ({{\"type\": \"function\", \"function\": "
                               "{...}}); the Responses API's function tool is flat: {\"type\": \"function\", "
                               "\"name\", \"description\", \"parameters\", \"strict\"}", f"tools[{i}].name",
                               "missing_required_parameter")
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise RequestError(f"Invalid type for 'tools[{i}].strict': expected a boolean, got {strict!r:.40}.",
                               f"tools[{i}].strict", "invalid_type")
        out.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters",
                                                                            "strict") if tool.get(k) is not None}})
    return out


def to_chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    if choice is None or choice in _TOOL_CHOICES:
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    kind = choice.get("type") if isinstance(choice, dict) else choice
    raise RequestError(f"tool_choice={choice!r:.80} is not served: send \"auto\", \"none\", \"required\" or "
                       f"{{\"type\": \"function\", \"name\": ...}} (a {kind!r} choice names no function tool)",
                       "tool_choice", "unsupported_parameter")


def to_response_format(text: dict | None) -> dict | None:
    """`text.format` as chat completions' `response_format` (the engine checks the schema)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError(f"text.format={fmt!r:.80} is not served: its type is one of \"text\", \"json_object\", "
                           "\"json_schema\"", "text.format")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "description", "schema", "strict")
                                                   if k in fmt}}


def to_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completions request this response is decoded as (400s for what is not served)."""
    refuse_unserved(req)
    return ChatCompletionRequest(
        model=req.model, messages=to_messages(req), tools=to_chat_tools(req.tools),
        tool_choice=to_chat_tool_choice(req.tool_choice), parallel_tool_calls=req.parallel_tool_calls,
        max_completion_tokens=req.max_output_tokens, temperature=req.temperature, top_p=req.top_p,
        response_format=to_response_format(req.text), method=req.method, stream=req.stream,
        reasoning_effort=reasoning_effort(req), chat_template_kwargs=req.chat_template_kwargs)


def template_error(e: TemplateArgumentError, req: ResponsesRequest) -> RequestError:
    """The engine's TemplateArgumentError named as this request gave it: a `reasoning_effort` from
    `reasoning.effort` (else from `chat_template_kwargs`)."""
    if e.param != "reasoning_effort":
        return RequestError(str(e), e.param, type(e).__name__)
    effort = reasoning_effort(req)
    if effort is None:
        return RequestError(str(e), "chat_template_kwargs", type(e).__name__)
    return RequestError(f"reasoning.effort={effort!r:.40} (the chat template's reasoning_effort): {e}",
                        "reasoning.effort", type(e).__name__)


# ----------------------------------------------------------------------------- the response

def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


class Output:
    """One response as it is sent: the stream's events (numbered), or (from the same engine events)
    its body. Output items open in the order the reply writes them: a `reasoning` item when the reply
    reasons (not for an empty block), a `message` item when text comes, a `function_call` item per call;
    an item is done when the next opens, or at the end.

    `fold(event)` folds in one engine event (reasoning, text or call) and returns the stream events it makes.
    With `predictions` (the `oospec.predicted_calls` extension), a `CallPredicted` is an
    `oospec.predicted_calls` event; without, it makes none, as a `ToolCallReady` never does."""

    def __init__(self, model: str, replica: str, req: ResponsesRequest, parallel: ParallelToolCalls | None = None,
                 first_token: Callable[[], None] = lambda: None, predictions: Predictions | None = None):
        self.id = "resp_" + uuid.uuid4().hex
        self.created_at = int(time.time())
        self.model, self.replica, self.req = model, replica, req
        self.parallel = parallel or ParallelToolCalls()
        self.content = ""
        self.reasoning = ""              # the reasoning sent so far
        self.items: list[dict] = []      # output items, as they stand
        self._open: dict | None = None   # the item being written
        self._calls = CallsSoFar()
        self._seq = 0
        self._first_token = first_token
        self.predictions = predictions

    @property
    def calls(self) -> list[dict]:
        return self._calls.calls

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    def response(self, status: str = "in_progress", gen: Generation | None = None, error: dict | None = None) -> dict:
        """The Response object: in progress (no output yet), or final with `gen`."""
        req = self.req
        tools = [{"type": "function", "name": t["name"], "description": t.get("description"),
                  "parameters": t.get("parameters"), "strict": t.get("strict")} for t in req.tools or ()]
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": False, "completed_at": int(time.time()) if status == "completed" else None,
            "error": error, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": self.model,
            "output": self.items if gen is not None or error is not None else [],
            "parallel_tool_calls": req.parallel_tool_calls is not False, "previous_response_id": None,
            "reasoning": _echo_reasoning(req.reasoning), "store": False, "temperature": req.temperature,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice or "auto", "tools": tools, "top_p": req.top_p, "truncation": "disabled",
            "usage": None, "metadata": req.metadata or {}}
        if gen is not None:
            usage = Usage.of(gen)
            body["usage"] = {"input_tokens": usage.prompt_tokens,
                             "input_tokens_details": {"cached_tokens": usage.cached_prompt_tokens,
                                                      "cache_write_tokens": 0},
                             "output_tokens": usage.completion_tokens,
                             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": usage.total_tokens}
            body["oospec"] = oospec_object(gen, self.calls, self.replica)
            if self.predictions is not None:
                self.predictions.closing(0, body["oospec"])
        return body

    def fold(self, item) -> list[dict]:
        """One engine event's stream events (none for an event a response does not show)."""
        if isinstance(item, CallPredicted) and self.predictions is not None:
            return [self._event(RESPONSES_EVENT, **self.predictions.add(0, item))]
        if not isinstance(item, (ReasoningDelta, TextDelta, ToolCallDelta)):
            return []
        if not self.reasoning and not self.content and not self.calls:
            self._first_token()
        if isinstance(item, ReasoningDelta):
            return self.reason(item.text)
        return self.text(item.text) if isinstance(item, TextDelta) else self.tool_call(item)

    def opening(self) -> list[dict]:
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def text(self, text: str) -> list[dict]:
        if not text:
            return []
        self.content += text
        events = []
        if self._open is None or self._open["type"] != "message":
            events += self._close() + self._open_message()
        self._open["content"][0]["text"] += text
        return events + [self._event("response.output_text.delta", item_id=self._open["id"],
                                     output_index=len(self.items) - 1, content_index=0, delta=text, logprobs=[])]

    def reason(self, text: str) -> list[dict]:
        """A piece of reasoning: into the open `reasoning` item (one opened first, as OpenAI's
        open-weight models and vLLM send it: the item, its `reasoning_text` part, then its deltas)."""
        if not text:
            return []
        self.reasoning += text
        events = []
        if self._open is None or self._open["type"] != "reasoning":
            events += self._close()
            self._open = {"id": "rs_" + uuid.uuid4().hex, "type": "reasoning", "summary": [], "content": [],
                          "status": "in_progress"}
            self.items.append(self._open)
            index = len(self.items) - 1
            events += [self._event("response.output_item.added", output_index=index, item=_copy(self._open)),
                       self._event("response.content_part.added", item_id=self._open["id"], output_index=index,
                                   content_index=0, part=_reasoning_part(""))]
            self._open["content"].append(_reasoning_part(""))
        self._open["content"][0]["text"] += text
        return events + [self._event("response.reasoning_text.delta", item_id=self._open["id"],
                                     output_index=len(self.items) - 1, content_index=0, delta=text)]

    def _open_message(self) -> list[dict]:
        self._open = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "status": "in_progress",
                      "role": "assistant", "content": []}
        self.items.append(self._open)
        index = len(self.items) - 1
        events = [self._event("response.output_item.added", output_index=index, item=_copy(self._open)),
                  self._event("response.content_part.added", item_id=self._open["id"], output_index=index,
                              content_index=0, part=_text_part(""))]
        self._open["content"].append(_text_part(""))
        return events

    def tool_call(self, ev) -> list[dict]:
        if not self.parallel.keeps(ev):
            return []
        call = self._calls.feed(ev)
        events = []
        if ev.id is not None:  # a call's first event: its id and whole name
            events += self._close()
            self._open = {"id": "fc_" + uuid.uuid4().hex, "type": "function_call", "status": "in_progress",
                          "arguments": "", "call_id": call["id"], "name": call["name"] or ""}
            self.items.append(self._open)
            events.append(self._event("response.output_item.added", output_index=len(self.items) - 1,
                                      item=_copy(self._open)))
        if ev.arguments and self._open is not None and self._open["type"] == "function_call":
            self._open["arguments"] += ev.arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=self._open["id"],
                                      output_index=len(self.items) - 1, delta=ev.arguments))
        return events

    def _close(self, status: str = "completed") -> list[dict]:
        """The events that finish the item being written."""
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = status
        index, events = self.items.index(item), []
        if item["type"] == "message":
            part = item["content"][0]
            events += [self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], logprobs=[]),
                       self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=_copy(part))]
        elif item["type"] == "reasoning":
            part = item["content"][0]
            events += [self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"]),
                       self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                   content_index=0, part=_copy(part))]
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, name=item["name"], arguments=item["arguments"]))
        return events + [self._event("response.output_item.done", output_index=index, item=_copy(item))]

    def closing(self, gen: Generation) -> list[dict]:
        """The last events: the open item done (incomplete when the reply hit max_output_tokens), and
        `response.completed` or `response.incomplete` with the whole response. Called once."""
        status = "incomplete" if gen.finish_reason == "length" else "completed"
        # a reply with neither text nor calls ends with an empty message (after its reasoning), as chat's ""
        events = [] if self.content or self.calls else self._close(status) + self._open_message()
        events += self._close(status)
        return events + [self._event(f"response.{status}", response=self.response(status, gen))]

    def body(self, gen: Generation) -> dict:
        """The non-streamed response: the one the stream's last event carries."""
        return self.closing(gen)[-1]["response"]

    def failed(self, message: str) -> list[dict]:
        """A stream that fails after its status line: `response.failed`, with OpenAI's error object."""
        return [self._event("response.failed", response=self.response(
            "failed", error={"code": "server_error", "message": message}))]


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_part(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


def _echo_reasoning(reasoning: dict | None) -> dict | None:
    """The response's `reasoning`: the request's effort and summary (no summary is written), or null."""
    if not reasoning or all(v is None for v in reasoning.values()):
        return None
    return {"effort": reasoning.get("effort"), "summary": reasoning.get("summary") or reasoning.get("generate_summary")}


def _copy(obj: dict) -> dict:
    return json.loads(json.dumps(obj))


async def respond(req: ResponsesRequest, request, start: Callable, model: str, replica: str,
                  first_token: Callable[[], None]):
    """The route's work (app.py owns the route): the request translated and queued by `start` (app.py's
    chat path: checks, engine stream, queue place), then its events as a stream or one body.
    `first_token()` is called at the first reasoning, text or call event (the time-to-first-token metric).
    A chat template argument the engine refuses (`reasoning.effort`, `chat_template_kwargs`) is a 400
    naming the field as the request gave it, before anything streams, as is a bad `oospec` extension."""
    ext = Extension.of(req)
    try:
        job, finished = start(to_chat(req), ext)
    except TemplateArgumentError as e:
        raise template_error(e, req) from None
    out = Output(model, replica, req, ParallelToolCalls.openai(req.parallel_tool_calls), first_token,
                 Predictions() if ext.predicted_calls else None)
    if req.stream:
        return StreamingResponse(_stream(job, out, finished), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    gen = await _collect(job, out, request)
    if gen is None:
        return Response(status_code=499)  # the client closed the request; nobody reads this
    finished(gen)
    return out.body(gen)


async def _collect(job, out: Output, request) -> Generation | None:
    """A non-streamed response: every event folded in; None when the client left before the end."""
    async def watch():
        while not await request.is_disconnected():
            await asyncio.sleep(0.25)
        job.cancel()

    watcher = asyncio.create_task(watch())
    gen = None
    try:
        async for item in job.events():
            if isinstance(item, Generation):
                gen = item
            else:
                out.fold(item)
    finally:
        watcher.cancel()
    return gen


async def _stream(job, out: Output, finished: Callable[[Generation], None]) -> AsyncIterator[str]:
    """The response's server-sent events. The client leaving closes this generator, and with it the
    job's events: the job is cancelled."""
    for event in out.opening():
        yield _sse(event)
    try:
        async for item in job.events():
            if isinstance(item, Generation):
                finished(item)
                events = out.closing(item)
            else:
                events = out.fold(item)
            for event in events:
                yield _sse(event)
    except Exception as e:  # the status line is sent: the failure goes in the stream
        log.exception("streamed response failed")
        for event in out.failed(f"internal error ({type(e).__name__}); the server log has the details"):
            yield _sse(event)
