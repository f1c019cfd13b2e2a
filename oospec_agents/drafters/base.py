"""One small interface for every drafter, in the spirit of transformers' CandidateGenerator, and the
one reply state they all read."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from ..formats import Reasoning, ToolFormat
from ..tools import Tool


@dataclass
class Prediction:
    """The caller's predicted output in target tokens, and what the prediction drafter keeps of it
    between rounds (drafters/prediction.py)."""
    tokens: list[int]
    index: dict[tuple[int, ...], list[int]] | None = None  # n-gram -> where it ends in `tokens` (built once)
    at: int = 0                                            # where the reply last matched


@dataclass
class ReplyState:
    """One reply as the drafters see it. The engine's commit step writes it in place (tokens appended,
    text replaced) and the drafters read it: nothing is copied or re-synced between rounds."""
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
    source: str               # "schema" | "retrieval" | "hint"


class Drafter(ABC):
    source: str

    @abstractmethod
    def propose(self, ctx: ReplyState) -> list[Draft]:
        """Token sequences that may follow `ctx.ids`; verification decides what is kept."""


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
