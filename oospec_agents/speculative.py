"""Speculative tool execution: start read-only tools before the agent runs them, hand the result over.

The sidecar names the whole call (`CallPredicted`) long before the target has written it, and a
verified call is complete (`ToolCallReady`) before the reply ends. `SpeculativeTools` starts the
tools the user marked speculative (read-only and idempotent) from those events, and when the agent
runs the verified call it hands over the run whose name and canonical JSON arguments are identical,
so the tool's time hides behind the model's. Anything else runs exactly as it does without the
runner: a verified call that matches no run executes normally, and a tool not given to the runner is
never started by it, by any path (it may sit behind an approval step, or cost money per call).

Lossless by construction: a prediction only ever starts a run; what the agent gets is the result of
the verified call, either from an identical run or from its normal execution. A run nobody claims has
its result and its errors discarded (and counted) when the model step is over (`settle`).

Framework-neutral: the LangChain middleware, the LlamaIndex agent and the benchmark drive this one
runner; it knows only events, names, argument dicts and callables.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import json
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from .events import CallPredicted, ToolCallReady

__all__ = ["NothingSpeculativeWarning", "SpeculativeTools", "call_key", "run_on_loop", "warn_nothing_speculative"]

_COUNTERS = ("predictions", "started", "hits", "wasted", "ready_started", "ready_hits", "errors_discarded",
             "cancelled", "skipped_in_flight", "skipped_confidence", "not_speculative")


def call_key(name: str, arguments: dict | str) -> tuple[str, str]:
    """(name, canonical JSON of `arguments`: sorted keys, compact): two calls are identical exactly
    when their keys are equal. `arguments` may be a dict or its JSON text (as a front-end holds it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tool call's name must be a non-empty string, got {name!r}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError as e:
            raise ValueError(f"the arguments of {name!r} are not JSON: {arguments!r} ({e})") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"the arguments of {name!r} must be a JSON object (a dict), got {arguments!r}")
    try:
        return name, json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"the arguments of {name!r} are not JSON-serialisable: {arguments!r} ({e})") from None


@dataclass(eq=False)
class _Run:
    """One speculative run of one call: where it came from, its future, and what became of it."""
    key: tuple[str, str]
    source: str                                   # "predicted" or "ready"
    future: concurrent.futures.Future = field(default=None)
    began: bool = False                           # the tool body has started (it may have run partly)
    claimed: bool = False
    dropped: bool = False
    finished: bool = False                        # its future is done and `_finished` has seen it
    aborted: bool = False                         # cancelled by `close` after it was claimed
    settled: bool = False                         # survived one `settle`: the next one drops it unclaimed


