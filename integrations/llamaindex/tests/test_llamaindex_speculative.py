"""Speculative tools for LlamaIndex agents (#55): OoOSpec's instrumentation events, and
OoOSpecSpeculativeTools with FunctionAgent.

A `Scripted` engine (the real engine on a scripted model) writes fixed replies, its scripted sidecar the
prediction (`predictions=`), so each test decides whether the prediction is the verified call. Every agent run is compared with the same run
without speculation: the target sees the same prompts, the agent the same ToolOutputs.
"""
import asyncio
import re
import threading
import time

import pytest
from llama_index.core.agent.workflow import AgentOutput, FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.tools import FunctionTool
from oospec_agents.models import EMBEDDED_TARGET_ADAPTER
from oospec_agents.drafters import Drafter
from oospec_agents.testing import Scripted, by_index
from oospec_agents.speculative import NothingSpeculativeWarning, SpeculativeTools

from llama_index.llms.oospec import (CallPredictedEvent, OoOSpec, OoOSpecSpeculativeTools, ReplyEndEvent,
                                     SpeculativeFunctionTool, SpeculativeTool, ToolCallReadyEvent)

from scripted_replies import reply_text

PARIS = ("get_weather", {"city": "Paris"})
LONDON = ("get_weather", {"city": "London"})
EMAIL = ("send_email", {"to": "bob", "body": "hi"})
ANSWER = ("It is sunny in Paris.", [])
QUESTION = "What is the weather in Paris?"


def as_call(name, arguments):
    return {"name": name, "arguments": arguments}


class RecordingEngine(Scripted):
    """A `Scripted` engine that keeps each request (`speculative_tools` among its fields), and can hold its
    stream after the prediction until `gate` is set (so a speculative run ends first)."""

    def __init__(self, *replies, gate=None, **kwargs):
        super().__init__(*replies, **kwargs)
        self.asked, self.gate = [], gate

    def stream(self, request, **kw):
        self.asked.append(request)
        events = super().stream(request, **kw)
        return events if self.gate is None else self._gated(events)

    def _gated(self, events):
        for event in events:
            yield event
            if type(event).__name__ == "CallPredicted":
                assert self.gate.wait(10), "the speculative run never signalled"


def scripted_llm(*replies, predicted=None, gate=None, **engine):
    """An OoOSpec over a RecordingEngine writing `replies` ((content, [(tool, args)])); `predicted`:
    the calls the sidecar predicts for the first reply; `engine`: the engine's keywords."""
    predictions = {0: [as_call(*c) for c in predicted]} if predicted else None
    engine = RecordingEngine(*(reply_text(*r) for r in replies), model_name="scripted-model",
                             predictions=predictions, gate=gate, **engine)
    return OoOSpec(engine=engine), engine


class Collect(BaseEventHandler):
    """Keeps the speculative tools' events it sees, in order."""

    seen: list = []

    def handle(self, event, **kwargs):
        if isinstance(event, (CallPredictedEvent, ToolCallReadyEvent, ReplyEndEvent)):
            self.seen.append(event)


@pytest.fixture
def collect():
    handler = Collect(seen=[])
    root = get_dispatcher()
    root.add_event_handler(handler)
    yield handler.seen
    root.event_handlers = [h for h in root.event_handlers if h is not handler]


class Weather:
    """A get_weather tool that records each run of its body (thread-safe), optionally raising."""

    def __init__(self, fail=(), gate=None):
        self.ran, self.fail, self.gate = [], set(fail), gate

    def __call__(self, city: str) -> str:
        """The current weather in a city."""
        self.ran.append(city)
        if self.gate is not None:
            self.gate.set()
        if city in self.fail:
            raise ValueError(f"no weather for {city}")
        return f"Sunny in {city}"

    def tool(self):
        return FunctionTool.from_defaults(self, name="get_weather", description="The current weather in a city.")


async def run_agent(llm, tools, streaming=True):
    agent = FunctionAgent(tools=tools, llm=llm, streaming=streaming)
    handler = agent.run(QUESTION, max_iterations=4)
    events = [event async for event in handler.stream_events()]
    return await handler, events


