"""The speculative tools runner: read-only tools start from a prediction, the verified call claims them.

No model: fake tools whose order is fixed by `threading.Event`s, never by sleeps. What each test
pins down is the runner's contract (oospec_agents/speculative.py): an identical verified call gets
the run's result and the tool body runs once; anything else runs normally and the run is dropped;
a tool not given to the runner is never started by it.
"""
from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest

from oospec_agents import CallPredicted, TextDelta, ToolCallReady
from oospec_agents.speculative import SpeculativeTools, call_key

PARIS = {"city": "Paris", "unit": "celsius"}


class Tool:
    """A fake sync tool: counts its calls, records their arguments, optionally waits for `release`
    (set by the test) and raises `error`. `entered` is set when a call has begun."""

    def __init__(self, result="sunny", error: Exception | None = None, gated: bool = False):
        self.result, self.error = result, error
        self.calls: list[dict] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not gated:
            self.release.set()

    def __call__(self, arguments: dict):
        self.calls.append(arguments)
        self.entered.set()
        assert self.release.wait(30), "the test never released the tool"
        if self.error is not None:
            raise self.error
        return f"{self.result}:{arguments.get('city', '')}"


class AsyncTool(Tool):
    """The async twin of `Tool`: awaits its release on the loop it runs on."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.cancelled = threading.Event()

    async def __call__(self, arguments: dict):
        self.calls.append(arguments)
        self.entered.set()
        try:
            while not self.release.is_set():
                await asyncio.sleep(0.005)  # poll: the release comes from another thread
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        if self.error is not None:
            raise self.error
        return f"{self.result}:{arguments.get('city', '')}"


def normal(tool, arguments):
    """The agent's normal execution of a call, as `run`'s fallback."""
    return lambda: tool(arguments)


@pytest.fixture
def weather():
    return Tool()


def test_call_key_is_the_name_and_canonical_json():
    assert call_key("f", {"b": 1, "a": [1, {"y": "é"}]}) == ("f", '{"a":[1,{"y":"é"}],"b":1}')
    assert call_key("f", '{"b": 1, "a": [1, {"y": "\\u00e9"}]}') == call_key("f", {"a": [1, {"y": "é"}], "b": 1})
    with pytest.raises(ValueError, match="not JSON"):
        call_key("f", "{nope")
    with pytest.raises(ValueError, match="JSON object"):
        call_key("f", [1, 2])
    with pytest.raises(ValueError, match="non-empty string"):
        call_key("", {})
    with pytest.raises(ValueError, match="serialisable"):
        call_key("f", {"x": object()})


def test_a_hit_hands_the_run_over_and_the_tool_body_runs_once(weather):
    with SpeculativeTools({"get_weather": weather}) as runner:
        assert runner.predicted([{"name": "get_weather", "arguments": PARIS}]) == 1
        assert weather.entered.wait(10)
        assert runner.settle([{"name": "get_weather", "arguments": dict(reversed(PARIS.items()))}]) == 0
        fallback = Tool()
        assert runner.run("get_weather", '{"unit": "celsius", "city": "Paris"}', normal(fallback, PARIS)) == "sunny:Paris"
        assert weather.calls == [PARIS] and fallback.calls == []
        stats = runner.stats
        assert (stats["predictions"], stats["started"], stats["hits"], stats["wasted"]) == (1, 1, 1, 0)
        assert runner.expected_latency()["get_weather"] is not None


def test_a_miss_runs_normally_and_settle_drops_the_run_as_wasted(weather):
    with SpeculativeTools({"get_weather": weather}) as runner:
        runner.predicted([{"name": "search", "arguments": {"q": "Paris"}}])
        assert runner.stats["not_speculative"] == 1 and runner.stats["started"] == 0
        runner.predicted([{"name": "get_weather", "arguments": PARIS}])
        assert weather.entered.wait(10)
        verified = {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}
        assert runner.settle([verified]) == 1
        clock = Tool("noon")
        assert runner.run("get_time", verified["arguments"], normal(clock, verified["arguments"])) == "noon:"
        assert clock.calls == [verified["arguments"]]
        stats = runner.stats
        assert (stats["predictions"], stats["started"], stats["hits"], stats["wasted"]) == (2, 1, 0, 1)


def test_right_name_wrong_arguments_runs_the_verified_call_normally():
    weather = Tool(gated=True)
    with SpeculativeTools({"get_weather": weather}) as runner:
        runner.predicted([{"name": "get_weather", "arguments": {"city": "Paris", "unit": "fahrenheit"}}])
        assert weather.entered.wait(10)
        assert runner.settle([{"name": "get_weather", "arguments": PARIS}]) == 1
        weather.release.set()  # the dropped run was already running: it finishes, unseen
        assert runner.run("get_weather", PARIS, normal(weather, PARIS)) == "sunny:Paris"
        assert weather.calls == [{"city": "Paris", "unit": "fahrenheit"}, PARIS]
        assert (runner.stats["hits"], runner.stats["wasted"], runner.stats["cancelled"]) == (0, 1, 0)


def test_a_claimed_run_raises_the_tools_own_exception():
    error = LookupError("no such city")
    weather = Tool(error=error)
    with SpeculativeTools({"get_weather": weather}) as runner:
        runner.predicted([{"name": "get_weather", "arguments": PARIS}])
        runner.settle([{"name": "get_weather", "arguments": PARIS}])
        with pytest.raises(LookupError) as raised:
            runner.run("get_weather", PARIS, normal(Tool(), PARIS))
        assert raised.value is error
        assert len(weather.calls) == 1 and runner.stats["hits"] == 1 and runner.stats["errors_discarded"] == 0


def test_an_unclaimed_runs_error_is_discarded_and_counted():
    finished_error = Tool(error=LookupError("done before settle"))
    running_error = Tool(error=LookupError("raises after settle"), gated=True)
    with SpeculativeTools({"a": finished_error, "b": running_error}) as runner:
        runner.predicted([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}])
        assert running_error.entered.wait(10)
        done = threading.Event()
        runner._runs[call_key("a", {})].future.add_done_callback(lambda _: done.set())
        assert done.wait(10)
        assert runner.settle([]) == 2
        assert runner.stats["errors_discarded"] == 1
        failed = threading.Event()
        runner._everything.copy().pop().future.add_done_callback(lambda _: failed.set())
        running_error.release.set()
        assert failed.wait(10)
        assert runner.stats["errors_discarded"] == 2 and runner.stats["wasted"] == 2


def test_a_tool_not_marked_speculative_is_never_started_early():
    pay = Tool("paid")
    weather = Tool()
    with SpeculativeTools({"get_weather": weather}) as runner:
        call = {"name": "send_payment", "arguments": {"to": "bob", "amount": 5}}
        assert runner.predicted([call]) == 0
        assert runner.ready("send_payment", call["arguments"]) is False
        runner.on_event(CallPredicted([call], confidence=0.99))
        runner.on_event(ToolCallReady(0, "call_0", "send_payment", call["arguments"]))
        runner.settle([call])
        assert pay.calls == []  # nothing ran it but the agent, below
        assert runner.run("send_payment", call["arguments"], normal(pay, call["arguments"])) == "paid:"
        assert pay.calls == [call["arguments"]]
        assert runner.stats["started"] == runner.stats["ready_started"] == 0
        assert runner.stats["not_speculative"] == 4
        assert set(runner.expected_latency()) == {"get_weather"}


def test_two_parallel_calls_run_at_once_and_are_both_claimed():
    weather, clock = Tool(gated=True), Tool("noon", gated=True)
    calls = [{"name": "get_weather", "arguments": PARIS}, {"name": "get_time", "arguments": {"tz": "UTC"}}]
    with SpeculativeTools({"get_weather": weather, "get_time": clock}) as runner:
        assert runner.predicted(calls) == 2
        assert weather.entered.wait(10) and clock.entered.wait(10)  # both running before either returns
        runner.settle(calls)
        weather.release.set()
        clock.release.set()
        results = {}
        threads = [threading.Thread(target=lambda c=c: results.__setitem__(
            c["name"], runner.run(c["name"], c["arguments"], lambda: pytest.fail("ran twice"))))
            for c in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == {"get_weather": "sunny:Paris", "get_time": "noon:"}
        assert runner.stats["hits"] == 2 and len(weather.calls) == len(clock.calls) == 1


def test_a_queued_run_is_cancelled_before_its_body_runs():
    blocker, queued = Tool(gated=True), Tool()
    with SpeculativeTools({"slow": blocker, "fast": queued}, max_in_flight=1) as runner:
        runner.predicted([{"name": "slow", "arguments": {}}])
        assert blocker.entered.wait(10)
        runner.settle([])  # the running sync body cannot be stopped: its thread stays busy
        assert runner.predicted([{"name": "fast", "arguments": {}}]) == 1  # queued behind it
        assert runner.settle([]) == 1
        blocker.release.set()
        assert queued.calls == []
        assert runner.stats["cancelled"] == 1 and runner.stats["wasted"] == 2


def test_an_async_run_is_cancelled_by_settle():
    search = AsyncTool(gated=True)
    with SpeculativeTools({"search": search}) as runner:
        runner.predicted([{"name": "search", "arguments": {"q": "x"}}])
        assert search.entered.wait(10)
        assert runner.settle([]) == 1
        assert search.cancelled.wait(10)
        assert runner.stats["cancelled"] == 1 and runner.stats["wasted"] == 1


def test_an_async_tool_is_claimed_from_another_loop_and_from_a_sync_caller():
    search = AsyncTool()
    with SpeculativeTools({"search": search}) as runner:
        runner.predicted([{"name": "search", "arguments": {"city": "Rome"}},
                          {"name": "search", "arguments": {"city": "Oslo"}}])
        runner.settle([{"name": "search", "arguments": {"city": "Rome"}},
                       {"name": "search", "arguments": {"city": "Oslo"}}])

        async def agent():
            async def never():
                pytest.fail("ran twice")
            return await runner.arun("search", {"city": "Rome"}, never)

        assert asyncio.run(agent()) == "sunny:Rome"                      # the caller's loop is not the runner's
        assert runner.run("search", {"city": "Oslo"}, lambda: pytest.fail("ran twice")) == "sunny:Oslo"
        assert len(search.calls) == 2 and runner.stats["hits"] == 2


def test_arun_claims_a_sync_run_and_runs_a_miss_normally():
    weather = Tool()
    with SpeculativeTools({"get_weather": weather}) as runner:
        runner.predicted([{"name": "get_weather", "arguments": PARIS}])

        async def agent():
            hit = await runner.arun("get_weather", PARIS, lambda: pytest.fail("ran twice"))

            async def fetch():
                return "normal"
            miss = await runner.arun("get_weather", {"city": "Rome"}, fetch)
            return hit, miss

        assert asyncio.run(agent()) == ("sunny:Paris", "normal")
        assert runner.stats["hits"] == 1 and len(runner.expected_latency()) == 1


def test_the_in_flight_bound_skips_and_counts_the_rest():
    tools = {name: Tool(gated=True) for name in "abc"}
    with SpeculativeTools(tools, max_in_flight=2) as runner:
        assert runner.predicted([{"name": n, "arguments": {}} for n in "abc"]) == 2
        assert runner.stats["skipped_in_flight"] == 1
        assert runner.ready("c", {}) is False and runner.stats["skipped_in_flight"] == 2
        for tool in tools.values():
            tool.release.set()
        assert tools["c"].calls == []


def test_identical_predictions_start_once():
    weather = Tool(gated=True)
    call = {"name": "get_weather", "arguments": PARIS}
    with SpeculativeTools({"get_weather": weather}) as runner:
        assert runner.predicted([call, dict(call)]) == 1
        assert runner.predicted([call]) == 0          # a follow-up wave repeating it
        assert runner.ready("get_weather", PARIS) is False
        weather.release.set()
        runner.settle([call])
        assert runner.run("get_weather", PARIS, lambda: pytest.fail("ran twice")) == "sunny:Paris"
        assert len(weather.calls) == 1
        assert (runner.stats["predictions"], runner.stats["started"], runner.stats["hits"]) == (1, 1, 1)


def test_two_identical_verified_calls_one_claims_the_other_runs_normally(weather):
    with SpeculativeTools({"get_weather": weather}) as runner:
        runner.predicted([{"name": "get_weather", "arguments": PARIS}])
        runner.settle([{"name": "get_weather", "arguments": PARIS}] * 2)
        assert runner.run("get_weather", PARIS, lambda: pytest.fail("ran twice")) == "sunny:Paris"
        assert runner.run("get_weather", PARIS, lambda: "normal") == "normal"
        assert len(weather.calls) == 1 and runner.stats["hits"] == 1


def test_min_confidence_starts_nothing_below_it_or_without_one(weather):
    call = {"name": "get_weather", "arguments": PARIS}
    with SpeculativeTools({"get_weather": weather}, min_confidence=0.5) as runner:
        assert runner.predicted([call], confidence=0.4) == 0
        assert runner.predicted([call]) == 0
        assert runner.stats["skipped_confidence"] == 2 and weather.calls == []
        assert runner.predicted([call], confidence=0.5) == 1


def test_ready_starts_a_verified_call_and_counts_its_hit(weather):
    with SpeculativeTools({"get_weather": weather}) as runner:
        runner.on_event(TextDelta("Let me check."))
        runner.on_event(ToolCallReady(0, "call_0", "get_weather", PARIS))
        runner.settle([{"id": "call_0", "name": "get_weather", "arguments": PARIS}])
        assert runner.run("get_weather", PARIS, lambda: pytest.fail("ran twice")) == "sunny:Paris"
        stats = runner.stats
        assert (stats["ready_started"], stats["ready_hits"], stats["started"], stats["hits"]) == (1, 1, 0, 0)


def test_on_event_takes_a_prediction_then_its_ready_call_as_one_run(weather):
    with SpeculativeTools({"get_weather": weather}) as runner:
        runner.on_event(CallPredicted([{"name": "get_weather", "arguments": PARIS}], confidence=0.9))
        runner.on_event(ToolCallReady(0, "call_0", "get_weather", PARIS))
        runner.settle([{"name": "get_weather", "arguments": PARIS}])
        runner.run("get_weather", PARIS, lambda: pytest.fail("ran twice"))
        assert len(weather.calls) == 1
        assert (runner.stats["started"], runner.stats["ready_started"], runner.stats["hits"]) == (1, 0, 1)


def test_a_run_left_unclaimed_does_not_outlive_the_next_step(weather):
    call = {"name": "get_weather", "arguments": PARIS}
    with SpeculativeTools({"get_weather": weather}) as runner:
        runner.predicted([call])
        runner.settle([call])     # the agent never ran it (a middleware stopped it, say)
        assert runner.settle([call]) == 1
        assert runner.run("get_weather", PARIS, lambda: "fresh") == "fresh"


def test_expected_latency_is_none_before_any_run_then_a_mean(weather):
    with SpeculativeTools({"get_weather": weather, "search": AsyncTool()}) as runner:
        assert runner.expected_latency() == {"get_weather": None, "search": None}
        runner.run("get_weather", PARIS, normal(weather, PARIS))  # a normal execution is measured too
        latency = runner.expected_latency()
        assert latency["get_weather"] >= 0.0 and latency["search"] is None


def test_tool_seconds_stand_until_a_run_is_measured(weather):
    with SpeculativeTools({"get_weather": weather, "search": AsyncTool()}, tool_seconds={"search": 2}) as runner:
        assert runner.expected_latency() == {"get_weather": None, "search": 2.0}
        runner.run("search", PARIS, lambda: "found")  # a normal execution: now measured, far under 2 s
        assert runner.expected_latency()["search"] < 2.0


@pytest.mark.parametrize("seconds, error, message", [
    ({"send_email": 1.0}, ValueError, r"tool_seconds names 'send_email', which is not a speculative tool \(\['get_weather'\]\)"),
    ({"get_weather": -1}, ValueError, r"tool_seconds\['get_weather'\] must be a number of seconds >= 0, got -1"),
    ({"get_weather": True}, ValueError, r"tool_seconds\['get_weather'\] must be a number of seconds >= 0, got True"),
    ([("get_weather", 1.0)], TypeError, "tool_seconds must map a speculative tool's name to its expected seconds"),
])
def test_bad_tool_seconds_are_clear_errors(weather, seconds, error, message):
    with pytest.raises(error, match=message):
        SpeculativeTools({"get_weather": weather}, tool_seconds=seconds)


def test_close_cancels_runs_and_later_calls_run_normally():
    search = AsyncTool(gated=True)
    runner = SpeculativeTools({"search": search})
    runner.predicted([{"name": "search", "arguments": {}}])
    assert search.entered.wait(10)
    runner.close()
    assert search.cancelled.is_set()  # close waits for the loop to finish its tasks
    assert runner.predicted([{"name": "search", "arguments": {}}]) == 0
    assert runner.run("search", {}, lambda: "normal") == "normal"
    runner.close()  # idempotent


@pytest.mark.parametrize("kwargs,match", [
    ({"tools": ["get_weather"]}, "must map"),
    ({"tools": {"get_weather": "not a function"}}, "not callable"),
    ({"tools": {}, "max_in_flight": 0}, "max_in_flight"),
    ({"tools": {}, "min_confidence": 1.5}, "min_confidence"),
])
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        SpeculativeTools(**kwargs)


def test_a_malformed_prediction_is_named(weather):
    with SpeculativeTools({"get_weather": weather}) as runner:
        with pytest.raises(ValueError, match="'name', 'arguments'"):
            runner.predicted(["get_weather"])
        with pytest.raises(TypeError, match="must be a list"):
            runner.predicted({"name": "get_weather"})


# -- an agent loop around the engine's stream: the runner in its place ---------------------------

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _call_text(name: str, arguments: dict) -> str:
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, json.dumps(arguments))


def agent(engine, tools: dict, offered: list, ask: str, runner: SpeculativeTools | None = None,
          method: str = "oospec", max_steps: int = 4, **kw) -> tuple[list[dict], list[dict]]:
    """A minimal tool-calling agent: stream a reply, run its calls, loop until a reply without calls.
    With `runner`, every event goes through it, the step is settled, and each call runs through
    `runner.run`. Returns the transcript and, per step, the runner's stats when the reply ended."""
    transcript = [{"role": "user", "content": ask}]
    at_reply_end = []
    for _ in range(max_steps):
        for event in engine.stream(transcript, offered, method=method, speculative_tools=(
                runner.expected_latency() if runner is not None else None), **kw):
            if runner is not None:
                runner.on_event(event)
        gen = event
        if runner is not None:
            at_reply_end.append(runner.stats)
            runner.settle(gen.tool_calls)
        transcript.append({"role": "assistant", "content": gen.content, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for c in gen.tool_calls]})
        if not gen.tool_calls:
            break
        for c in gen.tool_calls:
            execute = (lambda c=c: tools[c["name"]](c["arguments"]))
            result = execute() if runner is None else runner.run(c["name"], c["arguments"], execute)
            transcript.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return transcript, at_reply_end


