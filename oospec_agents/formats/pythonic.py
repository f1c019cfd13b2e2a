"""Pythonic tool calls (Llama 3.2 / Llama 4 / Gemma 3 pythonic templates): the reply is a Python list
of calls, `[get_weather(city="Paris"), other(a=1, b=[1, 2], c={"k": None})]`, with keyword arguments
whose values are Python literals.

`parse` reads each call with Python's own parser (`ast`), never `eval`. Everything else that reads
text still being written (the events' argument fragments, the schema drafter's skeleton) goes through
`scan_calls`: a small scanner that splits the list into its calls and writes each call, as far as it
goes, as the call JSON it stands for, `{"name": "get_weather", "arguments": {"city": "Paris"`. That
JSON only grows as the text grows: a number or a name waits until it ends, a string is sent as its
characters are decoded, and its closing quote waits for the next token (Python joins `"a" "b"`).
"""
from __future__ import annotations

import ast
import copy
import json
import math
import re
import warnings
from dataclasses import dataclass, field

from ..jsonscan import call_name
from .base import UNTERMINATED, ToolFormat, enum_strings, unique_completion

_NAME = r"[A-Za-z_][\w.]*"
_OPENER = re.compile(r"\s*\[\s*" + _NAME + r"\s*\(")       # the reply is a call list
_UNDECIDED = re.compile(r"\s*(\[\s*(" + _NAME + r"\s*)?)?")  # ... may still turn out to be one
_STRING = re.compile(r"(?:[rRuUbBfF]{1,2})?('''|\"\"\"|'|\")")
_WORD = re.compile(r"[\w.+\-]+")


class PythonicFormat(ToolFormat):
    name = "pythonic"
    args_key = "arguments"
    call_start = "["
    call_end = "]"
    call_sep = ", "
    calls_in_one_list = True

    def call_text(self, name, arguments):
        return name + "(" + ", ".join(f"{k}={python_literal(v)}" for k, v in arguments.items()) + ")"

    #: the prompt forced the list's `[` (tool_choice "required"): the reply is a call list whatever
    #: follows it, where a free reply's `[` opens one only before `name(`
    forced_list = False

    def forced_prefix(self, name=None):
        return "[" if name is None else "[" + name + "("

    def for_forced_reply(self, mode):
        if mode != "required":  # a named tool's prefix, `[name(`, already opens a call
            return self
        forced = copy.copy(self)
        forced.forced_list = True
        return forced

    def _is_list(self, text: str) -> bool:
        return bool(_OPENER.match(text) or self.forced_list and text.lstrip().startswith("["))

    def _begun(self, text: str) -> bool:
        """A call list, or the start of what may still become one."""
        return self._is_list(text) or _list_begun(text)

    def parse(self, text):
        if not self._is_list(text):
            return text.strip(), []
        scan = scan_calls(text)
        calls = [_read_call(text[c.start:c.end], c.end is not None, call_name(c.json())) for c in scan.calls]
        return ("" if scan.end is None else text[scan.end:].strip()), calls

    def segments(self, text):
        if not self._is_list(text):
            return [("text", text)]
        scan = scan_calls(text)
        segs = [("call", c.json()) for c in scan.calls]
        return segs if scan.end is None else segs + [("text", text[scan.end:])]

    def undecided_tail(self, text):
        return len(text) if _UNDECIDED.fullmatch(text) and not self._is_list(text) else 0

    def open_call_json(self, text):
        if not self._begun(text):
            return None
        scan = scan_calls(text)
        return None if scan.end is not None else scan.calls[-1].json()

    def calls_start(self, text):
        return text.find("[") if self._begun(text) else -1

    def forced_next(self, text, tools):
        """`[`, a tool name's unique completion and `(`, the next required keyword and `=`, an enum's
        unique completion, `)` after the last required argument, `]` after the call."""
        if not tools:
            return ""
        if not text.strip():
            return "["
        if not self._begun(text):
            return ""
        scan = scan_calls(text)
        if scan.end is not None:
            return ""
        call = scan.calls[-1]
        if call.state == "name":
            rest = unique_completion(call.name, [t.name for t in tools])
            return "" if rest is None else rest + "("
        if call.state == "done":
            return "]"
        tool = next((t for t in tools if t.name == call.name), None)
        if tool is None:
            return ""
        remaining = [k for k in tool.required if k not in call.keys]
        if call.state == "key":
            if not remaining:
                return ""
            return (" " if text.endswith(",") else "") + remaining[0] + "="
        if call.state == "keyword":
            rest = unique_completion(call.key, [k for k in tool.properties if k not in call.keys])
            return "" if rest is None else rest + "="
        schema = tool.properties.get(call.key, {})
        if call.state == "value":
            enum = schema.get("enum")
            if isinstance(enum, list) and len(enum) == 1:
                return python_literal(enum[0])
            if "const" in schema:
                return python_literal(schema["const"])
            strings = schema.get("type") == "string" or (enum and all(isinstance(e, str) for e in enum))
            return '"' if strings else ""
        if call.state == "string":
            rest = unique_completion(call.string, enum_strings(schema))
            return "" if rest is None else _escape(rest, call.quote) + call.quote
        if call.state == "after":
            return ", " + remaining[0] + "=" if remaining else ")"
        return ""

    def system_prompt(self, tools):
        return ("You have access to the following functions. To call functions, respond with a python list "
                "of the calls, in the format [func_name1(params_name1=params_value1, "
                "params_name2=params_value2...), func_name2(params)]. Do not use variables.\n\n"
                + "\n\n".join(json.dumps(t.to_openai(), ensure_ascii=False, indent=4) for t in tools))


