"""The drafters as one stack, in the engine's order, and a driver that needs no `Engine`: token ids in,
a draft out. Each engine reply has its own stack (`DrafterStack.for_reply`: `round_drafts`, `committed`,
`finished`); another engine (a vLLM proposer, which sees only token ids) drives one per request through
the token-id methods below. Either way the stack alone counts the accepted drafts per source.

API (`DrafterStack`):

    stack = DrafterStack(tokenizer, prompt_ids, tools)   # tools: OpenAI function-tool dicts (or None)
    draft = stack.propose(output_ids, k=8)    # each step: the ids committed after the prompt so far;
                                              # returns a linear draft, a list of at most k token ids
                                              # (maybe empty) to verify after them; extend=True: a
                                              # schema draft shorter than k is carried on by retrieval
    stack.hint(text)                          # the sidecar's call, as target-format text (from then on
    stack.hint_calls([{"name", "arguments"}]) # the hint is drafted; or its payload, rendered here)
    stack.accepted(output_ids)                # optional: what the target committed after the last
                                              # draft (the next `propose` tells it too)
    stack.finish(output_ids)                  # the request is over: the call memory keeps its reply
    stack.drafts(output_ids)                  # every drafter's drafts, best first (the engine's tree)

- `tokenizer`: the target's HF tokenizer; its chat template picks the tool-call format
  (`formats.detect_format`, as the engine does) unless `fmt` is given, and whether replies reason.
- `prompt_ids`: the ids the target is conditioned on (`Engine.prompt_ids`: a forced call's opener
  included). `prefix`: that opener's text, when the prompt forced one (`ToolFormat.forced_prefix`), so
  the drafters read the reply's text as the engine's do.
- `prediction`: the caller's predicted output in target ids (OpenAI's Predicted Outputs).
- `memory`: a `CallMemory` shared by the requests of one engine: earlier replies for the same tool set
  are drafted from (retrieval) and each finished reply is remembered. None: nothing is remembered.
- `drafters`: `{"schema", "retrieval", "hint", "prediction"}` -> `Drafter` (`default_drafters()` when
  None). One stack per request: `SuffixDrafter` and the prediction drafter keep per-reply state.

What it drafts, best first (`stack_drafts`): the prediction where the reply agrees with it, the hint
from where the reply has got to, the schema's forced text (the wrapper, `{"name": "`, a unique name
or key, brackets), then n-gram retrieval over the prompt, the reply, the call memory and the hint. The
linear draft is the first of them, as the engine's chain (a target without tree masks) takes it.
Not here: the grammar's jump-forward (strict requests) and verification; the caller verifies.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..formats import ToolFormat, detect_format, detect_reasoning
from ..tools import normalize_tools
from .base import Accepted, Draft, Drafter, Prediction, ReplyState, ReplyText
from .hint import HintDrafter
from .prediction import PredictionDrafter
from .retrieval import CallMemory, RetrievalDrafter
from .schema import SchemaDrafter

#: the drafters' slots, in the order their drafts go into a round's tree (the first is the chain's)
ORDER = ("prediction", "hint", "schema", "retrieval")


#: the drafter of each slot by default: a class, so that each request's stack has its own
DEFAULT_DRAFTERS = {"schema": SchemaDrafter, "retrieval": RetrievalDrafter, "hint": HintDrafter,
                    "prediction": PredictionDrafter}


def default_drafters() -> dict[str, Drafter]:
    """One drafter per slot, as an engine's reply (or a `DrafterStack`) starts with."""
    return {slot: make() for slot, make in DEFAULT_DRAFTERS.items()}


def stack_drafts(drafters: Mapping[str, Drafter], state: ReplyState) -> list[Draft]:
    """Every draft of one round, best first: the prediction (when the request has one), the hint (once
    it is here), the schema's forced text, retrieval."""
    out: list[Draft] = []
    for slot in ORDER:
        if (slot == "prediction" and state.prediction is None) or (slot == "hint" and not state.hint):
            continue
        out += drafters[slot].propose(state)
    return out


