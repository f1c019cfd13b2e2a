"""ChatOoOSpec dispatches the engine's CallPredicted and ToolCallReady as LangChain custom events (#55).

They reach every callback handler of the model's run, in invoke, stream, ainvoke and astream, and in
`astream_events`; and they change nothing the chat model returns.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.runnables import RunnableLambda

from langchain_oospec import ChatOoOSpec
from langchain_oospec.custom_events import CALL_PREDICTED, TOOL_CALL_READY, from_custom_event
from oospec_agents.events import CallPredicted, ToolCallReady
from oospec_agents.testing import BOOK_TABLE, Scripted, by_index

ARGUMENTS = {"restaurant": "Da Michele", "people": 4, "time": "19:30"}
REPLY = 'Booking it.<tool_call>\n{"name": "book_table", "arguments": {"restaurant": "Da Michele", "people": 4, ' \
        '"time": "19:30"}}\n</tool_call>'
PREDICTION = [{"name": "book_table", "arguments": {**ARGUMENTS, "people": 2}}]  # a prediction, not the call


class Recorder(BaseCallbackHandler):
    """What a callback handler sees: the custom events (name, data, run id) among the runs' starts and
    the model's end."""

    def __init__(self):
        self.seen: list[tuple] = []

    def on_chain_start(self, serialized, inputs, *, run_id, **kwargs: Any) -> None:
        self.seen.append(("chain", run_id))

    def on_chat_model_start(self, serialized, messages, *, run_id, **kwargs: Any) -> None:
        self.seen.append(("model", run_id))

    def on_custom_event(self, name: str, data: Any, *, run_id, **kwargs: Any) -> None:
        self.seen.append((name, data, run_id))

    def on_llm_end(self, response, *, run_id, **kwargs: Any) -> None:
        self.seen.append(("end", run_id))


class AsyncRecorder(AsyncCallbackHandler, Recorder):
    async def on_chain_start(self, serialized, inputs, *, run_id, **kwargs: Any) -> None:
        Recorder.on_chain_start(self, serialized, inputs, run_id=run_id)

    async def on_chat_model_start(self, serialized, messages, *, run_id, **kwargs: Any) -> None:
        Recorder.on_chat_model_start(self, serialized, messages, run_id=run_id)

    async def on_custom_event(self, name: str, data: Any, *, run_id, **kwargs: Any) -> None:
        Recorder.on_custom_event(self, name, data, run_id=run_id)

    async def on_llm_end(self, response, *, run_id, **kwargs: Any) -> None:
        Recorder.on_llm_end(self, response, run_id=run_id)


PROMPT = "Book Da Michele for 4 at 19:30"


def model(predicted: bool = True, replies: int = 1) -> Any:
    engine = Scripted(*[REPLY] * replies, predictions={k: PREDICTION for k in range(replies)} if predicted else {})
    return ChatOoOSpec(engine=engine).bind_tools([BOOK_TABLE])


def summed(chunks: list):
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    return message


def invoke(runnable, how: str, config: dict | None = None):
    """The message of one call, made as `how` says (a stream's chunks summed)."""
    if how == "invoke":
        return runnable.invoke(PROMPT, config)
    if how == "ainvoke":
        return asyncio.run(runnable.ainvoke(PROMPT, config))
    if how == "stream":
        return summed(list(runnable.stream(PROMPT, config)))

    async def collect():
        return [chunk async for chunk in runnable.astream(PROMPT, config)]
    return summed(asyncio.run(collect()))


def streamed_in_a_run(runnable, how: str):
    """A RunnableLambda that streams the model (LangChain's `stream` keeps the model's run manager to
    itself: the events are the caller's run's)."""
    if how == "stream":
        return RunnableLambda(lambda prompt: summed(list(runnable.stream(prompt))))

    async def astreamed(prompt):
        return summed([chunk async for chunk in runnable.astream(prompt)])
    return RunnableLambda(astreamed)


READY = {"index": 0, "id": "call_0", "name": "book_table", "arguments": ARGUMENTS}  # the id `by_index`
#: what the prediction changes of a message: how the reply was decoded (its hint drafted), and the seconds
DECODING = {"target_forwards", "accepted_by_source", "hint_bytes", "sidecar", "prefill_s", "decode_s"}


