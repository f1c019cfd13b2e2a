"""The sidecar in this process: each request's wave runs in a thread of its own.

    submit(request) -> ticket      returns at once; a thread runs the wave on the `WaveHost`
    ticket.poll()   -> Hint | None non-blocking: reads the mailbox, never takes a lock
    ticket.cancel()                the wave stops at its next step
    load_adapter(dir)              a new adapter for the waves that begin from now (WaveHost.load_adapter)

On a GPU the sidecar shares with the target, its wave runs on its own CUDA stream. On the CPU its
thread takes its own torch thread count (cores.own_threads). Faults never reach the target: an
exception, CUDA OOM, a hang past `timeout_s`, or output that does not join into a call become
`ticket.error` and no hint.
"""
from __future__ import annotations

import atexit
import contextlib
import threading

import torch

from .. import cores
from ..protocol import HintRequest, SidecarBase, Ticket
from ..runtime import WaveFn, WaveHost, WorkerSpec


class WaveSidecar(SidecarBase):
    def __init__(self, wave: WaveFn, *, device: torch.device | str = "cpu", timeout_s: float = 30.0,
                 threads: int | None = 1, name: str | None = None, spec: WorkerSpec | None = None):
        """`spec`: what `wave` was loaded from, which a hot swap loads again with another adapter."""
        self.device = torch.device(device)
        self.name = name or "wave"
        self.timeout_s = timeout_s
        self.threads = threads
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.host = WaveHost(wave, self.device, stream, spec=spec)

    @property
    def wave(self) -> WaveFn:
        return self.host.wave

    def submit(self, request: HintRequest) -> Ticket:
        ticket = Ticket(request, self.timeout_s)
        # the submitting thread's count, read before the engine lends the wave any of its cores: what
        # the wave thread leaves for the threads started after it (`cores.own_threads`)
        after = torch.get_num_threads()
        thread = threading.Thread(target=self._run, args=(request, ticket, after), name="oospec-sidecar", daemon=True)
        _LIVE[thread] = ticket
        thread.start()
        return ticket

    def estimate(self, request: HintRequest) -> float | None:
        return self.host.estimate(request)

    def clear_prefix_cache(self) -> None:
        self.host.clear_prefix_cache()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """The benchmark calls it between runs, so no run shares the cores with another's wave."""
        return self.host.wait_idle(timeout_s)

    def load_adapter(self, adapter) -> str:
        self.name = self.host.load_adapter(adapter).name
        return self.name

    def describe(self) -> dict:
        return {"placement": "thread", "prior_weight": getattr(self.wave, "prior_weight", None),
                "adapter": None if self.host.spec is None else self.host.spec.adapter}

    def _run(self, request: HintRequest, ticket: Ticket, after: int) -> None:
        try:
            outcome = self.host.run(ticket.id, request, cancelled=ticket.cancelled, wait_s=self.timeout_s,
                                    placement=lambda: self._placement(after))
            if outcome is not None:
                ticket.post(**outcome)
        finally:
            _LIVE.pop(threading.current_thread(), None)

    def _placement(self, after: int):
        if self.host.stream is not None:
            return torch.cuda.stream(self.host.stream)
        if self.threads:
            return cores.own_threads(self.threads, after)
        return contextlib.nullcontext()


#: wave threads still running, with their tickets. At interpreter exit they are cancelled and
#: joined: a daemon thread killed inside a torch op aborts the process ("terminate called ...").
_LIVE: dict[threading.Thread, Ticket] = {}


@atexit.register
def _stop_waves(timeout_s: float = 5.0) -> None:
    for thread, ticket in list(_LIVE.items()):
        ticket.cancelled.set()
        thread.join(timeout_s)
