"""OpenAI's Responses API (`POST /v1/responses`), read: what is served, and the request translated
into a chat completions request (`to_chat`), which takes the chat path from there (the same checks,
sampling among them, the same queue, the same cancellation when the client leaves). The request's wire
model is protocol.py's `ResponsesRequest`; its events are written by responses_output.py.

Served: `input` (a string, or message / `function_call` / `function_call_output` / `reasoning`
items), `instructions`, function `tools`, `tool_choice`, `parallel_tool_calls`, `max_output_tokens`,
`temperature` / `top_p` (as chat completions serves them), `text.format` (JSON mode and JSON Schema,
as chat completions' `response_format`), `reasoning.effort` (the engine's `reasoning_effort`;
`reasoning.summary` is accepted and ignored: no summary is written, the whole reasoning is the item's
`content`), vLLM's `chat_template_kwargs`, `stream`, and our `method`. An input `reasoning` item is the
`reasoning_content` of the assistant turn that follows it, as chat completions takes it. Not served:
storage (nothing is stored, every response says `"store": false`; `previous_response_id`,
`conversation` and `item_reference` items are 400s), built-in tools (`web_search`, `file_search`, ...),
images, files and audio in the input, encrypted reasoning, `background`, prompt templates, logprobs,
`truncation="auto"`.

Our opt-in `oospec` extension (extension.py) is read as on chat completions (`speculative_tools` go to
the engine; `predicted_calls`: responses_output.py).
"""
from __future__ import annotations

from typing import Any

from ..errors import TemplateArgumentError
from ..frontend import join_text_parts
from .protocol import ChatCompletionRequest, RequestError, ResponsesRequest

RESPONSES_PATH = "/v1/responses"
#: the input message roles (a `developer` message is a system message, as in chat completions)
ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
_TOOL_CHOICES = ("auto", "none", "required")
#: `reasoning`'s keys served (`summary` and its deprecated name accepted and ignored: no summary is written)
_REASONING_KEYS = ("effort", "summary", "generate_summary")
_SUMMARIES = ("auto", "concise", "detailed")


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
    transcript = _Transcript([{"role": "system", "content": req.instructions}] if req.instructions else [])
    adders = {"message": transcript.message, "function_call": transcript.function_call,
              "reasoning": transcript.reasoning, "function_call_output": transcript.function_call_output}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an object (an input item), got {type(item).__name__}", where)
        kind = item.get("type", "message" if "role" in item else None)
        add = adders.get(kind)
        if kind == "item_reference":
            raise RequestError(f"{where}: item_reference items are not served: this server stores no items; send "
                               "the item itself", f"{where}.type", "unsupported_parameter")
        if add is None:
            raise RequestError(f"{where}: input items of type {kind!r} are not served; this server reads message, "
                               "function_call, function_call_output and reasoning items", f"{where}.type",
                               "unsupported_parameter")
        add(item, i, where)
    return transcript.end()


class _Transcript:
    """The chat messages of a Responses input, added item by item: the calls not answered yet, the calls
    answered, and the reasoning items' text waiting for the assistant turn that follows them."""

    def __init__(self, messages: list[dict]):
        self.messages = messages
        self.pending: dict[str, int] = {}   # call_id -> input index, for calls not answered yet
        self.answered: set[str] = set()
        self.thought: list[str] = []

    def message(self, item: dict, i: int, where: str) -> None:
        _unanswered(self.pending)
        role = item.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role is {role!r}; expected one of {list(ROLES)}", f"{where}.role")
        if role != "assistant":
            self._flush_thought()
        self.messages.append(self._take_thought({"role": role, "content": _text(item.get("content"),
                                                                                 f"{where}.content")}))

    def function_call(self, item: dict, i: int, where: str) -> None:
        messages = self.messages
        call_id, name, arguments = (_string(item, key, where) for key in ("call_id", "name", "arguments"))
        if messages and messages[-1]["role"] == "tool":  # a new turn of calls: the last one's are answered
            _unanswered(self.pending)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        if messages and messages[-1]["role"] == "assistant" and not self.thought:
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append(self._take_thought({"role": "assistant", "content": "", "tool_calls": [call]}))
        self.pending[call_id] = i

    def reasoning(self, item: dict, i: int, where: str) -> None:
        _unanswered(self.pending)  # a new assistant turn: the last one's calls are answered
        text = _reasoning_text(item, where)
        if text:
            self.thought.append(text)

    def function_call_output(self, item: dict, i: int, where: str) -> None:
        call_id = _string(item, "call_id", where)
        if call_id not in self.pending:
            again = " (it is answered already)" if call_id in self.answered else ""
            raise RequestError(f"No tool call found for function call output with call_id {call_id}{again}.",
                               f"{where}.call_id")
        del self.pending[call_id]
        self.answered.add(call_id)
        self.messages.append({"role": "tool", "tool_call_id": call_id,
                              "content": _text(item.get("output"), f"{where}.output", required=True)})

    def end(self) -> list[dict]:
        _unanswered(self.pending)
        self._flush_thought()
        return self.messages

    def _flush_thought(self) -> None:  # reasoning that no assistant message or call followed: a turn of its own
        if self.thought:
            self.messages.append({"role": "assistant", "content": "", "reasoning_content": "\n\n".join(self.thought)})
            self.thought.clear()

    def _take_thought(self, message: dict) -> dict:
        if self.thought:
            message["reasoning_content"] = "\n\n".join(self.thought)
            self.thought.clear()
        return message


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
