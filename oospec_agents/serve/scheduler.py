"""One engine, up to `max_batch` replies decoding at once, the rest queued in arrival order, off the loop.

Worker threads drive each reply's blocking event iterator and hand the events to the loop, through the
front-ends' one sync-to-async bridge (`frontend.Bridge`). `max_batch` of them (`oospec serve
--max-batch`): the replies they decode at the same time share the engine's verify forwards (the
engine's batched rounds, batching.py). This module owns the queue behind them: its order, its depth,
and leaving it. `ThreadPoolExecutor` runs its jobs in submission order. At most `max_queue` replies
wait while `max_batch` decode; the next is refused (`QueueFull`, a 429).

A cancelled job (its client went away) sets the event the engine polls every round: the reply ends
after the round in progress, whether or not that round had an event to send, so the engine is free
again within one decode round.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Iterator

from ..frontend import Bridge


class QueueFull(RuntimeError):
    pass


class QueuedReply(Bridge):
    """One reply's place in the queue: the front-ends' `Bridge` over its event iterator (made on the
    loop, so that bad input fails before it queues), driven by the scheduler's worker."""

    def __init__(self, events: Iterator[Any], cancelled: threading.Event, on_cancel: Callable[["QueuedReply"], None]):
        # `cancelled` is the event the engine's stream polls every round
        super().__init__(lambda: events, cancelled, on_cancel=lambda: on_cancel(self))
        self.waiting = False   # counted in the queue depth; the scheduler's lock guards it

    def events(self) -> AsyncIterator[Any]:
        """The engine's events on the loop. Leaving early (a disconnect) cancels the job."""
        return self.items()


class Scheduler:
    """The queue in front of one engine: `submit` places a reply's event iterator (or refuses it, a 429),
    `max_batch` workers decode the oldest ones, `waiting` is the depth (`on_depth` is told every change)."""

    def __init__(self, max_queue: int, on_depth: Callable[[int], None] = lambda n: None, max_batch: int = 1):
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.max_queue, self.max_batch = max_queue, max_batch
        self._on_depth = on_depth
        self._worker = ThreadPoolExecutor(max_workers=max_batch, thread_name_prefix="oospec-decode")
        self._lock = threading.Lock()
        self._waiting = 0
        self._jobs: set[QueuedReply] = set()

    @property
    def waiting(self) -> int:
        return self._waiting

    def submit(self, events: Iterator[Any], cancelled: threading.Event) -> QueuedReply:
        """Queue a reply's event iterator, made with `cancelled` as its cancel event; raises QueueFull
        when `max_queue` replies already wait."""
        job = QueuedReply(events, cancelled, self._leave_queue)
        with self._lock:
            if self._waiting >= self.max_queue and len(self._jobs) - self._waiting >= self.max_batch:
                raise QueueFull(f"the queue is full: {self._waiting} requests are waiting behind the "
                                f"{self.max_batch} being decoded (--max-queue {self.max_queue}, --max-batch "
                                f"{self.max_batch}); retry later")
            self._jobs.add(job)
            job.waiting = True
            self._count(+1)
        self._worker.submit(self._start, job)
        return job

    def _start(self, job: QueuedReply) -> None:
        self._leave_queue(job)
        try:
            job.run()
        finally:
            with self._lock:
                self._jobs.discard(job)

    def _leave_queue(self, job: QueuedReply) -> None:
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
