"""The same app as Ray Serve replicas: each replica loads one engine (its own target and sidecar) and
serves the FastAPI app as its ingress. With `sidecar_placement="ray"` a replica's sidecar is an actor
of its own (sidecar/hosts/ray.py), which Ray may place on another GPU or node. Ray places the replicas
on whichever nodes have the resources and spreads requests over them behind one address; nothing here
knows about nodes.

Serve routes the admin call that swaps the sidecar's adapter (admin.py) to one replica. That replica
posts the adapter on an `AdapterBoard` actor, and every replica follows the board within `FOLLOW_S`,
so the call reaches them all; a replica that starts later (autoscaling, a replacement) starts on it.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable

from ray import serve

from ..batching import DEFAULT_MAX_BATCH

APP_NAME = "oospec"
#: how often a replica asks the board whether an admin call swapped the sidecar's adapter elsewhere
FOLLOW_S = 2.0

log = logging.getLogger("oospec.serve")


class AdapterBoard:
    """The sidecar adapter the last admin call swapped in, on whichever replica (a Ray actor)."""

    def __init__(self):
        self.version, self.path = 0, None

    def put(self, path: str) -> int:
        self.version, self.path = self.version + 1, path
        return self.version

    def get(self) -> tuple[int, str | None]:
        return self.version, self.path


def follow(engine, ask: Callable[[], tuple[int, str | None]], replica: str, stop: threading.Event,
           period_s: float = FOLLOW_S) -> None:
    """A replica's thread, until `stop`: load each adapter the board posts (`ask()`: its version and
    path) that the sidecar does not run yet. One that cannot load here (not readable on this node, say)
    is logged, and the replica keeps its own."""
    seen = 0
    while engine.sidecar is not None:
        try:
            version, path = ask()
        except Exception as e:  # the board is gone with the app (or slow): ask again
            log.debug("replica %s: the adapter board did not answer: %s", replica, e)
            version, path = seen, None
        if version > seen:
            seen = version
            if path != engine.sidecar.describe().get("adapter"):
                try:
                    log.info("replica %s: sidecar adapter swapped to %s", replica, engine.load_sidecar_adapter(path))
                except Exception as e:
                    log.warning("replica %s cannot follow the sidecar adapter swap to %s: %s", replica, path, e)
        if stop.wait(period_s):
            return


@serve.ingress()
class OoOSpecReplica:
    """One engine. The app is built after it has loaded (`__serve_build_asgi_app__`), so a replica
    takes traffic only once its engine is ready; `check_health` keeps asking the app whether it can answer."""

    def __init__(self, load: dict, options: dict, board=None):
        from ..engine import Engine
        self.engine = Engine.from_pretrained(**load)
        self.options = options
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.board = board
        if board is not None:
            import ray
            ask = lambda: ray.get(board.get.remote(), timeout=30)  # noqa: E731
            threading.Thread(target=follow, args=(self.engine, ask, self.replica, threading.Event()),
                             name="oospec-adapter-follow", daemon=True).start()

    def __serve_build_asgi_app__(self):
        from .app import create_app
        posted = None if self.board is None else lambda path: self.board.put.remote(str(path))
        return create_app(self.engine, replica_id=self.replica, close_engine=True, on_adapter_swap=posted,
                          **self.options)

    def check_health(self):
        """Ray Serve's periodic health check (from after the app is built and started): the replica is
        healthy while its app can answer, the rule `GET /health` answers 200 by; raising makes Ray
        replace the replica. `self.app` is the ingress wrapper's: the app `__serve_build_asgi_app__` built."""
        check_ready(self.app)


def check_ready(app) -> None:
    """Raise unless `app` (create_app's) can answer a request now: its engine is loaded. The same rule
    as the routes' 503 (`model_loading`) and 500 (`model_load_failed`), and as `GET /health`."""
    app.state.oospec.ready_engine()


def gpus_per_replica() -> int:
    """The two GPUs a replica uses (target and sidecar each on its own) when the cluster has them."""
    import ray
    return min(2, int(ray.cluster_resources().get("GPU", 0)))


def application(load: dict, options: dict, *, replicas: int | None = None, autoscale: tuple[int, int] | None = None,
                cpus_per_replica: float = 1.0, gpus: int | None = None):
    """The bound Ray Serve application (call after `ray.init`), with the board its replicas share."""
    import ray
    if gpus is None:  # a sidecar in an actor of its own takes its GPU itself
        gpus = min(gpus_per_replica(), 1) if load.get("sidecar_placement") == "ray" else gpus_per_replica()
    config = {"ray_actor_options": {"num_cpus": cpus_per_replica, "num_gpus": gpus},
              # Up to max_batch replies decode at once per engine (batched rounds); the app's queue holds the rest.
              "max_ongoing_requests": options.get("max_queue", 64) + options.get("max_batch", DEFAULT_MAX_BATCH)}
    if autoscale is not None:
        config["autoscaling_config"] = {"min_replicas": autoscale[0], "max_replicas": autoscale[1],
                                        "target_ongoing_requests": 2}
    else:
        config["num_replicas"] = replicas or 1
    board = ray.remote(AdapterBoard).options(num_cpus=0).remote()
    return serve.deployment(OoOSpecReplica, name="OoOSpecReplica", **config).bind(load, options, board)


def serve_forever(load: dict, options: dict, *, host: str, port: int, address: str | None = None, **scale) -> int:
    """`oospec serve --ray`: join (or start) a cluster, run the app, and serve until SIGINT/SIGTERM."""
    import ray
    ray.init(address=address)
    serve.start(http_options={"host": host, "port": port})
    serve.run(application(load, options, **scale), name=APP_NAME, route_prefix="/")
    print(f"oospec serve: Ray Serve application {APP_NAME!r} on http://{host}:{port}/v1", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    # Take the app off the cluster. A Ctrl-C reaches a local cluster's own processes too, and
    # then there is nothing left to ask: give up after a while and let ray.shutdown end it.
    deleting = threading.Thread(target=serve.delete, args=(APP_NAME,), daemon=True)
    deleting.start()
    deleting.join(timeout=30)
    ray.shutdown()
    return 0
