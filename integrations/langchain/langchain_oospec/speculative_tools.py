"""LangChain tools run before the agent runs them, from ChatOoOSpec's prediction.

`SpeculativeToolCalls` is the LangChain side of `oospec_agents.speculative.SpeculativeTools`, the
framework-neutral runner: it needs only langchain-core, and LangGraph's `ToolNode` takes it as it is
(`ToolNode(tools, wrap_tool_call=s.wrap_tool_call, awrap_tool_call=s.awrap_tool_call)`, with the model
called inside `s.model_step`); `SpeculativeToolsMiddleware` (middleware.py) is the same for
`langchain.agents.create_agent`.

- The prediction's path: while a model step runs, a callback handler is in the callback context
  (`register_configure_hook` with a ContextVar, as `get_openai_callback` does), so every run in the
  step gets it; `ChatOoOSpec` dispatches the engine's `CallPredicted` / `ToolCallReady` as custom
  events of its run (custom_events.py), and the handler feeds them to the runner, which starts the
  speculative tools with the predicted (or the verified) arguments. When the step returns, the runner
  is settled with the reply's tool calls: runs identical to none of them are dropped.
- The claim: when the agent runs a verified call, `wrap_tool_call` asks the runner for an identical
  run. On a hit, the agent's own tool execution runs a stand-in of the tool (`_Claimed`) that hands
  the run's outcome over, so the ToolMessage (content, artifact, name, tool_call_id, status), the
  agent's error handling of a raised exception and the tool callbacks are those of a normal run. On a
  miss it runs the tool normally: a tool never runs twice for one verified call.
- A speculative run is the tool's own `ainvoke` of the call (with a stand-in call id, replaced on the
  claim), as a task on the event loop of the agent's model step (`amodel_step`), where the agent's own
  calls of the tool run: a tool bound to that loop (an MCP tool of one persistent `ClientSession`, an
  HTTP client's connection pool) works early as it works late, and a session that ends (its server
  died) fails the run at once. Cancelling the run cancels that task. A sync agent (`model_step`) has
  no loop: its runs are tasks on the runner's own loop, a sync tool's body on that loop's executor.

Only the tools named speculative are ever started early: read-only, idempotent tools (docs/speculative-tools.md).
A tool that takes injected arguments (the agent's state, the call id, the runtime) cannot be run
before the agent runs the call, and naming one is an error.
"""
from __future__ import annotations

import asyncio
from contextlib import contextmanager
from contextvars import Context, ContextVar
from typing import Any, Awaitable, Callable, Iterable, Iterator, Literal, Sequence, TypeVar
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import BaseTool, ToolException
from langchain_core.tracers.context import register_configure_hook
from pydantic import PrivateAttr

from oospec_agents.speculative import SpeculativeTools, run_on_loop, warn_nothing_speculative

from .custom_events import from_custom_event

T = TypeVar("T")

#: the call id of a speculative run's ToolMessage, until a verified call claims it and gives its own
SPECULATIVE_CALL_ID = "oospec_speculative_run"

#: the handler of the model step in progress: every callback manager configured in it adds the handler
_step_listener: ContextVar[BaseCallbackHandler | None] = ContextVar("oospec_speculative_listener", default=None)
register_configure_hook(_step_listener, inheritable=True)


class _Listener(BaseCallbackHandler):
    """Feeds ChatOoOSpec's custom events (a prediction, a verified call ready) to the runner."""

    run_inline = True  # it only starts runs: no need for the async managers' executor hop

    def __init__(self, runner: SpeculativeTools):
        self.runner = runner

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, tags: list[str] | None = None,
                        metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        event = from_custom_event(name, data)
        if event is not None:
            self.runner.on_event(event)


