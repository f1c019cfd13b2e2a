"""The sidecar in a worker process of its own (`sidecar_placement="process"`), pinned to a core set of
its own where it has one (`sidecar_device="cpu:1"`, cores.py).

    parent (the engine's process)                      worker (torch.multiprocessing, "spawn")
    submit(request) -> ticket   -- ("wave", id, request as plain data) -->   loads the model itself, then
    ticket.poll()   <- mailbox  <-- ("done", id, payload | error) --------   a WaveHost runs rows -> wave -> join
    ticket.cancel()             -- ("cancel", id) -------------------------> the wave stops at its next step
    load_adapter(dir)           -- ("adapter", id, dir) -------------------> a thread loads it beside the waves,
                                <-- ("adapter", id, outcome) --------------   then WaveHost swaps it in

One duplex pipe carries everything. A reader thread on each side takes messages off it, so a cancel
reaches a wave that is running, and the target's `poll()` only reads a queue (it never blocks). The
worker returns the compact payload; the parent renders it in the target's format (`Ticket.poll`).

Faults stay faults: the worker dying (even `kill -9`), hanging past `timeout_s`, running out of
memory, or still starting when a hint is due become `ticket.error`. A dead worker, and one whose wave
hangs past its deadline (it is killed), is restarted by the next request; a worker that cannot load
its model is not (the error is kept). `close()`, interpreter exit (atexit) and the parent's death
(the worker reads end-of-file on its pipe) all end the worker.

A worker starts by re-importing the parent's main module ("spawn"). One that ends before its own code
runs (before it says "alive") failed there, and the error says so; one that is asked to start a worker
of its own while it re-imports (a script that builds the engine at its top level, without
`if __name__ == "__main__":`) exits with `BOOTSTRAP_EXIT`, and the error names the fix.
"""
from __future__ import annotations

import atexit
import itertools
import os
import queue
import sys
import threading
import time
import weakref
from pathlib import Path

import torch
import torch.multiprocessing as mp

from ...errors import ModelLoadError
from ...gcheap import freeze_gc_heap
from .. import cores
from ..protocol import HintRequest, SidecarBase, Ticket
from ..runtime import WaveHost, WorkerSpec, adapter_loaded, from_plain, load_adapter_here, load_wave, plain

#: how long `estimate()` waits for the worker's answer before it gives no estimate
ESTIMATE_WAIT_S = 0.5
#: how long `load_adapter()` waits for the worker to load the model with its new adapter
ADAPTER_WAIT_S = 300.0
#: the exit code of a worker that was asked to start a worker of its own while it re-imported its
#: parent's main module ("spawn"): a script that builds the engine at its top level
BOOTSTRAP_EXIT = 78
#: what that means, and the fix: in the worker's stderr, and in the parent's error
BOOTSTRAP_HELP = (
    "the sidecar worker is a fresh Python process ('spawn'), which first re-imports this program's main module "
    "{main}; that module builds the engine at its top level, so the worker would start a worker of its own "
    "(Python refuses: 'a new process before the current process has finished its bootstrapping phase'). "
    "Put the code that builds the engine under "
    "`if __name__ == \"__main__\":` (or in a function called from there), or keep the sidecar in a thread of "
    "this process: sidecar_placement=\"thread\" and a sidecar_device without a core set of its own.")