def transcript(response, events, engine=None):
    """What a run shows: each step's message and calls, each tool's output, and the prompts a scripted
    engine saw. The results of one step's parallel calls are taken by call id: FunctionAgent keeps them
    in the order they finish, with or without speculation."""
    steps, results = [], []
    for e in events:
        if isinstance(e, AgentOutput):
            steps.append((e.response.model_dump(), [c.model_dump() for c in e.tool_calls]))
        elif isinstance(e, ToolCallResult):
            out = e.tool_output
            results.append((len(steps), e.tool_id, e.tool_name, e.tool_kwargs, out.content, out.tool_name,
                            out.raw_input, out.raw_output, out.is_error, str(out.exception)))
    prompts = None if engine is None else [(by_call_id(r["messages"]), r["tools"], r["tool_choice"])
                                           for r in engine.requests]
    # the real engine draws each reply's call ids at random (call_<12 hex>_<index>)
    return re.sub(r"call_[0-9a-f]{12}_", "call_", repr((str(response), steps, sorted(results), prompts)))


def by_call_id(messages):
    """The messages with each run of tool results in call-id order."""
    ordered, run = [], []
    for m in [*messages, None]:
        if m is not None and m.get("role") == "tool":
            run.append(m)
            continue
        ordered += sorted(run, key=lambda r: r.get("tool_call_id") or "")
        run = []
        if m is not None:
            ordered.append(m)
    return ordered


async def plain_run(replies, tool, streaming=True):
    """The run without speculation (no prediction, the tool as it is)."""
    llm, engine = scripted_llm(*replies)
    response, events = await run_agent(llm, [tool], streaming)
    return transcript(response, events, engine)


def wait_for(predicate, what):
    """Wait (at most 10 s) for a counter a runner's thread updates after the agent is done."""
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


# ------------------------------------------------------------------ OoOSpec's events

class NoDrafts(Drafter):
    """TEST DOUBLE: a hint drafter that drafts nothing."""
    source = "hint"

    def propose(self, ctx):
        return []


#: what a sidecar's prediction adds to a reply's stats: the sidecar's own account
SIDECAR = {"sidecar", "hint_bytes", "sidecar_declined", "prediction_exact"}


def returned(responses) -> list[dict]:
    """The responses as OoOSpec returns them, less each reply's call ids (`by_index`), the seconds the
    stats measured and the sidecar's own account."""
    dumped = [by_index(r.model_dump()) for r in responses]
    for r in dumped:
        if r["raw"] is not None:
            r["raw"]["stats"] = {k: v for k, v in r["raw"]["stats"].items() if not k.endswith("_s") and k not in SIDECAR}
    return dumped

@pytest.mark.parametrize("method", ["chat", "stream_chat", "achat", "astream_chat"])
async def test_the_new_events_change_nothing_oospec_returns(method):
    replies = [("Let me look.", [PARIS, EMAIL])]

    async def responses(predicted):
        # the hint is not drafted: the prediction changes how the reply decodes in no way, only its events
        llm, _ = scripted_llm(*replies, predicted=predicted, drafters={"hint": NoDrafts()})
        messages = [ChatMessage(role="user", content=QUESTION)]
        result = getattr(llm, method)(messages)
        if method == "achat":
            return [await result]
        if method == "astream_chat":
            return [r async for r in await result]
        return list(result) if method == "stream_chat" else [result]

    without, with_predictions = await responses(None), await responses([LONDON])
    assert returned(with_predictions) == returned(without)
    assert len(without) > 1 if "stream" in method else len(without) == 1