class SpeculativeTools:
    """Runs the speculative tools early and hands identical verified calls their run's result.

    `tools`: name -> callable(arguments: dict) -> result, ONLY the tools that are safe to run early
    (read-only and idempotent). A coroutine function runs as a task on the runner's own event loop
    (a daemon thread, so sync and async callers alike can wait for it); a plain one on its thread pool.
    `max_in_flight`: at most this many live runs at once (the rest are skipped and counted).
    `min_confidence`: when set, a prediction whose confidence is below it, or None, starts nothing.
    `tool_seconds`: {name: expected seconds of one run} for tools not yet measured (`expected_latency`).

    Thread-safe: the engine's stream and the agent's tool calls may come from different threads.
    """

    def __init__(self, tools: Mapping[str, Callable[[dict], Any]], max_in_flight: int = 4,
                 min_confidence: float | None = None, tool_seconds: Mapping[str, float] | None = None):
        _check_settings(tools, max_in_flight, min_confidence)
        self._tools = dict(tools)
        self._latency = _Latency(self._tools, _checked_seconds(tool_seconds or {}, self._tools))
        self._async = {name: _is_coroutine_function(fn) for name, fn in self._tools.items()}
        self.max_in_flight = max_in_flight
        self.min_confidence = min_confidence
        self._lock = threading.RLock()  # re-entrant: a future's done-callback may fire inside a locked call
        self._runs: dict[tuple[str, str], _Run] = {}  # unclaimed, undropped runs, one per call key
        self._live: set[_Run] = set()                 # runs not dropped and not done: the in-flight bound
        self._everything: set[_Run] = set()           # runs not done, dropped or not: what close() cancels
        self._predicted_keys: set[tuple[str, str]] = set()  # calls predicted in this model step
        self._stats = dict.fromkeys(_COUNTERS, 0)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_in_flight, thread_name_prefix="oospec-speculative")
        self._loop = _LoopThread("oospec-speculative-loop")
        self._closed = False

    # -- the model step: events start runs --------------------------------------------------------

    def on_event(self, event) -> None:
        """Feed one `Engine.stream` event: `CallPredicted` -> `predicted`, `ToolCallReady` -> `ready`;
        any other event is ignored, so a consumer can pass every event through."""
        if isinstance(event, CallPredicted):
            self.predicted(event.calls, event.confidence)
        elif isinstance(event, ToolCallReady):
            self.ready(event.name, event.arguments)

    def predicted(self, calls: list[dict], confidence: float | None = None) -> int:
        """Start a run for each predicted call (`{"name", "arguments"}`) of a speculative tool, with the
        predicted arguments; returns how many started. A call already predicted in this model step is
        not counted again, and a call with a live run is not started twice."""
        keys = _prediction_keys(calls, confidence)
        with self._lock:
            self._stats["predictions"] += len(set(keys) - self._predicted_keys)
            self._predicted_keys.update(keys)
            ours = [key for key in dict.fromkeys(keys) if self._held(key)]
            if self.min_confidence is not None and (confidence is None or confidence < self.min_confidence):
                self._stats["skipped_confidence"] += len(ours)
                return 0
            # the bound as this prediction finds it: its runs are admitted together, so a run of it that
            # ends at once does not make room for the next (what starts does not depend on thread timing)
            room, started = self.max_in_flight - len(self._live), 0
            for key in ours:
                if started >= room:
                    self._stats["skipped_in_flight"] += 1
                    continue
                started += self._start(key, "predicted")
            return started

    def ready(self, name: str, arguments: dict | str) -> bool:
        """A verified call (its JSON has closed, the reply goes on): start it now if its tool is
        speculative and no identical run is live. Returns whether a run started."""
        key = call_key(name, arguments)
        with self._lock:
            return self._held(key) and self._start(key, "ready")

    def settle(self, verified_calls: list[dict]) -> int:
        """The model step is over and `verified_calls` (`{"name", "arguments"}`) are what the target
        wrote: drop every unclaimed run identical to none of them (cancelled where it can be: a queued
        thread job, an async task; a sync function already running finishes, keeping its pool thread
        until it returns, and its result is discarded), and any run left unclaimed since the previous step.
        Returns how many were dropped."""
        verified = {_key_of(call) for call in verified_calls}
        with self._lock:
            doomed = [run for key, run in self._runs.items() if key not in verified or run.settled]
            for run in doomed:
                self._drop(run)
            for run in self._runs.values():
                run.settled = True
            self._predicted_keys.clear()
            return len(doomed)

    # -- the agent runs the verified call ---------------------------------------------------------

    def run(self, name: str, arguments: dict | str, call: Callable[[], Any]) -> Any:
        """Run the verified call `name(arguments)`: the result of an identical run (waiting for it; its
        exception is raised as the tool raised it), else `call()`, the agent's normal execution."""
        key = call_key(name, arguments)
        run = self._claim(key)
        if run is not None:
            try:
                return run.future.result()
            except concurrent.futures.CancelledError:
                _cancelled_while_claimed(run)
        with self._latency.timing(key[0]):
            return call()

    async def arun(self, name: str, arguments: dict | str, acall: Callable[[], Awaitable[Any]]) -> Any:
        """`run` for async agents: awaits an identical run (on whichever loop or thread it runs), else
        `await acall()`."""
        key = call_key(name, arguments)
        run = self._claim(key)
        if run is not None:
            try:
                return await asyncio.wrap_future(run.future)
            except asyncio.CancelledError:
                if not run.aborted:  # the caller itself was cancelled (and with it the run it awaited)
                    raise
                _cancelled_while_claimed(run)
        with self._latency.timing(key[0]):
            return await acall()

    # -- what the runner knows --------------------------------------------------------------------

    def expected_latency(self) -> dict[str, float | None]:
        """Per speculative tool: the mean of its measured runs in seconds (every run the runner started,
        claimed or not, and every normal execution it timed in `run`/`arun`); before any, the
        `tool_seconds` given, else None. What the engine's pay-back rule weighs (`speculative_tools=`
        of `Engine.stream`)."""
        return {name: self._latency.expected(name) for name in self._tools}

    @property
    def stats(self) -> dict[str, int]:
        """A copy of the counters: `predictions` (distinct calls predicted per model step), `started` /
        `ready_started` (runs started from a prediction / a `ToolCallReady`), `hits` / `ready_hits`
        (claims of those runs), `wasted` (runs dropped unclaimed), `errors_discarded` (of those, the ones
        that raised), `cancelled` (dropped runs stopped before they finished), `skipped_in_flight`,
        `skipped_confidence`, `not_speculative` (predicted or ready calls of tools the runner does not
        hold: never started)."""
        with self._lock:
            return dict(self._stats)

    @property
    def tools(self) -> tuple[str, ...]:
        """The names of the speculative tools (the only ones this runner ever starts)."""
        return tuple(self._tools)

    def close(self) -> None:
        """Cancel every run (a sync function already running cannot be stopped: it finishes unseen), and
        stop the thread pool and the event loop. Idempotent; later calls of `run`/`arun` run normally."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for run in list(self._runs.values()):
                self._drop(run)
            for run in list(self._everything):
                run.aborted = run.claimed
                run.future.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop.stop()  # closed: no run starts it any more

    def __enter__(self) -> SpeculativeTools:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- inside -----------------------------------------------------------------------------------

    def _held(self, key: tuple[str, str]) -> bool:
        """Whether the runner may start `key`'s tool; a tool it does not hold is counted, never run."""
        if key[0] in self._tools:
            return True
        self._stats["not_speculative"] += 1
        return False

    def _start(self, key: tuple[str, str], source: str) -> bool:
        """Start a run of `key` unless an identical one is live, the bound is reached or the runner is
        closed (called with the lock held). A run left from an earlier step is replaced, not reused."""
        if self._closed:
            return False
        if (old := self._runs.get(key)) is not None:
            if not old.settled:
                return False
            self._drop(old)
        if len(self._live) >= self.max_in_flight:
            self._stats["skipped_in_flight"] += 1
            return False
        run = _Run(key, source)
        arguments = json.loads(key[1])  # the tool gets its own copy: nothing it does changes the key
        if self._async[key[0]]:
            run.future = asyncio.run_coroutine_threadsafe(self._run_async(run, arguments), self._loop.get())
        else:
            run.future = self._pool.submit(self._run_sync, run, arguments)
        self._runs[key] = run
        self._live.add(run)
        self._everything.add(run)
        run.future.add_done_callback(lambda _, run=run: self._finished(run))
        self._stats["started" if source == "predicted" else "ready_started"] += 1
        return True

    def _run_sync(self, run: _Run, arguments: dict) -> Any:
        run.began = True
        with self._latency.timing(run.key[0]):
            return self._awaited(self._tools[run.key[0]](arguments))

    def _awaited(self, result: Any) -> Any:
        """A plain callable that returns an awaitable (`lambda a: tool.ainvoke(a)`) is an async tool
        in disguise: its awaitable runs on the runner's loop, this pool thread waiting for it."""
        if not inspect.isawaitable(result):
            return result
        with self._lock:
            if self._closed:  # close() stopped the loop: the run is dropped, its result unseen
                getattr(result, "close", lambda: None)()
                raise RuntimeError("the speculative tools runner was closed before this run's awaitable ran")
            loop = self._loop.get()
        return asyncio.run_coroutine_threadsafe(_awaiting(result), loop).result()

    async def _run_async(self, run: _Run, arguments: dict) -> Any:
        run.began = True
        asyncio.current_task().add_done_callback(_retrieved)  # a cancelled run may end raising: unseen
        began = time.perf_counter()
        result = await self._tools[run.key[0]](arguments)  # a cancelled run is not measured
        self._latency.add(run.key[0], time.perf_counter() - began)
        return result

    def _finished(self, run: _Run) -> None:
        """A run's future is done: it leaves the bound; a dropped run's error is counted discarded."""
        with self._lock:
            run.finished = True
            self._live.discard(run)
            self._everything.discard(run)
            if run.dropped and _raised(run.future):
                self._stats["errors_discarded"] += 1

    def _drop(self, run: _Run) -> None:
        """Discard an unclaimed run (lock held): cancel it where it can be, count it wasted."""
        del self._runs[run.key]
        run.dropped = True
        self._live.discard(run)
        self._stats["wasted"] += 1
        if run.future.cancel():
            self._stats["cancelled"] += 1
        elif run.finished and _raised(run.future):  # else `_finished` counts it when it comes
            self._stats["errors_discarded"] += 1

    def _claim(self, key: tuple[str, str]) -> _Run | None:
        """Take the unclaimed run identical to the verified call `key`, once; None: run it normally."""
        with self._lock:
            run = self._runs.pop(key, None)
            if run is not None:
                run.claimed = True
                self._stats["hits" if run.source == "predicted" else "ready_hits"] += 1
            return run