class ProcessSidecar(SidecarBase):
    """The `Sidecar` contract, with the model in a worker process that this object starts (at once,
    and again after a death) and stops (`close()`)."""

    def __init__(self, spec: WorkerSpec, *, timeout_s: float = 30.0, name: str | None = None):
        self.spec = spec
        self.name = name or spec.ref
        self.device = torch.device(spec.device)
        self.cores = spec.cores       # a core set of its own: the worker keeps to it
        # a CPU wave on shared cores is lent the target's cores, as in a thread (cores.lend)
        self.threads = len(spec.cores) if spec.cores else spec.threads
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # guards `_worker` and `_failed`
        self._worker: _Worker | None = None
        self._failed: str | None = None   # the worker could not load its model: no restarts
        self._workers: list[_Worker] = []  # the current worker, for the finalizer (which must not hold self)
        weakref.finalize(self, _stop_all, self._workers)
        self._restart()

    @property
    def pid(self) -> int | None:
        worker = self._worker
        return None if worker is None else worker.process.pid

    # ------------------------------------------------------------------ the Sidecar contract

    def submit(self, request: HintRequest) -> "ProcessTicket":
        with self._lock:
            worker = self._worker
            if worker is None or not worker.alive() or worker.stuck(self.timeout_s):
                worker = self._restart()
            ticket = ProcessTicket(request, self.timeout_s, worker)
            if worker is None:
                ticket.post(error=f"sidecar worker failed to start: {self._failed}")
                return ticket
        worker.tickets[ticket.id] = ticket
        if not worker.send(("wave", ticket.id, plain(request))):
            worker.tickets.pop(ticket.id, None)
            ticket.post(error=f"sidecar worker died: {worker.end_reason()}")
        return ticket

    def estimate(self, request: HintRequest) -> float | None:
        """The worker's estimate of this request's wave (see payback.py); None while it starts, or
        when it does not answer within ESTIMATE_WAIT_S."""
        worker = self._worker
        if worker is None or not worker.ready.is_set() or not worker.alive():
            return None
        return worker.ask("estimate", plain(request), ESTIMATE_WAIT_S)[1]

    def clear_prefix_cache(self) -> None:
        worker = self._worker
        if worker is not None:
            worker.send(("clear",))  # queued in order: the next wave starts cold

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Start a worker if none runs, and wait until it has loaded its model; False on timeout.
        Raises ModelLoadError when the model cannot load (or the worker dies while loading)."""
        with self._lock:
            worker = self._worker if self._worker is not None and self._worker.alive() else self._restart()
        if worker is None:
            raise ModelLoadError(f"the sidecar worker cannot load {self.spec.ref!r}: {self._failed}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not worker.ready.wait(0.05):
            if not worker.alive() or worker.ended.is_set():
                worker.ended.wait(5)
                raise ModelLoadError(f"the sidecar worker for {self.spec.ref!r} ended while loading: "
                                     f"{worker.end_reason()}")
            if deadline is not None and time.monotonic() > deadline:
                return False
        return True

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until the worker has started and runs no wave (a cancelled one ends at its next step)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            worker = self._worker
            if worker is None or not worker.alive() or (worker.ready.is_set() and not worker.tickets):
                return True
            time.sleep(0.01)
        return False

    def load_adapter(self, adapter, timeout_s: float = ADAPTER_WAIT_S) -> str:
        """The worker loads the new adapter beside its waves and swaps it in (WaveHost.load_adapter);
        a worker started after this (a restart) loads it too."""
        from ... import models
        adapter = str(Path(adapter).expanduser().resolve())  # the worker's working directory may differ
        models.read_adapter(adapter, base=self.spec.ref)  # a plainly bad one fails here, worker or none
        with self._lock:
            worker = self._worker if self._worker is not None and self._worker.alive() else self._restart()
        if worker is None:
            raise RuntimeError(f"the sidecar worker cannot start: {self._failed}")
        answered, outcome = worker.ask("adapter", str(adapter), timeout_s)
        if not answered:
            raise RuntimeError(f"the sidecar worker did not load adapter {str(adapter)!r}: " +
                               (f"it died ({worker.end_reason()}); the next request starts another with the old "
                                "adapter" if worker.ended.is_set() else f"no answer within {timeout_s:g}s"))
        with self._lock:
            self.spec = adapter_loaded(outcome, self.spec, adapter)
        self.name = self.spec.name
        return self.name

    def describe(self) -> dict:
        return {"placement": "process", "prior_weight": self.spec.prior_weight,
                "cores": None if self.cores is None else sorted(self.cores), "adapter": self.spec.adapter}

    def close(self) -> None:
        """Stop the worker process and wait for it to end. A later request starts a new one."""
        with self._lock:
            worker, self._worker = self._worker, None
            self._workers.clear()
        if worker is not None:
            worker.stop()

    # ------------------------------------------------------------------ the worker's life

    def _restart(self) -> "_Worker | None":
        """Under `_lock`: end the current worker, and start another unless the model cannot load."""
        old = self._worker
        if old is not None:
            if old.failure is not None:
                self._failed = old.failure
            old.kill()
        self._worker = None
        self._workers.clear()
        if self._failed is not None:
            return None
        self._worker = _Worker(self.spec)
        self._workers.append(self._worker)
        return self._worker


class ProcessTicket(Ticket):
    """A request's mailbox, filled by the parent's reader thread."""

    def __init__(self, request: HintRequest, timeout_s: float, worker: "_Worker | None"):
        super().__init__(request, timeout_s, on_cancel=None if worker is None else worker.cancel)
        self._worker = worker

    def expire(self) -> None:
        """The deadline passed. A worker still loading is left to finish. A worker whose wave is this
        request's, or one that has run past the timeout, is hung: it is killed (without waiting),
        and the next request starts another."""
        worker = self._worker
        self.cancel()
        if worker is None:
            return super().expire()
        if worker.alive() and not worker.ready.is_set():
            self.error = (f"sidecar timeout: no hint after {self._timeout_s:g}s; the worker process is still "
                          f"starting ({time.monotonic() - worker.started:.1f}s so far)")
        elif (running := worker.running) is not None and (running[0] == self.id or worker.stuck(self._timeout_s)):
            worker.kill()
            self.error = (f"sidecar timeout: no hint after {self._timeout_s:g}s; the worker process is killed "
                          "and the next request starts another")
        else:
            super().expire()


class _Worker:
    """One worker process, its pipe, and the parent's reader thread that posts its answers."""

    def __init__(self, spec: WorkerSpec):
        _refuse_bootstrapping()
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_serve, args=(child_conn, spec), name="oospec-sidecar", daemon=True)
        self.started = time.monotonic()
        self.owner = os.getpid()  # a forked copy of this process must not stop the worker (atexit runs there too)
        self.process.start()
        child_conn.close()  # so that the worker's death reads as end-of-file here
        self.ready = threading.Event()
        self.ended = threading.Event()
        self.failure: str | None = None       # the worker's own report of why it could not load
        self.entered = False                  # the worker's own code runs (it said "alive")
        self.tickets: dict[int, ProcessTicket] = {}
        self.running: tuple[int, float] | None = None   # the wave the worker runs: (ticket id, since)
        self._asked: dict[int, list] = {}   # question id -> [done, answered, answer]
        self._ask_ids = itertools.count()
        self._send_lock = threading.Lock()
        _LIVE.add(self)
        threading.Thread(target=self._read, name="oospec-sidecar-reader", daemon=True).start()

    def alive(self) -> bool:
        return not self.ended.is_set() and self.process.is_alive()

    def stuck(self, timeout_s: float) -> bool:
        """A wave has run for over `timeout_s`: the worker hangs (a cancel did not stop it)."""
        running = self.running
        return running is not None and time.monotonic() - running[1] > timeout_s

    def send(self, message) -> bool:
        try:
            with self._send_lock:
                self.conn.send(message)
            return True
        except (OSError, ValueError):  # the worker is gone (or the pipe closed): its reader reports it
            return False

    def cancel(self, ticket: Ticket) -> None:
        self.send(("cancel", ticket.id))

    def ask(self, kind: str, data, wait_s: float) -> tuple[bool, object]:
        """Ask the worker's reader a question ("estimate", "adapter"): (answered, its answer), where
        no answer within `wait_s`, or from a worker that ended, is (False, None)."""
        qid = next(self._ask_ids)
        box = self._asked[qid] = [threading.Event(), False, None]
        if self.send((kind, qid, data)):
            box[0].wait(wait_s)
        self._asked.pop(qid, None)
        return box[1], box[2]

    def end_reason(self) -> str:
        if self.failure is not None:
            return self.failure
        code = self.process.exitcode
        if code is None:
            return "its pipe closed"
        if code == BOOTSTRAP_EXIT:
            return f"exit code {code}: " + BOOTSTRAP_HELP.format(main=_main_path())
        if code > 0 and not self.entered:
            return (f"exit code {code} before the worker ran any of its own code: a fresh Python process ('spawn') "
                    f"first re-imports this program's main module {_main_path()}, and that failed (its traceback "
                    "is on stderr)")
        return f"exit code {code}" + (f" (signal {-code})" if code < 0 else "")

    def kill(self) -> None:
        """SIGKILL, without waiting: the reader thread reaps it and fails its tickets."""
        if os.getpid() != self.owner:
            return
        try:
            self.process.kill()
        except (OSError, ValueError, AttributeError):
            pass

    def stop(self, grace_s: float = 2.0) -> None:
        """Ask the worker to end (its wave is cancelled), kill it after `grace_s`, and wait for it."""
        if os.getpid() != self.owner:
            return
        self.send(("stop",))
        self.process.join(grace_s)
        if self.process.is_alive():
            self.kill()
            self.process.join(5)
        self.ended.wait(5)

    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                kind = message[0]
                if kind == "alive":
                    self.entered = True
                elif kind == "ready":
                    self.ready.set()
                elif kind == "failed":
                    self.failure = message[1]
                elif kind == "started":
                    self.running = (message[1], time.monotonic())
                elif kind == "done":
                    self.running = None
                    ticket = self.tickets.pop(message[1], None)
                    if ticket is not None and message[2] is not None:
                        ticket.post(**message[2])
                elif kind in ("estimate", "adapter"):
                    box = self._asked.get(message[1])
                    if box is not None:
                        box[1:] = [True, message[2]]
                        box[0].set()
        except (EOFError, OSError):
            pass
        self.process.join(5)
        if self.process.is_alive():  # the pipe closed but the process lingers
            self.kill()
            self.process.join(5)
        self.ended.set()
        for box in list(self._asked.values()):  # nobody is left to answer
            box[0].set()
        _LIVE.discard(self)
        self.conn.close()
        error = (f"sidecar worker failed to start: {self.failure}" if self.failure is not None else
                 f"sidecar worker died: {self.end_reason()}; the next request starts another")
        for ticket in list(self.tickets.values()):
            ticket.post(error=error)
        self.tickets.clear()


