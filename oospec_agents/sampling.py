"""Sampling that keeps the target's distribution: the request's settings, the warped distribution at a
node, and the seeded draw that verification walks a token tree with.

Every draft here is deterministic (a point mass on its tokens). For such drafts the multi-draft
rejection rule (SpecInfer; Leviathan et al. and Chen et al. for one draft) at a tree node -- try its
children in order, accept child x with probability p'(x) of the target's warped distribution p' from
which the children rejected before have been removed and which is renormalised, and if none is
accepted draw from what is left -- emits each token x with probability exactly p'(x):
P(child k) = prod_{j<k} (1 - p'(x_j)/(1 - sum_{i<j} p'(x_i))) * p'(x_k)/(1 - sum_{j<k} p'(x_j)) = p'(x_k).
So it is the same as: draw t ~ p' at the node; if t is a child, descend to it; otherwise t is the
round's own next token. `verify.Verifier.verify` walks the tree that way, its `choose` a `Choice` (the
grammar's mask, then `Sampler.draw`), so every committed token is one draw from the target's own
conditional distribution.

One uniform is drawn per committed token (inverse CDF, from a generator seeded per request), in the
order the tokens are committed. The same seed and request give the same tokens on the same machine
and method; across methods they agree too wherever the target's logits agree bit for bit.

`temperature`, `top_k`, `top_p` and `min_p` are transformers' own warpers, in `generate`'s order, so
`target.generate(do_sample=True, ...)` with the same settings is the reference distribution. Penalties
(repetition, frequency, presence) are not served: they would need each tree node's own path.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Callable

import torch
from transformers import LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, \
    TopPLogitsWarper

from .errors import SamplingError


#: OpenAI's range of `temperature`: a value beyond it is an error naming it, as OpenAI's 400 is
TEMPERATURE_RANGE = (0, 2)


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings. Temperature None or 0 is greedy decoding (the others are then unused).

    The one check of their ranges, for the engine and every front-end: `temperature` 0 to 2 and `top_p`
    in (0, 1] (OpenAI's ranges), vLLM's `top_k` >= 0 and `min_p` in [0, 1], a 64-bit `seed`; a value out
    of range is a `SamplingError` whose `param` names the field and whose message states the range."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None

    def __post_init__(self):
        low, high = TEMPERATURE_RANGE
        _number("temperature", self.temperature, lambda v: low <= v <= high,
                f"from {low} to {high} (OpenAI's range; 0 decodes greedily)")
        _number("top_p", self.top_p, lambda v: 0 < v <= 1, "in (0, 1]")
        _number("min_p", self.min_p, lambda v: 0 <= v <= 1, "in [0, 1] (vLLM's range; 0: no min-p)")
        for name, value in (("top_k", self.top_k), ("seed", self.seed)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise _error(name, f"{name} must be an integer, got {value!r}")
        if self.seed is not None and not -2 ** 63 <= self.seed <= 2 ** 63 - 1:
            raise _error("seed", f"seed must be an integer from {-2 ** 63} to {2 ** 63 - 1}, got {self.seed!r}")
        if self.top_k is not None and self.top_k < 0:
            raise _error("top_k", f"top_k must be >= 0 (0: no top-k), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return not self.temperature

    def sampler(self) -> "Sampler | None":
        """A fresh sampler for one reply (its own seeded generator); None for greedy decoding."""
        return None if self.greedy else Sampler(self)


class Sampler:
    """One reply's draws: the warped distribution at a node, and one seeded uniform per drawn token."""

    def __init__(self, settings: Sampling):
        self.settings = settings
        seed = settings.seed if settings.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        s, warpers = settings, [TemperatureLogitsWarper(settings.temperature)]
        if s.top_k:
            warpers.append(TopKLogitsWarper(top_k=s.top_k))
        if s.top_p is not None and s.top_p < 1:
            warpers.append(TopPLogitsWarper(top_p=s.top_p))
        if s.min_p:
            warpers.append(MinPLogitsWarper(min_p=s.min_p))
        self.warpers = LogitsProcessorList(warpers)
        self._no_ids = torch.zeros((1, 0), dtype=torch.long)

    def probs(self, row: torch.Tensor) -> torch.Tensor:
        """p' at a node: the target's logits row (masked already under a grammar), warped, as probabilities."""
        scores = self.warpers(self._no_ids, row.detach().float().cpu()[None])
        return torch.softmax(scores, dim=-1)[0]

    def draw(self, row: torch.Tensor) -> int:
        """One token from p' at a node (inverse CDF of one seeded uniform)."""
        cdf = torch.cumsum(self.probs(row), dim=0)
        u = torch.rand((), generator=self.generator, dtype=torch.float64).item() * float(cdf[-1])
        return min(int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype), right=True)[0]), len(cdf) - 1)


