"""The JSON that vLLM holds a reply to when a call is forced through its structured outputs
(`vllm.tool_parsers.utils.get_json_schema_from_tools`, vLLM 0.32):

- `tool_choice="required"`: a JSON list of calls, each `{"name": <a tool's name>, "parameters": {...}}`
  (`VllmCallListFormat`): `[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]`;
- a named tool (`{"type": "function", "function": {"name": "f"}}`): the reply is that tool's
  arguments object alone (`VllmArgumentsFormat`): `{"a": 1}`.

vLLM compiles these schemas with xgrammar (strict mode: no properties beyond the schema's; properties
in the schema's declared order; any whitespace between tokens). The schema drafter walks them through
`forced_next`, which drafts what that grammar forces: the list's and objects' brackets, the `"name"` and
`"parameters"` keys, a tool name's unique completion, the next property where it is required and no
optional one may come before it, single-valued enums and consts, an enum's unique completion, and closing
brackets once nothing else may follow; while several offered tools fit a named tool's arguments so far, the
text all of them force. Where the grammar leaves a key or the object's end, it drafts the likelier (a first
key; the end once only optional keys are left): vLLM verifies every draft, so a guess costs no step.
Whitespace is the target's choice: the drafts write what `Layout` saw the target write at that place
(json.dumps's `, ` and `: ` where it saw nothing); it is never a reason the grammar rejects a draft.
"""
from __future__ import annotations

import json
import os
import re

from ..jsonscan import Frame, JsonState, call_name, scan_json
from ..tools import Tool
from .hermes import HermesFormat
from .base import UNTERMINATED, ToolFormat, enum_strings, tools_json_lines, unique_completion

NAME, PARAMS = "name", "parameters"
_SPACE = " \n\t\r"
_STRING_END = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.S)  # a string's body up to its closing quote


class VllmCallListFormat(ToolFormat):
    """`tool_choice="required"` under vLLM's structured outputs: a JSON list of `{"name", "parameters"}`."""
    name = "vllm_list"
    args_key = PARAMS
    call_start = "["
    call_end = "]"
    call_sep = ", "
    calls_in_one_list = True

    def __init__(self, layout: "Layout | None" = None):
        self.layout = layout or Layout()

    def parse(self, text):
        segs = self.segments(text)
        if segs and segs[0][0] == "text":
            return text.strip(), []
        calls = []
        for k, (_, raw) in enumerate(segs):
            call = self._read_call(raw.strip())
            if "error" in call and k == len(segs) - 1 and not _items(text)[2]:
                call["error"] = UNTERMINATED
            calls.append(call)
        return "", calls

    def segments(self, text):
        if not text.lstrip().startswith("["):
            return [("text", text)]
        closed, open_item, _ = _items(text)
        return [("call", c) for c in closed] + ([("call", open_item)] if open_item else [])

    def undecided_tail(self, text):
        return len(text) if not text.strip() else 0

    def open_call_json(self, text):
        if not text.lstrip().startswith("["):
            return None
        _, open_item, _ = _items(text)
        return open_item

    def calls_start(self, text):
        body = text.lstrip()
        return len(text) - len(body) if body.startswith("[") else -1

    def system_prompt(self, tools):
        return ("Reply with a JSON list of function calls, each "
                '{"name": <function-name>, "parameters": <args-json-object>}. The functions:\n' + tools_json_lines(tools))

    def forced_next(self, text, tools):
        body = text.lstrip()
        if not body:
            return "["
        if not body.startswith("["):
            return ""
        st = scan_json(body)
        if st.error or st.done or not st.stack:
            return ""
        stack, ws = st.stack, self.layout.of(body)
        if len(stack) == 1:  # in the list: an item (an object) or, after one, "," or "]"
            if stack[0].state != "value":
                return ""
            lead = ws(1, "open") if body.rstrip().endswith("[") else ws(1, "comma")
            return _after_space(body, lead + '{"name":' + ws(2, "colon") + '"')
        item = stack[1]
        if item.kind != "obj":
            return ""
        if len(stack) == 2:
            return _after_space(body, _item_forced(st, item, [t.name for t in tools], ws))
        if len(stack) == 3 and item.key == PARAMS and stack[2].kind == "obj":
            name = call_name(self.open_call_json(text) or "")
            tool = next((t for t in tools if t.name == name), None)
            return "" if tool is None else _after_space(body, arguments_forced(st, stack[2], tool, ws, 3))
        return ""

    def fits(self, text: str, tools: list[Tool]) -> bool:
        """Whether `text` may still be a reply vLLM's grammar accepts (what it checks of the open call: JSON,
        the item's keys, the tool name, the arguments' keys in order); a draft is cut where it stops."""
        return _fits_open_json(text, "[", lambda st, typing: self._item_fits(text, st, typing, tools))

    def _item_fits(self, text: str, st: JsonState, typing: str | None, tools: list[Tool]) -> bool:
        """Whether the open call item of the list (its state `st`) may still be one of `tools`'s calls."""
        if len(st.stack) < 2:
            return True
        item = st.stack[1]
        if item.kind != "obj" or item.keys not in ([], [NAME], [NAME, PARAMS]):
            return False
        if len(st.stack) == 2:
            if typing is not None:
                allowed = NAME if not item.keys else PARAMS if item.keys == [NAME] else ""
                return bool(allowed) and allowed.startswith(typing)
            if item.key == NAME and st.in_string is not None:
                return any(t.name.startswith(st.in_string) for t in tools)
            return True
        name = call_name(self.open_call_json(text) or "")
        tool = next((t for t in tools if t.name == name), None)
        if tool is None:
            return False
        return len(st.stack) > 3 or _fits(st.stack[2].keys, typing, tool)