def _list_begun(text: str) -> bool:
    """`text` is a call list, or the start of what may still become one (`[`, `[get_w`)."""
    return bool(_OPENER.match(text) or "[" in text and _UNDECIDED.fullmatch(text))


def python_literal(value) -> str:
    """`value` (a JSON value) as a Python literal."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's string escapes are Python's too
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{python_literal(str(k))}: {python_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as a tool-call argument; expected a JSON value")


# ---------------------------------------------------------------------------- reading finished calls

def _read_call(raw: str, finished: bool, name: str | None) -> dict:
    """One call's text, read by Python's parser, as a call dict (with "error" when it cannot be read).
    `name` is the name an invalid call reports: the one its call JSON (`PyCall.json`) gives, so the
    same that the event stream announces."""
    try:
        node = ast.parse(raw.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        why = f"call is not valid Python: {getattr(e, 'msg', None) or e}" if finished else UNTERMINATED
        return {"name": name, "arguments": raw, "error": why}
    if not isinstance(node, ast.Call) or _dotted(node.func) is None:
        return {"name": name, "arguments": raw, "error": "expected a call like name(key=value, ...)"}
    if node.args or any(kw.arg is None for kw in node.keywords):
        return {"name": name, "arguments": raw, "error": "arguments must be written as key=value"}
    args = {}
    for kw in node.keywords:
        try:
            value = ast.literal_eval(kw.value)
        except (ValueError, TypeError, RecursionError, MemoryError):
            return {"name": name, "arguments": raw, "error": f"argument {kw.arg}={ast.unparse(kw.value)} is not a "
                    "literal; expected True/False/None, a number, a string, or a list or dict of them"}
        try:
            args[kw.arg] = _json_value(value)
        except ValueError as e:
            return {"name": name, "arguments": raw, "error": f"argument {kw.arg!r}: {e}"}
    return {"name": _dotted(node.func), "arguments": args}


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (head := _dotted(node.value)) is not None:
        return head + "." + node.attr
    return None


def _json_value(value):
    """A literal as the JSON value it stands for: tuples become lists; sets, bytes and the like fail."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(v) for k, v in value.items()}
    raise ValueError(f"{value!r} has no JSON equivalent")


def _escape(s: str, quote: str) -> str:
    """`s` written inside a Python string that `quote` opened (JSON's escapes are Python's too)."""
    body = json.dumps(s, ensure_ascii=False)[1:-1]
    return body.replace("'", "\\'") if quote[0] == "'" else body


# ---------------------------------------------------------------------------- reading calls being written

