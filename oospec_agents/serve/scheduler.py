"""One engine, one reply at a time, in arrival order, off the event loop.

A single worker thread drives each reply's blocking event iterator and hands the events to the
loop. One worker is the queue: `ThreadPoolExecutor` runs its jobs in submission order. At most
`max_queue` replies wait behind the running one; the next is refused (`QueueFull`, a 429).

A cancelled job (its client went away) sets the event the engine polls every round: the reply ends
after the round in progress, whether or not that round had an event to send, so the engine is free
again within one decode round.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any, AsyncIterator, Callable, Iterator

_END = object()


class QueueFull(RuntimeError):
    pass


class Job:
    def __init__(self, events: Iterator[Any], cancelled: threading.Event, loop: asyncio.AbstractEventLoop,
                 on_cancel: Callable[["Job"], None]):
        self._events = events
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self._on_cancel = on_cancel
        self.cancelled = cancelled  # the same event the engine's stream polls every round
        self.waiting = False   # counted in the queue depth; the scheduler's lock guards it

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._on_cancel(self)

    def _put(self, item: Any, error: BaseException | None = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (item, error))
        except RuntimeError:  # the loop is gone: nobody listens any more
            self.cancelled.set()

    def _run(self) -> None:
        """On the worker thread. A cancelled job stops at its next event and ends its stream."""
        error = None
        try:
            with closing(self._events) as events:
                for item in ([] if self.cancelled.is_set() else events):
                    if self.cancelled.is_set():
                        break
                    self._put(item)
        except BaseException as e:  # re-raised on the loop, in the handler
            error = e
        self._put(_END, error)

    async def events(self) -> AsyncIterator[Any]:
        """The engine's events on the loop. Leaving early (a disconnect) cancels the job."""
        try:
            while True:
                item, error = await self._queue.get()
                if item is _END:
                    if error is not None:
                        raise error
                    return
                yield item
        finally:
            self.cancel()


class Scheduler:
    def __init__(self, max_queue: int, on_depth: Callable[[int], None] = lambda n: None):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.max_queue = max_queue
        self._on_depth = on_depth
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="oospec-decode")
        self._lock = threading.Lock()
        self._waiting = 0
        self._jobs: set[Job] = set()

    @property
    def waiting(self) -> int:
        return self._waiting

    def submit(self, events: Iterator[Any], cancelled: threading.Event) -> Job:
        """Queue a reply's event iterator, made with `cancelled` as its cancel event; raises QueueFull
        when `max_queue` replies already wait."""
        job = Job(events, cancelled, asyncio.get_running_loop(), self._leave_queue)
        with self._lock:
            if self._waiting >= self.max_queue and self._jobs:
                raise QueueFull(f"the queue is full: {self._waiting} requests are waiting behind the one being "
                                f"decoded (--max-queue {self.max_queue}); retry later")
            self._jobs.add(job)
            job.waiting = True
            self._count(+1)
        self._worker.submit(self._start, job)
        return job

    def _start(self, job: Job) -> None:
        self._leave_queue(job)
        try:
            job._run()
        finally:
            with self._lock:
                self._jobs.discard(job)

    def _leave_queue(self, job: Job) -> None:
        """On start, or when a client leaves while its job still waits: the place is free at once."""
        with self._lock:
            if job.waiting:
                job.waiting = False
                self._count(-1)

    def _count(self, change: int) -> None:
        self._waiting += change
        self._on_depth(self._waiting)

    def shutdown(self) -> None:
        """Cancel every job and wait for the worker to let go of the engine."""
        for job in list(self._jobs):
            job.cancel()
        self._worker.shutdown(wait=True, cancel_futures=False)
