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

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from ..errors import AdapterError
from .errors import ServeError

ADAPTER_PATH = "/v1/oospec/sidecar-adapter"


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


def install(app: FastAPI, state, *, api_key: str | None, adapter_root: str | None, on_swap=None) -> None:
    """Add the admin route to `app` (create_app's, whose `state` holds the engine). `on_swap(path)`, where
    given, tells the other replicas (ray_app.py): the reply's `all_replicas` says whether it was given."""
    root = None if adapter_root is None else Path(adapter_root).expanduser().resolve()

    def sidecar():
        """The engine's sidecar, once the call may touch it."""
        if not api_key:
            raise ServeError(403, f"{ADAPTER_PATH} is served only when the server has an API key (--api-key): "
                                  "without one anybody could swap the sidecar's adapter", code="admin_disabled")
        engine = state.ready_engine()
        if engine.sidecar is None:
            raise ServeError(400, "this server runs no sidecar (--no-sidecar): there is no adapter to swap",
                             code="no_sidecar")
        return engine

    def described(engine, **more) -> dict:
        return {"object": "oospec.sidecar_adapter", "sidecar": engine.sidecar.name,
                "adapter": engine.sidecar.describe().get("adapter"), "replica": state.replica, **more}

    @app.get(ADAPTER_PATH)
    async def current_adapter():
        return described(sidecar())

    @app.post(ADAPTER_PATH)
    async def load_adapter(req: AdapterRequest):
        engine = sidecar()
        if root is None:
            raise ServeError(403, "this server loads no adapter at run time: start it with --adapter-root DIR to "
                                  "allow adapter directories under DIR", param="path", code="no_adapter_root")
        path = under_root(req.path, root)
        before, t0 = engine.sidecar.name, time.perf_counter()
        try:
            await asyncio.to_thread(engine.load_sidecar_adapter, path)
        except AdapterError as e:
            raise ServeError(400, f"{e}; the sidecar keeps {before!r}", param="path", code="invalid_adapter")
        except Exception as e:  # a worker that died or ran out of memory loading it: the old adapter stays too
            raise ServeError(500, f"the sidecar could not load adapter {str(path)!r}: {type(e).__name__}: {e}; it "
                                  f"keeps {before!r}", code="adapter_load_failed")
        if on_swap is not None:
            on_swap(str(path))
        return described(engine, previous=before, load_s=round(time.perf_counter() - t0, 3),
                         all_replicas=on_swap is not None)