@dataclass
class PyCall:
    """One call of the list, as far as it is written."""
    start: int                      # where its text begins
    end: int | None = None          # where it ends (at a "," or the list's "]"), once it has
    name: str = ""                  # the function name (partial while `state` is "name")
    keys: list[str] = field(default_factory=list)
    key: str = ""                   # the keyword being written, or whose value is being read
    #: name | key (a keyword or ")" is next) | keyword | value (after "=") | string (an open string
    #: value) | scalar (an unfinished number or name) | nested (inside a list/dict/tuple value) |
    #: after (the value ended) | done (")" written) | error
    state: str = "name"
    string: str = ""                # an open string value's characters so far
    quote: str = '"'                # ... and its quote
    out: list[str] = field(default_factory=list)  # the call JSON written so far
    pending: str | None = None      # a string value whose closing quote waits for the next token
    comma: bool = False             # a "," inside a value, written once the next item begins
    stack: list[str] = field(default_factory=list)  # brackets open inside the argument value
    raw: str = ""                   # once in error: the text from the token that broke it, as written

    def json(self) -> str:
        """The call JSON this call stands for, as far as it is written (then, past an error, the rest
        as written: the call is invalid, and its arguments text shows what the target wrote)."""
        tail = "" if self.pending is None else json.dumps(self.pending, ensure_ascii=False)[:-1]
        return "".join(self.out) + tail + self.raw


@dataclass
class CallScan:
    calls: list[PyCall]
    end: int | None = None          # just past the list's "]", once it is written


def scan_calls(text: str) -> CallScan:
    """Split the call list that `text` starts with (possibly unfinished) into its calls."""
    start = text.find("[")
    scan = CallScan([PyCall(start + 1)])
    depth, i = 0, start + 1  # depth: brackets open inside the current call
    previous = broken = None  # where the last token began; where the current call stopped making sense
    while i < len(text):
        c, call = text[i], scan.calls[-1]
        if broken is None and call.state == "error":
            broken = previous
        previous = i
        if c.isspace():
            i += 1
        elif depth == 0 and c in ",]":
            call.end = i
            if broken is not None:
                call.raw, broken = text[broken:i].rstrip(), None
            if c == "]":
                scan.end = i + 1
                if not text[call.start:i].strip():  # after a trailing comma: no call
                    scan.calls.pop()
                return scan
            scan.calls.append(PyCall(i + 1))
            i += 1
        elif string := _STRING.match(text, i):
            quote = string.group(1)
            end = _string_end(text, string.end(), quote)
            _feed_string(call, string.group()[:-len(quote)], quote,
                         text[string.end():len(text) if end is None else end - len(quote)], end is not None)
            i = len(text) if end is None else end
        elif word := _WORD.match(text, i):
            _feed_word(call, word.group(), complete=word.end() < len(text))
            i = word.end()
        else:
            depth = max(0, depth + (c in "([{") - (c in ")]}"))
            _feed_punct(call, c)
            i += 1
    if scan.calls[-1].state == "error":
        scan.calls[-1].raw = text[previous if broken is None else broken:]
    return scan


def _feed_word(call: PyCall, word: str, complete: bool) -> None:
    """A name or a number; one that runs to the end of the text may still grow."""
    if call.state == "name":
        call.name = word
    elif call.state == "key" and word.isidentifier():
        call.key, call.state = word, "keyword"
    elif call.state in ("value", "nested") and not complete:
        call.state = "scalar" if call.state == "value" else "nested"
    elif call.state in ("value", "nested"):
        _close_string(call)
        _separate(call)
        call.out.append(_word_json(word))
        call.state = "nested" if call.stack else "after"
    else:
        call.state = "error"


