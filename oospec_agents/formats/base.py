"""The interface every tool-call text format implements.

A format knows three things about its target family: how a call is written as text (render),
how to read calls back out of generated text (parse), and the fixed skeleton around the JSON
that the schema drafter walks (`call_start`, `open_call_json`, `call_end`). A format whose calls
are not JSON (pythonic) drafts its own skeleton through `forced_next`.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from ..jsonscan import call_name
from ..tools import Tool


UNTERMINATED = ("unterminated tool call: generation stopped inside the call "
                "(max_new_tokens or a stop sequence reached)")
#: the engine's word for an unterminated call whose reply the model itself ended (its end-of-sequence token)
ENDED_INSIDE = "unterminated tool call: the model ended its reply (end of sequence) inside the call"


class ToolFormat(ABC):
    """How one model family writes tool calls as text: the one place the engine learns a family's markup.

    It renders (`render_call`, `render_calls`, `render_tool_result`: a call the sidecar predicts is
    posted as a hint in the target's own format), parses (`parse`, `segments`: the reply's text into
    content and calls, also mid-stream, where `undecided_tail` holds back what may still become markup),
    and gives the schema drafter the fixed skeleton around a call's JSON (`call_start`,
    `open_call_json`, `call_end`; `forced_prefix` for a forced tool_choice; `forced_next` where the
    calls are not JSON). `system_prompt` offers the tools where the chat template does not.
    A new format subclasses this, fills the class attributes below and the abstract methods, and is
    named in `formats.FORMATS` (and `detect_format` where a chat template can tell it).
    """
    name: str
    #: key that holds the arguments object in the call JSON
    args_key: str
    #: text written before a call's JSON object
    call_start: str
    #: text written after a call's JSON object
    call_end: str
    #: text between two calls of one message
    call_sep: str
    #: several calls of one message are items of one list, `call_start` a, `call_sep` b `call_end`
    #: (mistral, pythonic), rather than each call wrapped on its own (hermes)
    calls_in_one_list: bool = False
    #: markup tokens that tokenizers often hold as *special* tokens, which `decode(skip_special_tokens=
    #: True)` would drop from the reply's text: the engine keeps them (engine.ReplyText)
    markers: tuple[str, ...] = ()
    #: how a tool's result is written back, for chat templates that have no tool role of their own
    tool_result_start: str = "<tool_response>\n"
    tool_result_end: str = "\n</tool_response>"

    def call_json(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, self.args_key: arguments}, ensure_ascii=False)

    def call_text(self, name: str, arguments: dict) -> str:
        """One call as the format writes it, without the wrapper around it."""
        return self.call_json(name, arguments)

    def render_call(self, name: str, arguments: dict) -> str:
        return self.call_start + self.call_text(name, arguments) + self.call_end

    def render_calls(self, calls: list[dict]) -> str:
        if self.calls_in_one_list:
            return self.call_start + self.call_sep.join(
                self.call_text(c["name"], _as_dict(c["arguments"])) for c in calls) + self.call_end
        return self.call_sep.join(self.render_call(c["name"], _as_dict(c["arguments"])) for c in calls)

    def render_tool_result(self, content: str) -> str:
        return self.tool_result_start + content + self.tool_result_end

    def for_forced_reply(self, mode: str) -> "ToolFormat":
        """The format that reads a reply whose opener the prompt forced (`mode`: tool_choice's
        "required" or "named"): such a reply is calls, however it goes on. Most formats' forced
        openers already say so; the format itself."""
        return self

    def forced_prefix(self, name: str | None = None) -> str:
        """Assistant text prefilled to force a call (and, with `name`, that tool)."""
        if name is None:
            return self.call_start + '{"name": "'
        return self.call_start + '{"name": ' + json.dumps(name, ensure_ascii=False)

    @abstractmethod
    def parse(self, text: str) -> tuple[str, list[dict]]:
        """Split generated text into (content outside calls, calls).

        Each call is {"name", "arguments": dict} or, when it cannot be read,
        {"name", "arguments": raw str, "error": why}.
        """

    @abstractmethod
    def segments(self, text: str) -> list[tuple[str, str]]:
        """Split text, written so far, into ("text", content) and ("call", call JSON text) pieces in
        order; the last call may still be open. The calls are those that `parse` reads."""

    @abstractmethod
    def undecided_tail(self, text: str) -> int:
        """How many characters at the end of `text` may still turn out to open a call."""

    @abstractmethod
    def open_call_json(self, text: str) -> str | None:
        """The JSON written so far of a call that is still open at the end of `text`, else None.

        Returns "" right where a call's JSON is about to begin.
        """

    @abstractmethod
    def system_prompt(self, tools: list[Tool]) -> str:
        """The system prompt that offers `tools`, for chat templates that drop `tools=`."""

    def calls_start(self, text: str) -> int:
        """Where the wrapper of the call open at the end of `text` begins (a hint rendered by
        `render_call` is aligned with the text from there), or -1 when there is none to find."""
        tag = self.call_start.strip()
        return text.rfind(tag) if tag else -1

    def forced_next(self, text: str, tools: list[Tool]) -> str | None:
        """The text forced right after `text` (the schema drafter's next stretch), for formats whose
        calls are not JSON. None, the default, lets the drafter walk the call JSON itself."""
        return None

    def _read_call(self, raw: str) -> dict:
        """Decode one call's JSON text into a call dict (with "error" when it cannot)."""
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            return {"name": call_name(raw), "arguments": raw, "error": f"call is not valid JSON: {e}"}
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return {"name": call_name(raw), "arguments": raw, "error": "call JSON has no string 'name'"}
        args = obj.get(self.args_key, obj.get("arguments", obj.get("parameters", {})))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as e:
                return {"name": obj["name"], "arguments": args, "error": f"arguments are not valid JSON: {e}"}
        if not isinstance(args, dict):
            return {"name": obj["name"], "arguments": json.dumps(args), "error": "arguments must be a JSON object"}
        return {"name": obj["name"], "arguments": args}


def _as_dict(arguments: Any) -> dict:
    if isinstance(arguments, str):
        return json.loads(arguments) if arguments.strip() else {}
    return dict(arguments or {})


def unique_completion(prefix: str, options: list[str]) -> str | None:
    """The rest of the one option that starts with `prefix`, else None."""
    matches = [o for o in options if o.startswith(prefix)]
    return matches[0][len(prefix):] if len(matches) == 1 else None


def enum_strings(schema: dict) -> list[str]:
    enum = schema.get("enum")
    return [e for e in enum if isinstance(e, str)] if isinstance(enum, list) else []


def tools_json_lines(tools: list[Tool]) -> str:
    return "\n".join(json.dumps(t.to_openai(), ensure_ascii=False) for t in tools)
