"""ScriptedEngine: the unit tests' test double for `oospec_agents.Engine`. It loads no model."""
from __future__ import annotations

from typing import Iterator

import pytest

from oospec_agents import Engine, Generation
from oospec_agents.chat import normalize_messages
from oospec_agents.formats import HermesFormat
from oospec_agents.tools import check_calls, normalize_tools, resolve_tool_choice


class ScriptedEngine(Engine):
    """TEST DOUBLE. Replays scripted raw replies instead of decoding.

    A reply is the raw assistant text a target would write, tool-call markup included. Only the
    decoding is faked: requests are checked, and replies parsed and validated, by the engine's own
    chat, format and tool code. Replies stream in 4-character deltas, as a real engine's do in tokens.
    """

    def __init__(self, *replies: str):  # no super().__init__: there is no model to load
        self.fmt = HermesFormat()
        self.model_name = "scripted-test-double"
        self.replies = list(replies)
        self.requests: list[dict] = []

    def stream(self, messages, tools=None, *, tool_choice="auto", max_new_tokens=256, method="oospec",
               stop=None) -> Iterator[str | Generation]:
        normalize_messages(messages)
        tool_list = normalize_tools(tools)
        resolve_tool_choice(tool_choice, tool_list)
        self.requests.append({"messages": messages, "tools": tools, "tool_choice": tool_choice,
                              "max_new_tokens": max_new_tokens, "method": method, "stop": stop})
        text = self.replies.pop(0)
        cuts = [i for s in stop or [] if (i := text.find(s)) >= 0]
        if cuts:
            text = text[:min(cuts)]
        for i in range(0, len(text), 4):
            yield text[i:i + 4]
        content, parsed = self.fmt.parse(text)
        calls, invalid = check_calls(parsed, tool_list, id_prefix="call_scripted")
        stats = {"method": method, "new_tokens": len(text) // 4, "target_forwards": 3,
                 "accepted_by_source": {"schema": 5, "retrieval": 0, "hint": 2}, "hint_bytes": 40}
        yield Generation(text=text, token_ids=list(range(len(text) // 4)), tool_calls=calls,
                         invalid_tool_calls=invalid, stats=stats, content=content,
                         finish_reason="tool_calls" if calls else "stop", prompt_tokens=11)

    def generate(self, *args, **kwargs) -> Generation:
        *_, gen = self.stream(*args, **kwargs)
        return gen


@pytest.fixture
def scripted():
    """`scripted(*replies)` -> a ScriptedEngine test double."""
    return ScriptedEngine