def _by_index(transcript: list[dict]) -> str:
    """A transcript with each call id (its reply's own, `call_<reply>_<i>`) as `call_<i>`."""
    return re.sub(r"call_[0-9a-f]{12}_(\d+)", r"call_\1", json.dumps(transcript))


def test_an_agent_loop_with_the_runner_hits_misses_and_never_starts_an_unmarked_tool():
    from oospec_agents.testing import BOOK_TABLE, Scripted
    booking = {"restaurant": "Da Michele", "people": 2, "time": "20:00"}
    replies = [_call_text("get_weather", {"city": "Paris"}),
               "Checking both." + _call_text("get_weather", {"city": "Rome"}) + "\n" + _call_text("book_table", booking),
               "Sunny in Paris and Rome; table booked."]
    predictions = {0: [{"name": "get_weather", "arguments": {"city": "Paris"}}],                 # right
                   1: [{"name": "get_weather", "arguments": {"city": "Milan"}},                  # wrong arguments
                       {"name": "book_table", "arguments": booking}]}                            # not speculative
    offered = [WEATHER_TOOL, BOOK_TABLE]

    plain_tools = {"get_weather": Tool(), "book_table": Tool("booked")}
    expected, _ = agent(Scripted(*replies), plain_tools, offered, "Weather, then book.", method="toolspec")

    weather, book = Tool(), Tool("booked")
    with SpeculativeTools({"get_weather": weather}) as runner:
        got, at_reply_end = agent(Scripted(*replies, predictions=predictions),
                                  {"get_weather": weather, "book_table": book}, offered, "Weather, then book.", runner)
        stats = runner.stats
    assert _by_index(got) == _by_index(expected)             # the runner changes nothing the agent sees
    assert [s["started"] for s in at_reply_end] == [1, 2, 2]  # started from the prediction, before the reply ended
    assert (stats["predictions"], stats["started"], stats["hits"], stats["wasted"]) == (3, 2, 1, 1)
    assert stats["ready_started"] == 1 and stats["ready_hits"] == 1  # Rome started when its JSON closed
    assert stats["not_speculative"] == 2                      # book_table: predicted and ready, never started
    assert book.calls == [booking]                            # run by the agent, once
    assert sorted(c["city"] for c in weather.calls) == ["Milan", "Paris", "Rome"]  # Milan: the wasted run


