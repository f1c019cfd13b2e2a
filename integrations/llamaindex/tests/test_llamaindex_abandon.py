"""A stream abandoned halfway frees the engine for the next request, on a real (tiny) engine.

- Sync: LlamaIndex's callback wrapper does not close the stream it wraps, but closing or dropping
  the wrapper drops the last reference to ours, and CPython closes it there and then: the engine's
  stream is closed (`closing()`) and its lock released before `close()` returns.
- Async: Python has no synchronous finalisation of async generators. The wrapper drops ours, the
  event loop's async-generator hook closes it on its next turn, and the bridge stops the decode
  after the round in progress: the next request waits for that round, not for the reply.
- A cancelled `achat` awaits its worker, so the engine is free when the cancellation returns.
"""
import asyncio

import pytest
from llama_index.core.base.llms.types import ChatMessage
from oospec_agents import Generation

from llama_index.llms.oospec import OoOSpec

USER = [ChatMessage(role="user", content="Tell me a long story.")]


@pytest.fixture
def llm(tiny_engine):
    # a random model rambles: 400 tokens is a reply far longer than any test waits for
    return OoOSpec(engine=tiny_engine, method="ar", max_new_tokens=400)


@pytest.fixture
def replies(tiny_engine, monkeypatch):
    """What became of each engine stream, in order: "began" at its first event (it holds the engine
    from then on), then "finished" or "abandoned"."""
    log = []
    stream = tiny_engine.stream

    def recorded(*args, **kwargs):
        events = stream(*args, **kwargs)

        def gen():
            finished = False
            try:
                for i, event in enumerate(events):
                    if i == 0:
                        log.append("began")
                    finished = isinstance(event, Generation)
                    yield event
            finally:
                # logged before the engine is released, so that the next stream's "began" follows it
                log.append("finished" if finished else "abandoned")
                events.close()
        return gen()

    monkeypatch.setattr(tiny_engine, "stream", recorded)
    return log


def test_closing_a_stream_halfway_frees_the_engine_at_once(llm, tiny_engine, replies):
    stream = llm.stream_chat(USER)
    next(stream)
    assert tiny_engine.decoding == 1
    stream.close()
    assert tiny_engine.decoding == 0
    assert llm.chat(USER, max_new_tokens=3).raw["finish_reason"] in ("length", "stop")
    assert replies == ["began", "abandoned", "began", "finished"]


def test_dropping_a_stream_halfway_frees_the_engine_at_once(llm, tiny_engine, replies):
    stream = llm.stream_chat(USER)
    next(stream)
    del stream
    assert tiny_engine.decoding == 0
    assert replies == ["began", "abandoned"]


@pytest.mark.parametrize("close", [True, False], ids=["aclose", "dropped"])
async def test_breaking_out_of_an_async_stream_frees_the_engine_for_the_next_request(
        llm, tiny_engine, replies, close):
    stream = await llm.astream_chat(USER)
    async for _ in stream:
        break
    assert tiny_engine.decoding == 1  # the reply is being decoded
    if close:
        await stream.aclose()
    del stream
    await llm.achat(USER, max_new_tokens=3)
    # the wrapper's close (or the loop, for a dropped one) reaches our stream on a later turn: the next
    # reply may begin first, beside it (replies decode at once: batching.py); it is abandoned all the same
    assert sorted(replies) == ["abandoned", "began", "began", "finished"] and replies[0] == "began"
    await asyncio.sleep(0.05)
    assert tiny_engine.decoding == 0


async def test_cancelling_achat_frees_the_engine_when_the_cancellation_returns(llm, tiny_engine, replies):
    async def decoding():
        while replies != ["began"]:
            await asyncio.sleep(0.001)

    task = asyncio.create_task(llm.achat(USER))
    await asyncio.wait_for(decoding(), timeout=60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tiny_engine.decoding == 0
    assert replies == ["began", "abandoned"]