class _LoopThread:
    """An event loop of its own, started on first use in a daemon thread (`get`, the runner's lock held)."""

    def __init__(self, name: str):
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            started = threading.Event()

            async def serve() -> None:
                self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
                started.set()
                await self._stop.wait()  # asyncio.run then cancels what is left and waits for it

            self._thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True, name=self.name)
            self._thread.start()
            started.wait()
        return self._loop

    def stop(self) -> None:
        """Stop the loop, if it started, and wait for its thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()


class _Latency:
    """Per tool of `names`, the mean seconds of its measured runs; before any, the seconds given (else None)."""

    def __init__(self, names, given: dict[str, float]):
        self.names, self.given = frozenset(names), given
        self._lock = threading.Lock()
        self._measured: dict[str, tuple[int, float]] = {}  # name -> (runs measured, mean seconds)

    @contextlib.contextmanager
    def timing(self, name: str):
        """Measures the block's seconds as one run of `name` (raised or not)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    def add(self, name: str, seconds: float) -> None:
        if name not in self.names:  # a tool the runner does not hold is not measured
            return
        with self._lock:
            n, mean = self._measured.get(name, (0, 0.0))
            self._measured[name] = (n + 1, mean + (seconds - mean) / (n + 1))

    def expected(self, name: str) -> float | None:
        with self._lock:
            return self._measured[name][1] if name in self._measured else self.given.get(name)


