"""The wire protocol: the requests we accept (`ChatCompletionRequest`, and the Responses API's
`ResponsesRequest`), the 400s a chat request gets before the engine runs (`check_request`), and the
`oospec` object that closes every reply of both APIs (`oospec_object`).

As in vLLM's server, this module is the one place where the wire meets the engine:
`ChatCompletionRequest.to_chat_request` turns a request's fields into the front-ends' one request,
`frontend.ChatRequest`. A Responses request is translated into a chat request first
(responses_request.py). How events become chunks is chat_output.py's and responses_output.py's; the
routes (routes.py) only join these.

Fields we do not use (`user`, `metadata`, `store`, ...) are accepted and ignored. Sampling is served
as the engine serves it, keeping the target's distribution: `temperature`, `top_p`, `seed`, `n`,
`logprobs`/`top_logprobs`, and vLLM's `top_k` and `min_p`; a bad value is a 400 naming the field
(the engine's `SamplingError.param`). What would change the distribution the verification keeps
(penalties, `logit_bias`) is refused by `refuse_sampling`, unless it is neutral.

A reasoning target's reasoning is sent as vLLM and DeepSeek send it: `delta.reasoning_content` in the
stream, `message.reasoning_content` in the body; `chat_template_kwargs` (vLLM's field) and
`reasoning_effort` go to the engine, which names a bad one (`TemplateArgumentError.param`).
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engine import METHODS
from ..errors import SamplingError
from ..frontend import PENALTIES, ChatRequest, call_problems, check_penalties, choice_count, settings

#: stats not worth a line in every response
_HIDDEN_STATS = ("margins", "sidecar_profile", "rounds")


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` ends a stream with the usage chunk."""
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """`POST /v1/chat/completions` as we accept it: OpenAI's fields, vLLM's sampling and template fields,
    and our `method`. What is refused is `check_request`'s; what the engine gets, `to_chat_request`'s."""
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
    n: int | None = None                     # 1 to frontend.MAX_CHOICES, decoded one after another
    temperature: float | None = None         # None or 0: greedy decoding
    top_p: float | None = None
    top_k: int | None = None                 # vLLM's: 0 or -1 is no top-k
    min_p: float | None = None               # vLLM's
    seed: int | None = None                  # choice i draws with seed + i
    presence_penalty: float | None = None    # refused unless 0
    frequency_penalty: float | None = None   # refused unless 0
    repetition_penalty: float | None = None  # vLLM's; refused unless 1
    logit_bias: dict[str, float] | None = None  # refused unless empty
    logprobs: bool | None = None
    top_logprobs: int | None = None          # 0-20, with logprobs=true
    reasoning_effort: str | None = None      # for templates that read it; any other refuses it (the engine)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: arguments of the chat template
    response_format: dict[str, Any] | None = None
    functions: list[Any] | None = None       # refused, by name (`refuse_unserved`)
    function_call: Any = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    prediction: Any = None   # OpenAI's Predicted Outputs; the engine checks it and names what is wrong
    #: oospec's own field: the decoding method (all three give the same tokens; only the speed differs)
    method: Literal[METHODS] | None = None  # type: ignore[valid-type]

    def to_chat_request(self, method: str, speculative_tools: dict | None = None) -> ChatRequest:
        """The engine's request for this one (checked by `check_request`): the one place where the
        server's wire fields become a `frontend.ChatRequest`. `method` is the request's or the server's;
        `speculative_tools` the `oospec` extension's (extension.py)."""
        wire = {"method": method, "max_tokens": self.max_completion_tokens or self.max_tokens or None,
                "top_k": None if self.top_k == -1 else self.top_k,  # vLLM's top_k=-1: no top-k
                "speculative_tools": speculative_tools}
        return ChatRequest.of(self.messages, settings(wire, self))


class ResponsesRequest(BaseModel):
    """`POST /v1/responses` as we accept it (what is served: responses_request.py). Fields we do not use
    (`user`, `metadata`, `service_tier`, `prompt_cache_key`, `safety_identifier`, `max_tool_calls`, ...)
    are accepted and ignored."""
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


class RequestError(ValueError):
    """A request the server understands but will not serve; `param` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


def check_request(req: ChatCompletionRequest) -> None:
    """Every check a chat request gets before the engine sees it; the first that fails is a 400."""
    refuse_sampling(req)
    refuse_unserved(req)
    check_tools(req)
    check_tool_messages(req)


def refuse_sampling(req: ChatCompletionRequest) -> None:
    """What sampling is not served, or is out of its range, is a 400 naming it: penalties other than
    neutral, and `logit_bias` (`frontend.check_penalties`, every front-end's rule), and `n` outside
    1-8 (`frontend.choice_count`); the engine checks the rest (`ChatRequest.stream`, `sampling.Sampling`)."""
    try:
        check_penalties({name: getattr(req, name) for name in PENALTIES}, req.logit_bias)
        choice_count(req.n)
    except SamplingError as e:
        raise RequestError(str(e), e.param, getattr(e, "code", None)) from None


def refuse_unserved(req: ChatCompletionRequest) -> None:
    """What OpenAI serves and this server does not is a 400 that says so, never a reply without it."""
    if req.functions is not None or req.function_call is not None:
        param = "functions" if req.functions is not None else "function_call"
        raise RequestError(f"{param} is OpenAI's deprecated form of tools and is not served; send tools "
                           "(and tool_choice) instead", param)
    if req.audio is not None or (req.modalities and set(req.modalities) - {"text"}):
        raise RequestError(f"modalities={req.modalities!r}: audio output is not served; this server writes text",
                           "modalities" if req.audio is None else "audio")
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


def oospec_object(gen, calls: list[dict], replica: str) -> dict:
    """The extra top-level object: speculation stats, the calls' schema failures, the replica.

    `schema_failures`: {"index" (in the message's `tool_calls`; None for a call `parallel_tool_calls=false`
    left out), "id", "name", "error"} per call that misfits its tool's schema (it is a call all the same, as
    OpenAI's are: its arguments parse) or whose arguments cannot be read at all, in the reply's order."""
    stats = {k: v for k, v in dict(gen.stats).items() if k not in _HIDDEN_STATS}
    index = {c["id"]: i for i, c in enumerate(calls)}
    failures = [{"index": index.get(c["id"]), **c} for c in call_problems(gen)]
    return {"replica": replica, "stats": json.loads(json.dumps(stats, default=str)), "schema_failures": failures}
