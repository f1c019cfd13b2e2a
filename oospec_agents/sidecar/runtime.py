"""The wave's runtime, the same wherever a wave runs (a thread, a worker process, a Ray actor):

    load_wave(spec)                     the sidecar model and its `Wave`, from a `WorkerSpec`
    wave_rows(request)                  the rows a request needs, with the function row's choices
    run_waves(wave, [(request, cancelled)])  rows -> wave -> join -> payload, per request (concurrent
                                        requests share one batched wave); every fault becomes an error
    WaveHost                            one wave at a time (the requests that wait go into the next
                                        together), cancel by ticket id, a wave's estimated cost, and the
                                        adapter's hot swap (`load_adapter`)

The hosts (hosts/thread.py, process.py, ray.py) only carry requests to a `WaveHost` and its outcomes
back into a `protocol.Ticket`. Words: docs/glossary.md.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import importlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import AdapterError
from ..prefix_cache import DEFAULT_TOKENS
from ..tools import Tool
from .confidence import Calibration, call_logprob
from .join import JoinError, NoCall, encode_payload, join
from .protocol import HintRequest
from .rank import tool_prior
from .rows import Row, RowOptions, expand_rows
from .wave import MAX_ROWS, PRIOR_WEIGHT, WaveResult

#: (prefix, rows, cancel, choices: row -> {text: prior}) -> a `WaveResult`, or one generated text per row
#: alone (a plain wave function: no log-probabilities, no profile); `Wave` is the real one. A wave
#: function with `many` (`Wave.many`: a list of (prefix, rows, cancel, choices) -> one WaveResult each)
#: runs concurrent requests as one batch.
WaveFn = Callable[[str, list[Row], threading.Event, dict[int, dict[str, float]]], "WaveResult | list[str]"]


@dataclass(frozen=True)
class WorkerSpec:
    """What it takes to load a sidecar's wave, as plain data (it crosses to a worker process or an actor)."""
    ref: str
    device: str
    dtype: torch.dtype
    adapter: str | None
    max_row_tokens: int
    prefix_cache_tokens: int = DEFAULT_TOKENS
    threads: int | None = 1
    max_rows: int = MAX_ROWS  # above it a wave runs in two phases (docs/sidecar.md)
    prior_weight: float = PRIOR_WEIGHT  # the function row's lexical prior (rank.py; 0: off)
    cores: frozenset[int] | None = None  # a core set of its own: the worker keeps to it (cores.py)
    #: "module:function" that loads the wave from this spec instead of `load_wave` (a quantized wave,
    #: or a test's wrapper); it must be importable where the wave runs
    loader: str | None = None

    @property
    def name(self) -> str:
        """What stats and reports call the sidecar: its model, and its adapter's directory name."""
        base = {"embedded": "embedded:SmolLM2-135M-Instruct", "gemma3": "embedded:Gemma-3-270M"}.get(self.ref, self.ref)
        return base if self.adapter is None else f"{base}+{Path(self.adapter).name}"


def load_wave(spec: WorkerSpec):
    """The sidecar model and its `Wave` (or what `spec.loader` loads)."""
    if spec.loader is not None:
        module, _, name = spec.loader.partition(":")
        return getattr(importlib.import_module(module), name)(spec)
    from .. import models
    from .wave import Wave
    model, tok = models.load_model(spec.ref, device=torch.device(spec.device), dtype=spec.dtype, adapter=spec.adapter)
    wave = Wave(model, tok, max_row_tokens=spec.max_row_tokens, prefix_cache_tokens=spec.prefix_cache_tokens,
                max_rows=spec.max_rows, prior_weight=spec.prior_weight,
                calibration=Calibration.for_adapter(spec.adapter),  # its confidence.json, or the raw product
                row_options=RowOptions.for_adapter(spec.adapter))   # its rows.json, or today's rows
    wave.null_starts()  # a pass over the vocabulary, here at load time rather than in the first wave
    return wave