def returned(message) -> dict:
    """A message as the model returns it, but its id, its calls' ids (`by_index`) and how it was decoded."""
    dumped = by_index(message.model_dump(exclude={"id"}))
    dumped["response_metadata"] = {k: v for k, v in dumped["response_metadata"].items() if k not in DECODING}
    return dumped


@pytest.mark.parametrize("how", ["invoke", "stream", "ainvoke", "astream"])
def test_the_events_change_nothing_the_model_returns(how):
    with_events, without = invoke(model(), how), invoke(model(predicted=False), how)
    assert returned(with_events) == returned(without)
    assert with_events.tool_calls[0]["args"] == ARGUMENTS
    assert with_events.response_metadata["accepted_by_source"]["hint"] > 0  # the prediction was drafted
    in_a_run = invoke(streamed_in_a_run(model(), how), how) if how in ("stream", "astream") else with_events
    assert returned(in_a_run) == returned(without)


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
@pytest.mark.parametrize("handler", [Recorder, AsyncRecorder])
def test_a_handler_sees_the_events_of_the_models_run_before_it_ends(how, handler):
    recorder = handler()
    invoke(model(), how, {"callbacks": [recorder]})
    (_, run), *_ = recorder.seen
    assert by_index(recorder.seen) == [("model", run), (CALL_PREDICTED, {"calls": PREDICTION, "confidence": None}, run),
                             (TOOL_CALL_READY, READY, run), ("end", run)]


@pytest.mark.parametrize("how", ["stream", "astream"])
@pytest.mark.parametrize("handler", [Recorder, AsyncRecorder])
def test_a_handler_sees_the_events_of_a_stream_as_the_calling_runs(how, handler):
    recorder = handler()
    invoke(streamed_in_a_run(model(), how), "invoke" if how == "stream" else "ainvoke", {"callbacks": [recorder]})
    (_, caller), (_, run), *_ = recorder.seen
    assert by_index(recorder.seen) == [("chain", caller), ("model", run),
                             (CALL_PREDICTED, {"calls": PREDICTION, "confidence": None}, caller),
                             (TOOL_CALL_READY, READY, caller), ("end", run)]


def test_a_stream_outside_any_run_dispatches_nothing_and_returns_the_same():
    recorder = Recorder()
    message = invoke(model(), "stream", {"callbacks": [recorder]})
    assert [event[0] for event in recorder.seen] == ["model", "end"] and message.tool_calls


def test_each_of_n_generations_dispatches_its_events():
    recorder = Recorder()
    model(replies=2).bind(n=2).invoke(PROMPT, {"callbacks": [recorder]})
    names = [event[0] for event in recorder.seen]
    assert names == ["model", CALL_PREDICTED, TOOL_CALL_READY, CALL_PREDICTED, TOOL_CALL_READY, "end"]


def test_without_predictions_only_the_ready_call_is_dispatched():
    recorder = Recorder()
    invoke(model(predicted=False), "invoke", {"callbacks": [recorder]})
    assert [event[0] for event in recorder.seen] == ["model", TOOL_CALL_READY, "end"]


@pytest.mark.parametrize("chain", ["invoked", "streamed"])
def test_astream_events_yields_them_as_custom_events(chain):
    """In a chain, whether the model is invoked (custom events of its run) or streamed (of the chain's).
    (The model's own `astream_events` streams it outside any run: it has none, `test_a_stream_outside...`.)"""
    if chain == "invoked":
        runnable = RunnableLambda(lambda prompt, config: model().invoke(prompt, config))
    else:
        runnable = RunnableLambda(lambda prompt: prompt) | model()

    async def collect():
        return [e async for e in runnable.astream_events(PROMPT, version="v2") if e["event"] == "on_custom_event"]
    events = asyncio.run(collect())
    assert [(e["name"], from_custom_event(e["name"], by_index(e["data"]))) for e in events] == [
        (CALL_PREDICTED, CallPredicted(PREDICTION)),
        (TOOL_CALL_READY, ToolCallReady(0, "call_0", "book_table", ARGUMENTS))]


def test_other_custom_events_are_not_engine_events():
    assert from_custom_event("my_event", {"x": 1}) is None