@pytest.mark.parametrize("method", ["chat_with_tools", "stream_chat_with_tools"])
@pytest.mark.parametrize("parallel", [True, False])
def test_oospec_dispatches_the_prediction_the_ready_calls_and_the_reply_end(collect, method, parallel):
    weather, email = Weather().tool(), FunctionTool.from_defaults(lambda to, body: "sent", name="send_email")
    llm, _ = scripted_llm(("", [PARIS, EMAIL]), predicted=[LONDON])
    result = getattr(llm, method)([weather, email], user_msg=QUESTION, allow_parallel_tool_calls=parallel)
    response = list(result)[-1] if method.startswith("stream") else result
    kept = llm.get_tool_calls_from_response(response)
    assert [c.tool_name for c in kept] == (["get_weather", "send_email"] if parallel else ["get_weather"])

    assert [type(e).__name__ for e in collect] == (
        ["CallPredictedEvent"] + ["ToolCallReadyEvent"] * len(kept) + ["ReplyEndEvent"])
    predicted, *ready, end = collect
    assert predicted.calls == [as_call(*LONDON)] and predicted.confidence is None
    assert [(e.index, e.tool_id, e.tool_name, e.tool_kwargs) for e in ready] == [
        (i, c.tool_id, c.tool_name, c.tool_kwargs) for i, c in enumerate(kept)]
    assert end.tool_calls == kept
    assert {e.llm_id for e in collect} == {id(llm)}


def test_a_reply_without_calls_ends_with_an_empty_reply_end(collect):
    llm, _ = scripted_llm(ANSWER)
    llm.chat([ChatMessage(role="user", content=QUESTION)])
    assert [(type(e).__name__, e.tool_calls) for e in collect] == [("ReplyEndEvent", [])]


def test_toolspec_predicts_nothing(collect):
    llm, _ = scripted_llm(("", [PARIS]), predicted=[PARIS])
    llm.method = "toolspec"
    llm.chat_with_tools([Weather().tool()], user_msg=QUESTION)
    assert [type(e).__name__ for e in collect] == ["ToolCallReadyEvent", "ReplyEndEvent"]


# ------------------------------------------------------------------ FunctionAgent with speculative tools

@pytest.mark.parametrize("streaming", [True, False])
async def test_a_hit_runs_the_tool_once_and_the_agent_gets_the_same_output(streaming):
    expected = await plain_run([("", [PARIS]), ANSWER], Weather().tool(), streaming)
    weather = Weather()
    llm, engine = scripted_llm(("", [PARIS]), ANSWER, predicted=[PARIS])
    with OoOSpecSpeculativeTools([weather.tool()], speculative=["get_weather"], llm=llm) as spec:
        response, events = await run_agent(llm, spec.tools, streaming)
        stats = spec.stats
    assert weather.ran == ["Paris"]
    assert (stats["predictions"], stats["started"], stats["hits"], stats["wasted"]) == (1, 1, 1, 0)
    assert stats["ready_started"] == 0  # the ready call found the predicted run
    assert transcript(response, events, engine) == expected


async def test_a_miss_is_wasted_and_the_verified_call_runs_once():
    expected = await plain_run([("", [PARIS]), ANSWER], Weather().tool())
    weather = Weather()
    llm, engine = scripted_llm(("", [PARIS]), ANSWER, predicted=[LONDON])  # the right name, other arguments
    with OoOSpecSpeculativeTools([weather.tool()], speculative=["get_weather"], llm=llm) as spec:
        response, events = await run_agent(llm, spec.tools)
        stats = spec.stats
    assert weather.ran.count("Paris") == 1 and set(weather.ran) <= {"Paris", "London"}
    assert (stats["predictions"], stats["started"], stats["hits"], stats["wasted"]) == (1, 1, 0, 1)
    assert (stats["ready_started"], stats["ready_hits"]) == (1, 1)  # ToolCallReady started Paris early
    assert transcript(response, events, engine) == expected


async def test_a_claimed_run_that_raises_gives_the_agent_the_tools_own_error():
    expected = await plain_run([("", [PARIS]), ANSWER], Weather(fail={"Paris"}).tool())
    weather = Weather(fail={"Paris"})
    llm, engine = scripted_llm(("", [PARIS]), ANSWER, predicted=[PARIS])
    with OoOSpecSpeculativeTools([weather.tool()], speculative=["get_weather"], llm=llm) as spec:
        response, events = await run_agent(llm, spec.tools)
        stats = spec.stats
    assert weather.ran == ["Paris"]
    assert (stats["hits"], stats["wasted"], stats["errors_discarded"]) == (1, 0, 0)
    result = next(e for e in events if isinstance(e, ToolCallResult))
    assert result.tool_output.is_error and result.tool_output.content == "no weather for Paris"
    assert transcript(response, events, engine) == expected


