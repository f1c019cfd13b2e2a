"""TEST DOUBLE: `ScriptedEngine` replays scripted raw replies instead of decoding with a model.

Only the decoding is faked. Requests are checked, replies are cut into events, parsed and validated
by the engine's own code, so front-end tests (LangChain, LlamaIndex, the server) exercise the real
event stream without loading a model. Replies are committed in `step`-character rounds, as a real
engine commits them in tokens.
"""
from __future__ import annotations

from typing import Iterator

from .engine import Engine, Event, Generation
from .events import ReplyEvents
from .formats import HermesFormat
from .stats import DecodeStats
from .tools import check_calls


class ScriptedEngine(Engine):
    def __init__(self, *replies: str, step: int = 4, model_name: str = "scripted-test-double"):
        # no super().__init__: there is no model to load
        self.fmt = HermesFormat()
        self.native_tools = False
        self.model_name = model_name
        self.context_window = 4096
        self.replies = list(replies)
        self.step = step
        self.requests: list[dict] = []

    def prepare(self, messages, tools=None, tool_choice="auto", max_new_tokens: int = 256, stop=None):
        from .chat import normalize_messages
        from .tools import normalize_tools, resolve_tool_choice
        msgs, offered = normalize_messages(messages), normalize_tools(tools)
        resolve_tool_choice(tool_choice, offered)
        return msgs, offered

    def stream(self, messages, tools=None, *, tool_choice="auto", max_new_tokens=256, method="oospec",
               stop=None, **kw) -> Iterator[Event]:
        _, offered = self.prepare(messages, tools, tool_choice, max_new_tokens, stop)
        self.requests.append({"messages": messages, "tools": tools, "tool_choice": tool_choice,
                              "max_new_tokens": max_new_tokens, "method": method, "stop": stop,
                              **{k: v for k, v in kw.items() if k in ("response_format", "prediction")}})
        text = self.replies.pop(0)
        cuts = [i for s in stop or [] if (i := text.find(s)) >= 0]
        text = text[:min(cuts)] if cuts else text
        return self._replay(text, offered, method)

    def _replay(self, text: str, offered, method: str) -> Iterator[Event]:
        events = ReplyEvents(self.fmt, lambda i: f"call_scripted_{i}")
        for end in range(self.step, len(text), self.step):
            yield from events.feed(text[:end])
        yield from events.feed(text, final=True)
        content, parsed = self.fmt.parse(text)
        calls, invalid = check_calls(events.settle(text, parsed), offered, id_prefix="call_scripted")
        n = max(1, len(text) // self.step)
        stats = DecodeStats(method, prompt_tokens=11, new_tokens=n, target_forwards=3,
                            accepted_by_source={"schema": 5, "retrieval": 0, "hint": 2}, hint_bytes=40)
        yield Generation(text=text, token_ids=list(range(n)), tool_calls=calls, invalid_tool_calls=invalid,
                         stats=stats, content=content, finish_reason="tool_calls" if calls else "stop",
                         prompt_tokens=11)
