"""The sidecar as a Ray actor (`sidecar_placement="ray"`): a Ray Serve replica's target verifies hints
from a sidecar that Ray places on a GPU of its own, possibly on another node.

    RaySidecar.submit(request) -> ticket    actor.run.remote(id, request as plain data) -> ObjectRef
    ticket.poll()                            ray.wait([ref], timeout=0): never blocks; the payload is
                                             rendered here, in the target's format
    ticket.cancel()                          actor.cancel.remote(id): the wave stops at its next step
    load_adapter(dir)                        actor.load_adapter.remote(dir): loads it beside the waves,
                                             then swaps it in (the directory must be readable on its node)

The actor holds the same `runtime.WaveHost` as a thread or a worker process (one wave at a time,
cancel by ticket id); other actor threads take cancels and an adapter load while a wave runs. Faults stay faults: an actor
that dies (`ray.kill`, its node lost) or fails turns into `ticket.error`, and the next request starts
another actor. `close()` kills it.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import torch

from .. import cores
from ..protocol import HintRequest, SidecarBase, Ticket
from ..runtime import WaveHost, WorkerSpec, adapter_loaded, from_plain, load_adapter_here, load_wave, plain

#: how long `wait_ready` waits for an actor to load its model, and `load_adapter` for it to load an adapter
READY_TIMEOUT_S = 600.0


class _WaveActor:
    """Inside the actor: the sidecar model on its `WaveHost`. Threaded (max_concurrency), so that
    `cancel` and `load_adapter` run beside `run`; the runs that wait while a wave runs go together into the
    next (`WaveHost`)."""

    def __init__(self, spec: WorkerSpec):
        if spec.threads:
            cores.set_threads(spec.threads)
        self.host = WaveHost(load_wave(spec), spec.device, spec=spec)

    def ready(self) -> bool:
        return True

    def run(self, tid: int, request: dict) -> dict | None:
        return self.host.run(tid, from_plain(request))

    def cancel(self, tid: int) -> None:
        self.host.cancel(tid)

    def estimate(self, request: dict) -> float | None:
        return self.host.estimate(from_plain(request))

    def clear_prefix_cache(self) -> None:
        self.host.clear_prefix_cache()

    def load_adapter(self, adapter: str) -> dict:
        return load_adapter_here(self.host, adapter)


class RaySidecar(SidecarBase):
    """The `Sidecar` contract over a Ray actor that this object creates (again after a death) and kills
    (`close()`). Call it where `ray.init` has run (a Serve replica, or a driver)."""

    def __init__(self, spec: WorkerSpec, *, timeout_s: float = 30.0, name: str | None = None,
                 actor_options: dict | None = None):
        import ray
        self.name = name or spec.ref
        self.timeout_s = timeout_s
        device = torch.device(spec.device)
        # Ray gives a GPU actor its own device as cuda:0 (CUDA_VISIBLE_DEVICES).
        self.spec = spec if device.type != "cuda" else WorkerSpec(**{**spec.__dict__, "device": "cuda:0"})
        self.device = torch.device("cpu") if device.type != "cuda" else torch.device("cuda", 0)
        # threads for the runs that one wave takes together, a cancel, and an adapter that loads beside them
        options = {"num_gpus": 1 if device.type == "cuda" else 0, "num_cpus": 1,
                   "max_concurrency": WaveHost.MAX_REQUESTS + 2,
                   **(actor_options or {})}
        self._actor_class = ray.remote(_WaveActor).options(**options)
        self._lock = threading.Lock()
        self._actor = None
        self._restart()

    def _restart(self):
        self._actor = self._actor_class.remote(self.spec)
        return self._actor

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        import ray
        ray.get(self._actor.ready.remote(), timeout=timeout_s)

    def submit(self, request: HintRequest) -> "RayTicket":
        with self._lock:
            actor = self._actor if self._actor is not None else self._restart()
        return RayTicket(request, self.timeout_s, actor, on_lost=lambda: self._lost(actor))

    def estimate(self, request: HintRequest) -> float | None:
        import ray
        try:
            return ray.get(self._actor.estimate.remote(plain(request)), timeout=0.5)
        except Exception:  # no estimate (starting, busy, gone): the wave runs
            return None

    def clear_prefix_cache(self) -> None:
        self._actor.clear_prefix_cache.remote()

    def load_adapter(self, adapter, timeout_s: float = READY_TIMEOUT_S) -> str:
        """The actor loads the new adapter beside its waves and swaps it in; an actor started after
        this (after a death) loads it too. `adapter` must be readable where the actor runs."""
        import ray
        from ... import models
        adapter = str(Path(adapter).expanduser().resolve())  # the worker's working directory may differ
        models.read_adapter(adapter, base=self.spec.ref)  # a plainly bad one fails here
        with self._lock:
            actor = self._actor if self._actor is not None else self._restart()
        try:
            outcome = ray.get(actor.load_adapter.remote(str(adapter)), timeout=timeout_s)
        except ray.exceptions.RayActorError as e:
            self._lost(actor)
            raise RuntimeError(f"the sidecar actor died loading adapter {str(adapter)!r}: "
                               f"{str(e).splitlines()[0]}; the next request starts another with the old adapter")
        with self._lock:
            self.spec = adapter_loaded(outcome, self.spec, adapter)
        self.name = self.spec.name
        return self.name

    def describe(self) -> dict:
        return {"placement": "ray", "prior_weight": self.spec.prior_weight, "adapter": self.spec.adapter}

    def close(self) -> None:
        import ray
        with self._lock:
            actor, self._actor = self._actor, None
        if actor is not None:
            ray.kill(actor)

    def _lost(self, actor) -> None:
        """`actor` died: the next request starts another."""
        with self._lock:
            if self._actor is actor:
                self._actor = None


class RayTicket(Ticket):
    def __init__(self, request: HintRequest, timeout_s: float, actor, on_lost: Callable[[], None]):
        """`on_lost` is called when the actor died running this ticket (the sidecar starts another)."""
        super().__init__(request, timeout_s, on_cancel=lambda t: actor.cancel.remote(t.id))
        self._on_lost = on_lost
        self._ref = actor.run.remote(self.id, plain(request))

    def poll(self):
        if self._ref is not None:
            import ray
            ready, _ = ray.wait([self._ref], timeout=0)
            if ready:
                ref, self._ref = self._ref, None
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    self._on_lost()
                    outcome = {"error": f"sidecar actor died: {str(e).splitlines()[0]}"}
                except Exception as e:
                    outcome = {"error": f"sidecar actor failed: {type(e).__name__}: {e}"}
                if outcome is not None:
                    self.post(**outcome)
        return super().poll()
