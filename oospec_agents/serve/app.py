"""The FastAPI app: OpenAI Chat Completions over one engine, plus /v1/models, /health and /metrics,
and the Responses API (responses.py: translated into a chat request, it takes the chat path from `start`).

Every reply, streamed or not, is built from the engine's one event stream, so a non-streamed reply is
exactly the aggregate of the streamed chunks.

This module owns the routes and a request's path through them: checked (protocol.py), queued
(scheduler.py), folded into its `Reply` as SSE chunks or one body, and the client's leaving turned
into a cancelled job. The wire format is protocol.py's; the error bodies errors.py's; our opt-in
request extension (`"oospec": {"predicted_calls", "speculative_tools"}`) extension.py's.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .. import CallPredicted, Generation, LogprobsDelta, ReasoningDelta, TextDelta, ToolCallDelta
from ..batching import DEFAULT_MAX_BATCH
from ..frontend import ChatRequest, choice_count, settings
from . import admin
from .errors import Guard, ServeError, error_body, install_error_handlers
from .extension import Extension, Predictions
from .metrics import Metrics
from .protocol import (ChatCompletionRequest, Completion, check_tool_messages, check_tools, refuse_sampling,
                       refuse_unserved, sse)
from .responses import RESPONSES_PATH, ResponsesRequest, respond
from .scheduler import Scheduler

log = logging.getLogger("oospec.serve")

CHAT_PATH = "/v1/chat/completions"
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


def default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _State:
    """What the routes share: the engine (None while loading), its queue, its metrics."""

    def __init__(self, model: str, replica: str, max_queue: int, method: str, max_batch: int = 1):
        self.model, self.replica, self.method = model, replica, method
        self.metrics = Metrics()
        self.scheduler = Scheduler(max_queue, self.metrics.queue_depth.set, max_batch)
        self.engine = None
        self.load_error: str | None = None

    def ready_engine(self):
        if self.engine is not None:
            return self.engine
        if self.load_error is not None:
            raise ServeError(500, f"the model failed to load: {self.load_error}", code="model_load_failed")
        raise ServeError(503, f"the model {self.model!r} is still loading; retry shortly", code="model_loading")


def create_app(engine=None, *, loader: Callable[[], Any] | None = None, model: str = "embedded",
               api_key: str | None = None, max_queue: int = 64, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_batch: int | None = None,
               replica_id: str | None = None, method: str = "oospec", close_engine: bool = False,
               adapter_root: str | None = None, on_adapter_swap: Callable[[str], Any] | None = None) -> FastAPI:
    """An OpenAI-compatible app serving `engine`, or the engine `loader()` returns.

    With a loader the app answers at once: 503 while the loader runs (on a thread), then serves.
    `model` is the id clients name in requests. `max_batch`: replies decoded at once (their verify
    forwards batched by the engine); None: the engine's own `max_batch` (1 for an engine without one). `close_engine` closes the engine on shutdown
    (an engine the app loaded itself always is). `adapter_root` is the directory under which the admin
    call `POST /v1/oospec/sidecar-adapter` may load a sidecar adapter (admin.py; served with `api_key` only);
    `on_adapter_swap(path)` is called after each swap (Ray Serve replicas post it for the others).
    """
    if (engine is None) == (loader is None):
        raise ValueError("create_app needs exactly one of engine= or loader=")
    if max_batch is None:
        max_batch = getattr(engine, "max_batch", 1) if engine is not None \
            else DEFAULT_MAX_BATCH
    state = _State(model, replica_id or default_replica_id(), max_queue, method, max_batch)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loading = None
        if loader is None:
            state.engine = engine
        else:
            loading = asyncio.get_running_loop().run_in_executor(None, _load, state, loader)
        try:
            yield
        finally:
            state.scheduler.shutdown()
            if loading is not None:
                await loading
            if (loader is not None or close_engine) and hasattr(state.engine, "close"):
                state.engine.close()

    app = FastAPI(title="oospec serve", lifespan=lifespan)
    app.state.oospec = state
    install_error_handlers(app)
    admin.install(app, state, api_key=api_key, adapter_root=adapter_root, on_swap=on_adapter_swap)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes, metrics=state.metrics,
                       chat_path=CHAT_PATH)

    @app.get("/health")
    async def health():
        status = "ok" if state.engine is not None else "failed" if state.load_error else "loading"
        code = {"ok": 200, "loading": 503, "failed": 500}[status]
        return JSONResponse({"status": status, "model": state.model, "replica": state.replica,
                             "queue": state.scheduler.waiting, "error": state.load_error}, status_code=code)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.exposition(), media_type=state.metrics.content_type)

    def model_object() -> dict:
        return {"id": state.model, "object": "model", "created": 0, "owned_by": "oospec-agents"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_object()]}

    @app.get("/v1/models/{model:path}")  # `path`: a hub id such as "Qwen/Qwen2.5-7B-Instruct" holds a slash
    async def retrieve_model(model: str):
        if model != state.model:
            raise ServeError(404, f"unknown model {model!r}; this server serves {state.model!r}", param="model",
                             code="model_not_found")
        return model_object()

    def start(req: ChatCompletionRequest, ext: Extension = Extension()):
        """A chat request checked and queued: its Job, and `finished(gen)` recording its metrics.
        Chat completions and the Responses API (which arrives translated) both take this path. The
        job's events are the engine's (`LogprobsDelta`s among them when logprobs are asked for), of
        `n` choices one after another: choice i's events follow i Generations. `ext` is the request's
        `oospec` extension (its `speculative_tools` go to the engine)."""
        if req.model != state.model:
            raise ServeError(404, f"unknown model {req.model!r}; this server serves {state.model!r}",
                             param="model", code="model_not_found")
        refuse_sampling(req)
        refuse_unserved(req)
        check_tools(req)
        check_tool_messages(req)
        eng = state.ready_engine()
        method = req.method or state.method
        wire = {"method": method, "max_tokens": req.max_completion_tokens or req.max_tokens or None,
                "top_k": None if req.top_k == -1 else req.top_k, "speculative_tools": ext.speculative_tools}
        chat = ChatRequest.of(req.messages, settings(wire, req))  # vLLM's top_k=-1: no top-k
        # Bad input raises here, on the loop, before the request takes a place in the queue.
        cancelled = threading.Event()  # set when the client leaves: the engine stops after its round
        events = chat.stream_choices(eng, choice_count(req.n), cancelled)
        hint_asked = (method == "oospec" and bool(req.tools) and req.tool_choice != "none"
                      and getattr(eng, "sidecar", None) is not None)
        job = state.scheduler.submit(events, cancelled)

        def finished(gen):
            state.metrics.record(gen, hint_asked and not dict(gen.stats).get("sidecar_declined"))
        return job, finished

    @app.post(CHAT_PATH)
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        t0 = time.perf_counter()
        ext = Extension.of(req)
        job, finished = start(req, ext)
        completion = Completion(state.model, state.replica, choice_count(req.n), req.parallel_tool_calls,
                                bool(req.logprobs))
        fold = _Fold(completion, state, t0, Predictions() if ext.predicted_calls else None)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_sse(job, fold, usage, finished),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        gens = await _collect(job, fold, request)
        if gens is None:
            return Response(status_code=499)  # the client closed the request; nobody reads this
        for gen in gens:
            finished(gen)
        return fold.body()

    @app.post(RESPONSES_PATH)
    async def responses(req: ResponsesRequest, request: Request):
        """OpenAI's Responses API (responses.py), translated to a chat request and taking its path."""
        t0 = time.perf_counter()
        return await respond(req, request, start, state.model, state.replica,
                             lambda: state.metrics.ttft.observe(time.perf_counter() - t0))

    return app