def _cancelled_while_claimed(run: _Run) -> None:
    """A claimed run was cancelled (only `close` cancels one): if the tool never began, the caller
    runs it normally; if it began, running it again would run the tool twice for one call."""
    if run.began:
        raise RuntimeError(f"the speculative run of {run.key[0]!r} was cancelled by close() while the agent "
                           "waited for its result")


def _check_settings(tools: Any, max_in_flight: Any, min_confidence: Any) -> None:
    """`SpeculativeTools`' arguments, checked: a clear error naming the one that is wrong."""
    if not isinstance(tools, Mapping):
        raise TypeError(f"tools must map a tool name to its callable, got {type(tools).__name__}")
    for name, fn in tools.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a speculative tool's name must be a non-empty string, got {name!r}")
        if not callable(fn):
            raise TypeError(f"speculative tool {name!r} is not callable: {fn!r}")
    if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be a positive integer, got {max_in_flight!r}")
    if min_confidence is not None and (isinstance(min_confidence, bool) or not isinstance(min_confidence, (int, float))
                                       or not 0.0 <= min_confidence <= 1.0):
        raise ValueError(f"min_confidence must be None or a probability in [0, 1], got {min_confidence!r}")


def _prediction_keys(calls: Any, confidence: Any) -> list[tuple[str, str]]:
    """The call keys of a prediction, its arguments checked: a clear error naming the one that is wrong."""
    if not isinstance(calls, (list, tuple)):
        raise TypeError(f"predicted calls must be a list of {{'name', 'arguments'}} dicts, got {calls!r}")
    if confidence is not None and (isinstance(confidence, bool) or not isinstance(confidence, (int, float))):
        raise TypeError(f"a prediction's confidence must be a number or None, got {confidence!r}")
    return [_key_of(call) for call in calls]