class VllmArgumentsFormat(ToolFormat):
    """A named tool under vLLM's structured outputs: the reply is the tool's arguments object alone.

    The tool is `tool` where the caller knows it; else the one offered tool whose properties take the
    keys written so far, in order (none drafted while several could)."""
    name = "vllm_arguments"
    args_key = PARAMS
    call_start = ""
    call_end = ""
    call_sep = ""

    def __init__(self, tool: str | None = None, layout: "Layout | None" = None):
        self.tool = tool
        self.layout = layout or Layout()

    def call_text(self, name, arguments):
        return json.dumps(arguments, ensure_ascii=False)

    def render_calls(self, calls):
        return self.render_call(calls[0]["name"], _as_args(calls[0]["arguments"])) if calls else ""

    def parse(self, text):
        body = text.strip()
        if not body.startswith("{"):
            return body, []
        try:
            args = json.loads(body)
        except json.JSONDecodeError as e:
            return "", [{"name": self.tool, "arguments": body, "error": f"arguments are not valid JSON: {e}"}]
        return "", [{"name": self.tool, "arguments": args}]

    def segments(self, text):
        body = text.lstrip()
        return [("call", body)] if body.startswith("{") else [("text", text)]

    def undecided_tail(self, text):
        return len(text) if not text.strip() else 0

    def open_call_json(self, text):
        body = text.lstrip()
        if not body:
            return ""
        if not body.startswith("{"):
            return None
        return None if scan_json(body).done else body

    def calls_start(self, text):
        return -1

    def system_prompt(self, tools):
        return "Reply with the arguments of the function, as one JSON object. The functions:\n" + tools_json_lines(tools)

    def forced_next(self, text, tools):
        body = text.lstrip()
        if not body:
            return "{"
        st = scan_json(body)
        if st.error or st.done or len(st.stack) != 1 or st.stack[0].kind != "obj":
            return ""
        ws = self.layout.of(body)
        texts = [arguments_forced(st, st.stack[0], t, ws, 1) for t in self._tools(st, tools)]
        return _after_space(body, os.path.commonprefix(texts)) if texts else ""

    def fits(self, text: str, tools: list[Tool]) -> bool:
        """Whether `text` may still be the arguments of one of `tools` (or of the named one) under vLLM's grammar."""
        named = [t for t in tools if self.tool is None or t.name == self.tool]
        return _fits_open_json(text, "{", lambda st, typing: len(st.stack) > 1
                               or any(_fits(st.stack[0].keys, typing, t) for t in named))

    def _tools(self, st: JsonState, tools: list[Tool]) -> list[Tool]:
        """The tool the reply may be the arguments of: the caller's, else every one whose schema the text so
        far fits (xgrammar holds the reply to exactly the named tool's properties, in order); their forced
        texts' common start is forced, which is the whole text once one tool is left."""
        if self.tool is not None:
            return [t for t in tools if t.name == self.tool][:1]
        keys = st.stack[0].keys
        typing = st.in_string if st.in_string is not None and st.string_is_key else None
        return [t for t in tools if _fits(keys, typing, t)]