def wave_rows(request: HintRequest, *, priors: bool = True,
              options: RowOptions | None = None) -> tuple[list[Row], str, dict[int, dict[str, float]]]:
    """The rows this request needs. A named tool_choice needs only that tool's slot rows; otherwise
    the function row is constrained to the offered names (and `null` unless a call is required),
    each with its lexical prior (`rank.tool_prior`; null's is 0). `priors=False` (the pay-back
    estimate, which needs only the rows) leaves every prior 0 and skips the ranking. `options`: the
    adapter's row options (`wave.row_options`; None: today's rows)."""
    mode, named = request.tool_choice
    prefix, rows = expand_rows(request.messages, request.tools, options=options)
    if mode == "named":
        return [r for r in rows if r.tool == named], prefix, {}
    prior = tool_prior(request.messages, request.tools) if priors else [0.0] * len(request.tools)
    names = {" " + json.dumps(t.name, ensure_ascii=False): p for t, p in zip(request.tools, prior)}
    return rows, prefix, {0: names if mode == "required" else names | {" null": 0.0}}


def run_waves(wave: WaveFn, jobs: list[tuple[HintRequest, threading.Event]], *, device: torch.device,
              stream: torch.cuda.Stream | None = None) -> list[dict | None]:
    """rows -> wave -> join -> payload for each `(request, cancelled)`: `Ticket.post`'s keywords (the
    payload, a decline or the error, with the wave's profile), or None once the request is cancelled.
    Where the wave batches requests (`Wave.many`) and more than one is ready, their rows share the
    sidecar's forwards; otherwise they run one after another. A request's own fault (its rows, its
    join) is its own error; a fault of the shared wave is each one's."""
    outcomes: list[dict | None] = [None] * len(jobs)
    ready = []  # (job index, rows, prefix, choices)
    for n, (request, cancelled) in enumerate(jobs):
        try:
            ready.append((n, *wave_rows(request, options=getattr(wave, "row_options", None))))
        except Exception as e:
            outcomes[n] = _fault(e, device)
    many = getattr(wave, "many", None)
    try:
        start = time.perf_counter()
        if many is not None and len(ready) > 1:
            results = many([(prefix, rows, jobs[n][1], choices) for n, rows, prefix, choices in ready])
        else:
            results = [as_result(wave(prefix, rows, jobs[n][1], choices)) for n, rows, prefix, choices in ready]
        if stream is not None:
            stream.synchronize()
        wave_s = time.perf_counter() - start
    except Exception as e:
        for n, *_ in ready:
            outcomes[n] = _fault(e, device)
        return outcomes
    for (n, rows, _, _), result in zip(ready, results):
        request, cancelled = jobs[n]
        if cancelled.is_set():
            continue
        profile = {"queued_s": start - request.arrived, "wave_s": wave_s, **result.profile}
        try:
            call = join(rows, result.texts, request.tools, request.tool_choice, result.runner_ups)
            outcomes[n] = {"payload": encode_payload(call), "profile": profile,
                           "confidence": call_confidence(wave, rows, call, request.tool_choice,
                                                         result.row_logprobs)}
        except NoCall:
            outcomes[n] = {"declined": True, "profile": profile}
        except Exception as e:
            outcomes[n] = _fault(e, device)
    return outcomes


def as_result(out: WaveResult | list[str]) -> WaveResult:
    """A wave function's answer as a `WaveResult` (a plain wave function's texts alone: no log-probabilities,
    an empty profile)."""
    return out if isinstance(out, WaveResult) else WaveResult(list(out))


def _fault(e: Exception, device: torch.device) -> dict:
    """A wave's exception as `Ticket.post`'s error."""
    if isinstance(e, JoinError):
        return {"error": f"sidecar gave no usable call: {e}"}
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return {"error": f"sidecar out of memory on {device}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"}
    return {"error": f"sidecar failed: {type(e).__name__}: {e}"}


def call_confidence(wave, rows: list[Row], call: dict, tool_choice, row_logprobs) -> float | None:
    """The probability that `call` is exact: the wave's calibration of its rows' log-probability
    (`row_logprobs`, its `WaveResult`'s for these rows; confidence.py); None for a wave function that
    keeps no calibration."""
    calibration = getattr(wave, "calibration", None)
    if calibration is None:
        return None
    return calibration(call_logprob(rows, row_logprobs, call, tool_choice))


@dataclass(eq=False)
class _Pending:
    """A request waiting for the wave, then its outcome."""
    tid: int
    request: HintRequest
    cancelled: threading.Event
    on_start: Callable[[], None] | None = None
    outcome: dict | None = None
    done: bool = False


