"""The FastAPI app: OpenAI Chat Completions over one engine, plus /v1/models, /health and /metrics,
and the Responses API (translated into a chat request, it takes the chat path).

Every reply, streamed or not, is built from the engine's one event stream, so a non-streamed reply is
exactly the aggregate of the streamed chunks.

This module assembles the server: the shared state (state.py: engine, queue, metrics), the routes
(routes.py, thin functions over protocol.py's wire models), the admin route (admin.py), the error
bodies and the guard before the routes (errors.py), and the engine's loading and closing. A request's
path: checked (protocol.py), queued (scheduler.py), folded into what its API sends (chat_output.py,
responses_output.py) and streamed or collected (streaming.py); our opt-in request extension
(`"oospec": {"predicted_calls", "speculative_tools"}`) is extension.py's.
"""
from __future__ import annotations

import asyncio
import functools
import os
import socket
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI

from ..batching import DEFAULT_MAX_BATCH
from . import admin, routes
from .errors import Guard, install_error_handlers
from .routes import CHAT_PATH
from .state import ServerState

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


def default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def create_app(engine=None, *, loader: Callable[[], Any] | None = None, model: str = "embedded",
               api_key: str | None = None, max_queue: int = 64, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_batch: int | None = None,
               replica_id: str | None = None, method: str = "oospec", close_engine: bool = False,
               adapter_root: str | None = None, on_adapter_swap: Callable[[str], Any] | None = None) -> FastAPI:
    """An OpenAI-compatible app serving `engine`, or the engine `loader()` returns.

    With a loader the app answers at once: 503 while the loader runs (on a thread), then serves.
    `model` is the id clients name in requests. `max_batch`: replies decoded at once (their verify
    forwards batched by the engine); None: the engine's own `max_batch` (1 for an engine without one).
    `close_engine` closes the engine on shutdown (an engine the app loaded itself always is).
    `adapter_root` is the directory under which the admin call `POST /v1/oospec/sidecar-adapter` may
    load a sidecar adapter (admin.py; served with `api_key` only); `on_adapter_swap(path)` is called
    after each swap (Ray Serve replicas post it for the others).
    """
    if (engine is None) == (loader is None):
        raise ValueError("create_app needs exactly one of engine= or loader=")
    if max_batch is None:
        max_batch = getattr(engine, "max_batch", 1) if engine is not None else DEFAULT_MAX_BATCH
    state = ServerState(model, replica_id or default_replica_id(), max_queue, method, max_batch)
    lifespan = functools.partial(_lifespan, state=state, engine=engine, loader=loader,
                                 close=loader is not None or close_engine)
    app = FastAPI(title="oospec serve", lifespan=lifespan)
    app.state.oospec = state
    install_error_handlers(app)
    admin.install(app, api_key=api_key, adapter_root=adapter_root, on_swap=on_adapter_swap)
    app.include_router(routes.router)
    app.add_middleware(Guard, api_key=api_key, max_body_bytes=max_body_bytes, metrics=state.metrics,
                       chat_path=CHAT_PATH)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI, *, state: ServerState, engine, loader, close: bool):
    """The app's life: its engine given, or loaded on a thread (503s meanwhile); on shutdown the queue
    cancelled, the loading waited for, and the engine closed when `close`."""
    loading = None
    if loader is None:
        state.engine = engine
    else:
        loading = asyncio.get_running_loop().run_in_executor(None, state.load, loader)
    try:
        yield
    finally:
        state.scheduler.shutdown()
        if loading is not None:
            await loading
        if close and hasattr(state.engine, "close"):
            state.engine.close()
