"""ToolSpec's schema drafter: a finite-state machine over the call text that drafts every forced
stretch -- the wrapper, `{"name": "`, a tool name's unique completion, the arguments opener, the
next required key, an enum's unique completion and the closing brackets."""
from __future__ import annotations

import json

from ..formats.base import enum_strings, unique_completion
from ..jsonscan import JsonState, call_name, scan_json
from ..tools import Tool
from .base import Draft, ReplyState, Drafter, encode_after, separator_variants

MAX_DRAFT_CHARS = 96


class SchemaDrafter(Drafter):
    source = "schema"

    def propose(self, ctx: ReplyState) -> list[Draft]:
        text = forced_text(ctx)
        if not text:
            return []
        return [Draft(encode_after(ctx.tokenizer, ctx.ids, t), self.source)
                for t in separator_variants(text, ctx.fmt.args_key)]


def forced_text(ctx: ReplyState) -> str:
    """Follow the forced stretches from the end of `ctx.text` for as long as they stay forced; none
    while the reply is reasoning (a call written there is reasoning, not a call)."""
    text, out = ctx.answer, ""
    while text is not None and len(out) < MAX_DRAFT_CHARS:
        step = _next_forced(ctx, text + out)
        if not step:
            break
        out += step
    return out


def _next_forced(ctx: ReplyState, text: str) -> str:
    """The next forced stretch after `text`: the format's own skeleton, the call's opening, or what the
    open call's JSON forces."""
    fmt = ctx.fmt
    own = fmt.forced_next(text, ctx.tools)
    if own is not None:  # a format whose calls are not JSON walks its own skeleton
        return own
    body = fmt.open_call_json(text)
    if body is None:
        # Nothing open. At the very start of a reply with tools on offer, a call is the likely move.
        return fmt.forced_prefix() if ctx.tools and not text.strip() else ""
    if body == "":
        tag = fmt.call_start.rstrip("\n")
        return ("\n" if tag and text.endswith(tag) and fmt.call_start.endswith("\n") else "") + '{"name": "'
    st = scan_json(body)
    if st.error:
        return ""
    if st.done:
        return fmt.call_end if fmt.call_end and not text.endswith(fmt.call_end) else ""
    if not st.stack:  # the call's object has not opened: "<", whitespace, a stray scalar
        return ""
    if len(st.stack) == 1:
        return _in_call_object(st, [t.name for t in ctx.tools], fmt.args_key)
    if len(st.stack) == 2 and st.stack[0].key == fmt.args_key and st.stack[-1].kind == "obj":
        tool = next((t for t in ctx.tools if t.name == call_name(body, st)), None)
        return "" if tool is None else _in_arguments(st, tool)
    return ""


def _in_call_object(st: JsonState, names: list[str], args_key: str) -> str:
    """The forced text in the call object itself: `{"name": ..., "<args_key>": {...}}`."""
    top = st.stack[-1]
    if st.in_string is not None:
        if st.string_is_key:
            rest = unique_completion(st.in_string, [k for k in ("name", args_key) if k not in top.keys])
            return "" if rest is None else rest + '": ' + ('"' if st.in_string + rest == "name" else "{")
        if top.key == "name":
            rest = unique_completion(st.in_string, names)
            return "" if rest is None else rest + '", "' + args_key + '": {'
        return ""
    if top.state == "key":
        return '"name": "' if not top.keys else '"' + args_key + '": {'
    if top.state == "after":
        if "name" in top.keys and args_key not in top.keys:
            return ', "' + args_key + '": {'
        if args_key in top.keys:
            return "}"
    return ""


def _in_arguments(st: JsonState, tool: Tool) -> str:
    """The forced text in `tool`'s arguments object: a key's or an enum's unique completion, the next
    required key, what a value forces first, the closing bracket."""
    top = st.stack[-1]
    remaining = [k for k in tool.required if k not in top.keys]
    if st.in_string is not None:
        if st.string_is_key:
            rest = unique_completion(st.in_string, [k for k in tool.properties if k not in top.keys])
            return "" if rest is None else rest + '": '
        enum = enum_strings(tool.properties.get(top.key, {}))
        rest = unique_completion(st.in_string, enum) if enum else None
        return "" if rest is None else rest + '"'
    if st.scalar is not None:
        return ""
    if top.state == "key":
        return '"' + remaining[0] + '": ' if remaining else ""
    if top.state == "value":  # a single enum value or const whole, a string's quote
        schema = tool.properties.get(top.key, {})
        enum = schema.get("enum")
        if isinstance(enum, list) and len(enum) == 1:
            return json.dumps(enum[0], ensure_ascii=False)
        if "const" in schema:
            return json.dumps(schema["const"], ensure_ascii=False)
        return '"' if schema.get("type") == "string" or (enum and all(isinstance(e, str) for e in enum)) else ""
    if top.state == "after":
        return ', "' + remaining[0] + '": ' if remaining else "}"
    return ""
