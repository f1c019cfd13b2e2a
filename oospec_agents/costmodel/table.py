"""A measured cost table, `oospec profile`'s cost.json, and the times it prices by interpolation.

`verify_s[i][j]` is the median seconds of one verify forward of `k[i]` tree nodes over a KV cache of
`context[j]` tokens (the model call alone, as the engine's `stats.forward_s` counts it);
`prefill_s[j]` is a prefill of `context[j]` tokens from an empty cache.

Between grid points both are linear (forward time is affine in the tokens fed and in the keys
attended, so linear is the right shape in k and in context, not log-linear). Below the grid's first
point a time is clamped to it (a forward never gets cheaper than the smallest one measured). Above the
grid's last point the last segment is extended, up to EXTRAPOLATE times the grid's end; beyond that
the table refuses rather than guess.
"""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import OoOSpecError

#: how far past the last grid point a time may be extrapolated, as a multiple of that point
EXTRAPOLATE = 2.0
KIND = "oospec cost table"


class CostModelError(OoOSpecError):
    """A cost table or a bench result that cannot be priced: named, with what was expected."""


class OutsideTable(CostModelError):
    """A forward lies too far outside the profiled grid to extrapolate."""


def interp(xs: list[float], ys: list[float], x: float, what: str) -> float:
    """Piecewise-linear y(x) over ascending `xs`; clamped below, extended (to EXTRAPOLATE * xs[-1]) above."""
    if x > xs[-1] * EXTRAPOLATE:
        raise OutsideTable(f"{what} {x:g} is beyond the cost table ({what} {xs[0]:g}..{xs[-1]:g}, priced up to "
                           f"{EXTRAPOLATE:g}x its end): profile a larger {what}")
    if len(xs) == 1 or x <= xs[0]:
        return ys[0]
    i = min(bisect.bisect_right(xs, x), len(xs) - 1)  # the segment [i-1, i]; the last one past the end
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class CostTable:
    k: list[int]
    context: list[int]
    verify_s: list[list[float]]   # [k][context]
    prefill_s: list[float]        # [context]
    meta: dict

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        data = read_json(path, "cost table", "oospec profile")
        if data.get("kind") != KIND:
            raise CostModelError(f"{str(path)!r} is not a cost table from `oospec profile` (no \"kind\": \"{KIND}\")")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict) -> CostTable:
        meta = {key: v for key, v in data.items() if key not in ("k", "context", "verify_s", "prefill_s")}
        return cls(list(data["k"]), list(data["context"]), data["verify_s"], data["prefill_s"], meta)

    def to_dict(self) -> dict:
        return self.meta | {"k": self.k, "context": self.context, "verify_s": self.verify_s,
                            "prefill_s": self.prefill_s}

    def verify(self, k: int, context: int) -> float:
        """Seconds of one verify forward of `k` nodes over `context` cached tokens: bilinear."""
        per_k = [interp(self.context, row, context, "context") for row in self.verify_s]
        return interp(self.k, per_k, k, "k")

    def prefill(self, new: int, cached: int = 0) -> float:
        """Seconds to prefill `new` prompt tokens after `cached` ones already in the KV cache.

        P(cached + new) - P(cached) from the prefill column (with P(0) = 0): the tail's linear work and
        its queries against every key, which is what the difference of two full prefills leaves.
        Never less than one forward of min(new, max k) tokens over `cached`: the difference drops
        the fixed cost of a forward, which the tail still pays."""
        if new <= 0:
            return 0.0
        full = interp(self.context, self.prefill_s, cached + new, "prefill context")
        head = interp(self.context, self.prefill_s, cached, "prefill context") if cached else 0.0
        return max(full - head, self.verify(min(new, self.k[-1]), cached))

    def in_grid(self, k: int, context: int) -> bool:
        return k <= self.k[-1] and context <= self.context[-1]


def read_json(path: str | Path, what: str, maker: str):
    """A JSON file's content; a missing file or bad JSON is a CostModelError naming `what` and the
    command (`maker`) that writes one."""
    path = Path(path)
    if not path.is_file():
        raise CostModelError(f"{what} {str(path)!r} does not exist (write one with `{maker}`)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CostModelError(f"{what} {str(path)!r} is not valid JSON: {e}") from None
