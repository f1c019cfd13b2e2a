"""What one decode did: forwards, accepted tokens by source, times, and the sidecar's part."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: sources of the committed tokens other than each forward's own next token: the drafts the target
#: accepted, by drafter; and "grammar", the tokens a strict request's grammar forced (jump-forward:
#: committed unverified, then fed to the target along with the next forward's drafts); "prediction" is
#: the caller's predicted output (OpenAI's `prediction`), drafted where the reply agrees with it
SOURCES = ("schema", "retrieval", "hint", "grammar", "prediction")


@dataclass
class DecodeStats(Mapping):
    """Read it by attribute. It is also a read-only mapping of `to_dict()`, so `stats["method"]`
    keeps working for code written against the dict it used to be."""
    method: str
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0        # prompt tokens whose KV came from the prefix cache
    new_tokens: int = 0
    target_forwards: int = 0
    accepted_by_source: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    draft_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    forward_s: float = 0.0               # of decode_s: the target's verify forwards
    host_s: float = 0.0                  # of decode_s: everything else (drafting, trees, commits, events)
    hint_ready_s: float | None = None
    hint_bytes: int | None = None
    sidecar: str | None = None           # the sidecar asked for a hint (method "oospec" with tools), by name
    sidecar_error: str | None = None
    sidecar_declined: bool = False
    hint_follow_ups: int = 0             # follow-up waves asked for the function the target wrote (session.py)
    sidecar_skipped: str | None = None   # why the wave did not run: it could not pay back (payback.py)
    wave_estimate_s: float | None = None  # the pay-back rule's estimates, when it judged this request
    call_estimate_s: float | None = None   # the whole call (prefill + decode), for reports
    decode_estimate_s: float | None = None  # the decode a hint could shorten: the rule weighs the wave against it
    hidden_estimate_s: float | None = None  # speculative tools on offer: the tool time the rule expects the wave to hide
    prediction_exact: bool | None = None  # a hint was read: whether a call it predicted is exactly one the target wrote
    sidecar_profile: dict | None = None
    sidecar_cached_prompt_tokens: int | None = None  # of the wave's shared prefix, when its hint arrived
    #: one (tree nodes, accepted drafts, context tokens before the forward) per verify forward: the
    #: acceptance trace that `oospec project` prices with a measured cost table
    rounds: list[tuple[int, int, int]] = field(default_factory=list)
    #: per verify forward, how many concurrent replies shared it (1: this reply alone; engine batching)
    batch_sizes: list[int] = field(default_factory=list)
    #: a reply that reasons first: the new tokens, target forwards (the prefill's included) and decode
    #: seconds up to and including the forward that closed the reasoning (None: no reasoning, or it never
    #: closed). The rest is the answer part, where the calls are drafted (`oospec bench --thinking`)
    reasoning_tokens: int | None = None
    reasoning_forwards: int | None = None
    reasoning_s: float | None = None
    margins: list[float] | None = None   # top-2 logit margin per new token, when asked for
    prediction_tokens: int = 0           # the caller's prediction, in target tokens (0: none given)
    prediction_matched: int = 0          # of them, those the reply has, in order (OpenAI's accepted_prediction_tokens)

    @property
    def accepted_tokens(self) -> int:
        return sum(self.accepted_by_source.values())

    @property
    def mean_accepted_tokens(self) -> float:
        """New tokens per target forward."""
        return self.new_tokens / max(1, self.target_forwards)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["margins"] is None:
            del out["margins"]
        out["accepted_tokens"] = self.accepted_tokens
        out["mean_accepted_tokens"] = self.mean_accepted_tokens
        return out

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self):
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())
