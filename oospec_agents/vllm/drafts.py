"""The one adapter between vLLM's proposer and our drafters: a linear draft of up to k tokens for one
reply, from its ids, the tools its prompt offers and the sidecar's hint when it has come.

Each request drives the engine's own drafters through a `DrafterStack` (drafters/stack.py: schema
forced text, retrieval over the prompt, the reply and the call memory, the hint, told what the target
accepted); nothing here re-implements them. vLLM verifies a chain, not a tree, so the stack's first
draft is taken (hint, then schema, then retrieval), and a schema draft shorter than k is carried on by
retrieval from its end (`extend=True`).
"""
from __future__ import annotations

from ..drafters import DrafterStack
from ..drafters.retrieval import CallMemory
from ..formats import ToolFormat
from .prompt import PromptView


class ReplyDrafts:
    """One request's drafting across vLLM steps: its `DrafterStack` and its ids so far."""

    def __init__(self, view: PromptView, ids: list[int], fmt: ToolFormat, tokenizer, memory: CallMemory):
        self.view = view
        self.stack = DrafterStack(tokenizer, ids[:view.n_prompt], list(view.tools), fmt=fmt, memory=memory)
        self.output: list[int] = ids[view.n_prompt:]

    @property
    def state(self):
        """The drafters' view of the reply (`drafters.ReplyState`)."""
        return self.stack.state

    def set_hint(self, hint: str) -> None:
        """The sidecar's call, rendered in the target's format: drafted where the reply agrees, and
        retrieval draws from its tokens too."""
        self.stack.hint(hint)

    def update(self, ids: list[int]) -> None:
        """The request's ids this step (prompt + reply so far)."""
        self.output = ids[self.view.n_prompt:]

    def propose(self, k: int) -> tuple[list[int], str | None]:
        """Up to `k` draft ids after the reply's ids, and the drafter they came from."""
        draft = self.stack.propose(self.output, k, extend=True)
        return draft, self.stack.source if draft else None

    def finish(self) -> None:
        """The request is over: the call memory keeps its reply (the drafters' feedback hook)."""
        self.stack.finish(self.output)
