"""The one adapter between vLLM's proposer and our drafters: a linear draft of up to k tokens for one
reply, from its ids, the tools its prompt offers and the sidecar's hint when it has come.

Each request drives the engine's own drafters through a `DrafterStack` (drafters/stack.py: schema
forced text, retrieval over the prompt, the reply and the call memory, the hint, told what the target
accepted); nothing here re-implements them. vLLM verifies a chain, not a tree, so the stack's first
draft is taken (hint, then schema, then retrieval), and a schema draft shorter than k is carried on by
retrieval from its end (`extend=True`).

The format the reply is written in is read from its first characters (`formats.vllm_json.reply_format`):
the chat template's own (hermes, ...) as the model writes it, or the JSON vLLM holds a forced call to
with its structured outputs (a list of `{"name", "parameters"}` under tool_choice "required", a named
tool's arguments object). The stack starts once the reply's first non-space character decides it; until
then nothing is drafted.
"""
from __future__ import annotations

from ..drafters import DrafterStack
from ..drafters.retrieval import CallMemory
from ..formats import ToolFormat
from ..formats.vllm_json import Layout, reply_format
from .prompt import PromptView


class ReplyDrafts:
    """One request's drafting across vLLM steps: its `DrafterStack` and its ids so far."""

    def __init__(self, view: PromptView, ids: list[int], fmt: ToolFormat, tokenizer, memory: CallMemory,
                 uid: int = 0, layouts: dict | None = None):
        self.view, self.base, self.tokenizer, self.memory, self.uid = view, fmt, tokenizer, memory, uid
        self.layouts = {} if layouts is None else layouts  # vLLM's JSON formats' whitespace, learnt
        self.prompt = ids[:view.n_prompt]
        self.output: list[int] = ids[view.n_prompt:]
        self.stack: DrafterStack | None = None
        self.fmt: ToolFormat | None = None
        self.hint: str | None = None  # the sidecar's call, in the template's format

    def set_hint(self, hint: str) -> None:
        """The sidecar's call, rendered in the template's format: drafted where the reply agrees (in the
        reply's own format), and retrieval draws from its tokens too."""
        self.hint = hint
        if self.stack is not None:
            self._give_hint()

    def _give_hint(self) -> None:
        if self.fmt is self.base:
            self.stack.hint(self.hint)
            return
        _, calls = self.base.parse(self.hint)
        calls = [c for c in calls if "error" not in c]
        if calls:
            self.stack.hint(self.fmt.render_calls(calls))

    def update(self, ids: list[int]) -> None:
        """The request's ids this step (prompt + reply so far)."""
        self.output = ids[self.view.n_prompt:]
        if self.stack is None and self.output:
            self.fmt = reply_format(self.tokenizer.decode(self.output, skip_special_tokens=False), self.base,
                                    layouts=self.layouts)
            if self.fmt is not None:
                self.stack = DrafterStack(self.tokenizer, self.prompt, list(self.view.tools), fmt=self.fmt,
                                          memory=self.memory)
                if self.hint:
                    self._give_hint()

    def propose(self, k: int) -> tuple[list[int], str | None]:
        """Up to `k` draft ids after the reply's ids, and the drafter they came from."""
        if self.stack is None:
            return [], None
        draft = self.stack.propose(self.output, k, extend=True)
        fits = getattr(self.fmt, "fits", None)
        if draft and fits is not None:  # vLLM's JSON: cut the draft where its grammar would
            draft = draft[:self._fitting(draft, fits)]
        return draft, self.stack.source if draft else None

    def _fitting(self, draft: list[int], fits) -> int:
        """How many of `draft`'s tokens keep the reply's text one vLLM's grammar may accept."""
        text, tools = self.stack.state.text, self.stack.state.tools
        for n in range(1, len(draft) + 1):
            if not fits(text + self.tokenizer.decode(draft[:n], skip_special_tokens=False), tools):
                return n - 1
        return len(draft)

    def finish(self) -> None:
        """The request is over: the call memory keeps its reply (the drafters' feedback hook)."""
        if self.stack is not None:
            self.stack.finish(self.output)
            if isinstance(getattr(self.fmt, "layout", None), Layout):
                self.fmt.layout.observe(self.stack.state.text)
