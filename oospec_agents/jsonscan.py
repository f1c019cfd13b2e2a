"""The one reader of JSON text that is still being written: tool-call JSON, read while the target
writes it.

It owns:

- `scan_json`: the character-level state machine over a (possibly unfinished, possibly invalid)
  JSON prefix. It says where the prefix stops (the open containers with their keys, an open string
  or scalar, whether the top value is complete or the text has gone wrong) and, when the top value
  is an object, where each of its members' values begins and ends.
- `call_name`: the one way to read a call's function name from its JSON text: the outermost
  object's "name" string, once that string is closed. Text after the name may be unfinished or
  invalid; the name still reads.
- `read_call`: what an unfinished call object says so far (`CallSoFar`): its name, the span of
  its arguments value, and how far the text may be sent (an unfinished string escape waits).

The schema drafter, the formats and the event stream read call JSON through these, and nothing
else in the package scans JSON character by character. Stdlib only: the bottom floor of the package, it imports nothing
from it. One linear pass per call; the bodies of strings and scalars are skipped by regular
expressions rather than character by character, since the engine scans the open call every round.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_SPACE = " \n\t\r"
_STRING_BODY = re.compile(r'[^"\\]*')   # a string's characters up to its end or the next escape
#: a string's characters, escapes included, up to its closing quote (or an escape the text cuts short)
_STRING = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)
_SCALAR = re.compile(r"[^,}\] \n\t]*")   # a number or literal runs up to a delimiter


@dataclass
class Frame:
    """One open container."""
    kind: str                       # "obj" | "arr"
    keys: list[str] = field(default_factory=list)  # the keys read so far (raw, as written)
    key: str | None = None          # key whose value is being read
    state: str = "key"              # obj: key | colon | value | after ; arr: value | after


@dataclass
class Member:
    """One member of the outermost object: its key (decoded) and its value's span in the text."""
    key: str | None                 # None when the key's escapes do not decode
    start: int
    end: int | None = None          # just past the value, once it has ended


@dataclass
class JsonState:
    """Where a JSON prefix stops: the container stack and, if inside a string or scalar, its text."""
    stack: list[Frame]
    in_string: str | None = None     # partial string content (raw)
    string_is_key: bool = False
    scalar: str | None = None        # partial number / literal
    done: bool = False               # the top-level value is complete
    error: bool = False              # the text stopped being JSON (the scan stops there)
    #: the outermost value's members when it is an object (else None), as far as the scan went
    members: list[Member] | None = None
    #: in an open string, where an escape that the text cuts short begins (else None)
    open_escape: int | None = None

    @property
    def closed(self) -> bool:
        """The outermost value is an object and its closing brace is written."""
        return self.done and self.members is not None


def scan_json(text: str, stop_after: str | None = None) -> JsonState:
    """Scan `text`, the start of a JSON value, as far as it goes or until it stops being JSON. With `stop_after`,
    it also stops where the outermost object's first member with that key ends (`call_name` reads no more)."""
    st = JsonState(stack=[])
    stack = st.stack
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _SPACE:
            i += 1
            continue
        top = stack[-1] if stack else None
        if c in ",:":  # between members or items; between a key and its value
            if top is None or top.state != ("after" if c == "," else "colon"):
                return _failed(st)
            top.state = "key" if c == "," and top.kind == "obj" else "value"
            i += 1
            continue
        if c == '"' and top is not None and top.state == "key":  # only an object waits for a key
            st.string_is_key = True
            j = _STRING.match(text, i + 1).end()
            if j >= n or text[j] != '"':
                return _open_string(st, text, i)
            top.key = s = text[i + 1:j]
            top.keys.append(s)
            top.state = "colon"
            i = j + 1
            continue
        if c in "}]":
            if top is None or (c == "}") != (top.kind == "obj"):
                return _failed(st)
            stack.pop()
            end = i = i + 1
        else:  # a value begins: a string, an object or a list, a number or a literal
            if top is not None and top.state != "value":
                return _failed(st)
            if top is None and c == "{":
                st.members = []
            elif st.members is not None and len(stack) == 1:
                _begin_member(top, st.members, i)
            if c in "{[":
                stack.append(Frame("obj", state="key") if c == "{" else Frame("arr", state="value"))
                i += 1
                continue
            if c == '"':
                st.string_is_key = False
                j = _STRING.match(text, i + 1).end()
                if j >= n or text[j] != '"':
                    return _open_string(st, text, i)
                end = i = j + 1
            else:
                j = _SCALAR.match(text, i).end()
                if j >= n:
                    st.scalar = text[i:]
                    return st
                end = i = j  # the delimiter is read next
        if _value_ended(st, text, i, end, stop_after):
            return st
    return st


