"""The OpenAI Chat Completions request as we accept it, and the bodies we answer with.

This module owns the wire format: the request model, the checks that answer a 400 before the engine
runs (`refuse_sampling`, `refuse_unserved`, `check_tools`, `check_tool_messages`), the request's
sampling settings as the engine takes them (`sampling`), and `Completion`, whose `Reply`s (one per
choice, `n`) turn the engine's events into chunks and the same replies' body. Which tool calls a reply
keeps (`parallel_tool_calls`) is the front-ends' one rule, `frontend.ParallelToolCalls`.

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
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engine import METHODS
from ..errors import SamplingError
from ..frontend import PENALTIES, CallsSoFar, ParallelToolCalls, Usage, call_problems, check_penalties, choice_count, \
    openai_logprobs

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


class RequestError(ValueError):
    """A request the server understands but will not serve; `param` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


def refuse_sampling(req: ChatCompletionRequest) -> None:
    """What sampling is not served, or is out of its range, is a 400 naming it: penalties other than
    neutral, and `logit_bias` (`frontend.check_penalties`, every front-end's rule), and `n` outside
    1-8 (`frontend.choice_count`); the engine checks the rest (`ChatRequest.stream`, `sampling.Sampling`)."""
    try:
        check_penalties({name: getattr(req, name) for name in PENALTIES}, req.logit_bias)
        choice_count(req.n)
    except SamplingError as e:
        raise RequestError(str(e), e.param, getattr(e, "code", None)) from None


def sampling(req: ChatCompletionRequest) -> dict:
    """The request's sampling settings, as `ChatRequest` takes them (the engine checks their values):
    vLLM's `top_k=-1` is no top-k, and OpenAI's `logprobs`/`top_logprobs` pair is the engine's one
    `logprobs` (`frontend.openai_logprobs`)."""
    return {"temperature": req.temperature, "top_p": req.top_p, "top_k": None if req.top_k == -1 else req.top_k,
            "min_p": req.min_p, "seed": req.seed, "logprobs": openai_logprobs(req.logprobs, req.top_logprobs)}


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


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"
