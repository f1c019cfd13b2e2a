"""Mistral (7B-Instruct-v0.3, Nemo, Small): `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`;
several calls are items of the one list.

Read also: the newer `[TOOL_CALLS]name[ARGS]{...}` form, and a list whose `[TOOL_CALLS]` is missing
at the reply's start: the tag is a control token that `decode(skip_special_tokens=True)` drops.
"""
from __future__ import annotations

import json
import re

from ..jsonscan import scan_json
from .base import UNTERMINATED, ToolFormat, tools_json_lines

TAG, ARGS = "[TOOL_CALLS]", "[ARGS]"
_TAGLESS = re.compile(r"\s*\[\s*\{")     # a call list at the reply's start, its tag dropped
_TAGLESS_OPEN = re.compile(r"\s*\[\s*")  # ... not yet decided


class MistralFormat(ToolFormat):
    name = "mistral"
    args_key = "arguments"
    call_start = TAG + " ["
    call_end = "]"
    call_sep = ", "
    calls_in_one_list = True
    markers = (TAG, ARGS)
    tool_result_start = "[TOOL_RESULTS] "
    tool_result_end = "[/TOOL_RESULTS]"

    def parse(self, text):
        content, calls, segs = [], [], self.segments(text)
        for k, (kind, piece) in enumerate(segs):
            if kind == "text":
                content.append(piece)
                continue
            call = self._read_call(piece.strip())
            if "error" in call and k == len(segs) - 1 and _json_prefix(piece):
                call["error"] = UNTERMINATED
            calls.append(call)
        return "".join(content).strip(), calls

    def segments(self, text):
        out, pos = [], 0
        after = len(text) - len(text.lstrip()) if TAG not in text and _TAGLESS.match(text) else None
        while after is not None or (tag := text.find(TAG, pos)) >= 0:
            if after is None:
                out.append(("text", text[pos:tag]))
                after = tag + len(TAG)
            items, pos = _read_items(text, after)
            out += [("call", item) for item in items]
            if pos is None:  # the calls run to the end of the text
                return out
            after = None
        out.append(("text", text[pos:]))
        return out

    def undecided_tail(self, text):
        if TAG not in text and _TAGLESS_OPEN.fullmatch(text):
            return len(text)
        return max((n for n in range(min(len(TAG) - 1, len(text)), 0, -1) if text.endswith(TAG[:n])), default=0)

    def open_call_json(self, text):
        kind, body = self.segments(text)[-1]
        # "" also right after the tag, before the list's "[": `forced_next` drafts that gap
        return body if kind == "call" else None

    def forced_next(self, text, tools):
        if text.rstrip().endswith(TAG) and self.open_call_json(text) == "":
            return "[" if text.endswith(" ") else " ["
        return None

    def calls_start(self, text):
        tag = text.rfind(TAG)
        if tag >= 0:
            return tag
        return len(text) - len(text.lstrip()) if _TAGLESS.match(text) else -1

    def system_prompt(self, tools):
        return ("You can call functions. To call one or more, reply with [TOOL_CALLS] followed by a JSON list "
                'of calls: [TOOL_CALLS] [{"name": <function-name>, "arguments": <args-json-object>}, ...]\n'
                "The available functions:\n" + tools_json_lines(tools))


def _read_items(text: str, pos: int) -> tuple[list[str], int | None]:
    """The calls' texts that follow a `[TOOL_CALLS]` ending at `pos`, and where the text after them
    begins (None when they run to the end of `text`).

    The list form gives each item's JSON as written; the `name[ARGS]{...}` form gives the call JSON
    it stands for (`{"name": "name", "arguments": {...}}`) once its name is complete.
    """
    i = _skip_space(text, pos)
    if i == len(text):
        return [""], None
    if text[i] not in "[{":  # the newer form: name[ARGS]{...}
        marker = text.find(ARGS, i)
        if marker < 0:
            return [text[i:]], None
        head = '{"name": ' + json.dumps(text[i:marker].strip(), ensure_ascii=False) + ', "arguments": '
        args = marker + len(ARGS)
        end = _json_end(text, args)
        return ([head + text[args:]], None) if end is None else ([head + text[args:end] + "}"], end)
    if text[i] == "{":  # one call with no list around it
        end = _json_end(text, i)
        return ([text[i:]], None) if end is None else ([text[i:end]], end)
    i, items = _skip_space(text, i + 1), []
    while True:
        if i == len(text):
            return items + [""], None
        if text[i] == "]":
            return items, i + 1
        end = _json_end(text, i) if text[i] == "{" else None
        if end is None:  # open, or not a JSON object: the rest is this call's text
            return items + [text[i:]], None
        items.append(text[i:end])
        i = _skip_space(text, end)
        if i == len(text):
            return items, None
        if text[i] == ",":
            i = _skip_space(text, i + 1)
        elif text[i] != "]":
            return items + [text[i:]], None


def _json_prefix(text: str) -> bool:
    """`text` is the start of some JSON value, cut short."""
    state = scan_json(text)
    return not state.error and not state.done


def _json_end(text: str, i: int) -> int | None:
    try:
        return json.JSONDecoder().raw_decode(text, i)[1]
    except json.JSONDecodeError:
        return None


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i