def _load(state: _State, loader) -> None:
    try:
        state.engine = loader()
        log.info("model %r loaded; serving", state.model)
    except Exception as e:
        log.exception("loading the model failed")
        state.load_error = f"{type(e).__name__}: {e}"


class _Fold:
    """One chat request's engine events folded into its `Completion`: `apply(event)` returns the chunks
    to send now; `gens` collects the choices' Generations (choice i's events follow i of them).
    `predictions` is the `oospec.predicted_calls` extension's record (None: off, and a `CallPredicted`
    sends nothing, as a `ToolCallReady` never does: a stock client sees no new chunk)."""

    def __init__(self, completion: Completion, state: _State, t0: float, predictions: Predictions | None):
        self.completion, self.state, self.t0, self.predictions = completion, state, t0, predictions
        self.gens: list = []

    def apply(self, item) -> list[dict]:
        choice = len(self.gens)
        reply = self.completion.replies[choice]
        if isinstance(item, (ReasoningDelta, TextDelta, ToolCallDelta)):
            if not self.gens and not reply.reasoning and not reply.content and not reply.calls:
                self.state.metrics.ttft.observe(time.perf_counter() - self.t0)
            if isinstance(item, ToolCallDelta):
                return reply.hold(reply.tool_call(item))
            return reply.hold(reply.text(item.text) if isinstance(item, TextDelta) else reply.reason(item.text))
        if isinstance(item, LogprobsDelta):
            return reply.logprobs(item)
        if isinstance(item, CallPredicted) and self.predictions is not None:
            return [self.predictions.chunk(self.completion, choice, item)]
        if not isinstance(item, Generation):  # ToolCallReady, an unasked CallPredicted: nothing on the wire
            return []
        self.gens.append(item)  # the choice's Generation
        last = reply.last_chunk(item)
        if self.predictions is not None:
            self.predictions.closing(choice, last["oospec"])
        return reply.release() + [last]

    @property
    def complete(self) -> bool:
        return len(self.gens) == len(self.completion.replies)

    def body(self) -> dict:
        """The non-streamed reply; with the extension, each choice's `oospec` object lists its predictions."""
        body = self.completion.body(self.gens)
        if self.predictions is not None:
            extra = body["oospec"]
            for choice, oospec in enumerate(extra.get("choices", [extra])):
                self.predictions.closing(choice, oospec)
            if "choices" in extra:
                self.predictions.closing(0, extra)
        return body


async def _collect(job, fold: _Fold, request: Request):
    """A non-streamed reply: every event folded in; its choices' Generations, or None when the client
    left before the end."""
    async def watch():
        while not await request.is_disconnected():
            await asyncio.sleep(0.25)
        job.cancel()

    watcher = asyncio.create_task(watch())
    try:
        async for item in job.events():
            fold.apply(item)
    finally:
        watcher.cancel()
    return fold.gens if fold.complete else None


async def _sse(job, fold: _Fold, usage: bool, finished):
    for chunk in fold.completion.first_chunks():
        yield sse(chunk)
    try:
        async for item in job.events():
            for chunk in fold.apply(item):
                yield sse(chunk)
            if isinstance(item, Generation):
                finished(item)
        if usage and fold.complete:
            yield sse(fold.completion.usage_chunk(fold.gens))
    except Exception as e:  # the status line is sent: the error goes in the stream, as OpenAI's does
        log.exception("streamed request failed")
        yield sse(error_body(500, f"internal error ({type(e).__name__}); the server log has the details"))
    yield sse("[DONE]")