async def test_an_unclaimed_run_that_raises_is_discarded_and_counted():
    expected = await plain_run([("", [PARIS]), ANSWER], Weather().tool())
    gate = threading.Event()
    weather = Weather(fail={"London"}, gate=gate)
    # the engine holds its stream after the prediction until the London run has begun
    llm, engine = scripted_llm(("", [PARIS]), ANSWER, predicted=[LONDON], gate=gate)
    with OoOSpecSpeculativeTools([weather.tool()], speculative=["get_weather"], llm=llm) as spec:
        response, events = await run_agent(llm, spec.tools)
        wait_for(lambda: spec.stats["errors_discarded"] == 1, "the London run's error was not counted")
        stats = spec.stats
    assert weather.ran.count("London") == 1 and weather.ran.count("Paris") == 1
    assert (stats["hits"], stats["wasted"], stats["errors_discarded"]) == (0, 1, 1)
    assert not any(e.tool_output.is_error for e in events if isinstance(e, ToolCallResult))
    assert transcript(response, events, engine) == expected


async def test_an_unmarked_tool_is_never_started_early():
    order = []

    def send_email(to: str, body: str) -> str:
        """Send an email."""
        order.append("send_email ran")
        return "sent"

    def plain_replies():
        return ("", [EMAIL]), ("Sent.", [])
    expected_llm, expected_engine = scripted_llm(*plain_replies())
    expected = transcript(*await run_agent(expected_llm, [Weather().tool(), send_email]), expected_engine)
    order.clear()

    llm, engine = scripted_llm(*plain_replies(), predicted=[EMAIL])  # predicted right, but not speculative
    with OoOSpecSpeculativeTools([Weather().tool(), send_email], speculative=["get_weather"], llm=llm) as spec:
        assert not isinstance(spec.tools[1], SpeculativeTool)
        response, events = await run_agent(llm, spec.tools)
        stats = spec.stats
    assert order == ["send_email ran"]
    assert (stats["predictions"], stats["started"], stats["ready_started"], stats["hits"]) == (1, 0, 0, 0)
    assert stats["not_speculative"] == 2  # the prediction and the ready call, neither started
    assert transcript(response, events, engine) == expected


async def test_the_unmarked_tool_runs_after_the_step_ends():
    """The order of the step's end and the unmarked tool's one run, seen from the same handler."""
    order = []

    class Order(BaseEventHandler):
        def handle(self, event, **kwargs):
            if isinstance(event, ReplyEndEvent):
                order.append("step ended")

    def send_email(to: str, body: str) -> str:
        """Send an email."""
        order.append("send_email ran")
        return "sent"

    handler, root = Order(), get_dispatcher()
    root.add_event_handler(handler)
    try:
        llm, _ = scripted_llm(("", [EMAIL]), ("Sent.", []), predicted=[EMAIL])
        with OoOSpecSpeculativeTools([Weather().tool(), send_email], speculative=["get_weather"], llm=llm) as spec:
            await run_agent(llm, spec.tools)
    finally:
        root.event_handlers = [h for h in root.event_handlers if h is not handler]
    assert order == ["step ended", "send_email ran", "step ended"]


