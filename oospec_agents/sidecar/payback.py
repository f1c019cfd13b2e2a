"""Whether a sidecar's wave can pay back, when it runs on the cores the target decodes on.

On a second device the wave is free: it always runs. On the target's own CPU it is not: while it
runs it takes cores the target's matrix products would use, and its seconds land on the target's
call almost one for one. What a hint can win back is a share of the decode: the rounds it saves.
So, per request:

    wave_s   = the sidecar's estimate of its wave, from the cost of its earlier waves
               (a line through their seconds against uncached prefix tokens + 8 per row)
    decode_s = the target's estimate of this reply's decode: the mean decode time of earlier
               speculative replies
    run the wave when wave_s <= share * decode_s

The share is what the hint is expected to save at most, and the rule weighs the wave against the
decode alone, not the whole call (docs/sidecar.md, "The pay-back rule: the measurements behind it").

Both estimates are fitted on line as requests finish (exponentially weighted, so they follow the
machine); until there is something to fit, the wave runs. The share was chosen on train records,
not on the dev or unseen records the benchmark reports: docs/bench.md, "When the wave pays back",
has the sweep. The prefill line stays: `call_s` reports the whole call.
"""
from __future__ import annotations

#: the wave runs when its estimated seconds are at most this share of the expected decode
DEFAULT_RATIO = 0.2


class Line:
    """y ~ a + b*x, least squares over recent points (each older point weighs `1 - decay` less)."""

    def __init__(self, decay: float = 0.2):
        self.decay = decay
        self._s = [0.0] * 5  # weights, x, y, x*x, x*y

    def add(self, x: float, y: float) -> None:
        keep = 1.0 - self.decay
        self._s = [keep * s + v for s, v in zip(self._s, (1.0, x, y, x * x, x * y))]

    def __call__(self, x: float) -> float | None:
        """The fitted y at x; the mean y while the points cannot fix a slope; None with no points."""
        n, sx, sy, sxx, sxy = self._s
        if n == 0:
            return None
        spread = n * sxx - sx * sx
        if spread <= 1e-9 * max(1.0, n * sxx):
            return sy / n
        b = max(0.0, (n * sxy - sx * sy) / spread)  # cost never falls with more work
        return (sy - b * sx) / n + b * x


class PayBack:
    """The target's side of the rule: it learns its own call time, and judges the sidecar's estimate."""

    def __init__(self, ratio: float = DEFAULT_RATIO):
        if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or ratio <= 0:
            raise ValueError(f"wave_payback must be a number > 0 (or None to always run the wave), got {ratio!r}")
        self.ratio = float(ratio)
        self.prefill = Line()   # seconds against uncached prompt tokens
        self.decode = Line()    # seconds of decoding (x = 0: its mean)

    def observe(self, prompt_tokens: int, cached_prompt_tokens: int, prefill_s: float, decode_s: float) -> None:
        self.prefill.add(prompt_tokens - cached_prompt_tokens, prefill_s)
        self.decode.add(0.0, decode_s)

    def decode_s(self) -> float | None:
        """The expected decode of the next speculative reply (None before one is seen)."""
        return self.decode(0.0)

    def call_s(self, uncached_prompt_tokens: int) -> float | None:
        prefill, decode = self.prefill(uncached_prompt_tokens), self.decode(0.0)
        return None if prefill is None or decode is None else prefill + decode

    def verdict(self, wave_s: float | None, decode_s: float | None) -> str | None:
        """None: run the wave. Otherwise why it is skipped (it goes to `stats.sidecar_skipped`)."""
        if wave_s is None or decode_s is None or wave_s <= self.ratio * decode_s:
            return None
        return (f"the wave (about {wave_s:.2f} s on the cores it shares with the target) would cost more than "
                f"{self.ratio:.0%} of the decode it can shorten (about {decode_s:.2f} s)")