@pytest.mark.slow
def test_the_embedded_model_s_prediction_starts_the_tool_and_the_transcript_is_unchanged(embedded_fp32):
    """The real engine's events drive the runner: the sidecar's prediction (injected as the hint, so the
    test does not hang on a sidecar's accuracy) starts the tool before the reply ends, the verified
    call claims it, and the transcript is the one the plain agent gets without the runner."""
    ask = "What's the weather in Paris?"
    plain, _ = agent(embedded_fp32, {"get_weather": Tool()}, [WEATHER_TOOL], ask, method="toolspec",
                     max_steps=1, max_new_tokens=48)
    written = plain[1]["tool_calls"]
    assert len(written) == 1, plain  # the embedded model calls the weather tool here
    call = {"name": written[0]["function"]["name"], "arguments": json.loads(written[0]["function"]["arguments"])}

    weather = Tool()
    with SpeculativeTools({"get_weather": weather}) as runner:
        got, at_reply_end = agent(embedded_fp32, {"get_weather": weather}, [WEATHER_TOOL], ask, runner,
                                  max_steps=1, max_new_tokens=48, hint=_call_text(call["name"], call["arguments"]))
        stats = runner.stats
    assert _without_ids(got) == _without_ids(plain)
    assert at_reply_end[0]["started"] == 1 and (stats["hits"], stats["wasted"]) == (1, 0)
    assert weather.calls == [call["arguments"]]


