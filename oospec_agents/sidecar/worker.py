"""The sidecar runtime: each request's wave runs in its own thread; the target polls a mailbox.

    submit(request) -> ticket                 returns at once; a thread runs rows -> wave -> join -> payload
    ticket.poll()   -> Hint | None            non-blocking: reads the mailbox, never takes a lock
    ticket.cancel()                           the request is done; the wave stops at its next step

Devices: the sidecar model sits on its own device (two GPUs: cuda:1). On a GPU it shares with the
target, its wave runs on its own CUDA stream. On the CPU its thread sets its own torch thread count
(OpenMP's thread count is per calling thread, so the target's thread keeps its own).

Faults never reach the target: an exception, CUDA OOM, a hang past `timeout_s`, or output that does
not join into a call become `ticket.error` and no hint.

`sidecar_placement="process"` runs the same `run_wave` in a worker process instead (process.py).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import queue
import threading
import time
from pathlib import Path
from typing import Callable

import torch

from ..prefix_cache import DEFAULT_TOKENS
from .base import Hint, HintRequest
from .join import JoinError, NoCall, encode_payload, join, render_payload
from .rank import tool_prior
from .rows import Row, expand_rows
from .wave import MAX_ROWS, PRIOR_WEIGHT

#: (prefix, rows, cancel, choices: row -> {text: prior}) -> one generated text per row; `Wave` is the real one
WaveFn = Callable[[str, list[Row], threading.Event, dict[int, dict[str, float]]], list[str]]


class WaveSidecar:
    def __init__(self, wave: WaveFn, *, device: torch.device | str = "cpu", timeout_s: float = 30.0,
                 threads: int | None = 1, name: str | None = None):
        self.wave = wave
        self.name = name or "wave"
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        self.threads = threads
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._one_wave = threading.Lock()  # taken only by wave threads: a cancelled wave finishes before the next

    def clear_prefix_cache(self) -> None:
        cache = getattr(self.wave, "prefix_cache", None)  # a wave function may keep none
        if cache is not None:
            cache.clear()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until no wave runs (a cancelled wave ends at its next step); False on timeout.
        The benchmark calls it between runs, so no run shares the cores with another's wave."""
        if not self._one_wave.acquire(timeout=timeout_s):
            return False
        self._one_wave.release()
        return True

    def estimate(self, request: HintRequest) -> float | None:
        """Seconds this request's wave is expected to take (None: no estimate yet). See payback.py."""
        estimate = getattr(self.wave, "estimate", None)  # a wave function may keep no costs
        if estimate is None:
            return None
        rows, prefix, _ = wave_rows(request, priors=False)
        return estimate(prefix, rows)

    def submit(self, request: HintRequest) -> "Ticket":
        ticket = Ticket(request, self.timeout_s)
        # the submitting thread's count, read before the engine lends the wave any of its cores: what
        # the wave thread leaves for the threads started after it (`own_threads`)
        after = torch.get_num_threads()
        thread = threading.Thread(target=self._run, args=(request, ticket, after), name="oospec-sidecar", daemon=True)
        _LIVE[thread] = ticket
        thread.start()
        return ticket

    def _run(self, request: HintRequest, ticket: "Ticket", after: int) -> None:
        try:
            self._wave_and_post(request, ticket, after)
        finally:
            _LIVE.pop(threading.current_thread(), None)

    def _wave_and_post(self, request: HintRequest, ticket: "Ticket", after: int) -> None:
        if not self._one_wave.acquire(timeout=self.timeout_s):
            ticket.post(error=f"sidecar timeout: an earlier wave has held the sidecar for over {self.timeout_s:g}s")
            return
        try:
            if ticket.cancelled.is_set():
                return
            with self._placement(after):
                outcome = run_wave(self.wave, request, ticket.cancelled, device=self.device, stream=self.stream)
        finally:
            self._one_wave.release()
        if outcome is not None:
            ticket.post(**outcome)

    def _placement(self, after: int):
        if self.stream is not None:
            return torch.cuda.stream(self.stream)
        if self.threads:
            return own_threads(self.threads, after)
        return contextlib.nullcontext()