async def test_async_tools_hit_and_a_dropped_async_run_is_cancelled():
    finished = []

    async def get_weather(city: str) -> str:
        """The current weather in a city."""
        if city == "London":
            await asyncio.Event().wait()  # never ends: only a cancellation stops it
        finished.append(city)
        return f"Sunny in {city}"

    expected = await plain_run([("", [PARIS]), ANSWER], FunctionTool.from_defaults(get_weather))
    assert finished == ["Paris"]
    finished.clear()
    # a hit
    llm, engine = scripted_llm(("", [PARIS]), ANSWER, predicted=[PARIS])
    with OoOSpecSpeculativeTools([get_weather], speculative=[get_weather], llm=llm) as spec:
        response, events = await run_agent(llm, spec.tools)
        assert (spec.stats["hits"], spec.stats["wasted"]) == (1, 0)
    assert finished == ["Paris"]
    assert transcript(response, events, engine) == expected
    # a miss: the London task is cancelled when the step settles
    finished.clear()
    llm, engine = scripted_llm(("", [PARIS]), ANSWER, predicted=[LONDON])
    with OoOSpecSpeculativeTools([get_weather], speculative=[get_weather], llm=llm) as spec:
        response, events = await run_agent(llm, spec.tools)
        stats = spec.stats
    assert finished == ["Paris"]
    assert (stats["hits"], stats["wasted"], stats["cancelled"], stats["ready_hits"]) == (0, 1, 1, 1)
    assert transcript(response, events, engine) == expected


async def parallel_run(**options):
    """Two parallel calls, both predicted, with the runner's `options`: (the tool's runs, the stats,
    whether the transcript is the one without speculation)."""
    replies = [("", [PARIS, LONDON]), ("Sunny in both.", [])]
    plain, plain_engine = scripted_llm(*replies)
    expected = transcript(*await run_agent(plain, [Weather().tool()]), plain_engine)
    weather = Weather()
    llm, engine = scripted_llm(*replies, predicted=[PARIS, LONDON])
    with OoOSpecSpeculativeTools([weather.tool()], speculative=["get_weather"], llm=llm, **options) as spec:
        response, events = await run_agent(llm, spec.tools)
        stats = spec.stats
    return sorted(weather.ran), stats, transcript(response, events, engine) == expected


async def test_two_parallel_calls_each_hit_their_own_run():
    ran, stats, same = await parallel_run()
    assert ran == ["London", "Paris"] and same
    assert (stats["predictions"], stats["started"], stats["hits"], stats["wasted"]) == (2, 2, 2, 0)


async def test_the_in_flight_bound_holds_and_every_call_still_runs_once():
    ran, stats, same = await parallel_run(max_in_flight=1)
    assert ran == ["London", "Paris"] and same
    assert stats["started"] == 1 and stats["skipped_in_flight"] >= 1  # London found the bound reached


def test_the_sync_call_path_hands_over_the_run():
    """`predict_and_call` runs the tool through `call` (LlamaIndex's call_tool, with keyword arguments)."""
    plain, _ = scripted_llm(("", [PARIS]))
    expected = plain.predict_and_call([Weather().tool()], user_msg=QUESTION)
    weather = Weather()
    llm, _ = scripted_llm(("", [PARIS]), predicted=[PARIS])
    with OoOSpecSpeculativeTools([weather.tool()], speculative=["get_weather"], llm=llm) as spec:
        response = llm.predict_and_call(spec.tools, user_msg=QUESTION)
        assert (spec.stats["hits"], spec.stats["wasted"]) == (1, 0)
    assert weather.ran == ["Paris"]
    got, want = (r.sources[0].model_dump(exclude={"exception"}) for r in (response, expected))
    assert got == want
    assert str(response) == str(expected) == "Sunny in Paris"


async def test_only_the_given_llms_replies_are_followed():
    other, _ = scripted_llm(("", [PARIS]), predicted=[PARIS])
    llm, _ = scripted_llm()
    weather = Weather()
    with OoOSpecSpeculativeTools([weather.tool()], speculative=["get_weather"], llm=llm) as spec:
        other.chat_with_tools([weather.tool()], user_msg=QUESTION)
        assert spec.stats["predictions"] == spec.stats["started"] == 0
    assert weather.ran == []