class SpeculativeToolCalls:
    """Runs the speculative tools from ChatOoOSpec's predictions and hands their runs to the agent.

    Args:
        speculative: the tools that may run before the agent runs them (read-only and idempotent),
            each a LangChain tool, or a name (or the function the agent's tool was made from) to be
            found among the tools of the model requests (`offer`). No other tool is started early.
        max_in_flight: at most this many speculative runs at once.
        min_confidence: when set, a prediction whose confidence is below it (or unknown) starts nothing.
        tool_seconds: the expected seconds of speculative tools, by name, until the runner has measured
            them (`speculative_tools()`, which the engine's pay-back rule weighs).

    Use `model_step` / `amodel_step` around each model call, `wrap_tool_call` / `awrap_tool_call` as
    the tool executor's wrapper, and `close()` when done (or use it as a context manager: `with`). One instance serves one agent run at a
    time: concurrent runs sharing it stay correct, but one step's `settle` drops the others' runs.
    """

    def __init__(self, speculative: Sequence[BaseTool | str | Callable], max_in_flight: int = 4,
                 min_confidence: float | None = None, tool_seconds: dict[str, float] | None = None):
        if isinstance(speculative, (str, BaseTool)) or not isinstance(speculative, Iterable):
            raise TypeError(f"speculative must be a list of tools or tool names, got {speculative!r}")
        self._tools: dict[str, BaseTool | None] = {}  # name -> the tool, None until a request offers it
        for item in speculative:
            name, tool = _name_and_tool(item)
            if self._tools.get(name) is None:
                self._tools[name] = tool
        if not self._tools:
            warn_nothing_speculative(type(self).__name__, stacklevel=2)
        for tool in filter(None, self._tools.values()):
            _check_runs_early(tool)
        self.runner = SpeculativeTools({name: self._early(name) for name in self._tools}, max_in_flight=max_in_flight,
                                       min_confidence=min_confidence, tool_seconds=tool_seconds)
        self._listener = _Listener(self.runner)
        self._agent_loop: asyncio.AbstractEventLoop | None = None  # the loop of the latest model step

    @property
    def stats(self) -> dict[str, int]:
        """The runner's counters: `predictions`, `started`, `hits`, `wasted`, and the rest of
        `SpeculativeTools.stats` (runs started by a verified call, errors discarded, ...)."""
        return self.runner.stats

    def speculative_tools(self) -> dict[str, float | None]:
        """{speculative tool: expected seconds or None}: the runner's mean of its measured runs, else the
        `tool_seconds` given. ChatOoOSpec's `speculative_tools=` call argument: the engine's pay-back rule
        runs the sidecar's wave where the tool time a hit hides pays for it."""
        return self.runner.expected_latency()

    def offer(self, tools: Iterable[Any]) -> None:
        """The tools of a model request: a speculative tool given by name is the one of that name
        (a tool another middleware added included). A name no request has offered is an error at the
        next model step."""
        for tool in tools:
            if isinstance(tool, BaseTool) and tool.name in self._tools and self._tools[tool.name] is not tool:
                _check_runs_early(tool)
                self._tools[tool.name] = tool

    # -- the model step -----------------------------------------------------------------------------

    def model_step(self, call: Callable[[], T]) -> T:
        """`call()` (the model call) with the predictions of every ChatOoOSpec run in it starting the
        speculative tools; then the runs identical to none of the reply's tool calls are dropped."""
        self._agent_loop = None  # a sync agent: async runs go to the runner's own loop
        with self._step() as verified:
            result = call()
            verified += _verified_calls(result)
        return result

    async def amodel_step(self, acall: Callable[[], Awaitable[T]]) -> T:
        """`model_step` for async agents: `acall()` returns the awaitable model call. The step's speculative
        runs are tasks on this event loop, where the agent runs its tools."""
        self._agent_loop = asyncio.get_running_loop()
        with self._step() as verified:
            result = await acall()
            verified += _verified_calls(result)
        return result

    @contextmanager
    def _step(self) -> Iterator[list[dict]]:
        """The model step: the listener in the callback context; at its end the runner settled with the
        calls the body put in the yielded list (none when the step failed)."""
        missing = sorted(name for name, tool in self._tools.items() if tool is None)
        if missing:
            raise ValueError(f"speculative names {missing}, which no model request offered as a tool: name the "
                             "agent's tools (put SpeculativeToolsMiddleware before middleware that selects tools), "
                             "or give the tool objects themselves")
        verified: list[dict] = []
        token = _step_listener.set(self._listener)
        try:
            yield verified
        finally:  # a failed step verified nothing: every run is dropped
            _step_listener.reset(token)
            self.runner.settle(verified)

    # -- the agent runs a verified call ---------------------------------------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], T]) -> T:
        """A `ToolNode` tool-call wrapper (`wrap_tool_call=`; also the middleware's hook): `handler`
        runs the tool normally, or, when an identical speculative run exists, a stand-in of the tool
        that hands that run's outcome (or its exception) over."""
        if not self._speculative(request):
            return handler(request)
        fallback = _Fallback(lambda: handler(request))
        try:
            outcome = self.runner.run(request.tool_call["name"], request.tool_call["args"], fallback)
        except Exception as error:
            if fallback.used:
                raise
            return handler(_claimed(request, error=error))
        return outcome if fallback.used else handler(_claimed(request, outcome))

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[T]]) -> T:
        """`wrap_tool_call` for async agents (`awrap_tool_call=` of `ToolNode`)."""
        if not self._speculative(request):
            return await handler(request)
        fallback = _Fallback(lambda: handler(request))
        try:
            outcome = await self.runner.arun(request.tool_call["name"], request.tool_call["args"], fallback)
        except Exception as error:
            if fallback.used:
                raise
            return await handler(_claimed(request, error=error))
        return outcome if fallback.used else await handler(_claimed(request, outcome))

    def close(self) -> None:
        """Cancel the runs in flight and stop the runner's threads. Idempotent."""
        self.runner.close()

    def __enter__(self) -> SpeculativeToolCalls:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- inside ---------------------------------------------------------------------------------------

    def _speculative(self, request: Any) -> bool:
        return request.tool is not None and request.tool_call["name"] in self._tools

    def _early(self, name: str) -> Callable[[dict], Awaitable[Any]]:
        """The runner's callable for tool `name`: its `ainvoke` of the call, which gives the ToolMessage
        the agent's execution gives (but for the call id), or raises what it raises. It runs in an
        empty context, outside the model run's callbacks: the agent's handlers and traces see the tool
        run once, when a verified call claims it, never a prediction's run. It runs on the agent's
        loop (the latest async model step's) while that loop runs, else on the runner's."""
        async def run(arguments: dict) -> Any:
            call = {"type": "tool_call", "name": name, "args": arguments, "id": SPECULATIVE_CALL_ID}
            return await run_on_loop(self._agent_loop, self._tools[name].ainvoke(call), Context())
        return run