@contextlib.contextmanager
def own_threads(n: int, after: int):
    """`n` intra-op threads for the calling (wave) thread, then `after` (the submitting thread's count).
    `torch.set_num_threads` sets the calling thread's count, and also the process-wide count that every
    thread started later begins with (the target thread's own count is untouched). So it is set to
    `after` when the wave ends: otherwise, after the first wave, every new thread (a server's request
    threads, an async front-end's executor) would decode the target on one core. Not the count this
    thread began with: it may have begun while the engine lent the wave the target's cores."""
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(after)


#: wave threads still running, with their tickets. At interpreter exit they are cancelled and
#: joined: a daemon thread killed inside a torch op aborts the process ("terminate called ...").
_LIVE: dict[threading.Thread, "Ticket"] = {}


@atexit.register
def _stop_waves(timeout_s: float = 5.0) -> None:
    for thread, ticket in list(_LIVE.items()):
        ticket.cancelled.set()
        thread.join(timeout_s)


def run_wave(wave: WaveFn, request: HintRequest, cancelled, *, device: torch.device,
             stream: torch.cuda.Stream | None = None) -> dict | None:
    """rows -> wave -> join -> payload for one request, wherever the wave runs (a thread here, a worker
    process in process.py). Returns `Ticket.post`'s keywords: the payload, a decline or the error,
    with the wave's profile; None once the request is cancelled. Every fault becomes an error."""
    try:
        rows, prefix, choices = wave_rows(request)
        start = time.perf_counter()
        texts = wave(prefix, rows, cancelled, choices)
        if stream is not None:
            stream.synchronize()
        profile = {"queued_s": start - request.arrived, "wave_s": time.perf_counter() - start,
                   **(getattr(wave, "profile", None) or {})}
        if cancelled.is_set():
            return None
        try:
            call = join(rows, texts, request.tools, request.tool_choice)
        except NoCall:
            return {"declined": True, "profile": profile}
        return {"payload": encode_payload(call), "profile": profile}
    except JoinError as e:
        return {"error": f"sidecar gave no usable call: {e}"}
    except (torch.OutOfMemoryError, MemoryError) as e:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"error": f"sidecar out of memory on {device}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"}
    except Exception as e:
        return {"error": f"sidecar failed: {type(e).__name__}: {e}"}


def wave_rows(request: HintRequest, *, priors: bool = True) -> tuple[list[Row], str, dict[int, dict[str, float]]]:
    """The rows this request needs. A named tool_choice needs only that tool's slot rows; otherwise
    the function row is constrained to the offered names (and `null` unless a call is required),
    each with its lexical prior (`rank.tool_prior`; null's is 0). `priors=False` (the pay-back
    estimate, which needs only the rows) leaves every prior 0 and skips the ranking."""
    mode, named = request.tool_choice
    prefix, rows = expand_rows(request.messages, request.tools)
    if mode == "named":
        return [r for r in rows if r.tool == named], prefix, {}
    prior = tool_prior(request.messages, request.tools) if priors else [0.0] * len(request.tools)
    names = {" " + json.dumps(t.name, ensure_ascii=False): p for t, p in zip(request.tools, prior)}
    return rows, prefix, {0: names if mode == "required" else names | {" null": 0.0}}


class Ticket:
    """One request's mailbox. The wave thread posts once; the target's poll reads without locking."""

    def __init__(self, request: HintRequest, timeout_s: float):
        self.error: str | None = None
        self.declined = False   # the wave finished and predicts no call: there is no hint, and no fault
        self.cancelled = threading.Event()
        self._request = request
        self._deadline = request.arrived + timeout_s
        self._timeout_s = timeout_s
        self._mailbox: queue.SimpleQueue = queue.SimpleQueue()
        self._hint: Hint | None = None

    def post(self, *, payload: bytes | None = None, error: str | None = None, profile: dict | None = None,
             declined: bool = False) -> None:
        self._mailbox.put((payload, time.perf_counter() - self._request.arrived, error, profile, declined))

    def poll(self) -> Hint | None:
        if self._hint is not None or self.error is not None or self.declined:
            return self._hint
        try:
            payload, ready_s, error, profile, declined = self._mailbox.get_nowait()
        except queue.Empty:
            if time.perf_counter() > self._deadline:
                self._expire()
            return None
        if error is not None:
            self.error = error
            return None
        if declined:
            self.declined = True
            return None
        try:
            self._hint = Hint(render_payload(payload, self._request.fmt), len(payload), ready_s, profile)
        except Exception as e:
            self.error = f"sidecar gave no usable call: cannot render payload {payload[:80]!r}: {e}"
        return self._hint

    def cancel(self) -> None:
        self.cancelled.set()

    def _expire(self) -> None:
        """The deadline passed with no hint."""
        self.error = f"sidecar timeout: no hint after {self._timeout_s:g}s; the wave is abandoned"
        self.cancelled.set()