def test_closing_stops_following_the_replies():
    spec = OoOSpecSpeculativeTools([Weather().tool()], speculative=["get_weather"])
    assert spec.handler in get_dispatcher("llama_index.llms.oospec.events").event_handlers
    spec.close()
    spec.close()
    assert spec.handler not in get_dispatcher("llama_index.llms.oospec.events").event_handlers
    llm, _ = scripted_llm(("", [PARIS]), predicted=[PARIS])
    llm.chat_with_tools(spec.tools, user_msg=QUESTION)
    assert spec.stats["predictions"] == 0


# ------------------------------------------------------------------ the wrapped tools, the engine's request

def test_wrapped_tools_keep_the_metadata_and_the_model_sees_the_same_schemas():
    weather, email = Weather().tool(), FunctionTool.from_defaults(lambda to, body: "sent", name="send_email")
    with OoOSpecSpeculativeTools([weather, email], speculative=["get_weather"]) as spec:
        wrapped, unmarked = spec.tools
        assert isinstance(wrapped, SpeculativeFunctionTool) and isinstance(wrapped, FunctionTool)
        assert wrapped.metadata is weather.metadata and wrapped.tool is weather and wrapped.real_fn is weather.real_fn
        assert unmarked is email
        llm, _ = scripted_llm()
        sent = llm._prepare_chat_with_tools(spec.tools)["tools"]
        assert sent == llm._prepare_chat_with_tools([weather, email])["tools"]


def test_the_engine_is_told_the_speculative_tools_and_their_expected_seconds():
    """Per marked tool: the runner's measured mean, else the `tool_seconds` given, else None."""
    tools = [Weather().tool(), FunctionTool.from_defaults(lambda to, body: "sent", name="send_email")]
    llm, engine = scripted_llm(*[("", [PARIS])] * 4, ANSWER)
    told = lambda: engine.asked[-1].speculative_tools  # noqa: E731
    with OoOSpecSpeculativeTools(tools, speculative=["get_weather"], tool_seconds={"get_weather": 1.5}) as given:
        llm.chat_with_tools(given.tools, user_msg=QUESTION)
        assert told() == {"get_weather": 1.5}
        given.tools[0].call(city="Paris")  # its ready call's run, claimed: now measured
        llm.chat_with_tools(given.tools, user_msg=QUESTION)
        assert list(told()) == ["get_weather"] and isinstance(told()["get_weather"], float)
        assert told()["get_weather"] < 1.5  # the measured mean: microseconds
    with OoOSpecSpeculativeTools(tools, speculative=["get_weather"]) as measured:
        llm.chat_with_tools(measured.tools, user_msg=QUESTION)
        assert told() == {"get_weather": None}
        measured.tools[0].call(city="Paris")
        llm.chat_with_tools(measured.tools, user_msg=QUESTION)
        assert list(told()) == ["get_weather"] and isinstance(told()["get_weather"], float)
    llm.chat_with_tools(tools, user_msg=QUESTION)  # no speculative tool: nothing said
    assert told() is None


def test_a_call_that_is_no_model_call_runs_the_tool_directly():
    weather = Weather()
    with OoOSpecSpeculativeTools([weather.tool()], speculative=["get_weather"]) as spec:
        assert spec.tools[0].call("Paris").content == "Sunny in Paris"  # positional
        assert spec.tools[0].call(city=object()).content.startswith("Sunny in <object")  # no JSON
        assert spec.stats["hits"] == 0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"speculative": ["search"]}, ValueError,
     r"speculative names 'search', which is not one of the tools \(\['get_weather'\]\)"),
    ({"speculative": "get_weather"}, TypeError, "speculative must be a list"),
    ({"speculative": ["get_weather"], "tool_seconds": {"get_weather": -1}}, ValueError,
     r"tool_seconds\['get_weather'\] must be a number of seconds >= 0, got -1"),
    ({"speculative": ["get_weather"], "tool_seconds": {"send_email": 1.0}}, ValueError,
     "tool_seconds names 'send_email', which is not a speculative tool"),
    ({"speculative": {"get_weather": 1.5}}, TypeError, r"give the expected seconds of one run as tool_seconds="),
    ({"speculative": [3]}, TypeError, "speculative entries are tool names, tools or functions, got 3"),
    ({"speculative": ["get_weather"], "llm": "gpt"}, TypeError, "llm must be an OoOSpec"),
    ({"speculative": ["get_weather"], "max_in_flight": 0}, ValueError, "max_in_flight must be a positive integer"),
])
def test_bad_arguments_are_clear_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        OoOSpecSpeculativeTools([Weather().tool()], **kwargs)