def _value_ended(st: JsonState, text: str, i: int, end: int, stop_after: str | None) -> bool:
    """Mark the value that ends at `end` (the scan goes on at `i`) as ended; whether the scan stops there: the
    top value is done (only whitespace may follow it), or the outermost member keyed `stop_after` has ended."""
    stack, members = st.stack, st.members
    if not stack:
        st.done = True
        st.error = bool(text[i:].strip(_SPACE))
        return True
    stack[-1].state = "after"
    if members is not None and len(stack) == 1:
        members[-1].end = end
        return stop_after is not None and members[-1].key == stop_after
    return False


def _failed(st: JsonState) -> JsonState:
    """`st`, where the text has stopped being JSON."""
    st.error = True
    return st


def _open_string(st: JsonState, text: str, i: int) -> JsonState:
    """`st`, stopped inside the string that opens at `i` and runs to the end of the text: its content so
    far, and where an escape that the text cuts short begins."""
    st.in_string = text[i + 1:]
    j, escape = i + 1, -1
    while j < len(text):
        j = _STRING_BODY.match(text, j).end()
        if j < len(text):
            escape, j = j, j + 2  # a backslash and the character it escapes
    if escape >= 0 and escape + (6 if text.startswith("u", escape + 1) else 2) > len(text):
        st.open_escape = escape
    return st


def _begin_member(obj: Frame, members: list[Member], i: int) -> None:
    key = obj.key
    members.append(Member(key if key is None or "\\" not in key else _loads('"' + key + '"'), i))


def call_name(text: str, scanned: JsonState | None = None) -> str | None:
    """The function name that call JSON text gives: the value of the outermost object's first "name"
    member, decoded, once that string is closed. None while it is open, when it is not a string, or
    when there is none (the text is not an object, or goes wrong before the name). Whatever follows
    the name may be unfinished or invalid: the scan stops at the name. `scanned`, `scan_json(text)`
    where the caller has it already, saves a second scan."""
    st = scan_json(text, stop_after="name") if scanned is None else scanned
    for m in st.members or ():
        if m.key == "name":
            return _loads(text[m.start:m.end]) if m.end is not None and text[m.start] == '"' else None
    return None


@dataclass
class CallSoFar:
    """What one call's JSON text says so far."""
    name: str | None = None         # the function name, once its string is closed
    args_start: int | None = None   # where the arguments value begins in the call text
    args_end: int | None = None     # where it ends, once it has ended
    safe_end: int = 0               # how far the text may be sent (an unfinished escape waits)
    closed: bool = False            # the call object's closing brace is written


def read_call(raw: str, args_keys: tuple[str, ...]) -> CallSoFar:
    """Scan the (possibly unfinished) JSON text of one call object: its name (`call_name`), the span
    of its first member whose key is one of `args_keys`, and how far it may be sent.

    Read while the text is still being written, so nothing needs the end. A text that goes wrong is
    read up to where it does (past that, it is all sendable: the call is invalid, its text final)."""
    st = scan_json(raw)
    out = CallSoFar(name=call_name(raw, st), safe_end=len(raw) if st.open_escape is None else st.open_escape,
                    closed=st.closed)
    for m in st.members or ():
        if m.key in args_keys:
            out.args_start, out.args_end = m.start, m.end
            break
    return out


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None
