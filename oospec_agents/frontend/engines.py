"""Which engine a front-end decodes with: `EngineLike`, what it asks of one; `LazyEngine`, the shared engine
for its models, loaded on first use."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, runtime_checkable

from ..engine import Engine
from ..references import check_reference
from ..request import ChatRequest, Event


@runtime_checkable
class EngineLike(Protocol):
    """What a front-end asks of an engine: `Engine` is one. `stream` takes a `ChatRequest` (`ChatRequest.stream`
    passes it) and yields its events, a `Generation` last."""
    model_name: str
    context_window: int

    def stream(self, request: ChatRequest, *, cancel: threading.Event | None = None) -> Iterator[Event]: ...


@dataclass
class LazyEngine:
    """Which engine a chat model uses: a given one, or the shared engine for its models, loaded on
    first use (constructing a chat model loads nothing)."""
    model: str = "embedded"
    sidecar: Any = None
    options: dict = field(default_factory=dict)   # from_pretrained keywords: devices, dtype, ...
    engine: EngineLike | None = None

    def __post_init__(self) -> None:
        if self.engine is None:  # what costs nothing to check fails at construction, not at the first call
            for ref in (self.model, self.sidecar):
                check_reference(ref, probe_hub=False)

    def get(self, model: str | None = None) -> EngineLike:
        if self.engine is not None and model in (None, self.model):
            return self.engine
        options = {k: v for k, v in self.options.items() if v is not None}
        engine = Engine.shared(model or self.model, self.sidecar, **options)
        if model in (None, self.model):
            self.engine = engine
        return engine