def test_bad_tools_are_clear_errors():
    from llama_index.core.workflow import Context

    def lookup(ctx: Context, key: str) -> str:
        """Look a key up in the workflow's state."""
        return key

    with pytest.raises(TypeError, match=r"tools\[1\] must be a LlamaIndex BaseTool or a function, got int"):
        OoOSpecSpeculativeTools([Weather().tool(), 3], speculative=[])
    with pytest.raises(ValueError, match="two tools are named 'get_weather'"):
        OoOSpecSpeculativeTools([Weather().tool(), Weather().tool()], speculative=[])
    with pytest.raises(ValueError, match=r"tool 'lookup' takes the workflow Context \('ctx'\)"):
        OoOSpecSpeculativeTools([lookup], speculative=["lookup"])
    with pytest.warns(NothingSpeculativeWarning, match=r"^OoOSpecSpeculativeTools: speculative names no tool, so no "
                      "tool starts early and the agent runs as without speculation") as caught:
        OoOSpecSpeculativeTools([lookup], speculative=[]).close()  # unmarked, it is the agent's as before
    assert caught[0].filename == __file__  # the warning points at the user's line


def test_the_runner_is_the_framework_neutral_one():
    with OoOSpecSpeculativeTools([Weather().tool()], speculative=["get_weather"], max_in_flight=2) as spec:
        assert isinstance(spec.runner, SpeculativeTools)
        assert spec.runner.tools == ("get_weather",) and spec.runner.max_in_flight == 2


# ------------------------------------------------------------------ the embedded model, end to end

@pytest.mark.slow
@pytest.mark.xfail(not EMBEDDED_TARGET_ADAPTER.exists(), strict=False,
                   reason="SmolLM2-135M calls a tool by itself only with the embedded tool-calling adapter")
async def test_function_agent_on_the_embedded_model_hits_and_gives_the_same_transcript(embedded_llm, monkeypatch):
    """The real engine: the agent run with speculation gives the transcript of the run without it.
    The first step's sidecar hint is injected (the call the target writes, so that the test does not
    hang on the sidecar's accuracy or on the pay-back rule's choice on this CPU): the engine's
    CallPredicted starts the tool before the reply ends and the agent's call takes its run over."""
    ran = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers and return the product."""
        ran.append((a, b))
        return a * b

    async def run(tools):
        handler = FunctionAgent(tools=tools, llm=embedded_llm).run("What is 6 times 7?", max_iterations=4)
        events = [e async for e in handler.stream_events()]
        return await handler, events

    response, events = await run([multiply])
    expected = transcript(response, events)
    written = [(e.tool_name, e.tool_kwargs) for e in events if isinstance(e, ToolCallResult)]
    assert written and ran == [(w[1]["a"], w[1]["b"]) for w in written]
    ran.clear()

    engine, stream, hinted = embedded_llm.engine, embedded_llm.engine.stream, []

    def first_step_hinted(*args, **kwargs):
        if not hinted:
            hinted.append(kwargs.setdefault("hint", reply_text("", written[:1])))
        return stream(*args, **kwargs)

    monkeypatch.setattr(engine, "stream", first_step_hinted)
    with OoOSpecSpeculativeTools([multiply], speculative=["multiply"], llm=embedded_llm) as spec:
        got = transcript(*await run(spec.tools))
        stats = spec.stats
    assert got == expected
    assert (stats["predictions"], stats["started"], stats["hits"], stats["wasted"]) == (1, 1, 1, 0)
    assert stats["hits"] + stats["ready_hits"] == len(written)  # every verified call found its run
    assert len(ran) == len(written)