def _feed_string(call: PyCall, prefix: str, quote: str, body: str, complete: bool) -> None:
    joined = call.pending is not None  # Python joins adjacent strings: "a" "b" is "ab"
    if call.state not in ("value", "nested") and not (call.state == "after" and joined):
        call.state = "error"
        return
    if "b" in prefix.lower() or "f" in prefix.lower():  # bytes and f-strings are not plain strings
        call.state = "error"
        return
    if not complete:  # decode only what can no longer change: an escape may be cut in half
        body = body[:_safe_cut(body, raw="r" in prefix.lower())]
        body = body.rstrip(quote[0]) if len(quote) == 3 else body
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an invalid escape such as "\d" is kept, with a warning
            decoded = ast.literal_eval(prefix + quote + body + quote)
    except (ValueError, SyntaxError):
        if complete:
            call.state = "error"
        return  # an open string whose prefix cannot be read yet: nothing more to send
    if not joined:
        _separate(call)
    call.pending = (call.pending or "") + decoded
    top = not call.stack
    if complete:
        call.state = "after" if top else "nested"
    else:
        call.string, call.quote, call.state = call.pending, quote, "string" if top else "nested"


def _feed_punct(call: PyCall, c: str) -> None:
    state, closer = call.state, {"(": ")", "[": "]", "{": "}"}
    if state == "name" and c == "(" and call.name:
        call.out.append('{"name": ' + json.dumps(call.name, ensure_ascii=False) + ', "arguments": {')
        call.state = "key"
    elif state == "keyword" and c == "=":
        call.out.append((", " if call.keys else "") + json.dumps(call.key, ensure_ascii=False) + ": ")
        call.keys.append(call.key)
        call.state = "value"
    elif state in ("key", "after") and c == ")" and not call.stack:
        _close_string(call)
        call.out.append("}}")
        call.state = "done"
    elif state == "after" and c == "," and not call.stack:
        _close_string(call)
        call.state = "key"
    elif state in ("value", "nested") and c in "([{":
        _close_string(call)
        _separate(call)
        call.out.append("{" if c == "{" else "[")
        call.stack.append(c)
        call.state = "nested"
    elif state in ("nested", "after") and call.stack and c == closer[call.stack[-1]]:
        _close_string(call)
        call.comma = False  # a trailing comma: JSON has none
        call.out.append("}" if call.stack.pop() == "{" else "]")
        call.state = "nested" if call.stack else "after"
    elif state == "nested" and call.stack and c == ",":
        _close_string(call)
        call.comma = True
    elif state == "nested" and call.stack and c == ":" and call.stack[-1] == "{":
        _close_string(call)
        call.out.append(": ")
    else:
        call.state = "error"


def _close_string(call: PyCall) -> None:
    if call.pending is not None:
        call.out.append(json.dumps(call.pending, ensure_ascii=False))
        call.pending = None


def _separate(call: PyCall) -> None:
    if call.comma:
        call.out.append(", ")
        call.comma = False


def _word_json(word: str) -> str:
    """A Python name or number as JSON: True/False/None become true/false/null; any other name
    stays as written (and the call is invalid)."""
    if word in ("True", "False", "None"):
        return {"True": "true", "False": "false", "None": "null"}[word]
    try:
        value = ast.literal_eval(word)
    except (ValueError, SyntaxError):
        return word
    return json.dumps(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else word


def _string_end(text: str, j: int, quote: str) -> int | None:
    """Just past the closing `quote` of a string whose body starts at `j`, or None while it is open."""
    while j < len(text):
        if text[j] == "\\":
            j += 2
        elif text.startswith(quote, j):
            return j + len(quote)
        else:
            j += 1
    return None


def _safe_cut(body: str, raw: bool) -> int:
    """How much of an open string's body is final: up to an escape that may still be unfinished."""
    j, n = 0, len(body)
    while j < n:
        if body[j] != "\\":
            j += 1
            continue
        kind = body[j + 1] if j + 1 < n else ""
        if not kind or raw or kind not in "xuUN01234567":
            width = 2
        elif kind == "N":
            close = body.find("}", j)
            width = n + 1 if close < 0 else close + 1 - j
        elif kind in "xuU":
            width = {"x": 4, "u": 6, "U": 10}[kind]
        else:  # octal: up to three digits, so one at the very end may be followed by more
            k = j + 1
            while k < n and k < j + 4 and body[k] in "01234567":
                k += 1
            width = k - j if k < n or k == j + 4 else n + 1 - j
        if j + width > n:
            return j
        j += width
    return n
