"""ToolSpec's schema drafter: a finite-state machine over the call text that drafts every forced
stretch -- the wrapper, `{"name": "`, a tool name's unique completion, the arguments opener, the
next required key, an enum's unique completion and the closing brackets."""
from __future__ import annotations

import json

from ..formats.base import enum_strings, unique_completion
from ..jsonscan import call_name, scan_json
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
    depth = len(st.stack)
    top = st.stack[-1]
    names = [t.name for t in ctx.tools]
    if depth == 1:  # the call object: {"name": ..., "<args_key>": {...}}
        if st.in_string is not None:
            if st.string_is_key:
                rest = unique_completion(st.in_string, [k for k in ("name", fmt.args_key) if k not in top.keys])
                return "" if rest is None else rest + '": ' + ('"' if st.in_string + rest == "name" else "{")
            if top.key == "name":
                rest = unique_completion(st.in_string, names)
                return "" if rest is None else rest + '", "' + fmt.args_key + '": {'
            return ""
        if top.state == "key":
            return '"name": "' if not top.keys else '"' + fmt.args_key + '": {'
        if top.state == "after":
            if "name" in top.keys and fmt.args_key not in top.keys:
                return ', "' + fmt.args_key + '": {'
            if fmt.args_key in top.keys:
                return "}"
        return ""
    if depth == 2 and st.stack[0].key == fmt.args_key and top.kind == "obj":
        tool = next((t for t in ctx.tools if t.name == call_name(body, st)), None)
        if tool is None:
            return ""
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
        if top.state == "value":
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