class Layout:
    """The whitespace the target writes around JSON punctuation, by nesting depth: after an opening
    bracket (`open`), after a comma (`comma`), after a colon (`colon`) and before a closing bracket
    (`close`). vLLM's grammar lets the target choose it (SmolLM2 writes `[\n  {"name": ...}\n]` and a
    named tool's `{\n  "k": "v"\n}`), so the drafts write what this reply, else earlier replies in
    the same format (`observe`), wrote at that place; json.dumps's spacing where none has been seen."""

    DEFAULT = {"open": "", "comma": " ", "colon": " ", "close": ""}

    def __init__(self):
        self.seen: dict[tuple[int, str], str] = {}

    def observe(self, text: str) -> None:
        """Learn from a committed reply's text."""
        self.seen.update(whitespace(text))

    def of(self, text: str):
        """A lookup `ws(depth, slot)` for drafting after `text`: its own whitespace first."""
        local = whitespace(text)

        def ws(depth: int, slot: str) -> str:
            for seen in (local, self.seen):
                if (depth, slot) in seen:
                    return seen[(depth, slot)]
            opened = local.get((depth, "open"), self.seen.get((depth, "open"), ""))
            if opened.startswith("\n") and slot in ("comma", "close"):  # indented: a line per member
                return opened if slot == "comma" else "\n" + opened[1:-2]
            return self.DEFAULT[slot]
        return ws


def whitespace(text: str) -> dict[tuple[int, str], str]:
    """The whitespace `text` (JSON, maybe unfinished) writes at each (depth, slot), the last one seen;
    a slot at the very end of the text (its whitespace may go on) is not read."""
    out: dict[tuple[int, str], str] = {}
    depth, i, n = 0, 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            m = _STRING_END.match(text, i + 1)
            i = m.end() + 1
            continue
        if c in "{[,:":
            if c in "{[":
                depth += 1
            j = i + 1
            while j < n and text[j] in _SPACE:
                j += 1
            if j < n:
                out[(depth, {"{": "open", "[": "open", ",": "comma", ":": "colon"}[c])] = text[i + 1:j]
            i = j
            continue
        if c in "}]":
            j = i
            while j > 0 and text[j - 1] in _SPACE:
                j -= 1
            out[(depth, "close")] = text[j:i]
            depth -= 1
        i += 1
    return out


class VllmHermesFormat(HermesFormat):
    """Hermes as vLLM's hermes structural tag holds it (VLLM_ENFORCE_STRICT_TOOL_CALLING, a strict tool, or a
    forced tool_choice): `<tool_call>\n{"name": "f", "arguments": ` is fixed text there, spaces included, and
    a strict tool's arguments follow its schema in xgrammar's order. Where the reply is not held (auto, no
    strict tool) the same drafts are only proposals: the two places that differ from `HermesFormat`'s walk are
    the space after the name's comma, and a strict tool's next property (its declared order)."""

    def forced_next(self, text, tools):
        body = self.open_call_json(text)
        if not body:
            return None
        st = scan_json(body)
        if st.done and not st.error:  # the call's JSON is closed: the rest of its end tag, after what is written
            trail = body[len(body.rstrip(_SPACE)):]
            return self.call_end[len(trail):] if self.call_end.startswith(trail) else ""
        if st.error or st.done or st.in_string is not None and len(st.stack) < 2:
            return None
        if len(st.stack) == 1 and st.stack[0].keys == [NAME] and st.stack[0].state == "key" and body.endswith(","):
            return ' "' + self.args_key + '": {'
        if len(st.stack) == 2 and st.stack[0].key == self.args_key and st.stack[1].kind == "obj":
            tool = next((t for t in tools if t.name == call_name(body, st)), None)
            if tool is not None and tool.strict:
                return arguments_forced(st, st.stack[1], tool, Layout().of(body), 2)
        return None


