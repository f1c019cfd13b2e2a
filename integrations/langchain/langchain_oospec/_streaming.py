"""From the engine's raw text stream to what a chat model streams: content deltas, sync or async."""
from __future__ import annotations

import asyncio
import contextvars
import threading
from contextlib import closing
from typing import Any, AsyncIterator, Callable, Iterator, Sequence


class ContentStream:
    """Turn raw text deltas (tool-call markup included) into deltas of the reply's content.

    Content is released once it can no longer turn out to be the start of a tool call or of a stop
    string, so everything streamed is a prefix of the final `Generation.content`.
    """

    def __init__(self, fmt: Any, stop: Sequence[str]):
        self._fmt = fmt
        self._markers = [m for m in (fmt.call_start.strip(), *stop) if m]
        self._raw = ""
        self.emitted = ""

    def feed(self, delta: str) -> str:
        self._raw += delta
        content, _ = self._fmt.parse(self._raw)
        if self._fmt.open_call_json(self._raw) is None:
            # Trailing whitespace waits too: the final content is stripped.
            content = content[:len(content) - _held_back(content, self._markers)].rstrip()
        return self._advance(content)

    def finish(self, content: str) -> str:
        """The rest of the final content."""
        return self._advance(content)

    def _advance(self, content: str) -> str:
        if len(content) <= len(self.emitted) or not content.startswith(self.emitted):
            return ""
        delta, self.emitted = content[len(self.emitted):], content
        return delta


def _held_back(text: str, markers: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    return max((n for m in markers for n in range(min(len(m) - 1, len(text)), 0, -1)
                if text.endswith(m[:n])), default=0)


_END = object()


async def iterate_in_thread(make_iterator: Callable[[], Iterator[Any]]) -> AsyncIterator[Any]:
    """Drive a blocking iterator on one worker thread and hand its items to the event loop.

    One thread for the whole stream keeps the engine's decode loop off the loop and on a single
    thread; when the consumer stops early the iterator is closed, which releases the engine.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stopped = threading.Event()

    def put(item: Any, error: BaseException | None = None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (item, error))
        except RuntimeError:  # the loop is gone: nobody is listening any more
            stopped.set()

    def produce() -> None:
        try:
            with closing(make_iterator()) as items:
                for item in items:
                    if stopped.is_set():
                        return
                    put(item)
        except BaseException as e:  # re-raised on the loop, in the consumer
            put(_END, e)
        else:
            put(_END)

    loop.run_in_executor(None, contextvars.copy_context().run, produce)
    try:
        while True:
            item, error = await queue.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stopped.set()
