"""Streaming: show only the reply's text, and drive the engine's blocking stream from asyncio."""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncIterator, Iterator, TypeVar

T = TypeVar("T")


class VisibleText:
    """The part of a reply in progress that a reader should see.

    The engine streams everything the target writes, tool-call markup included. A chat message's
    content is the text outside the calls, so streamed deltas must add up to exactly that: text that
    could still turn out to be the start of a call opener is held back until it is decided.
    """

    def __init__(self, fmt) -> None:
        self._fmt = fmt
        self._opener = fmt.call_start.strip()
        self._raw = ""
        self.text = ""

    def feed(self, delta: str) -> str:
        """Take the next raw delta; return the newly visible text ("" while undecided)."""
        self._raw += delta
        decided = self._raw[: len(self._raw) - self._undecided_tail()]
        visible, _ = self._fmt.parse(decided)
        if not visible.startswith(self.text):
            return ""
        new, self.text = visible[len(self.text):], visible
        return new

    def finish(self, content: str) -> str:
        """The last delta, given the reply's final content."""
        new = content[len(self.text):] if content.startswith(self.text) else ""
        self.text = content
        return new

    def _undecided_tail(self) -> int:
        for n in range(min(len(self._opener) - 1, len(self._raw)), 0, -1):
            if self._raw.endswith(self._opener[:n]):
                return n
        return 0


async def iterate_in_thread(items: Iterator[T]) -> AsyncIterator[T]:
    """Yield from a blocking iterator without blocking the event loop.

    One worker thread runs the whole iteration, because torch's grad mode and the engine's decode
    state are per thread. If the consumer stops early, the worker stops after its current item.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stopped = threading.Event()
    done = object()

    def put(item, error=None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (item, error))
        except RuntimeError:  # the loop closed: nobody is listening any more
            stopped.set()

    def work() -> None:
        try:
            for item in items:
                put(item)
                if stopped.is_set():
                    break
        except BaseException as e:  # re-raised in the consumer
            put(None, e)
        else:
            put(done)
        finally:
            getattr(items, "close", lambda: None)()

    worker = loop.run_in_executor(None, work)
    try:
        while True:
            item, error = await queue.get()
            if error is not None:
                raise error
            if item is done:
                break
            yield item
    finally:
        stopped.set()
        # The engine is free again only once the worker has let go of it.
        await worker
