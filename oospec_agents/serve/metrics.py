"""Prometheus metrics of one server (one registry per app, so several apps can share a process)."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine import SOURCES
from ..sidecar.session import LATE

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


class Metrics:
    """One app's Prometheus metrics (`/metrics`): requests by status, tokens, forwards, accepted drafts by
    source, hints in time or late, sidecar faults, queue depth, time to first token, request seconds."""
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("oospec_requests", "Chat completion requests by HTTP status", ["status"], registry=r)
        self.prompt_tokens = Counter("oospec_prompt_tokens", "Prompt tokens of served replies", registry=r)
        self.generated_tokens = Counter("oospec_generated_tokens", "Tokens the target committed", registry=r)
        self.target_forwards = Counter("oospec_target_forwards", "Target forward passes", registry=r)
        self.accepted = Counter("oospec_accepted_tokens", "Tokens committed without a target forward of their own, "
                                "by source: drafts the target accepted, and (grammar) tokens a strict grammar forced",
                                ["source"], registry=r)
        self.hints = Counter("oospec_hints", "Sidecar hints asked for: in time (used while the reply was "
                             "decoded) or late (the reply ended first)", ["arrival"], registry=r)
        self.sidecar_faults = Counter("oospec_sidecar_faults", "Sidecar faults (the target decodes on without "
                                      "the hint)", registry=r)
        self.queue_depth = Gauge("oospec_queue_depth", "Requests waiting behind the ones being decoded", registry=r)
        self.ttft = Histogram("oospec_time_to_first_token_seconds", "From request to its first content or "
                              "tool-call event", buckets=_LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("oospec_request_seconds", "Whole chat completion requests",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        for source in SOURCES:
            self.accepted.labels(source)
        for arrival in ("in_time", "late"):
            self.hints.labels(arrival)

    def record(self, gen, hint_asked: bool) -> None:
        stats = dict(gen.stats)
        self.prompt_tokens.inc(gen.prompt_tokens)
        self.generated_tokens.inc(len(gen.token_ids))
        self.target_forwards.inc(stats.get("target_forwards") or 0)
        for source, n in (stats.get("accepted_by_source") or {}).items():
            self.accepted.labels(source).inc(n)
        error = stats.get("sidecar_error") or ""
        late = error.startswith(LATE)  # the session reports a late hint as a fault; here it is late
        if error and not late:
            self.sidecar_faults.inc()
        elif hint_asked:
            self.hints.labels("late" if late or stats.get("hint_ready_s") is None else "in_time").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
