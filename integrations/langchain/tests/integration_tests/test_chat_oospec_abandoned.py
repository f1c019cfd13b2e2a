"""Abandoning a stream halfway, sync or async, frees the engine for the next request at once.

On a real engine over a tiny random model (conftest.py): its replies run to `max_tokens`, so the first
reply is still being decoded when it is abandoned, and only abandoning it lets the next one start.
"""
from __future__ import annotations

import asyncio

import pytest

from langchain_oospec import ChatOoOSpec

FIRST = ("Write a long story about a dragon.", {"max_tokens": 400})
SECOND = ("Say hi.", {"max_tokens": 4})


@pytest.fixture
def model(tiny_engine) -> ChatOoOSpec:
    return ChatOoOSpec(engine=tiny_engine)


@pytest.fixture
def engine_log(tiny_engine, monkeypatch) -> list[list[str]]:
    """Per request on the engine, the kinds of its events, then "closed" when its stream ends."""
    real_stream, log = tiny_engine.stream, []

    def recorded(*args, **kwargs):
        events = []
        log.append(events)
        try:
            for event in real_stream(*args, **kwargs):
                events.append(type(event).__name__)
                yield event
        finally:
            events.append("closed")

    monkeypatch.setattr(tiny_engine, "stream", recorded)
    return log


def assert_first_abandoned_second_done(log: list[list[str]]) -> None:
    first, second = log
    assert "Generation" not in first and first[-1] == "closed", \
        f"the first reply was not abandoned: it ended with {first[-2:]} after {len(first)} events"
    assert second[-2:] == ["Generation", "closed"], f"the second reply did not complete: {second}"


@pytest.mark.parametrize("abandon", ["close", "drop"])
def test_abandoning_a_stream_frees_the_engine_at_once(model, tiny_engine, engine_log, abandon):
    stream = model.stream(FIRST[0], **FIRST[1])
    assert next(stream).chunk_position != "last"
    assert tiny_engine.decoding == 1, "the first reply should be holding the engine while it decodes"
    if abandon == "close":
        stream.close()
    else:
        del stream
    assert tiny_engine.decoding == 0, "the abandoned stream still holds the engine"
    # The same thread asks next: had the engine stayed held, this would wait on its lock forever.
    assert model.invoke(SECOND[0], **SECOND[1]).response_metadata["finish_reason"] == "length"
    assert_first_abandoned_second_done(engine_log)


async def test_breaking_out_of_astream_frees_the_engine_for_the_next_request(model, tiny_engine, engine_log):
    async for chunk in model.astream(FIRST[0], **FIRST[1]):
        assert chunk.chunk_position != "last"
        assert tiny_engine.decoding == 1, "the first reply should be holding the engine while it decodes"
        break
    # LangChain leaves closing the abandoned astream to the event loop, which does it on a later turn: the
    # next reply may begin (and, decoding beside it, end) first (batching.py); the first is freed all the same
    assert (await model.ainvoke(SECOND[0], **SECOND[1])).response_metadata["finish_reason"] == "length"
    for _ in range(500):  # the loop's turn, bounded (5 s): a stream that is never closed still fails here
        if tiny_engine.decoding == 0:
            break
        await asyncio.sleep(0.01)
    assert tiny_engine.decoding == 0
    assert_first_abandoned_second_done(engine_log)