def _item_forced(st: JsonState, item: Frame, names: list[str], ws) -> str:
    """The forced text inside one call object of the list (depth 2): `{"name": "<tool>", "parameters": {`."""
    allowed = [NAME] if not item.keys else [PARAMS] if item.keys == [NAME] else []
    params = '"' + PARAMS + '":' + ws(2, "colon") + "{"
    if st.in_string is not None:
        if st.string_is_key:
            rest = unique_completion(st.in_string, allowed) if item.state == "key" else None
            if rest is None:
                return ""
            return rest + '":' + ws(2, "colon") + ('"' if st.in_string + rest == NAME else "{")
        if item.key == NAME:
            rest = unique_completion(st.in_string, names)
            return "" if rest is None else rest + '",' + ws(2, "comma") + params
        return ""
    if st.scalar is not None:
        return ""
    if item.state == "key":
        return ('"name":' + ws(2, "colon") + '"') if not item.keys else params if allowed else ""
    if item.state == "colon":
        return ":" + ws(2, "colon") + ('"' if item.key == NAME else "{")
    if item.state == "value":
        return '"' if item.key == NAME else "{"
    if item.state == "after":
        if item.keys == [NAME]:
            return "," + ws(2, "comma") + params
        return ws(2, "close") + "}" if PARAMS in item.keys else ""
    return ""


def arguments_forced(st: JsonState, frame: Frame, tool: Tool, ws, depth: int) -> str:
    """The forced text in `tool`'s arguments object (the innermost open container, `frame`, at `depth`), as
    xgrammar holds it: properties in the schema's declared order, none but the schema's, each required one present.
    Where the grammar leaves a choice between a key and the object's end, the draft takes the likelier: a
    first key, and the end once only optional keys are left (vLLM verifies a draft; it never forces one)."""
    if st.stack[-1] is not frame or tool.parameters.get("additionalProperties") not in (None, False):
        return ""
    props, required = list(tool.properties), set(tool.required)
    keys = frame.keys
    if any(k not in props for k in keys):
        return ""
    after = props[max((props.index(k) for k in keys), default=-1) + 1:]  # a key being read is in `keys`
    cands: list[str] = []
    for k in after:
        cands.append(k)
        if k in required:
            break
    needs_more = any(k in required for k in after)
    colon = ":" + ws(depth, "colon")
    if st.in_string is not None:
        if st.string_is_key:
            rest = unique_completion(st.in_string, cands)
            return "" if rest is None else rest + '"' + colon
        enum = enum_strings(tool.properties.get(frame.key, {}))
        rest = unique_completion(st.in_string, enum) if enum else None
        return "" if rest is None else rest + '"'
    if st.scalar is not None:
        return ""
    if frame.state == "key":  # after "{" or ",": the whitespace this layout writes there, then a key
        lead = ws(depth, "comma") if keys else ws(depth, "open")
        if not cands:
            return "" if keys else ws(depth, "close") + "}"
        if cands[0] in required or len(cands) == 1:
            return lead + '"' + cands[0] + '"' + colon
        return lead + '"'  # an object of optional keys only: a key is likelier than "}" (a draft, not a rule)
    if frame.state == "colon":
        return colon
    if frame.state == "value":
        return _value_opener(tool.properties.get(frame.key, {}))
    if frame.state == "after":
        if not cands:
            return ws(depth, "close") + "}"
        if needs_more:
            return "," + ws(depth, "comma") + ('"' + cands[0] + '"' + colon if cands[0] in required else '"')
        return ws(depth, "close") + "}"  # only optional keys left: the object's end is the likelier (a draft)
    return ""


