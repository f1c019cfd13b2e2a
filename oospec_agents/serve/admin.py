"""The admin route: `POST /v1/oospec/sidecar-adapter` with `{"path": DIR}` swaps the sidecar's LoRA
adapter at run time (`Engine.load_sidecar_adapter`; docs/server.md, "Swapping the sidecar's adapter").

It is an admin's call, so it is guarded twice:
- it is served only when the server has an API key (the bearer key `Guard` checks on /v1/); without
  one it answers 403, since anybody could call it;
- it loads only directories under `--adapter-root`, after symlinks and `..` are resolved; a relative
  path is taken under the root. Without a root it refuses every path.

A bad adapter is a 400 naming the problem, and the sidecar keeps the adapter it had. The load runs on
a thread beside the decode, so replies in flight go on (on the old adapter until the new one is in).
`GET` on the same path says which adapter the sidecar runs. Under Ray Serve the call lands on one
replica, which posts the adapter for the others to follow (ray_app.py).
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, ConfigDict

from ..errors import AdapterError
from .errors import ServeError

ADAPTER_PATH = "/v1/oospec/sidecar-adapter"

router = APIRouter()


class AdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str  # an adapter directory under --adapter-root (a relative path is taken under it)


def under_root(path: str, root: Path) -> Path:
    """`path` resolved (symlinks, `..`; relative to `root`), or a 403 when that leaves `root`."""
    real = (root / Path(path).expanduser()).resolve()
    if not real.is_relative_to(root):
        raise ServeError(403, f"adapter path {path!r} resolves to {str(real)!r}, outside --adapter-root "
                              f"{str(root)!r}: this server loads adapters only from under it",
                         param="path", code="adapter_outside_root")
    return real


class Admin:
    """The admin route's settings, as create_app was given them: the API key (none: the route answers
    403), the adapter root, and `on_swap(path)`, which tells the other replicas (ray_app.py)."""

    def __init__(self, api_key: str | None, adapter_root: str | None, on_swap: Callable[[str], Any] | None):
        self.api_key, self.on_swap = api_key, on_swap
        self.root = None if adapter_root is None else Path(adapter_root).expanduser().resolve()

    def engine(self, state):
        """The engine whose sidecar the call may touch (`state`: the app's ServerState)."""
        if not self.api_key:
            raise ServeError(403, f"{ADAPTER_PATH} is served only when the server has an API key (--api-key): "
                                  "without one anybody could swap the sidecar's adapter", code="admin_disabled")
        engine = state.ready_engine()
        if engine.sidecar is None:
            raise ServeError(400, "this server runs no sidecar (--no-sidecar): there is no adapter to swap",
                             code="no_sidecar")
        return engine


def install(app: FastAPI, *, api_key: str | None, adapter_root: str | None, on_swap=None) -> None:
    """Add the admin route to `app` (create_app's, whose `app.state.oospec` holds the engine). `on_swap(path)`,
    where given, tells the other replicas (ray_app.py): the reply's `all_replicas` says whether it was given."""
    app.state.oospec_admin = Admin(api_key, adapter_root, on_swap)
    app.include_router(router)


def described(engine, replica: str, **more) -> dict:
    return {"object": "oospec.sidecar_adapter", "sidecar": engine.sidecar.name,
            "adapter": engine.sidecar.describe().get("adapter"), "replica": replica, **more}


@router.get(ADAPTER_PATH)
async def current_adapter(request: Request):
    state = request.app.state.oospec
    return described(request.app.state.oospec_admin.engine(state), state.replica)


@router.post(ADAPTER_PATH)
async def load_adapter(req: AdapterRequest, request: Request):
    state, admin = request.app.state.oospec, request.app.state.oospec_admin
    engine = admin.engine(state)
    if admin.root is None:
        raise ServeError(403, "this server loads no adapter at run time: start it with --adapter-root DIR to "
                              "allow adapter directories under DIR", param="path", code="no_adapter_root")
    path = under_root(req.path, admin.root)
    before, t0 = engine.sidecar.name, time.perf_counter()
    try:
        await asyncio.to_thread(engine.load_sidecar_adapter, path)
    except AdapterError as e:
        raise ServeError(400, f"{e}; the sidecar keeps {before!r}", param="path", code="invalid_adapter")
    except Exception as e:  # a worker that died or ran out of memory loading it: the old adapter stays too
        raise ServeError(500, f"the sidecar could not load adapter {str(path)!r}: {type(e).__name__}: {e}; it "
                              f"keeps {before!r}", code="adapter_load_failed")
    if admin.on_swap is not None:
        admin.on_swap(str(path))
    return described(engine, state.replica, previous=before, load_s=round(time.perf_counter() - t0, 3),
                     all_replicas=admin.on_swap is not None)