class WaveHost:
    """A loaded wave and the rules of running it: one wave at a time, and the requests that wait for it
    meanwhile run together in the next (`Wave.many`: they share the sidecar's forwards); cancel by
    ticket id (also before the wave has begun), and the estimate of a wave's seconds (payback.py)."""

    #: cancels kept for waves not (yet) running: a late cancel of a finished wave is forgotten after this many
    EARLY_CANCELS = 256
    #: the most requests one wave takes (the rest wait for the next)
    MAX_REQUESTS = 8

    def __init__(self, wave: WaveFn, device: torch.device | str = "cpu", stream: torch.cuda.Stream | None = None,
                 spec: WorkerSpec | None = None):
        self.wave = wave
        self.device = torch.device(device)
        self.stream = stream
        #: what `wave` was loaded from (None: a wave handed in, which cannot swap its adapter)
        self.spec = spec
        self._turn = threading.Condition()  # guards _busy and _pending: whose wave runs next
        self._busy = False
        self._pending: list[_Pending] = []
        self._swap = threading.Lock()  # one adapter load at a time
        self._lock = threading.Lock()  # guards the two maps below
        self._running: dict[int, threading.Event] = {}
        self._early: collections.OrderedDict[int, None] = collections.OrderedDict()

    def run(self, tid: int, request: HintRequest, *, cancelled: threading.Event | None = None,
            wait_s: float | None = None, on_start: Callable[[], None] | None = None,
            placement: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> dict | None:
        """Run ticket `tid`'s wave once the wave before it has ended (an error after `wait_s`), beside
        the other requests waiting then; None when it was cancelled. `on_start` is called as the wave
        begins; `placement` is entered around the wave that this thread runs."""
        return self.run_many([(tid, request, on_start)], cancelled=[cancelled], wait_s=wait_s,
                             placement=placement)[0]

    def run_many(self, jobs: list[tuple[int, HintRequest, Callable[[], None] | None]], *,
                 cancelled: list[threading.Event | None] | None = None, wait_s: float | None = None,
                 placement: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
                 ) -> list[dict | None]:
        """`run` for several tickets `(tid, request, on_start)` that arrived together (a worker process
        reads them off its pipe at once): one outcome each."""
        events = [e or threading.Event() for e in (cancelled or [None] * len(jobs))]
        pending = [_Pending(tid, request, event, on_start) for (tid, request, on_start), event in zip(jobs, events)]
        with self._lock:
            for job in pending:
                if job.tid in self._early:  # cancelled before it began
                    del self._early[job.tid]
                    job.cancelled.set()
                self._running[job.tid] = job.cancelled
        try:
            self._wait_turn(pending, wait_s, placement)
            return [job.outcome for job in pending]
        finally:
            with self._lock:
                for job in pending:
                    self._running.pop(job.tid, None)

    def _wait_turn(self, mine: list[_Pending], wait_s: float | None, placement) -> None:
        """Queue `mine`, and run waves (of whatever waits) until they are done. The thread that finds
        the wave free runs the next one for everyone waiting; a job still queued after `wait_s` ends
        with a timeout error."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        with self._turn:
            self._pending.extend(mine)
            while not all(job.done for job in mine):
                if not self._busy and self._pending:
                    batch, self._pending = self._pending[:self.MAX_REQUESTS], self._pending[self.MAX_REQUESTS:]
                    self._busy = True
                    self._turn.release()
                    try:
                        self._run_batch(batch, placement)
                    finally:
                        self._turn.acquire()
                        self._busy = False
                        for job in batch:
                            job.done = True
                        self._turn.notify_all()
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    for job in mine:
                        if job in self._pending:
                            self._pending.remove(job)
                            job.outcome = {"error": f"sidecar timeout: an earlier wave has held the sidecar for "
                                                    f"over {wait_s:g}s"}
                            job.done = True
                    deadline = None  # a job already taken into a wave is waited for
                    continue
                self._turn.wait(left)

    def _run_batch(self, batch: list[_Pending], placement) -> None:
        wave = self.wave  # an adapter swapped in meanwhile serves the next wave
        live = []
        for job in batch:
            if job.cancelled.is_set():
                continue
            if job.on_start is not None:
                job.on_start()
            live.append(job)
        if not live:
            return
        with placement():
            outcomes = run_waves(wave, [(job.request, job.cancelled) for job in live], device=self.device,
                                 stream=self.stream)
        for job, outcome in zip(live, outcomes):
            job.outcome = outcome

    def cancel(self, tid: int) -> None:
        with self._lock:
            event = self._running.get(tid)
            if event is None:
                self._early[tid] = None
                while len(self._early) > self.EARLY_CANCELS:
                    self._early.popitem(last=False)
        if event is not None:
            event.set()

    def cancel_all(self) -> None:
        with self._lock:
            events = list(self._running.values())
        for event in events:
            event.set()

    def estimate(self, request: HintRequest) -> float | None:
        """Seconds this request's wave is expected to take (None: no estimate yet, or a wave function
        that keeps no costs)."""
        estimate = getattr(self.wave, "estimate", None)
        if estimate is None:
            return None
        try:
            rows, prefix, _ = wave_rows(request, priors=False, options=getattr(self.wave, "row_options", None))
            return estimate(prefix, rows)
        except Exception:  # no estimate: the wave runs
            return None

    def clear_prefix_cache(self) -> None:
        cache = getattr(self.wave, "prefix_cache", None)  # a wave function may keep none
        if cache is not None:
            cache.clear()

    def load_adapter(self, adapter) -> WorkerSpec:
        """Swap the wave's LoRA adapter for the one in directory `adapter`; returns the new spec.

        The new wave (the base model, merged with the adapter) loads beside the old one while waves
        run on; then waves that begin use it. A wave already running finishes on the adapter it
        began with: it holds the old wave. An adapter that is missing, corrupt or for another base
        model raises AdapterError (models.read_adapter, check_adapter_fits) and the old one stays.
        The new wave starts with an empty prefix cache (the old one's KV is the old adapter's) and
        the old wave's cost line (the same base model costs the same), so the pay-back rule goes on."""
        if self.spec is None:
            raise AdapterError("this sidecar was handed a loaded wave, not a model to load: it cannot swap "
                               "its adapter")
        from .. import models
        path = Path(adapter).expanduser().resolve()
        models.read_adapter(path, base=self.spec.ref)  # the cheap checks, before a model loads
        with self._swap:
            spec = dataclasses.replace(self.spec, adapter=str(path))
            wave = load_wave(spec)
            if hasattr(self.wave, "cost") and hasattr(wave, "cost"):
                wave.cost = self.wave.cost
            self.wave, self.spec = wave, spec
        return spec

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until no wave runs and none waits; False on timeout."""
        with self._turn:
            return self._turn.wait_for(lambda: not self._busy and not self._pending, timeout_s)


def load_adapter_here(host: WaveHost, adapter: str) -> dict:
    """`host.load_adapter` where the wave runs (a worker process, an actor), its outcome as plain data
    for `adapter_loaded` on the caller's side."""
    try:
        return {"adapter": host.load_adapter(adapter).adapter}
    except AdapterError as e:
        return {"error": str(e), "bad_adapter": True}
    except Exception as e:  # out of memory, a disk that fails mid-read: the old adapter stays all the same
        return {"error": f"{type(e).__name__}: {e}", "bad_adapter": False}


def adapter_loaded(outcome: dict, spec: WorkerSpec, adapter) -> WorkerSpec:
    """The spec the wave now runs (`load_adapter_here`'s outcome applied to `spec`), or its error raised:
    AdapterError for a bad adapter, RuntimeError for any other fault. Either way the old adapter stays."""
    if "error" in outcome:
        if outcome["bad_adapter"]:
            raise AdapterError(outcome["error"])
        raise RuntimeError(f"the sidecar could not load adapter {str(adapter)!r}: {outcome['error']}; "
                           "the old adapter stays")
    return dataclasses.replace(spec, adapter=outcome["adapter"])


def plain(request: HintRequest) -> dict:
    """The request as picklable data for a worker or an actor (the hint is rendered on the target's side)."""
    return {"messages": request.messages, "tools": [(t.name, t.description, t.parameters) for t in request.tools],
            "tool_choice": request.tool_choice, "arrived": request.arrived}


def from_plain(data: dict) -> HintRequest:
    return HintRequest(data["messages"], [Tool(*t) for t in data["tools"]], None, data["tool_choice"], data["arrived"])
