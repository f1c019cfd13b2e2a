"""Llama 3.x JSON tool calls: the message is `{"name": ..., "parameters": {...}}` (optionally after
`<|python_tag|>`); several calls are separated by `; `."""
from __future__ import annotations

import json

from .base import ToolFormat, tools_json_lines

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    args_key = "parameters"
    call_start = ""
    call_end = ""
    call_sep = "; "

    def parse(self, text):
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
        if not body.startswith("{"):
            return text.strip(), []
        calls, pos, dec = [], 0, json.JSONDecoder()
        while pos < len(body):
            try:
                _, end = dec.raw_decode(body, pos)
            except json.JSONDecodeError:
                raw = body[pos:].strip()
                call = self._read_call(raw)
                if "error" in call and not raw.rstrip().endswith("}"):
                    call["error"] = ("unterminated tool call: generation stopped inside the call "
                                     "(max_new_tokens or a stop sequence reached)")
                calls.append(call)
                break
            calls.append(self._read_call(body[pos:end]))
            pos = end
            while pos < len(body) and body[pos] in "; \n\t":
                pos += 1
        return "", calls

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
