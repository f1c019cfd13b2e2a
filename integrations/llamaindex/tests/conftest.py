"""Fixtures: a scripted engine for the adapter layer, and the embedded engine for end-to-end checks."""
from __future__ import annotations

import pytest
from oospec_agents import Engine, Generation
from oospec_agents.formats import HermesFormat

from llama_index.llms.oospec import OoOSpec


class ScriptedEngine(Engine):
    """Replays scripted replies through the Engine interface and records what each request asked.

    It streams the reply's text (tool-call markup included) in 3-character pieces, the way the real
    engine streams committed tokens, then the final Generation.
    """

    def __init__(self, *replies: tuple[str, list[tuple[str, dict]]]) -> None:  # no models to load
        self.fmt = HermesFormat()
        self.model_name = "scripted-model"
        self.context_window = 4096
        self.replies = list(replies)
        self.requests: list[dict] = []

    def stream(self, messages, tools=None, *, tool_choice="auto", max_new_tokens=256, method="oospec",
               stop=None, **kw):
        self.requests.append({"messages": messages, "tools": tools, "tool_choice": tool_choice,
                              "max_new_tokens": max_new_tokens, "method": method})
        content, calls = self.replies.pop(0)
        calls = [{"name": name, "arguments": args} for name, args in calls]
        text = content + ("\n" if content and calls else "") + self.fmt.render_calls(calls)
        for i in range(0, len(text), 3):
            yield text[i:i + 3]
        tool_calls = [{"id": f"call_{i}", **c} for i, c in enumerate(calls)]
        n = len(text) // 4 + 1
        yield Generation(text=text, token_ids=list(range(n)), tool_calls=tool_calls, invalid_tool_calls=[],
                         stats={"method": method, "new_tokens": n, "target_forwards": 3,
                                "accepted_by_source": {"schema": 2, "retrieval": 0, "hint": 0}},
                         content=content, finish_reason="tool_calls" if calls else "stop", prompt_tokens=17)


@pytest.fixture
def scripted():
    """Build an OoOSpec over a ScriptedEngine that gives `replies`, each (content, [(tool, args), ...])."""
    def make(*replies, **kwargs) -> tuple[OoOSpec, ScriptedEngine]:
        engine = ScriptedEngine(*replies)
        return OoOSpec(engine=engine, **kwargs), engine
    return make


@pytest.fixture(scope="module")
def embedded_llm():
    """The embedded default pair, loaded once; small replies keep the CPU budget."""
    return OoOSpec(max_new_tokens=48)
