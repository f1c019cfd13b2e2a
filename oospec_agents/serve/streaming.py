"""What Chat Completions and the Responses API share once a request is queued: its engine events
folded into what the API sends, streamed as server-sent events or collected into one body.

A `Fold` is one request's reply as its API writes it (chat_output.py's `ChatFold`, responses_output.py's
`ResponsesFold`): `apply(event)` folds in one engine event (its Generations too) and returns what to
send now, so a non-streamed body is exactly the aggregate of the streamed events. `answer` is the
routes' one way to reply: a stream (`events`), or the body once every event is in (`collect`), with the
client's leaving turned into a cancelled reply either way.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Callable

from fastapi.responses import Response, StreamingResponse

from ..engine import Generation
from .scheduler import QueuedReply

log = logging.getLogger("oospec.serve")


class Fold:
    """One request's engine events as its API sends them. `gens` are its choices' Generations so far."""
    #: what the log calls a stream that fails ("request", "response")
    what = "request"

    def __init__(self, choices: int = 1):
        self.gens: list[Generation] = []
        self.choices = choices

    @property
    def complete(self) -> bool:
        """Every choice has ended (its Generation folded in)."""
        return len(self.gens) == self.choices

    def opening(self) -> list:
        """What a stream sends before the first engine event."""
        return []

    def apply(self, item) -> list:
        """What to send for one engine event (a Generation ends a choice)."""
        raise NotImplementedError

    def ending(self) -> list:
        """What a stream sends after the last engine event, when it did not fail."""
        return []

    def failed(self, message: str) -> list:
        """What a stream sends when it fails after its status line (the error, in the API's shape)."""
        raise NotImplementedError

    def trailer(self) -> list:
        """What a stream sends last, whether or not it failed."""
        return []

    def encode(self, event: Any) -> str:
        """One event as a server-sent event."""
        raise NotImplementedError

    def body(self) -> dict:
        """The non-streamed reply (once `complete`)."""
        raise NotImplementedError


async def answer(queued: QueuedReply, fold: Fold, finished: Callable[[Generation], None], stream: bool,
                 request):
    """The reply to a `queued` request (scheduler.py): its stream, or (not streamed) its body;
    `finished(gen)` is called per choice that ended. A client that leaves before a body is ready gets a
    499 (nobody reads it)."""
    if stream:
        return StreamingResponse(events(queued, fold, finished), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    if not await collect(queued, fold, request):
        return Response(status_code=499)
    for gen in fold.gens:
        finished(gen)
    return fold.body()


async def collect(queued: QueuedReply, fold: Fold, request) -> bool:
    """Every event of a non-streamed reply folded in; False when the client left before the end (its
    reply is then cancelled)."""
    async def watch():
        while not await request.is_disconnected():
            await asyncio.sleep(0.25)
        queued.cancel()

    watcher = asyncio.create_task(watch())
    try:
        async for item in queued.events():
            fold.apply(item)
    finally:
        watcher.cancel()
    return fold.complete


async def events(queued: QueuedReply, fold: Fold, finished: Callable[[Generation], None]) -> AsyncIterator[str]:
    """A streamed reply's server-sent events. The client leaving closes this generator, and with it the
    queued reply's events: it is cancelled."""
    for event in fold.opening():
        yield fold.encode(event)
    try:
        async for item in queued.events():
            if isinstance(item, Generation):
                finished(item)
            for event in fold.apply(item):
                yield fold.encode(event)
        for event in fold.ending():
            yield fold.encode(event)
    except Exception as e:  # the status line is sent: the error goes in the stream, as OpenAI's does
        log.exception("streamed %s failed", fold.what)
        for event in fold.failed(f"internal error ({type(e).__name__}); the server log has the details"):
            yield fold.encode(event)
    for event in fold.trailer():
        yield fold.encode(event)
