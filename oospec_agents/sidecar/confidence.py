"""The wave's confidence: a calibrated probability that its whole predicted call is exact.

    logprob = call_logprob(rows, result.row_logprobs, call, tool_choice)   the call's rows, summed
    confidence = calibration(logprob)                                      in [0, 1]

A call is exact when its function and every argument are right, so its raw score is the log of the
product of its rows' sequence probabilities: the function row's (unless tool_choice named the tool)
and each slot row's of the chosen tool (a slot that answered null counts too: leaving an argument out
is a decision). A 135M model's greedy rows are over-confident, so the raw product is mapped to a
probability by a monotone map fitted on training records (`Calibration.fit`: Platt scaling,
p = sigmoid(a * logprob + b)), shipped as `confidence.json` in the adapter's directory
(`CALIBRATION_FILE`). An adapter without one (a fresh `oospec adapt` output) gets the raw product,
`Calibration.raw()`, and says so in its `kind`.

Fitting and measuring: `python -m oospec_agents.train.evaluate calibrate` (train records only) and
`... sidecar`'s reliability table (`reliability`, `threshold_figures`); docs/sidecar-accuracy.md.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from .rows import Row

#: the calibration's file name in an adapter's directory
CALIBRATION_FILE = "confidence.json"


def call_logprob(rows: list[Row], logprobs: list[float | None] | None, call: dict,
                 tool_choice: tuple[str, str | None]) -> float | None:
    """The log-probability of the wave's call `call` ({"name", "arguments"}): the function row's (none
    under a named tool_choice, whose rows hold no function row) plus every slot row of the called tool.
    None when the wave kept no log-probabilities (a wave function other than `Wave`), or one of those
    rows was not decoded."""
    if not isinstance(logprobs, list) or len(logprobs) != len(rows):
        return None
    picked = [lp for r, lp in zip(rows, logprobs)
              if (r.kind == "function" and tool_choice[0] != "named") or (r.kind == "slot" and r.tool == call["name"])]
    if not picked or any(lp is None or not math.isfinite(lp) for lp in picked):
        return None
    return float(sum(picked))


@dataclass(frozen=True)
class Calibration:
    """p = sigmoid(a * logprob + b) for kind "platt"; p = exp(logprob) for kind "raw" (uncalibrated)."""
    kind: str = "raw"
    a: float = 1.0
    b: float = 0.0
    #: where it was fitted: the data, the records, the adapter (free text, for reports)
    fitted_on: str | None = None
    n: int | None = None

    def __call__(self, logprob: float | None) -> float | None:
        if logprob is None:
            return None
        if self.kind == "raw":
            return math.exp(min(0.0, logprob))
        z = self.a * logprob + self.b
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    @classmethod
    def raw(cls) -> "Calibration":
        return cls()

    @classmethod
    def fit(cls, logprobs: list[float], exact: list[bool], *, fitted_on: str | None = None,
            iterations: int = 100) -> "Calibration":
        """Platt scaling by Newton's method on the log-loss, each step halved until the loss falls (with
        Platt's smoothed targets, so a set that is all exact or all wrong still gives a finite map).
        Raises ValueError for no points or mismatched lengths."""
        if not logprobs or len(logprobs) != len(exact):
            raise ValueError(f"calibration needs one exact flag per log-probability, got {len(logprobs)} and "
                             f"{len(exact)}")
        pos = sum(map(bool, exact))
        hi, lo = (pos + 1) / (pos + 2), 1 / (len(exact) - pos + 2)
        ys = [hi if e else lo for e in exact]

        def loss(a: float, b: float) -> float:
            total = 0.0
            for x, y in zip(logprobs, ys):
                z = a * x + b
                total += max(z, 0) - z * y + math.log1p(math.exp(-abs(z)))  # -log-likelihood, stable
            return total
        a, b = 1.0, 0.0
        current = loss(a, b)
        for _ in range(iterations):
            ga = gb = haa = hab = hbb = 0.0
            for x, y in zip(logprobs, ys):
                p = Calibration("platt", a, b)(x)
                w = max(p * (1 - p), 1e-12)
                ga, gb = ga + (p - y) * x, gb + (p - y)
                haa, hab, hbb = haa + w * x * x, hab + w * x, hbb + w
            det = haa * hbb - hab * hab
            if abs(det) < 1e-18:
                break
            da, db = (hbb * ga - hab * gb) / det, (haa * gb - hab * ga) / det
            step = 1.0
            while step > 1e-6 and loss(a - step * da, b - step * db) > current:
                step /= 2
            if step <= 1e-6:
                break
            a, b = a - step * da, b - step * db
            previous, current = current, loss(a, b)
            if previous - current < 1e-10:
                break
        if a < 0:  # a map that falls as the model's own probability rises is noise: a flat one, the base rate
            a, b = 0.0, math.log((pos + 1) / (len(exact) - pos + 1))
        return cls("platt", round(a, 6), round(b, 6), fitted_on, len(exact))

    @classmethod
    def load(cls, path) -> "Calibration":
        """A calibration file; a bad one raises ValueError naming the file and the problem."""
        try:
            data = json.loads(Path(path).read_text())
            cal = cls(**data)
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(f"cannot read the sidecar's confidence calibration {str(path)!r}: {e}") from None
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                      for v in (cal.a, cal.b))
        if cal.kind not in ("platt", "raw") or not numbers:
            raise ValueError(f"the sidecar's confidence calibration {str(path)!r} is not a finite platt or raw map: "
                             f"{data}")
        return cal

    @classmethod
    def for_adapter(cls, adapter) -> "Calibration":
        """The adapter directory's `CALIBRATION_FILE`, or the raw product where it has none."""
        path = None if adapter is None else Path(adapter) / CALIBRATION_FILE
        return cls.load(path) if path is not None and path.is_file() else cls.raw()

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def reliability(points: list[tuple[float, bool]], bins: int = 5) -> list[dict]:
    """The reliability table of (confidence, exact) points: per equal-width bin of confidence, its
    count, mean predicted confidence and observed share exact (empty bins are left out)."""
    table = []
    for k in range(bins):
        lo, hi = k / bins, (k + 1) / bins
        got = [(c, e) for c, e in points if lo <= c < hi or (k == bins - 1 and c == 1.0)]
        if got:
            table.append({"bin": f"{lo:.1f}-{hi:.1f}", "n": len(got),
                          "mean_confidence": round(sum(c for c, _ in got) / len(got), 4),
                          "observed_exact": round(sum(e for _, e in got) / len(got), 4)})
    return table


def threshold_figures(points: list[tuple[float, bool]], threshold: float) -> dict:
    """Whole-call exactness of the predictions a consumer acts on at `threshold` (confidence >= it):
    `acted` (how many), precision (the share of them exact) and recall (the share of all exact
    predictions they hold)."""
    acted = [e for c, e in points if c >= threshold]
    exact = sum(e for _, e in points)
    return {"threshold": threshold, "acted": len(acted), "of": len(points),
            "precision": round(sum(acted) / len(acted), 4) if acted else None,
            "recall": round(sum(acted) / exact, 4) if exact else None}