class _Fallback:
    """The agent's normal execution of a call, as the runner's fallback: it records whether the runner
    used it, which tells its result (or exception) apart from a claimed run's."""

    def __init__(self, execute: Callable[[], Any]):
        self._execute = execute
        self.used = False

    def __call__(self) -> Any:
        self.used = True
        return self._execute()


class _Claimed(BaseTool):
    """A tool as the agent's execution runs it for a verified call whose speculative run was claimed:
    `_run` gives the run's outcome, and the tool's own `run` formats it, so the ToolMessage (its
    content, artifact, name, the verified call's id, its status) is the one the tool gives. An error
    the tool handled itself (status "error") comes back as a ToolException whose handler returns that
    content; an exception it raised is raised again, for the agent's error handling."""

    _outcome: Any = PrivateAttr(default=None)
    _error: BaseException | None = PrivateAttr(default=None)

    def holding(self, outcome: Any, error: BaseException | None) -> "_Claimed":
        """This stand-in, holding the claimed run's outcome (or the error it raised)."""
        self._outcome, self._error = outcome, error
        return self

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        return self._hand_over()

    async def _arun(self, *args: Any, **kwargs: Any) -> Any:
        return self._hand_over()

    def _hand_over(self) -> Any:
        outcome = self._outcome
        if self._error is not None:
            raise self._error
        if isinstance(outcome, ToolMessage):
            if outcome.status == "error":
                raise ToolException(outcome.content)
            return outcome.content, outcome.artifact
        return outcome  # what the tool returned as its own output (e.g. a Command)


def _claimed(request: Any, outcome: Any = None, error: BaseException | None = None) -> Any:
    """`request` with its tool replaced by a `_Claimed` stand-in holding the run's outcome or error."""
    tool = request.tool
    message = isinstance(outcome, ToolMessage) and error is None
    response_format: Literal["content", "content_and_artifact"] = (
        "content_and_artifact" if message and outcome.status != "error" else "content")
    stand_in = _Claimed(name=tool.name, description=tool.description, return_direct=tool.return_direct,
                        tags=tool.tags, metadata=tool.metadata, response_format=response_format,
                        handle_tool_error=_content if message and outcome.status == "error" else False,
                        handle_validation_error=False).holding(outcome, error)
    return request.override(tool=stand_in)


def _content(error: ToolException) -> Any:
    return error.args[0]


def _verified_calls(result: Any) -> list[dict]:
    """The tool calls (`{"name", "arguments"}`) of a model step's result: an AIMessage, or an agent
    middleware's ModelResponse (its `result` messages) or ExtendedModelResponse (its `model_response`)."""
    result = getattr(result, "model_response", result)
    messages = getattr(result, "result", [result])
    return [{"name": call["name"], "arguments": call["args"]}
            for message in messages if isinstance(message, AIMessage) for call in message.tool_calls]


def _name_and_tool(item: Any) -> tuple[str, BaseTool | None]:
    if isinstance(item, BaseTool):
        return item.name, item
    if isinstance(item, str) and item:
        return item, None
    if callable(item) and getattr(item, "__name__", None):  # the agent made its tool from this function
        return item.__name__, None
    raise TypeError(f"speculative: each entry must be a LangChain tool, a tool name or the function a tool was "
                    f"made from, got {item!r}")


def _check_runs_early(tool: BaseTool) -> None:
    """A tool that takes injected arguments (state, store, runtime, the call id) cannot run before the
    agent runs the call: naming it speculative is an error."""
    if isinstance(tool.args_schema, dict):  # a JSON Schema declares no injected argument
        return
    fields = getattr(tool.get_input_schema(), "model_fields", None) or {}
    injected = sorted(set(fields) - set(tool.args))
    if injected:
        raise ValueError(f"speculative tool {tool.name!r} takes injected arguments {injected}, which exist only when "
                         "the agent runs the call: it cannot run early, so leave it out of speculative")