def _checked_seconds(seconds: Any, tools: Mapping[str, Any]) -> dict[str, float]:
    """`tool_seconds`, checked: a mapping of speculative tools' names to seconds >= 0."""
    if not isinstance(seconds, Mapping):
        raise TypeError(f"tool_seconds must map a speculative tool's name to its expected seconds, got {seconds!r}")
    for name, value in seconds.items():
        if name not in tools:
            raise ValueError(f"tool_seconds names {name!r}, which is not a speculative tool ({sorted(tools)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"tool_seconds[{name!r}] must be a number of seconds >= 0, got {value!r}")
    return {name: float(value) for name, value in seconds.items()}


def _key_of(call) -> tuple[str, str]:
    """`call_key` of a `{"name", "arguments"}` dict, with an error naming a call of another shape."""
    if not isinstance(call, Mapping) or "name" not in call:
        raise ValueError(f"a call must be a {{'name', 'arguments'}} dict, got {call!r}")
    return call_key(call["name"], call.get("arguments", {}))


async def _awaiting(awaitable: Awaitable[Any]) -> Any:
    return await awaitable  # run_coroutine_threadsafe takes coroutines only, not every awaitable


class NothingSpeculativeWarning(UserWarning):
    """No tool may start early: the agent runs every tool when it runs the call, as without speculation."""


def warn_nothing_speculative(owner: str, stacklevel: int = 2) -> None:
    """The warning of a front-end (`owner`) given an empty speculative list: valid, and the same as
    no speculation. `stacklevel` as `warnings.warn` takes it, counted from the caller."""
    warnings.warn(f"{owner}: speculative names no tool, so no tool starts early and the agent runs as without "
                  "speculation. Name the read-only, idempotent tools that may run before the agent runs them; an "
                  "MCP tool qualifies when its server is in read_only_tools' trust and declares it readOnlyHint "
                  "(read_only_tools warns which of these is missing)", NothingSpeculativeWarning,
                  stacklevel=stacklevel + 1)


async def run_on_loop(loop: asyncio.AbstractEventLoop | None, coroutine: Awaitable[Any],
                      context: contextvars.Context | None = None) -> Any:
    """Await `coroutine` run as a task on `loop`, the event loop its tool belongs to (an agent's loop,
    in another thread; the running loop when `loop` is None, closed or not running), in `context` (a
    copy of the current context when None). Cancelling the await cancels the task; an error the task
    raises once cancelled (a transport torn down mid-call) is discarded, never logged as unretrieved."""
    here = asyncio.get_running_loop()
    context = contextvars.copy_context() if context is None else context  # an empty Context is falsy
    if loop is not None and loop is not here and loop.is_running() and not loop.is_closed():
        start = asyncio.run_coroutine_threadsafe  # the task is made in the context current here
        return await asyncio.wrap_future(context.run(start, _quietly(coroutine), loop))
    return await context.run(asyncio.ensure_future, _quietly(coroutine))


async def _quietly(coroutine: Awaitable[Any]) -> Any:
    asyncio.current_task().add_done_callback(_retrieved)
    return await coroutine


def _retrieved(task: asyncio.Task) -> None:
    """Mark a task's exception retrieved: its awaiter, if any is left, has it already."""
    if not task.cancelled():
        task.exception()


def _raised(future: concurrent.futures.Future) -> bool:
    return not future.cancelled() and future.exception() is not None


def _is_coroutine_function(fn) -> bool:
    """Whether calling `fn` gives a coroutine: an async function, a partial of one, or an object whose
    `__call__` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