def _main_path() -> str:
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return repr(path) if path else "(the script)"


def _refuse_bootstrapping() -> None:
    """In a worker that is still re-importing its parent's main module, starting a worker is the
    script building the engine at its top level: each worker would start another. Python's
    multiprocessing raises its 'bootstrapping phase' RuntimeError, which the parent would only see as
    "exit code 1"; instead, say what happened on stderr and exit with `BOOTSTRAP_EXIT`, which the
    parent's error explains (`_Worker.end_reason`)."""
    if not getattr(mp.current_process(), "_inheriting", False):
        return
    sys.stderr.write("oospec: " + BOOTSTRAP_HELP.format(main=_main_path()) + "\n")
    sys.stderr.flush()
    raise SystemExit(BOOTSTRAP_EXIT)


#: workers not yet ended: stopped at interpreter exit
_LIVE: set[_Worker] = set()


def _stop_all(workers) -> None:
    for worker in list(workers):
        worker.stop()


@atexit.register
def _stop_at_exit() -> None:
    _stop_all(_LIVE)


# ---------------------------------------------------------------------- in the worker process

def _serve(conn, spec: WorkerSpec) -> None:
    """The worker's main: load the model, then run waves in order until "stop" or the parent's death;
    the waves that queued while one ran go together into the next (`Wave.many`). A reader thread takes
    cancels and estimates off the pipe while a wave runs."""
    conn.send(("alive",))  # past the re-import of the parent's main module: what fails now is the worker's
    if spec.cores:
        cores.pin_process(spec.cores)
    elif spec.threads:
        cores.set_threads(spec.threads)
    try:
        host = WaveHost(load_wave(spec), spec.device, spec=spec)
    except BaseException as e:
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    freeze_gc_heap()  # the worker's loaded heap: its collections stay out of the waves (gcheap.py)
    send_lock = threading.Lock()

    def send(message) -> None:
        with send_lock:
            conn.send(message)

    work: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read, args=(conn, host, send, work), name="oospec-sidecar-reader", daemon=True).start()
    send(("ready",))
    held = None  # a message read while gathering waves: the next in order
    while True:
        message, held = (held, None) if held is not None else (work.get(), None)
        if message[0] == "stop":
            break
        if message[0] == "clear":
            host.clear_prefix_cache()
            continue
        waves, held = _gather(work, message, host.MAX_REQUESTS)
        outcomes = host.run_many([(tid, from_plain(request), lambda tid=tid: send(("started", tid)))
                                  for _, tid, request in waves])
        for (_, tid, _), outcome in zip(waves, outcomes):
            send(("done", tid, outcome))
    conn.close()