def tell(listeners, state: ReplyState, accepted: Accepted) -> None:
    """Feedback to every drafter (and the call memory) of what a round committed."""
    for listener in listeners:
        listener.accepted(state, accepted)


class DrafterStack:
    """The engine's drafters driven from token ids: see the module's docstring."""

    def __init__(self, tokenizer, prompt_ids: Sequence[int], tools=None, *, fmt: ToolFormat | None = None,
                 prefix: str = "", prediction: Sequence[int] | None = None, memory: CallMemory | None = None,
                 drafters: Mapping[str, Drafter] | None = None):
        if not prompt_ids or not all(isinstance(t, int) for t in prompt_ids):
            raise ValueError("prompt_ids must be a non-empty list of token ids")
        template = getattr(tokenizer, "chat_template", None)
        fmt = fmt or detect_format(template)
        reasoning = detect_reasoning(template)
        tool_list = normalize_tools(tools)
        state = ReplyState(
            ids=list(prompt_ids), n_prompt=len(prompt_ids), text=prefix, tools=tool_list, fmt=fmt,
            tokenizer=tokenizer, pool=[] if memory is None else memory.recall(tool_list),
            prediction=Prediction(list(prediction)) if prediction else None,
            reasoning=None if reasoning is None else reasoning.for_prompt(tokenizer.decode(list(prompt_ids))))
        self._setup(state, ReplyText(tokenizer, fmt), memory, drafters)

    @classmethod
    def for_reply(cls, state: ReplyState, text: ReplyText, *, memory: CallMemory | None = None,
                  drafters: Mapping[str, Drafter] | None = None) -> "DrafterStack":
        """The stack of one engine reply: `state` is the reply's, which its commit step writes
        (`reply.Reply.commit`); the engine drafts with `round_drafts` and reports with `committed` and
        `finished` (the token-id methods above are for callers that see only ids)."""
        stack = cls.__new__(cls)
        cls._setup(stack, state, text, memory, drafters)
        return stack

    def _setup(self, state: ReplyState, text: ReplyText, memory: CallMemory | None, drafters) -> None:
        self.fmt, self.memory, self.state, self.prefix, self._text = state.fmt, memory, state, state.text, text
        self.drafters = dict(default_drafters() if drafters is None else drafters)
        missing = set(ORDER) - set(self.drafters)
        if missing:
            raise ValueError(f"drafters lacks the slots {sorted(missing)}; it needs {list(ORDER)}")
        #: the drafts the target accepted, per source: counted here alone (`committed`, `accepted`)
        self.accepted_by_source: dict[str, int] = {}
        # told each round: the drafters that read the feedback (a drafter keeping `Drafter.accepted` ignores it)
        self._listening = [d for d in self.drafters.values() if type(d).accepted is not Drafter.accepted]
        self._last: tuple[int, Draft] | None = None  # the last linear draft, and the reply length it followed
        self._done = False

    # ------------------------------------------------------------------ each step

    def propose(self, output_ids: Sequence[int], k: int = 8, *, extend: bool = False) -> list[int]:
        """A linear draft of at most `k` tokens to follow `output_ids` (the ids after the prompt). `extend`:
        where the first draft is the schema's forced text and shorter than `k`, retrieval carries it on
        from its end (a chain verifier, which cannot take the engine's tree of both, gains the rest)."""
        self.accepted(output_ids)
        drafts = [d for d in stack_drafts(self.drafters, self.state) if d.tokens]
        if not drafts or k < 1:
            self._last = None
            return []
        first = next((d for d in drafts if not d.late), drafts[0])  # a late draft displaces none (Draft.late)
        tokens = list(first.tokens[:k])
        if extend and first.source == "schema" and len(tokens) < k:
            tokens += self._retrieval_after(tokens)[:k - len(tokens)]
        self._last = (len(self.state.ids), Draft(tokens, first.source))
        return tokens

    @property
    def source(self) -> str | None:
        """The drafter whose draft the last `propose` returned (None: it drafted nothing)."""
        return None if self._last is None else self._last[1].source

    def _retrieval_after(self, head: list[int]) -> list[int]:
        """Retrieval's continuation after the reply's ids and then `head` (a draft not yet verified)."""
        state, saved = self.state, self.state.ids
        state.ids = saved + head
        try:
            more = self.drafters["retrieval"].propose(state)
        finally:
            state.ids = saved
        return list(more[0].tokens) if more else []

    def drafts(self, output_ids: Sequence[int]) -> list[Draft]:
        """Every drafter's drafts after `output_ids`, best first: the engine merges them into one tree."""
        self.accepted(output_ids)
        return stack_drafts(self.drafters, self.state)

    def hint(self, text: str) -> None:
        """The sidecar's call, as target-format text: drafted from now on, aligned to the reply."""
        if not isinstance(text, str) or not text:
            raise ValueError(f"a hint is a non-empty string of target-format call text, got {text!r:.60}")
        self.state.add_hint(text)

    def hint_calls(self, calls: list[dict]) -> None:
        """A hint's payload: calls as `{"name", "arguments"}` dicts, rendered in the target's format."""
        if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) and "name" in c for c in calls):
            raise ValueError("hint_calls takes a non-empty list of {'name', 'arguments'} dicts")
        self.hint(self.fmt.render_calls(calls))

    def accepted(self, output_ids: Sequence[int], done: bool = False) -> Accepted | None:
        """Bring the reply up to `output_ids` and tell the drafters what was committed since the last
        call (None when nothing was, and the reply goes on)."""
        if self._done:
            raise ValueError("this request is finished; a DrafterStack serves one request")
        state, n = self.state, self.state.n_prompt
        output_ids = list(output_ids)
        before = len(state.ids)
        if state.ids[n:] == output_ids[:before - n]:
            new = output_ids[before - n:]
            state.ids += new
        else:  # the caller rewound (a preempted request recomputed): start over from its ids
            state.ids[n:] = output_ids
            new, before = output_ids, n
        if new:
            state.text = self.prefix + self._text(state.ids[n:])
        if not new and not done:
            return None
        by_source = {}
        if self._last is not None and self._last[0] == before:
            draft, hit = self._last[1], 0
            while hit < min(len(draft.tokens), len(new)) and draft.tokens[hit] == new[hit]:
                hit += 1
            by_source = {draft.source: hit} if hit else {}
        self._last = None
        self._credit(by_source)
        told = Accepted(tuple(new), by_source, done)
        tell(self._listening, state, told)
        if done and self.memory is not None:
            self.memory.remember(state.tools, state.new)
        self._done = done
        return told

    def finish(self, output_ids: Sequence[int]) -> None:
        """The request is over: the drafters are told, and the call memory keeps the reply."""
        self.accepted(output_ids, done=True)

    # ------------------------------------------------------------------ inside the engine

    def round_drafts(self) -> list[Draft]:
        """Every drafter's drafts after the reply's state as it is (its commit step wrote it), best first."""
        return stack_drafts(self.drafters, self.state)

    def committed(self, tokens: Sequence[int], by_source: Mapping[str, int]) -> None:
        """A verified round committed `tokens` (the state holds them already), `by_source` of them drafts:
        counted, and told to the drafters that read the feedback (no `Accepted` is built for none)."""
        self._credit(by_source)
        if self._listening:
            tell(self._listening, self.state, Accepted(tuple(tokens), by_source))

    def finished(self, stats=None) -> None:
        """The reply is over: the drafters that listen are told, the call memory keeps the reply."""
        if self._listening:
            tell(self._listening, self.state, Accepted((), {}, done=True, stats=stats))
        if self.memory is not None:
            self.memory.remember(self.state.tools, self.state.new)
        self._done = True

    def _credit(self, by_source: Mapping[str, int]) -> None:
        for source, n in by_source.items():
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + n