def _error(param: str, message: str) -> SamplingError:
    error = SamplingError(message)
    error.param = param
    return error


def _number(name: str, value, ok, expected: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise _error(name, f"{name} must be a number {expected}, got {value!r}")


#: OpenAI's most `top_logprobs` alternatives per token
MAX_TOP_LOGPROBS = 20


def check_logprobs(logprobs) -> int | None:
    """The engine's `logprobs` argument: None or False (none), True (the chosen token's only, like
    `top_logprobs=0`), or the number of alternatives per token, 0-20."""
    if logprobs is None or logprobs is False:
        return None
    if logprobs is True:
        return 0
    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise _error("top_logprobs", f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {logprobs!r}")
    return logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One committed token's log-probability, and its top alternatives: of the target's distribution at
    that position (under a grammar, the masked one), before any sampling warper."""
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def openai(self, token_text: Callable[[int], str]) -> dict:
        """OpenAI's logprobs entry (`{"token", "logprob", "bytes", "top_logprobs"}`), each token's text
        `token_text(token id)`."""
        def one(token_id: int, logprob: float) -> dict:
            text = token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
        return one(self.token_id, self.logprob) | {"top_logprobs": [one(t, lp) for t, lp in self.top]}


def greedy(row: torch.Tensor) -> int:
    """The greedy token of one logits row: its first largest logit. Upcast to float32 first -- exact, the
    same token -- since the CPU takes a bf16 row's argmax about 3x slower than a float32 one's."""
    return int(row.float().argmax())


class Choice:
    """How one reply picks each token from a logits row: the grammar's mask first, then the argmax (greedy)
    or a seeded draw (`Sampler`); with `top_logprobs` set, each chosen token's `TokenLogprob` is kept
    until the commit step takes it. The verifier calls it on the accepted path's rows, in order."""

    def __init__(self, guide=None, sampler: Sampler | None = None, top_logprobs: int | None = None):
        self.guide, self.sampler, self.top_logprobs = guide, sampler, top_logprobs
        self._taken: list[TokenLogprob] = []

    @classmethod
    def for_reply(cls, guide, sampler: Sampler | None, top_logprobs: int | None) -> "Choice | None":
        """None when the plain argmax of the logits is the choice (no grammar, greedy, no logprobs)."""
        if guide is None and sampler is None and top_logprobs is None:
            return None
        return cls(guide, sampler, top_logprobs)

    def __call__(self, row: torch.Tensor) -> int:
        if self.guide is not None and self.sampler is None and self.top_logprobs is None:
            return self.guide.choose(row)  # the masked argmax, without masking a row the grammar agrees with
        if self.guide is not None:
            row = self.guide.masked(row)
        token = greedy(row) if self.sampler is None else self.sampler.draw(row)
        if self.guide is not None:
            self.guide.consume([token])
        if self.top_logprobs is not None:
            self._taken.append(_logprob(row, token, self.top_logprobs))
        return token

    def take(self) -> list[TokenLogprob]:
        """The logprobs of the tokens chosen since the last take, in order."""
        taken, self._taken = self._taken, []
        return taken


def _logprob(row: torch.Tensor, token: int, top: int) -> TokenLogprob:
    logp = torch.log_softmax(row.detach().float(), dim=-1)
    best = torch.topk(logp, top) if top else None
    alternatives = () if best is None else tuple(zip(best.indices.tolist(), best.values.tolist()))
    return TokenLogprob(token, float(logp[token]), alternatives)
