"""The one adapter between vLLM's proposer and our drafters: a linear draft of up to k tokens for one
reply, from its ids, the tools its prompt offers and the sidecar's hint when it has come.

It drives the engine's own drafters (drafters/: schema forced text, retrieval over the prompt, the
reply and call memory, the hint) on a `ReplyState` it keeps per request; nothing here re-implements
them. vLLM verifies a chain, not a tree, so the drafts are ranked (hint, then schema, then
retrieval) and the first is taken; a schema draft shorter than k is carried on by retrieval from its end.
"""
from __future__ import annotations

from ..drafters import HintDrafter, ReplyState, RetrievalDrafter, SchemaDrafter
from ..formats import ToolFormat
from .prompt import PromptView


class ReplyDrafts:
    """One request's drafting state across vLLM steps (its ids are replaced each step)."""

    def __init__(self, view: PromptView, ids: list[int], fmt: ToolFormat, tokenizer, pool: list[list[int]]):
        self.view = view
        self.state = ReplyState(ids=list(ids), n_prompt=view.n_prompt, text="", tools=list(view.tools),
                                fmt=fmt, tokenizer=tokenizer, pool=pool)
        self.accepted_hint = False

    def set_hint(self, hint: str) -> None:
        """The sidecar's call, rendered in the target's format: drafted where the reply agrees, and
        retrieval draws from its tokens too."""
        self.state.hint = hint
        self.state.pool.append(self.state.tokenizer.encode(hint, add_special_tokens=False))

    def update(self, ids: list[int]) -> None:
        """The request's ids this step (prompt + reply so far)."""
        st = self.state
        st.ids = ids
        st.text = st.tokenizer.decode(ids[st.n_prompt:], skip_special_tokens=False)


class Drafting:
    """The drafters, shared by every request of one proposer."""

    def __init__(self, retrieval: RetrievalDrafter | None = None):
        self.hint, self.schema = HintDrafter(), SchemaDrafter()
        self.retrieval = retrieval or RetrievalDrafter(max_tokens=16)

    def propose(self, reply: ReplyDrafts, k: int) -> tuple[list[int], str | None]:
        """Up to `k` draft ids after the reply's ids, and the source of their first token."""
        st = reply.state
        order = [self.retrieval] if not st.tools else [self.schema, self.retrieval]
        if st.hint:
            order.insert(0, self.hint)
        for drafter in order:
            drafts = [d.tokens for d in drafter.propose(st) if d.tokens]
            if drafts:
                best = drafts[0][:k]
                if drafter is self.schema and len(best) < k:
                    best += self._carry_on(st, best, k - len(best))
                return best, drafter.source
        return [], None

    def _carry_on(self, st: ReplyState, head: list[int], k: int) -> list[int]:
        """Retrieval's continuation after `head` (the schema's forced tokens), up to k."""
        saved = st.ids
        st.ids = saved + head
        try:
            more = self.retrieval.propose(st)
        finally:
            st.ids = saved
        return more[0].tokens[:k] if more else []
