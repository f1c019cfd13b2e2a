"""Hermes / Qwen2.5 / Qwen3 / ChatML: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`."""
from __future__ import annotations

from .base import UNTERMINATED, ToolFormat, tools_json_lines

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesFormat(ToolFormat):
    name = "hermes"
    args_key = "arguments"
    call_start = OPEN + "\n"
    call_end = "\n" + CLOSE
    call_sep = "\n"
    markers = (OPEN, CLOSE)

    def parse(self, text):
        content, calls, segs = [], [], self.segments(text)
        for k, (kind, piece) in enumerate(segs):
            if kind == "text":
                content.append(piece)
            elif k == len(segs) - 1:  # a call is last only while its closing tag is missing
                raw = piece.strip()
                calls.append({"name": self._read_call(raw).get("name"), "arguments": raw,
                              "error": UNTERMINATED})
            else:
                calls.append(self._read_call(piece.strip()))
        return "".join(content).strip(), calls

    def segments(self, text):
        out, pos = [], 0
        while (start := text.find(OPEN, pos)) >= 0:
            out.append(("text", text[pos:start]))
            body = start + len(OPEN)
            end = text.find(CLOSE, body)
            out.append(("call", text[body:] if end < 0 else text[body:end]))
            if end < 0:
                return out
            pos = end + len(CLOSE)
        out.append(("text", text[pos:]))
        return out

    def undecided_tail(self, text):
        return max((n for n in range(min(len(OPEN) - 1, len(text)), 0, -1) if text.endswith(OPEN[:n])), default=0)

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
