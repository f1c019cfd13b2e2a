"""What a vLLM proposer can know of a request from its token ids alone.

vLLM's `custom_class` proposer sees each running request as one row of token ids (prompt, then the
reply so far): no request id, no prompt length, no tools. The rendered prompt carries all three:
the chat template's assistant header ends the prompt, and the tools are the JSON objects that the
template (or our format's system prompt) wrote into it. `PromptReader` reads them once per prompt.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from ..formats import ToolFormat, detect_format
from ..errors import ToolSchemaError
from ..tools import Tool, normalize_tools

#: where a tool's JSON may begin in a rendered prompt (OpenAI's shape, or the bare function)
_OPENERS = ('{"type": "function"', '{"type":"function"', '{"name": ', '{"name":')
#: prompts whose reading is kept
MAX_VIEWS = 4096


@dataclass(frozen=True)
class PromptView:
    """One request's prompt as read from its ids: where the reply starts and what it may call."""
    n_prompt: int              # ids before the reply (through the assistant header)
    tools: tuple[Tool, ...]    # the tools the prompt offers; empty: retrieval drafts only
    key: int                   # identifies the request's prompt across steps (its ids' hash)


class PromptReader:
    """Finds the reply's start and the offered tools in a request's ids, for one tokenizer."""

    def __init__(self, tokenizer, fmt: ToolFormat | None = None):
        self.tokenizer = tokenizer
        self.fmt = fmt or detect_format(getattr(tokenizer, "chat_template", None))
        self.header = assistant_header(tokenizer)
        self._views: OrderedDict[int, PromptView] = OrderedDict()  # read once per prompt

    def read(self, ids: list[int]) -> PromptView | None:
        """The prompt in `ids` (a prompt, then possibly reply tokens), or None where no assistant
        header is found: a prompt format this reader does not recognise gets no drafts."""
        at = _last_index(ids, self.header)
        if at is None:
            return None
        n_prompt = at + len(self.header)
        key = hash(tuple(ids[:n_prompt]))
        view = self._views.get(key)
        if view is None:
            text = self.tokenizer.decode(ids[:n_prompt], skip_special_tokens=False)
            view = self._views[key] = PromptView(n_prompt, tuple(tools_in(text)), key)
            while len(self._views) > MAX_VIEWS:
                self._views.popitem(last=False)
        return view


def assistant_header(tokenizer) -> list[int]:
    """The ids the chat template writes to open the assistant's turn (its generation prompt)."""
    msgs = [{"role": "user", "content": "x"}]
    try:
        bare = tokenizer.apply_chat_template(msgs, tokenize=False)
        full = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    except Exception:  # no template, or one that cannot render a user turn: nothing to recognise
        return []
    if not full.startswith(bare) or full == bare:
        return []
    return tokenizer.encode(full[len(bare):], add_special_tokens=False)


def tools_in(text: str) -> list[Tool]:
    """The function tools whose JSON the prompt text holds (each with a name and `parameters`),
    in order, each name once. Earlier calls (`{"name", "arguments"}`) are not tools."""
    dec, found, seen = json.JSONDecoder(), [], set()
    pos = 0
    while (at := text.find("{", pos)) >= 0:
        pos = at + 1
        if not text.startswith(_OPENERS, at):
            continue
        try:
            obj, end = dec.raw_decode(text, at)
        except json.JSONDecodeError:
            continue
        spec = obj.get("function", obj) if isinstance(obj, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("name"), str) and isinstance(spec.get("parameters"), dict) \
                and spec["name"] not in seen:
            try:
                found.extend(normalize_tools([{"type": "function", "function": spec}]))
            except ToolSchemaError:  # a JSON object that only looks like a tool: not offered
                continue
            seen.add(spec["name"])
            pos = end
    return found


def _last_index(ids: list[int], pattern: list[int]) -> int | None:
    """Where the last occurrence of `pattern` in `ids` starts, else None."""
    n = len(pattern)
    if not n:
        return None
    for start in range(len(ids) - n, -1, -1):
        if ids[start] == pattern[0] and ids[start:start + n] == pattern:
            return start
    return None
