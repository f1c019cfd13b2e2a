"""SpeculativeToolsMiddleware (#55) on `create_agent`, and the same runner under a LangGraph ToolNode.

`Scripted` (the real engine on a model scripted to write hermes replies) has a scripted sidecar whose
prediction the engine sends as `CallPredicted`; the tools are real LangChain tools whose bodies count
their runs. Every agent run is compared with the same run without the middleware: the transcript (every
message but its random ids and how its reply was decoded) must be identical.
"""
from __future__ import annotations

import asyncio
import json
import sys
import threading

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, StructuredTool, ToolException, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from typing_extensions import Annotated

from langchain_oospec import ChatOoOSpec, SpeculativeToolCalls, SpeculativeToolsMiddleware
from oospec_agents.events import CallPredicted
from oospec_agents.testing import Scripted, by_index

QUESTION = {"messages": [HumanMessage("What is the weather in Paris?")]}
ANSWER = "It is sunny in Paris."


def call(name: str, **arguments) -> str:
    return '<tool_call>\n' + json.dumps({"name": name, "arguments": arguments}) + '\n</tool_call>'


def predicted(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


class Tools:
    """The agent's tools; each body logs its arguments, and `started` is set when any body begins."""

    def __init__(self):
        self.ran: list[tuple[str, dict]] = []
        self.started = threading.Event()
        log = self._log

        @tool
        def get_weather(city: str) -> str:
            """The current weather in a city."""
            log("get_weather", city=city)
            return f"Sunny in {city}"

        @tool
        def get_time(city: str) -> str:
            """The local time in a city."""
            log("get_time", city=city)
            return f"12:00 in {city}"

        @tool
        def send_email(to: str) -> str:
            """Send an email (not read-only: never to be run early)."""
            log("send_email", to=to)
            return f"sent to {to}"

        def flaky(city: str) -> str:
            """A lookup that fails with a ToolException, which the tool itself turns into an error message."""
            log("flaky", city=city)
            raise ToolException(f"no data for {city}")
        flaky = StructuredTool.from_function(flaky, handle_tool_error=True)

        @tool
        def broken(city: str) -> str:
            """A lookup that raises a plain exception (the agent's ToolNode does not handle it)."""
            log("broken", city=city)
            raise RuntimeError(f"broken lookup for {city}")

        @tool
        async def aget_weather(city: str) -> str:
            """The current weather in a city (async)."""
            log("aget_weather", city=city)
            await asyncio.sleep(0)
            return f"Sunny in {city}"

        self.all = [get_weather, get_time, send_email, flaky, broken, aget_weather]
        self.by_name = {t.name: t for t in self.all}

    def _log(self, name: str, **arguments) -> None:
        self.ran.append((name, arguments))
        self.started.set()

    def runs(self, name: str) -> list[dict]:
        return [args for tool_name, args in self.ran if tool_name == name]


class GatedEngine(Scripted):
    """After its CallPredicted, the reply waits (up to 10 s) until a tool body has begun: a tool that
    starts from the prediction is seen to run while the model is still writing its reply, and a run the
    step then drops has begun (its body ran) whatever the threads' timing."""

    def __init__(self, *replies, tools: Tools, **kw):
        super().__init__(*replies, **kw)
        self.tools = tools
        self.tool_ran_during_reply: list[bool] = []

    def stream(self, *args, **kw):
        for event in super().stream(*args, **kw):
            yield event
            if isinstance(event, CallPredicted):
                self.tool_ran_during_reply.append(self.tools.started.wait(10))


class StepLog(AgentMiddleware):
    """Outermost middleware: what had run when each tool step began."""

    def __init__(self, tools: Tools):
        self.logged = tools  # not `self.tools`: an AgentMiddleware's `tools` are tools it adds to the agent
        self.at_tool_step: list[list] = []

    def wrap_tool_call(self, request, handler):
        self.at_tool_step.append(list(self.logged.ran))
        return handler(request)

    async def awrap_tool_call(self, request, handler):
        self.at_tool_step.append(list(self.logged.ran))
        return await handler(request)


def run_agent(replies, tools: Tools, *, predictions=None, middleware=(), engine_cls=Scripted,
              asynchronous=False):
    """The messages of one agent run (the agent has every tool of `tools`), and its engine."""
    engine = engine_cls(*replies, predictions=predictions or {}, **({"tools": tools} if engine_cls is GatedEngine
                                                                   else {}))
    agent = create_agent(ChatOoOSpec(engine=engine), tools=tools.all, middleware=list(middleware))
    if asynchronous:
        return asyncio.run(agent.ainvoke(QUESTION))["messages"], engine
    return agent.invoke(QUESTION)["messages"], engine


#: what a prediction changes of a reply's message: how it was decoded (its hint drafted), and the seconds
DECODING = {"target_forwards", "accepted_by_source", "hint_bytes", "sidecar", "prefill_s", "decode_s"}


def transcript(messages) -> list[dict]:
    """The messages as the agent saw them, but for their ids (random per run; a call's `by_index`) and
    how each reply was decoded."""
    dumped = [by_index(m.model_dump(exclude={"id"})) for m in messages]
    for m in dumped:
        m["response_metadata"] = {k: v for k, v in m["response_metadata"].items() if k not in DECODING}
    return dumped


class Speculated:
    """One agent run with SpeculativeToolsMiddleware (outermost a StepLog), the first reply's prediction
    scripted; its transcript is checked against the same run without the middleware and predictions."""

    def __init__(self, tools: Tools, replies, prediction: list[dict], speculative: list, *, asynchronous=False,
                 gated=False, **options):
        self.middleware = SpeculativeToolsMiddleware(speculative=speculative, **options)
        self.steps = StepLog(tools)
        try:
            self.messages, self.engine = run_agent(
                replies, tools, predictions={0: prediction}, middleware=[self.steps, self.middleware],
                engine_cls=GatedEngine if gated else Scripted, asynchronous=asynchronous)
        finally:
            self.middleware.close()
        plain, _ = run_agent(replies, Tools(), asynchronous=asynchronous)
        assert transcript(self.messages) == transcript(plain)

    def counts(self, *names: str) -> tuple[int, ...]:
        stats = self.middleware.stats
        return tuple(stats[name] for name in names)


@pytest.fixture
def tools():
    return Tools()


PARIS = call("get_weather", city="Paris"), ANSWER


def test_a_hit_runs_the_tool_once_during_the_reply_and_hands_it_over(tools):
    run = Speculated(tools, PARIS, [predicted("get_weather", city="Paris")], ["get_weather"], gated=True)
    assert run.engine.tool_ran_during_reply == [True]            # started from the prediction, mid-reply
    assert run.steps.at_tool_step == [[("get_weather", {"city": "Paris"})]]  # done before the agent's tool step
    assert tools.ran == [("get_weather", {"city": "Paris"})]      # once: the agent's step claimed it
    assert run.counts("predictions", "started", "hits", "wasted") == (1, 1, 1, 0)
    result = run.messages[2]
    assert isinstance(result, ToolMessage) and result.content == "Sunny in Paris" and result.status == "success"
    assert result.tool_call_id == run.messages[1].tool_calls[0]["id"]


@pytest.mark.parametrize("named", ["get_weather", "the function"])
def test_a_tool_given_by_its_name_or_function_is_the_agents_own(tools, named):
    named = tools.by_name["get_weather"].func if named == "the function" else named
    run = Speculated(tools, PARIS, [predicted("get_weather", city="Paris")], [named])
    assert run.counts("hits", "wasted") == (1, 0)


def test_a_miss_drops_the_run_and_the_agent_runs_its_call(tools):
    """The sidecar predicted another tool: its run is wasted, the verified call runs once (started as
    soon as its JSON closed, by its ToolCallReady)."""
    run = Speculated(tools, PARIS, [predicted("get_time", city="Paris")], ["get_weather", "get_time"], gated=True)
    assert tools.runs("get_time") == [{"city": "Paris"}] and tools.runs("get_weather") == [{"city": "Paris"}]
    assert run.counts("started", "hits", "wasted", "ready_started", "ready_hits") == (1, 0, 1, 1, 1)


def test_the_right_name_with_wrong_arguments_is_a_miss(tools):
    replies = (call("get_weather", city="London"), "It is sunny in London.")
    run = Speculated(tools, replies, [predicted("get_weather", city="Paris")], ["get_weather"], gated=True)
    assert tools.runs("get_weather") == [{"city": "Paris"}, {"city": "London"}]  # London once
    assert run.counts("hits", "wasted", "ready_hits") == (0, 1, 1)
    assert run.messages[2].content == "Sunny in London"


def test_a_tool_not_named_is_never_started_early(tools):
    replies = (call("send_email", to="bob@example.com"), "Sent.")
    run = Speculated(tools, replies, [predicted("send_email", to="bob@example.com")], ["get_weather"])
    assert run.steps.at_tool_step == [[]]  # nothing ran before the agent's tool step
    assert tools.runs("send_email") == [{"to": "bob@example.com"}]
    assert run.counts("started", "ready_started", "hits") == (0, 0, 0) and run.counts("not_speculative")[0] >= 1


def test_a_claimed_run_that_the_tool_handled_gives_the_same_error_message(tools):
    run = Speculated(tools, (call("flaky", city="Paris"), "No data."), [predicted("flaky", city="Paris")], ["flaky"])
    assert tools.runs("flaky") == [{"city": "Paris"}] and run.counts("hits") == (1,)
    error = run.messages[2]
    assert (error.status, error.content, error.name) == ("error", "no data for Paris", "flaky")


def test_claimed_arguments_that_misfit_the_schema_give_the_agents_own_error_message(tools):
    """The tool's argument validation fails in the speculative run: the agent's ToolNode reports it
    exactly as it does when it runs the call itself (a ToolInvocationError message)."""
    replies = (call("get_weather", city=["Paris"]), "Sorry.")
    run = Speculated(tools, replies, [predicted("get_weather", city=["Paris"])], ["get_weather"])
    assert run.counts("hits") == (1,) and tools.ran == []
    assert run.messages[2].status == "error" and "get_weather" in run.messages[2].content


def test_a_claimed_run_that_raises_raises_in_the_agent_as_the_tool_did(tools):
    speculative = SpeculativeToolsMiddleware(speculative=["broken"])
    replies = (call("broken", city="Paris"), "unused")
    try:
        with pytest.raises(RuntimeError, match="broken lookup for Paris"):
            run_agent(replies, tools, predictions={0: [predicted("broken", city="Paris")]}, middleware=[speculative])
    finally:
        speculative.close()
    with pytest.raises(RuntimeError, match="broken lookup for Paris"):
        run_agent(replies, Tools())  # as without the middleware
    assert tools.runs("broken") == [{"city": "Paris"}] and speculative.stats["hits"] == 1


def test_an_unclaimed_run_that_raises_is_discarded(tools):
    run = Speculated(tools, PARIS, [predicted("broken", city="Paris")], ["broken", "get_weather"], gated=True)
    assert tools.runs("broken") == [{"city": "Paris"}] and tools.runs("get_weather") == [{"city": "Paris"}]
    assert run.counts("hits", "wasted") == (0, 1)
    # its error is discarded: counted as such if it had raised before the step settled, else it was cancelled
    assert sum(run.counts("errors_discarded", "cancelled")) == 1


def test_two_parallel_calls_are_both_handed_over(tools):
    replies = (call("get_weather", city="Paris") + "\n" + call("get_time", city="Paris"), ANSWER)
    both = [predicted("get_weather", city="Paris"), predicted("get_time", city="Paris")]
    run = Speculated(tools, replies, both, ["get_weather", "get_time"])
    assert sorted(tools.ran) == [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]
    assert run.counts("predictions", "started", "hits", "wasted") == (2, 2, 2, 0)
    assert [m.content for m in run.messages if isinstance(m, ToolMessage)] == ["Sunny in Paris", "12:00 in Paris"]


def test_the_in_flight_bound_holds_and_every_call_still_runs_once(tools):
    replies = (call("get_weather", city="Paris") + "\n" + call("get_time", city="Paris"), ANSWER)
    both = [predicted("get_weather", city="Paris"), predicted("get_time", city="Paris")]
    run = Speculated(tools, replies, both, ["get_weather", "get_time"], max_in_flight=1)
    assert run.counts("started", "hits") == (1, 1)
    # get_time's prediction was skipped; its ToolCallReady too unless get_weather's run had finished by then
    assert run.counts("skipped_in_flight")[0] >= 1
    assert sorted(tools.ran) == [("get_time", {"city": "Paris"}), ("get_weather", {"city": "Paris"})]


def test_a_prediction_below_min_confidence_starts_nothing(tools):
    """The scripted sidecar's predictions carry no confidence (None): with min_confidence set they start no
    run; the verified call still starts early, from its ToolCallReady."""
    run = Speculated(tools, PARIS, [predicted("get_weather", city="Paris")], ["get_weather"], min_confidence=0.5)
    assert run.counts("started", "skipped_confidence", "ready_hits") == (0, 1, 1)
    assert tools.ran == [("get_weather", {"city": "Paris"})]


def test_an_async_agent_with_an_async_tool(tools):
    replies = (call("aget_weather", city="Paris"), ANSWER)
    run = Speculated(tools, replies, [predicted("aget_weather", city="Paris")], ["aget_weather"], gated=True,
                     asynchronous=True)
    assert run.engine.tool_ran_during_reply == [True]
    assert run.steps.at_tool_step == [[("aget_weather", {"city": "Paris"})]]
    assert tools.ran == [("aget_weather", {"city": "Paris"})]
    assert run.counts("started", "hits", "wasted") == (1, 1, 0)


def test_an_async_agent_with_a_sync_tool_and_a_miss(tools):
    replies = (call("get_weather", city="London"), "It is sunny in London.")
    run = Speculated(tools, replies, [predicted("get_weather", city="Paris")], ["get_weather"], gated=True,
                     asynchronous=True)
    assert tools.runs("get_weather") == [{"city": "Paris"}, {"city": "London"}]
    assert run.counts("hits", "wasted") == (0, 1)


def test_without_a_prediction_the_agent_runs_as_without_the_middleware(tools):
    run = Speculated(tools, PARIS, [], ["get_weather"])
    assert tools.runs("get_weather") == [{"city": "Paris"}]
    assert run.counts("predictions", "started", "hits") == (0, 0, 0)


# -- LangGraph ToolNode: the same runner, wired by hand ------------------------------------------------

def tool_node_graph(tools: Tools, speculative: SpeculativeToolCalls | None):
    """A hand-built LangGraph loop: the model (inside `speculative.model_step`), then a ToolNode whose
    execution claims the runner's runs (`wrap_tool_call=` / `awrap_tool_call=`), then the model again."""
    weather = tools.by_name["get_weather"]
    engine = Scripted(call("get_weather", city="Paris"), ANSWER,
                            predictions={0: [predicted("get_weather", city="Paris")]})
    model = ChatOoOSpec(engine=engine).bind_tools([weather])
    step = speculative.model_step if speculative else (lambda call: call())
    hooks = {"wrap_tool_call": speculative.wrap_tool_call,
             "awrap_tool_call": speculative.awrap_tool_call} if speculative else {}
    offered = {"speculative_tools": speculative.speculative_tools()} if speculative else {}

    def call_model(state: MessagesState) -> dict:
        return {"messages": [step(lambda: model.invoke(state["messages"], **offered))]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([weather], **hooks))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def test_a_tool_node_claims_the_runners_runs(tools):
    speculative = SpeculativeToolCalls([tools.by_name["get_weather"]])
    try:
        messages = tool_node_graph(tools, speculative).invoke(QUESTION)["messages"]
    finally:
        speculative.close()
    assert tools.ran == [("get_weather", {"city": "Paris"})]
    assert (speculative.stats["started"], speculative.stats["hits"], speculative.stats["wasted"]) == (1, 1, 0)
    plain = tool_node_graph(Tools(), None).invoke(QUESTION)["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert transcript(messages) == transcript(plain)


# -- bad input -----------------------------------------------------------------------------------------

@tool
def with_call_id(city: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
    """A tool that needs the call's id."""
    return city


def test_a_tool_with_injected_arguments_cannot_be_speculative(tools):
    with pytest.raises(ValueError, match=r"'with_call_id' takes injected arguments \['tool_call_id'\]"):
        SpeculativeToolsMiddleware(speculative=[with_call_id])


@pytest.mark.parametrize("asynchronous", [False, True])
def test_an_empty_speculative_list_warns_and_the_agent_runs_as_without_it(tools, asynchronous):
    """`speculative=[]` (read_only_tools found no tool it may start) is valid: a warning that names
    why nothing starts early, and the agent's run is the run without the middleware."""
    from oospec_agents.speculative import NothingSpeculativeWarning
    with pytest.warns(NothingSpeculativeWarning, match=r"SpeculativeToolsMiddleware: speculative names no tool, so "
                      r"no tool starts early and the agent runs as without speculation.*readOnlyHint") as caught:
        run = Speculated(tools, PARIS, [predicted("get_weather", city="Paris")], [], asynchronous=asynchronous)
    assert caught[0].filename == __file__                        # the warning points at the user's line
    assert tools.runs("get_weather") == [{"city": "Paris"}]      # once, when the agent ran the call
    assert run.counts("predictions", "started", "hits", "not_speculative") == (1, 0, 0, 2)


@pytest.mark.parametrize("speculative, error, message", [
    ("get_weather", TypeError, "speculative must be a list of tools or tool names"),
    ([42], TypeError, "each entry must be a LangChain tool, a tool name or the function"),
])
def test_bad_speculative_lists_are_clear_errors(speculative, error, message):
    with pytest.raises(error, match=message):
        SpeculativeToolsMiddleware(speculative=speculative)


def test_a_name_that_is_not_among_the_agents_tools_is_a_clear_error(tools):
    speculative = SpeculativeToolsMiddleware(speculative=["get_wether"])
    try:
        with pytest.raises(ValueError, match=r"speculative names \['get_wether'\], which no model request offered"):
            run_agent((ANSWER,), tools, middleware=[speculative])
    finally:
        speculative.close()


def test_without_langchain_the_import_error_names_the_extra(monkeypatch):
    monkeypatch.delitem(sys.modules, "langchain_oospec.middleware", raising=False)
    monkeypatch.setitem(sys.modules, "langchain.agents.middleware", None)  # as if langchain were not installed
    with pytest.raises(ImportError, match=r'pip install "langchain-oospec\[agents\]"'):
        from langchain_oospec import SpeculativeToolsMiddleware  # noqa: F401


def test_the_reply_in_a_model_step_is_the_models_reply(tools):
    """model_step returns what the call returns, and a step that fails drops every run it started."""
    weather = tools.by_name["get_weather"]
    speculative = SpeculativeToolCalls([weather])
    try:
        reply = AIMessage("no calls")
        assert speculative.model_step(lambda: reply) is reply
        with pytest.raises(KeyError):
            speculative.model_step(lambda: {}["missing"])
    finally:
        speculative.close()


class OfferedEngine(Scripted):
    """Records the `speculative_tools=` of each request (the engine's pay-back rule weighs it)."""

    def __init__(self, *replies, **kw):
        super().__init__(*replies, **kw)
        self.offered: list = []

    def stream(self, request, **kw):
        self.offered.append(request.speculative_tools)
        return super().stream(request, **kw)


def test_the_engine_is_told_the_speculative_tools_and_their_expected_seconds(tools):
    speculative = SpeculativeToolsMiddleware(speculative=["get_weather", "get_time"], tool_seconds={"get_time": 0.5})
    try:
        _, engine = run_agent(PARIS, tools, predictions={0: [predicted("get_weather", city="Paris")]},
                              middleware=[speculative], engine_cls=OfferedEngine)
    finally:
        speculative.close()
    before, after = engine.offered
    assert before == {"get_weather": None, "get_time": 0.5}            # nothing measured yet: as given
    assert after["get_time"] == 0.5 and after["get_weather"] >= 0      # the measured run of get_weather


@pytest.mark.parametrize("seconds, message", [
    ({"send_email": 1.0}, "tool_seconds names 'send_email', which is not a speculative tool"),
    ({"get_weather": -1}, r"tool_seconds\['get_weather'\] must be a number of seconds >= 0, got -1"),
])
def test_bad_tool_seconds_are_clear_errors(seconds, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeToolsMiddleware(speculative=["get_weather"], tool_seconds=seconds)


def test_the_middleware_is_a_context_manager_as_the_llamaindex_helper_is(tools):
    """`with SpeculativeToolsMiddleware(...) as speculative:` closes its runner on leaving: a call ready
    after that starts nothing, and the agent's own execution runs the tool."""
    with SpeculativeToolsMiddleware(speculative=[tools.by_name["get_weather"]],
                                    tool_seconds={"get_weather": 0.5}) as speculative:
        assert speculative.speculative_tools() == {"get_weather": 0.5}
    assert speculative.runner.ready("get_weather", {"city": "Paris"}) is False
    assert speculative.runner.run("get_weather", {"city": "Paris"}, lambda: "normal") == "normal"
    assert tools.ran == []


class ToolCallbacks(BaseCallbackHandler):
    """The tool runs the agent's callback handlers see."""

    def __init__(self):
        self.seen: list[tuple] = []

    def on_tool_start(self, serialized, input_str, *, inputs=None, **kwargs) -> None:
        self.seen.append(("start", serialized, input_str, inputs))

    def on_tool_end(self, output, **kwargs) -> None:
        self.seen.append(("end", output.model_dump(exclude={"id"})))


@pytest.mark.parametrize("speculative", [["get_weather"], []])
def test_the_agents_handlers_see_one_tool_run_as_without_the_middleware_when_streamed(tools, speculative):
    """Under `stream_mode="messages"` too (the model streams through invoke): the prediction's run is
    outside the agent's callbacks, and the claimed call's callbacks are a normal run's."""
    middleware = [SpeculativeToolsMiddleware(speculative=speculative)] if speculative else []
    engine = Scripted(*PARIS, predictions={0: [predicted("get_weather", city="Paris")]})
    agent = create_agent(ChatOoOSpec(engine=engine), tools=tools.all, middleware=middleware)
    handler = ToolCallbacks()
    try:
        streamed = [m for m, _ in agent.stream(QUESTION, {"callbacks": [handler]}, stream_mode="messages")]
    finally:
        for m in middleware:
            m.close()
    result = {"content": "Sunny in Paris", "additional_kwargs": {}, "response_metadata": {}, "type": "tool",
              "name": "get_weather", "tool_call_id": "call_0", "artifact": None, "status": "success"}
    assert by_index(handler.seen) == [("start", {"name": "get_weather", "description": "The current weather in a city."},
                             "{'city': 'Paris'}", {"city": "Paris"}), ("end", result)]
    assert [by_index(m.tool_call_id) for m in streamed if isinstance(m, ToolMessage)] == ["call_0"]
    assert tools.ran == [("get_weather", {"city": "Paris"})]
    if middleware:
        assert middleware[0].stats["hits"] == 1