def load_sidecar(ref, *, device, dtype, sidecar_adapter=None, sidecar_timeout_s: float = 30.0,
                 sidecar_threads: int | None = 1, sidecar_max_row_tokens: int = 32,
                 sidecar_prefix_cache_tokens: int = DEFAULT_TOKENS, sidecar_placement: str = "auto",
                 sidecar_max_rows: int = MAX_ROWS, sidecar_prior_weight: float = PRIOR_WEIGHT):
    """Load a sidecar model (HF id, path, GGUF, or "embedded") behind a `WaveSidecar` (its waves in
    threads of this process), a `ProcessSidecar` (a worker process that loads the model itself) or a
    `RaySidecar` (a Ray actor, on a GPU of its own where the cluster has one): `sidecar_placement` is
    "thread", "process", "ray" or "auto" (process.auto_placement).

    "embedded" is SmolLM2-135M-Instruct plus the slot-prediction LoRA adapter when it is present.
    `sidecar_max_rows` bounds a wave's rows (`Wave(max_rows=...)`: above it, two phases); a device
    that batches rows in parallel may take more. `sidecar_prior_weight` weighs the lexical prior over
    the offered tools in the function row (`Wave(prior_weight=...)`, `rank.py`; 0 turns it off).
    """
    from .. import models
    from .process import ProcessSidecar, WorkerSpec, resolve_placement
    placement = resolve_placement(sidecar_placement, torch.device(device))
    adapter = sidecar_adapter
    if str(ref) == "embedded" and adapter is None and models.EMBEDDED_SIDECAR_ADAPTER.exists():
        adapter = models.EMBEDDED_SIDECAR_ADAPTER
    name = "embedded:SmolLM2-135M-Instruct" if str(ref) == "embedded" else str(ref)
    if adapter is not None:
        name += "+" + Path(adapter).name
    spec = WorkerSpec(str(ref), str(device), dtype, None if adapter is None else str(adapter),
                      sidecar_max_row_tokens, sidecar_prefix_cache_tokens, sidecar_threads, sidecar_max_rows,
                      sidecar_prior_weight)
    if placement == "process":
        sidecar = ProcessSidecar(spec, timeout_s=sidecar_timeout_s, name=name)
        sidecar.wait_ready()  # a model that cannot load fails here, as in a thread
        return sidecar
    if placement == "ray":
        from .ray_actor import RaySidecar
        sidecar = RaySidecar(spec, timeout_s=sidecar_timeout_s, name=name)
        sidecar.wait_ready()
        return sidecar
    return WaveSidecar(load_wave(spec), device=device, timeout_s=sidecar_timeout_s, threads=sidecar_threads, name=name)


def load_wave(spec):
    """The sidecar model and its `Wave`, loaded from a `process.WorkerSpec` (here, or in a worker process)."""
    from .. import models
    from .wave import Wave
    model, tok = models.load_model(spec.ref, device=torch.device(spec.device), dtype=spec.dtype, adapter=spec.adapter)
    wave = Wave(model, tok, max_row_tokens=spec.max_row_tokens, prefix_cache_tokens=spec.prefix_cache_tokens,
                max_rows=spec.max_rows, prior_weight=spec.prior_weight)
    wave.null_starts()  # a pass over the vocabulary, here at load time rather than in the first wave
    return wave