def _without_ids(transcript: list[dict]) -> list[dict]:
    """The transcript without its call ids: each reply draws fresh ones."""
    return [{k: v for k, v in m.items() if k != "tool_call_id"}
            | ({"tool_calls": [{k: v for k, v in c.items() if k != "id"} for c in m["tool_calls"]]} if "tool_calls" in m else {})
            for m in transcript]


def test_a_plain_callable_returning_an_awaitable_is_awaited_on_the_runners_loop():
    search = AsyncTool()
    with SpeculativeTools({"search": lambda arguments: search(arguments)}) as runner:
        runner.predicted([{"name": "search", "arguments": {"city": "Oslo"}}])
        assert runner.run("search", {"city": "Oslo"}, lambda: pytest.fail("ran twice")) == "sunny:Oslo"
        with pytest.raises(TypeError, match="confidence"):
            runner.predicted([], confidence="high")


def test_close_while_the_agent_awaits_a_claimed_run_says_so():
    search = AsyncTool(gated=True)
    runner = SpeculativeTools({"search": search})
    runner.predicted([{"name": "search", "arguments": {}}])
    assert search.entered.wait(10)

    async def agent():
        waiting = asyncio.create_task(runner.arun("search", {}, lambda: pytest.fail("ran twice")))
        await asyncio.sleep(0)  # the task claims the run and awaits it
        runner.close()
        with pytest.raises(RuntimeError, match="cancelled by close"):
            await waiting

    asyncio.run(agent())
    assert runner.stats["hits"] == 1 and len(search.calls) == 1