def _read(conn, host: WaveHost, send, work: queue.SimpleQueue) -> None:
    """The worker's reader thread: cancels, estimates and adapters are served as they come; waves,
    "clear" and "stop" go to `work`, in order, for the main loop."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone: nobody is left to answer
        kind = message[0]
        if kind == "cancel":
            host.cancel(message[1])
        elif kind == "estimate":
            send(("estimate", message[1], host.estimate(from_plain(message[2]))))
        elif kind == "adapter":  # loads beside the waves, which go on with the old adapter until it is in
            threading.Thread(target=lambda qid=message[1], path=message[2]: send(
                ("adapter", qid, load_adapter_here(host, path))), name="oospec-sidecar-adapter",
                daemon=True).start()
        else:  # "wave", "clear", "stop": in order, between waves
            if kind == "stop":
                host.cancel_all()
            work.put(message)


def _gather(work: queue.SimpleQueue, first: tuple, limit: int) -> tuple[list[tuple], tuple | None]:
    """The wave `first` and the waves queued behind it, up to `limit` (they run together:
    WaveHost.run_many), and the first other message read meanwhile, held as the next in order."""
    waves = [first]
    while len(waves) < limit:
        try:
            more = work.get_nowait()
        except queue.Empty:
            break
        if more[0] != "wave":
            return waves, more
        waves.append(more)
    return waves, None
