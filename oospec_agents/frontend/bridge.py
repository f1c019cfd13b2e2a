"""The one sync-to-async bridge: the engine's blocking event stream driven on a worker thread, its items
handed to an event loop (`Bridge`; `aiterate` for the integrations, the server's scheduler for its queue)."""
from __future__ import annotations

import asyncio
import contextvars
import threading
from contextlib import aclosing, closing
from typing import Any, AsyncIterator, Awaitable, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

_END = object()


class Bridge(Generic[T]):
    """The sync-to-async bridge: a blocking iterator driven on a worker thread, its items handed to
    the event loop it was made on. Every front-end's async path goes through it: `aiterate` for the
    integrations, the server's `Job` (serve/scheduler.py) for its queue.

    - Whoever owns the worker calls `run()` on it: one thread runs the whole iteration (torch's grad
      mode and the decode state are per thread). `make_iterator` is called there, and the iterator
      is closed there, with `closing()`.
    - `items()` is the consumer's side, on the loop; the iterator's error is re-raised there.
    - `cancelled` is set when the consumer stops early (or the loop is gone): the worker stops after
      its current item, and does not start one if it is set before `run()`. Pass the event the
      engine's stream polls every round and the engine stops too, with or without an item to hand over.
    """

    def __init__(self, make_iterator: Callable[[], Iterator[T]], cancelled: threading.Event | None = None,
                 on_cancel: Callable[[], None] = lambda: None):
        self._make_iterator = make_iterator
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._on_cancel = on_cancel
        self.cancelled = threading.Event() if cancelled is None else cancelled

    def cancel(self) -> None:
        """Stop the worker after its current item; `on_cancel` runs the first time only."""
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._on_cancel()

    def _put(self, item: Any, error: BaseException | None = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (item, error))
        except RuntimeError:  # the loop is gone: nobody is listening any more
            self.cancelled.set()

    def run(self) -> None:
        """On the worker thread: make the iterator, hand over its items until it ends or the bridge
        is cancelled, close it."""
        error = None
        try:
            with closing(self._make_iterator()) as items:
                for item in ([] if self.cancelled.is_set() else items):
                    if self.cancelled.is_set():
                        break
                    self._put(item)
        except BaseException as e:  # re-raised on the loop, in the consumer
            error = e
        self._put(_END, error)

    async def items(self, worker: Awaitable | None = None) -> AsyncIterator[T]:
        """The iterator's items on the loop. Leaving early cancels the bridge; with `worker` (the
        future running `run()`), it is awaited too, so the iterator is closed when the consumer resumes."""
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
            if worker is not None:
                await asyncio.shield(worker)


async def aiterate(make_iterator: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """Drive a blocking iterator on one worker thread and hand its items to the running event loop.

    - One thread of the loop's default executor runs the whole iteration (a `Bridge`), in a copy of
      the caller's contextvars (callbacks and tracing see the caller's context).
    - The iterator is made and closed on that thread, with `closing()`.
    - When the consumer stops early, the worker stops after its current item and closes the
      iterator; the bridge awaits the worker, so the engine is free when the consumer resumes.
    """
    bridge = Bridge(make_iterator)
    worker = asyncio.get_running_loop().run_in_executor(None, contextvars.copy_context().run, bridge.run)
    async with aclosing(bridge.items(worker)) as items:
        async for item in items:
            yield item
