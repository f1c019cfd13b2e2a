"""Hermes / Qwen2.5 / Qwen3 / ChatML: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`."""
from __future__ import annotations

from .base import ToolFormat, tools_json_lines

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesFormat(ToolFormat):
    name = "hermes"
    args_key = "arguments"
    call_start = OPEN + "\n"
    call_end = "\n" + CLOSE
    call_sep = "\n"

    def parse(self, text):
        content, calls, pos = [], [], 0
        while True:
            start = text.find(OPEN, pos)
            if start < 0:
                content.append(text[pos:])
                break
            content.append(text[pos:start])
            body_start = start + len(OPEN)
            end = text.find(CLOSE, body_start)
            if end < 0:
                raw = text[body_start:].strip()
                calls.append({"name": self._read_call(raw).get("name"), "arguments": raw,
                              "error": "unterminated tool call: generation stopped inside the call "
                                       "(max_new_tokens or a stop sequence reached)"})
                break
            calls.append(self._read_call(text[body_start:end].strip()))
            pos = end + len(CLOSE)
        return "".join(content).strip(), calls

    def open_call_json(self, text):
        start = text.rfind(OPEN)
        if start < 0 or text.find(CLOSE, start) >= 0:
            return None
        body = text[start + len(OPEN):]
        if body in ("", "\n"):
            return ""
        return body[1:] if body.startswith("\n") else body

    def system_prompt(self, tools):
        return ("You are a function calling AI model. You are provided with function signatures within "
                "<tools></tools> XML tags. You may call one or more functions to assist with the user query. "
                "Don't make assumptions about what values to plug into functions. Here are the available tools: "
                "<tools>\n" + tools_json_lines(tools) + "\n</tools>\n"
                "For each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
