"""Llama 3.x JSON tool calls: the message is `{"name": ..., "parameters": {...}}` (optionally after
`<|python_tag|>`); several calls are separated by `; `."""
from __future__ import annotations

import json

from .base import UNTERMINATED, ToolFormat, tools_json_lines

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    args_key = "parameters"
    call_start = ""
    call_end = ""
    call_sep = "; "
    markers = (PYTHON_TAG,)

    def parse(self, text):
        segs = self.segments(text)
        if segs[0][0] == "text":
            return text.strip(), []
        calls = []
        for _, raw in segs:
            call = self._read_call(raw.strip())
            if "error" in call and not raw.rstrip().endswith("}"):
                call["error"] = UNTERMINATED
            calls.append(call)
        return "", calls

    def segments(self, text):
        body = _body(text)
        if body is None:
            return [("text", text)]
        out, pos, dec = [], 0, json.JSONDecoder()
        while pos < len(body):
            try:
                _, end = dec.raw_decode(body, pos)
            except json.JSONDecodeError:
                out.append(("call", body[pos:]))
                break
            out.append(("call", body[pos:end]))
            pos = end
            while pos < len(body) and body[pos] in "; \n\t":
                pos += 1
        return out

    def undecided_tail(self, text):
        # the whole reply is a call or none: until its first character decides, all of it waits
        return len(text) if PYTHON_TAG.startswith(text.lstrip()) else 0

    def open_call_json(self, text):
        body = text.lstrip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
        if not body.startswith("{"):
            return None
        last = body.rsplit("; ", 1)[-1] if body.count("; {") else body
        return last

    def system_prompt(self, tools):
        return ("You have access to the following functions. To call a function, respond with JSON for a "
                'function call in the format {"name": function name, "parameters": dictionary of argument '
                "name and its value}. Do not use variables.\n\n" + tools_json_lines(tools))


def _body(text: str) -> str | None:
    """The calls' text of a reply that is calls (after an optional python tag), else None."""
    body = text.lstrip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].lstrip()
    return body if body.startswith("{") else None
