"""What a server's routes share (`ServerState`: the engine, its queue, its metrics), and a chat
request's way into the queue (`ServerState.submit`), which both APIs take.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..engine import Generation
from ..frontend import choice_count
from .errors import ServeError
from .extension import Extension
from .metrics import Metrics
from .protocol import ChatCompletionRequest, check_request
from .scheduler import QueuedReply, Scheduler

log = logging.getLogger("oospec.serve")


class ServerState:
    """What the routes share: the engine (None while loading), its queue, its metrics, and the model id
    and replica the replies name."""

    def __init__(self, model: str, replica: str, max_queue: int, method: str, max_batch: int = 1):
        self.model, self.replica, self.method = model, replica, method
        self.metrics = Metrics()
        self.scheduler = Scheduler(max_queue, self.metrics.queue_depth.set, max_batch)
        self.engine = None
        self.load_error: str | None = None

    def load(self, loader: Callable[[], Any]) -> None:
        """Load the engine (on a thread: the app answers 503 meanwhile); a failure is kept for /health."""
        try:
            self.engine = loader()
            log.info("model %r loaded; serving", self.model)
        except Exception as e:
            log.exception("loading the model failed")
            self.load_error = f"{type(e).__name__}: {e}"

    def ready_engine(self):
        if self.engine is not None:
            return self.engine
        if self.load_error is not None:
            raise ServeError(500, f"the model failed to load: {self.load_error}", code="model_load_failed")
        raise ServeError(503, f"the model {self.model!r} is still loading; retry shortly", code="model_loading")

    def check_model(self, model: str) -> None:
        if model != self.model:
            raise ServeError(404, f"unknown model {model!r}; this server serves {self.model!r}", param="model",
                             code="model_not_found")

    def model_object(self) -> dict:
        return {"id": self.model, "object": "model", "created": 0, "owned_by": "oospec-agents"}

    def first_token(self, t0: float) -> Callable[[], None]:
        """What a fold calls at a request's first token: the time-to-first-token metric since `t0`."""
        return lambda: self.metrics.ttft.observe(time.perf_counter() - t0)

    def submit(self, req: ChatCompletionRequest, ext: Extension = Extension()
               ) -> tuple[QueuedReply, Callable[[Generation], None]]:
        """A chat request checked and queued: its place in the queue, and `finished(gen)` recording a
        choice's metrics. Chat completions and the Responses API (which arrives translated) both take
        this path. The queued reply's events are the engine's (`LogprobsDelta`s among them when logprobs
        are asked for), of `n` choices one after another: choice i's events follow i Generations. `ext`
        is the request's `oospec` extension (its `speculative_tools` go to the engine)."""
        self.check_model(req.model)
        check_request(req)
        eng = self.ready_engine()
        method = req.method or self.method
        chat = req.to_chat_request(method, ext.speculative_tools)
        # Bad input raises here, on the loop, before the request takes a place in the queue.
        cancelled = threading.Event()  # set when the client leaves: the engine stops after its round
        events = chat.stream_choices(eng, choice_count(req.n), cancelled)
        hint_asked = (method == "oospec" and bool(req.tools) and req.tool_choice != "none"
                      and getattr(eng, "sidecar", None) is not None)
        queued = self.scheduler.submit(events, cancelled)

        def finished(gen):
            self.metrics.record(gen, hint_asked and not dict(gen.stats).get("sidecar_declined"))
        return queued, finished
