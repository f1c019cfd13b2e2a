"""One small interface for every drafter, in the spirit of transformers' CandidateGenerator (`propose`,
and the feedback hook `accepted`, its `update_candidate_strategy`), and the one reply state they all read.

A drafter proposes from the `ReplyState` alone. A drafter that overrides `accepted` is told, once a round
is verified, what the target accepted (`Accepted`); the last telling of a reply has `done` set. One
`DrafterStack` (drafters/stack.py) per request drives a set of drafters: an engine reply's, or one driven
from token ids alone.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..formats import Reasoning, ToolFormat
from ..stats import DecodeStats
from ..tools import Tool


@dataclass
class Prediction:
    """The caller's predicted output in target tokens, and what the prediction drafter keeps of it
    between rounds (drafters/prediction.py)."""
    tokens: list[int]
    index: dict[tuple[int, ...], list[int]] | None = None  # n-gram -> where it ends in `tokens` (built once)
    at: int = 0                                            # where the reply last matched


class HintText(str):
    """A hint's text (target-format calls) carrying what the sidecar knows of it: `confidence`, the
    probability that its whole call is exact (None: unknown, as for a caller's own hint), and
    `alternatives`, runner-up calls in the target's format where the sidecar was unsure; and
    `after_calls`, how many of the reply's calls come before the hint's first (a follow-up wave's hint
    for a parallel reply's next call). It is a str, so whatever reads a hint as text reads it unchanged."""
    confidence: float | None
    alternatives: tuple[str, ...]
    after_calls: int

    def __new__(cls, text: str, confidence: float | None = None, alternatives=(), after_calls: int = 0):
        self = super().__new__(cls, text)
        self.confidence, self.after_calls = confidence, after_calls
        self.alternatives = tuple(a for a in alternatives if isinstance(a, str) and a and a != text)
        return self


@dataclass
class ReplyState:
    """One reply as the drafters see it. Its commit step writes it in place (tokens appended, text
    replaced: `reply.Reply.commit` in the engine, `DrafterStack.accepted` without one) and the drafters
    read it: nothing is copied or re-synced between rounds."""
    ids: list[int]            # prompt ids, then the committed new tokens: one list that grows
    n_prompt: int
    text: str                 # assistant text so far: forced prefix + decoded new tokens
    tools: list[Tool]
    fmt: ToolFormat
    tokenizer: object
    hint: str | None = None   # the sidecar's call, rendered in the target's format
    #: earlier token sequences retrieval drafts from besides `ids`: this tool set's earlier replies
    #: (the engine's call memory) and the hint's tokens once it is here
    pool: list[list[int]] = field(default_factory=list)
    prediction: Prediction | None = None  # the caller's predicted output, and where the reply is in it
    reasoning: Reasoning | None = None    # the reply's reasoning block, when its template reasons

    def add_hint(self, hint: str) -> None:
        """The sidecar's call is here: the hint drafter aligns it, retrieval drafts from its tokens too."""
        self.hint = hint
        self.pool.append(self.tokenizer.encode(hint, add_special_tokens=False))

    @property
    def new(self) -> list[int]:
        """The committed new tokens (a copy)."""
        return self.ids[self.n_prompt:]

    @property
    def answer(self) -> str | None:
        """The text after the reply's reasoning, where content and calls are written (all of `text`
        when there is no reasoning); None while the reasoning is still open. Calls are drafted only here."""
        return self.text if self.reasoning is None else self.reasoning.split(self.text)[1]


@dataclass
class Draft:
    tokens: list[int]
    source: str               # "schema" | "retrieval" | "hint" | "prediction"
    #: a guess that takes the tree's nodes only after every other draft has its own (a hint the reply
    #: has left, or that the sidecar is unsure of, and the runner-up calls): it never displaces them
    late: bool = False


@dataclass(frozen=True)
class Accepted:
    """What one verified round committed, as its drafters are told it."""
    tokens: tuple[int, ...]   # the tokens committed this round, in order (the reply's state holds them already)
    by_source: Mapping[str, int] = field(default_factory=dict)  # of them, the draft tokens accepted, per source
    done: bool = False        # the reply is over (it finished; an abandoned reply is never told `done`)
    stats: DecodeStats | None = None  # with `done`, in the engine: what the decode did (its timings, forwards)


class Drafter(ABC):
    """Proposes token sequences from the reply's state alone; told what the target accepted."""
    source: str

    @abstractmethod
    def propose(self, ctx: ReplyState) -> list[Draft]:
        """Token sequences that may follow `ctx.ids`; verification decides what is kept."""

    def accepted(self, ctx: ReplyState, accepted: Accepted) -> None:
        """Feedback after each verified round (`ctx` already holds its tokens); by default ignored."""


def separator_variants(text: str, args_key: str) -> list[str]:
    """`text`, and if it writes the separator before the arguments key, also the compact form.

    json.dumps writes `"name": "f", "arguments": {...}`; tuned models often write `"f","arguments"`
    there instead (SmolLM2's adapter does). Drafting both, as two tree branches that share
    everything before the comma, costs a few draft tokens and saves a forward per call.
    """
    spaced = ', "' + args_key + '"'
    if spaced not in text:
        return [text]
    return [text, text.replace(spaced, ',"' + args_key + '"', 1)]


def encode_after(tokenizer, ids: list[int], text: str, lookback: int = 3) -> list[int]:
    """Token ids for `text` as the target would tokenize it right after `ids`.

    Encoding `text` alone can differ from the in-context tokenization when a merge crosses the
    boundary, so re-encode from a committed token boundary and keep only what follows it.
    """
    if not text:
        return []
    for k in range(1, min(lookback, len(ids)) + 1):
        tail = ids[-k:]
        enc = tokenizer.encode(tokenizer.decode(tail) + text, add_special_tokens=False)
        if enc[:k] == tail:
            return enc[k:]
    return tokenizer.encode(text, add_special_tokens=False)


class ReplyText:
    """A reply's text from its tokens: special tokens dropped, except the format's call markers.

    Mistral's `[TOOL_CALLS]` (and Llama 3's `<|python_tag|>`) are special tokens in their
    tokenizers, so `decode(skip_special_tokens=True)` alone would cut them out of the text that the
    format parses; a marker that is plain text in a tokenizer is left to the plain decode."""

    def __init__(self, tokenizer, fmt: ToolFormat):
        self.tokenizer = tokenizer
        self.keep: dict[int, str] = {}
        for marker in fmt.markers:
            ids = tokenizer.encode(marker, add_special_tokens=False)
            if len(ids) == 1 and not tokenizer.decode(ids, skip_special_tokens=True):
                self.keep[ids[0]] = marker

    def __call__(self, ids: list[int]) -> str:
        decode = self.tokenizer.decode
        cuts = [i for i, t in enumerate(ids) if t in self.keep] if self.keep else []
        if not cuts:
            return decode(ids, skip_special_tokens=True)
        parts, start = [], 0
        for i in cuts:
            parts += [decode(ids[start:i], skip_special_tokens=True), self.keep[ids[i]]]
            start = i + 1
        return "".join(parts) + decode(ids[start:], skip_special_tokens=True)
