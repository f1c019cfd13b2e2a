"""Reasoning before the answer: the `<think>...</think>` block of Qwen3, DeepSeek-R1 distills and SmolLM3.

A template that reasons is detected from its text, like the call format. Whether a reply starts
inside the block depends on the rendered prompt: DeepSeek-R1 distills (and Qwen3 thinking-only
templates) end their generation prompt with `<think>\\n`, so the reply begins inside the reasoning;
Qwen3 lets the model open the block itself; with `enable_thinking=False` Qwen3's template writes an
empty closed block into the prompt, and the reply has no reasoning at all.

A reply is one optional reasoning block at its start, then the answer (content and calls), which
the call format reads. Anything written inside the block, a call opener included, is reasoning.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .harmony import HarmonyReasoning, detect_harmony


@dataclass(frozen=True)
class Reasoning:
    open: str = "<think>"
    close: str = "</think>"
    #: the prompt already opened the block: the reply begins inside the reasoning
    starts_open: bool = False

    def for_prompt(self, prompt: str) -> "Reasoning | None":
        """How a reply to `prompt` reasons: inside an open block, free to open one, or not at all
        (None) where the generation prompt already holds a closed (empty) block."""
        tail = prompt.rstrip()
        if tail.endswith(self.close):
            return None
        return replace(self, starts_open=tail.endswith(self.open))

    def split(self, text: str, final: bool = False) -> tuple[str | None, str | None]:
        """(reasoning, answer) of a reply's text so far. The reasoning is the block's text without its
        markers (None when the reply has no block); the answer is the text after the block, None while
        the block is open or the text may still open one. Until `final`, a tail that may be the start
        of the closing marker is held back from the reasoning; with `final` the reply is over: an open
        block is all reasoning and the answer is empty."""
        if self.starts_open:
            start = 0
        else:
            head = len(text) - len(text.lstrip())
            if not text.startswith(self.open, head):
                if not final and self.open.startswith(text[head:]):  # "" or "<thi": not decided yet
                    return None, None
                return None, text
            start = head + len(self.open)
        end = text.find(self.close, start)
        if end >= 0:
            return text[start:end], text[end + len(self.close):]
        if final:
            return text[start:], ""
        return text[start:len(text) - _partial(text, self.close)], None


def _partial(text: str, marker: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `marker`."""
    return max((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if text.endswith(marker[:n])), default=0)


def detect_reasoning(chat_template: str | None) -> Reasoning | HarmonyReasoning | None:
    """A harmony template (gpt-oss) reasons on its analysis channel; one that writes `<think>` and
    `</think>` reasons in a think block; None for one that does neither."""
    t = chat_template or ""
    if detect_harmony(t):
        return HarmonyReasoning()
    reasoning = Reasoning()
    return reasoning if reasoning.open in t and reasoning.close in t else None
