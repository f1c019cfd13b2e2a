"""A response of OpenAI's Responses API as it is sent: the engine's events folded into the stream's
events (with sequence numbers) and the same response's body (`ResponsesFold`, streaming.py's `Fold`
for `/v1/responses`).

Output items open in the order the reply writes them: a reasoning target's reasoning is a `reasoning`
output item (`reasoning_text` content) before the message and the calls, as OpenAI's open-weight models
and vLLM give it; then a `message` item when text comes, a `function_call` item per call. With our
opt-in `oospec` extension's `predicted_calls` (extension.py), each prediction is an
`oospec.predicted_calls` event of its own (never a `function_call` item), listed again under
`oospec.predictions` in the response.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable

from ..engine import Generation
from ..events import CallPredicted, ReasoningDelta, TextDelta, ToolCallDelta
from ..frontend import CallsSoFar, ParallelToolCalls, Usage
from .extension import RESPONSES_EVENT, Predictions
from .protocol import ResponsesRequest, oospec_object
from .streaming import Fold


class ResponsesFold(Fold):
    """One response as it is sent: the stream's events (numbered), or (from the same engine events)
    its body. Output items open in the order the reply writes them: a `reasoning` item when the reply
    reasons (not for an empty block), a `message` item when text comes, a `function_call` item per call;
    an item is done when the next opens, or at the end.

    `apply(event)` folds in one engine event (reasoning, text or call; the Generation closes the
    response) and returns the stream events it makes. `first_token()` is called at the first reasoning,
    text or call event (the time-to-first-token metric). With `predictions` (the
    `oospec.predicted_calls` extension), a `CallPredicted` is an `oospec.predicted_calls` event;
    without, it makes none, as a `ToolCallReady` never does."""
    what = "response"

    def __init__(self, model: str, replica: str, req: ResponsesRequest, parallel: ParallelToolCalls | None = None,
                 first_token: Callable[[], None] = lambda: None, predictions: Predictions | None = None):
        super().__init__(choices=1)
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
        self._final: dict | None = None  # the response the closing event carries

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

    def apply(self, item) -> list[dict]:
        """One engine event's stream events (none for an event a response does not show); the
        Generation's are the closing ones."""
        if isinstance(item, Generation):
            self.gens.append(item)
            events = self.closing(item)
            self._final = events[-1]["response"]
            return events
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

    def body(self) -> dict:
        """The non-streamed response: the one the stream's last event carries."""
        return self._final

    def encode(self, event: dict) -> str:
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

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