def _after_space(text: str, forced: str) -> str:
    """`forced` after `text`, less the whitespace at its start that `text` already ends with."""
    trail = text[len(text.rstrip(_SPACE)):]
    if not trail or not forced[:1].isspace():
        return forced
    return forced[len(trail):] if forced.startswith(trail) else forced.lstrip(_SPACE)


def _value_opener(schema: dict) -> str:
    """What a property's value forces first: a single enum value or const whole, a string's quote."""
    enum = schema.get("enum")
    if isinstance(enum, list) and len(enum) == 1:
        return json.dumps(enum[0], ensure_ascii=False)
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False)
    if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
        return '"'
    return '"' if schema.get("type") == "string" and not enum else ""


def _fits_open_json(text: str, opener: str, open_fits) -> bool:
    """Whether `text` may still be JSON that opens with `opener` under vLLM's grammar: yes while only whitespace
    is written or once it closes well-formed, no where it opens otherwise or is malformed; while it is open,
    `open_fits(state, typing)` decides (`typing`: the start of a key being written, else None)."""
    body = text.lstrip()
    if not body:
        return True
    if not body.startswith(opener):
        return False
    st = scan_json(body)
    if st.error or st.done:
        return not st.error
    return open_fits(st, st.in_string if st.in_string is not None and st.string_is_key else None)


def _fits(keys: list[str], typing: str | None, tool: Tool) -> bool:
    """Whether an arguments object whose keys so far are `keys` (and, `typing`, the start of the next)
    may be `tool`'s under xgrammar: its properties, in their declared order."""
    if tool.parameters.get("additionalProperties") not in (None, False):
        return True
    props, at = list(tool.properties), -1
    for k in keys:
        if k not in props or props.index(k) <= at:
            return False
        at = props.index(k)
    return typing is None or any(p.startswith(typing) for p in props[at + 1:])


def _items(text: str) -> tuple[list[str], str | None, bool]:
    """A JSON list's text read item by item: the closed items' texts, the open item's text ("" where an
    item is about to begin; None where none is open) and whether the list has closed."""
    body = text.lstrip()
    dec, closed = json.JSONDecoder(), []
    pos, n = 1, len(body)
    while True:
        while pos < n and body[pos] in " \n\t\r":
            pos += 1
        if pos >= n:
            return closed, ("" if not closed or body.rstrip().endswith((",", "[")) else None), False
        if body[pos] == "]":
            return closed, None, True
        if body[pos] == "," and closed:
            pos += 1
            continue
        try:
            _, end = dec.raw_decode(body, pos)
        except json.JSONDecodeError:
            return closed, body[pos:], False
        closed.append(body[pos:end])
        pos = end


def _as_args(arguments) -> dict:
    if isinstance(arguments, str):
        return json.loads(arguments) if arguments.strip() else {}
    return dict(arguments or {})


def reply_format(text: str, base: ToolFormat, *, named: str | None = None,
                 layouts: dict[str, Layout] | None = None) -> ToolFormat | None:
    """The format a reply is written in, read from its first characters: vLLM's call list where it opens
    with `[`, a named tool's arguments where it opens with `{` (unless `base`'s own calls open so), else
    `base`. None while only whitespace is written (nothing decides yet). `layouts`: format name -> the
    whitespace learnt from earlier replies in it (shared by a proposer's replies; filled in here)."""
    layouts = {} if layouts is None else layouts
    body = text.lstrip()
    if not body:
        return None
    if body.startswith("[") and not base.call_start.strip().startswith("["):
        return VllmCallListFormat(layouts.setdefault(VllmCallListFormat.name, Layout()))
    if body.startswith("{") and base.open_call_json(body) is None:
        return VllmArgumentsFormat(named, layouts.setdefault(VllmArgumentsFormat.name, Layout()))
    return VllmHermesFormat() if type(base) is HermesFormat else base
