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

With speculative tools on offer (`Engine.stream(..., speculative_tools={name: seconds})`), a hint
is worth more than decode rounds: an agent that starts a read-only tool from the predicted call hides
that tool's time behind the reply (speculative.py). A step whose call takes the model G seconds,
whose hint is ready at g, with a tool of T seconds, then takes max(G, g + T) instead of G + T: it
saves min(T, G - g) when the prediction is exactly the verified call. On shared cores the wave
starts at arrival and slows the target by about its own seconds, so G - g is about the call without
the wave (`call_s`). The rule then expects

    hidden_s = exact * min(tool_s, call_s)
    run the wave when wave_s <= share * decode_s + hidden_s

where `tool_s` is the mean expected latency of the speculative tools on offer whose latency is known
(none known: no tool term; the rule weighs what it knows) and `exact` is the share of earlier
waves whose predicted call was exactly the call the target wrote, fitted on line like the rest and
starting from EXACT_PRIOR (the shipped sidecar's whole-call exactness on unseen tools, 46.7-51.7%).
With 1 s tools the hidden second pays for a wave of up to about 0.7 s; with 0.25 s tools it adds
about 0.12 s, which a wave on a 2-core CPU (0.4-0.9 s) does not fit under: the wave is skipped.

Both estimates are fitted on line as requests finish (exponentially weighted, so they follow the
machine); until there is something to fit, the wave runs. The share was chosen on train records,
not on the dev or unseen records the benchmark reports: docs/bench.md, "When the wave pays back",
has the sweep. The prefill line stays: `call_s` reports the whole call.
"""
from __future__ import annotations

#: the wave runs when its estimated seconds are at most this share of the expected decode
DEFAULT_RATIO = 0.2
#: the share of waves whose predicted call is exactly the verified one, before any is seen
EXACT_PRIOR = 0.5


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
        self._exact = [1.0, EXACT_PRIOR]  # weight, weighted count of waves whose call was exact (the prior: one wave)

    def observe(self, prompt_tokens: int, cached_prompt_tokens: int, prefill_s: float, decode_s: float) -> None:
        self.prefill.add(prompt_tokens - cached_prompt_tokens, prefill_s)
        self.decode.add(0.0, decode_s)

    def observe_prediction(self, exact: bool) -> None:
        """A wave ran: whether its predicted call was exactly the call the target wrote (False when its
        hint came too late to be read, or the reply called nothing)."""
        keep = 1.0 - self.prefill.decay
        self._exact = [keep * self._exact[0] + 1.0, keep * self._exact[1] + float(exact)]

    def exact(self) -> float:
        """The expected share of waves whose predicted call is exact."""
        return self._exact[1] / self._exact[0]

    def hidden_s(self, tool_s: float | None, call_s: float | None) -> float:
        """The tool seconds a wave is expected to hide behind the call (0 without speculative tools)."""
        if not tool_s or call_s is None:
            return 0.0
        return self.exact() * min(tool_s, call_s)

    def decode_s(self) -> float | None:
        """The expected decode of the next speculative reply (None before one is seen)."""
        return self.decode(0.0)

    def call_s(self, uncached_prompt_tokens: int) -> float | None:
        prefill, decode = self.prefill(uncached_prompt_tokens), self.decode(0.0)
        return None if prefill is None or decode is None else prefill + decode

    def verdict(self, wave_s: float | None, decode_s: float | None, hidden_s: float = 0.0) -> str | None:
        """None: run the wave. Otherwise why it is skipped (it goes to `stats.sidecar_skipped`).
        `hidden_s`: the tool time the wave is expected to hide (`hidden_s()`)."""
        if wave_s is None or decode_s is None or wave_s <= self.ratio * decode_s + hidden_s:
            return None
        why = (f"the wave (about {wave_s:.2f} s on the cores it shares with the target) would cost more than "
               f"{self.ratio:.0%} of the decode it can shorten (about {decode_s:.2f} s)")
        return why + (f" plus the tool time it is expected to hide (about {hidden_s:.2f} s)" if hidden_s else "")
