"""Speculative tools for LlamaIndex agents: read-only tools start before the reply that calls them ends.

`OoOSpec` dispatches the sidecar's predicted call (`CallPredictedEvent`), each verified call whose
arguments have closed (`ToolCallReadyEvent`) and the reply's end (`ReplyEndEvent`) through LlamaIndex's
instrumentation dispatcher (events.py). `OoOSpecSpeculativeTools` is the LlamaIndex side of the
framework-neutral runner (`oospec_agents.speculative.SpeculativeTools`):

- `SpeculativeToolsHandler`, a `BaseEventHandler` on that dispatcher, feeds the runner: a prediction
  or a ready call starts the marked tool with those arguments; a reply's end settles the step (runs
  identical to none of its verified calls are dropped).
- `SpeculativeTool` wraps each marked tool for the agent, with the same metadata (the model sees the
  same schema): its `acall`/`call` takes over the identical run's `ToolOutput` (waiting for it, or
  raising its exception) or runs the tool as it always does. The speculative run calls the tool
  through the same path the agent's call takes, so the ToolOutput is the one the agent would have got.
  A FunctionTool's wrapper is a FunctionTool (`SpeculativeFunctionTool`, of the same function), so
  LlamaIndex code that treats FunctionTools apart (`call_tool`'s keyword arguments) treats it alike.

An async tool's speculative run runs on the event loop of the agent whose reply predicted it (learnt
by `AgentLoop`, a span handler that sees OoOSpec's async chat begin on that loop), where the agent's
own calls of the tool run: a tool bound to that loop (an MCP client's HTTP connection pool,
`BasicMCPClient`) works early as it works late. Without an async chat (sync use), on the runner's loop.

Tools not marked are handed to the agent as they are: nothing starts them early, by any path.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.span import SimpleSpan
from llama_index.core.instrumentation.span_handlers import BaseSpanHandler
from llama_index.core.tools import FunctionTool
from llama_index.core.tools.function_tool import sync_to_async
from llama_index.core.tools.types import (AsyncBaseTool, BaseTool, BaseToolAsyncAdapter, ToolMetadata, ToolOutput,
                                          adapt_to_async_tool)
from oospec_agents.speculative import SpeculativeTools, call_key, run_on_loop, warn_nothing_speculative

from .events import CallPredictedEvent, ReplyEndEvent, ToolCallReadyEvent, dispatcher

__all__ = ["AgentLoop", "OoOSpecSpeculativeTools", "SpeculativeFunctionTool", "SpeculativeTool",
           "SpeculativeToolsHandler"]

_log = logging.getLogger(__name__)

# The body every FunctionTool's async path has when it was given only a sync function: LlamaIndex's
# `sync_to_async` runs that function on a thread. Such a tool is started early on the runner's pool.
_SYNC_TO_ASYNC = sync_to_async(print).__code__


class SpeculativeTool(AsyncBaseTool):
    """A marked tool as the agent sees it: the tool's own metadata; `acall`/`call` hand over an identical
    speculative run's ToolOutput (or its exception), or else call the tool. A call with positional
    arguments, or arguments that are no JSON, is no call a model wrote: it runs the tool directly."""

    is_speculative = True  # read by OoOSpec (base.py), which names these tools' seconds to the engine

    def __init__(self, tool: BaseTool, runner: SpeculativeTools) -> None:
        self._tool = adapt_to_async_tool(tool)
        self._given = tool
        self._runner = runner

    @property
    def metadata(self) -> ToolMetadata:
        return self._tool.metadata

    @property
    def tool(self) -> BaseTool:
        """The tool this wraps, as it was given."""
        return self._given

    @property
    def expected_latency(self) -> Optional[float]:
        """Expected seconds of one run: the mean of the runs measured so far, else the `tool_seconds`
        given (else None). The engine's pay-back rule weighs it (`speculative_tools=`)."""
        return self._runner.expected_latency().get(self.metadata.get_name())

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        if args or not _is_json(kwargs):
            return self._tool.call(*args, **kwargs)
        return self._runner.run(self.metadata.get_name(), kwargs, lambda: self._tool.call(**kwargs))

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        if args or not _is_json(kwargs):
            return await self._tool.acall(*args, **kwargs)
        return await self._runner.arun(self.metadata.get_name(), kwargs, lambda: self._tool.acall(**kwargs))

    @classmethod
    def wrap(cls, tool: BaseTool, runner: SpeculativeTools) -> "SpeculativeTool":
        """The wrapper of `tool`: a SpeculativeFunctionTool for a FunctionTool, else a SpeculativeTool."""
        kind = SpeculativeFunctionTool if isinstance(tool, FunctionTool) else SpeculativeTool
        return kind(tool, runner)


class SpeculativeFunctionTool(SpeculativeTool, FunctionTool):
    """A marked FunctionTool's wrapper: a FunctionTool of the same function (its signature and Context
    parameter as LlamaIndex inspects them) whose calls go through the runner as SpeculativeTool's do. Its
    own `partial_params` are empty: the wrapped tool adds its own, so a call's key is the model's call."""

    def __init__(self, tool: FunctionTool, runner: SpeculativeTools) -> None:
        FunctionTool.__init__(self, fn=tool.real_fn, metadata=tool.metadata)
        SpeculativeTool.__init__(self, tool, runner)


class SpeculativeToolsHandler(BaseEventHandler):
    """Feeds a runner from OoOSpec's instrumentation events: `CallPredictedEvent` -> `predicted`,
    `ToolCallReadyEvent` -> `ready`, `ReplyEndEvent` -> `settle` (the model step is over). With
    `llm_id`, only the replies of that OoOSpec (`id(llm)`). The dispatcher swallows a handler's
    exceptions, so a failure here is logged as a warning: the calls then run when the agent runs them."""

    runner: Any = Field(exclude=True, description="The oospec_agents.speculative.SpeculativeTools it feeds.")
    llm_id: Optional[int] = Field(default=None, description="id() of the one OoOSpec followed; None: every one.")

    @classmethod
    def class_name(cls) -> str:
        return "SpeculativeToolsHandler"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if not isinstance(event, (CallPredictedEvent, ToolCallReadyEvent, ReplyEndEvent)):
            return
        if self.llm_id is not None and event.llm_id != self.llm_id:
            return
        try:
            if isinstance(event, CallPredictedEvent):
                self.runner.predicted(event.calls, event.confidence)
            elif isinstance(event, ToolCallReadyEvent):
                self.runner.ready(event.tool_name, event.tool_kwargs)
            else:
                self.runner.settle([{"name": c.tool_name, "arguments": c.tool_kwargs} for c in event.tool_calls])
        except Exception:
            _log.warning("speculative tools: %s could not be handled; its calls run when the agent runs them",
                         event.class_name(), exc_info=True)


class AgentLoop(BaseSpanHandler[SimpleSpan]):
    """The event loop of the latest OoOSpec async chat (`achat`, `astream_chat`; with `llm_id`, only
    that OoOSpec's): the agent's loop, where its tool calls run. A sync chat sets it to None. OoOSpec
    decodes in a worker thread, so the events that start runs come from there: this span handler sees
    the chat begin on the agent's own thread, before the decode."""

    llm_id: Optional[int] = Field(default=None, description="id() of the one OoOSpec followed; None: every one.")
    loop: Any = Field(default=None, exclude=True, description="The agent's event loop, or None.")

    def __init__(self, llm_id: Optional[int] = None) -> None:
        super().__init__()  # BaseSpanHandler's __init__ takes its own fields only
        self.llm_id = llm_id

    @classmethod
    def class_name(cls) -> str:
        return "AgentLoop"

    def new_span(self, id_: str, bound_args: Any, instance: Optional[Any] = None, parent_span_id: Optional[str] = None,
                 tags: Optional[Dict[str, Any]] = None, **kwargs: Any) -> None:
        if type(instance).__name__ != "OoOSpec" or self.llm_id not in (None, id(instance)):
            return None
        method = id_.partition("-")[0].rpartition(".")[2]
        if method in ("achat", "astream_chat"):
            self.loop = asyncio.get_running_loop()
        elif method in ("chat", "stream_chat"):
            self.loop = None
        return None

    def prepare_to_exit_span(self, *args: Any, **kwargs: Any) -> None:
        return None

    def prepare_to_drop_span(self, *args: Any, **kwargs: Any) -> None:
        return None


class OoOSpecSpeculativeTools:
    """The tools of a LlamaIndex agent, of which the `speculative` ones start early from OoOSpec's
    predictions and ready calls.

    `tools`: the agent's tools (BaseTools or plain functions, as `FunctionAgent(tools=...)` takes them).
    `speculative`: the ones safe to start before the agent runs them (read-only and idempotent; see
    docs/speculative-tools.md), by name, tool or function. `llm`: follow only this OoOSpec's replies
    (None: every OoOSpec's). `max_in_flight`, `min_confidence`, `tool_seconds` (the expected seconds of
    one run by tool name, until measured: the engine's pay-back rule weighs them): the runner's, as
    `SpeculativeToolsMiddleware` takes them in LangChain.

    Give `.tools` to the agent; `.stats` counts `predictions`, `started`, `hits` and `wasted` (and the
    runner's other counters). Close it (or use it as a context manager) to stop following the replies
    and stop the runner's threads.

    Examples:
        ```python
        llm = OoOSpec()
        with OoOSpecSpeculativeTools([get_weather, send_email], speculative=["get_weather"], llm=llm) as spec:
            agent = FunctionAgent(tools=spec.tools, llm=llm)
            print(await agent.run("Weather in Paris?"), spec.stats)
        ```
    """

    def __init__(self, tools: Sequence[Union[BaseTool, Callable[..., Any]]],
                 speculative: Iterable[Any], *, llm: Any = None, max_in_flight: int = 4,
                 min_confidence: Optional[float] = None, tool_seconds: Optional[Mapping[str, float]] = None) -> None:
        given = [_as_tool(t, i) for i, t in enumerate(tools)]
        by_name: Dict[str, BaseTool] = {}
        for tool in given:
            name = tool.metadata.get_name()
            if name in by_name:
                raise ValueError(f"two tools are named {name!r}: the model's calls could not tell them apart")
            by_name[name] = tool
        marked = _marked(speculative, by_name)
        if not marked:
            warn_nothing_speculative(type(self).__name__, stacklevel=2)
        for name in marked:
            tool = by_name[name]
            if isinstance(tool, FunctionTool) and tool.requires_context:
                raise ValueError(f"tool {name!r} takes the workflow Context ({tool.ctx_param_name!r}), which only the "
                                 "agent's own call has: it cannot be started early, so it cannot be speculative")
        llm_id = None if llm is None else _llm_id(llm)
        self.agent_loop = AgentLoop(llm_id=llm_id)
        self.runner = SpeculativeTools({name: _speculative_run(adapt_to_async_tool(by_name[name]), self.agent_loop)
                                        for name in marked},
                                       max_in_flight=max_in_flight, min_confidence=min_confidence,
                                       tool_seconds=tool_seconds)
        self.tools: List[BaseTool] = [SpeculativeTool.wrap(t, self.runner) if t.metadata.get_name() in marked else t
                                      for t in given]
        self.handler = SpeculativeToolsHandler(runner=self.runner, llm_id=llm_id)
        dispatcher.add_event_handler(self.handler)
        get_dispatcher().add_span_handler(self.agent_loop)

    @property
    def stats(self) -> Dict[str, int]:
        """The runner's counters: `predictions`, `started`, `hits`, `wasted`, `ready_started`, `ready_hits`,
        `errors_discarded`, `cancelled`, `skipped_in_flight`, `skipped_confidence`, `not_speculative`."""
        return self.runner.stats

    def expected_latency(self) -> Dict[str, Optional[float]]:
        """Per speculative tool: the mean measured seconds of its runs, before any the `tool_seconds`
        given, else None."""
        return self.runner.expected_latency()

    def close(self) -> None:
        """Stop following the replies, cancel the runs left, and stop the runner's threads. Idempotent."""
        dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not self.handler]
        root = get_dispatcher()
        root.span_handlers = [h for h in root.span_handlers if h is not self.agent_loop]
        self.runner.close()

    def __enter__(self) -> "OoOSpecSpeculativeTools":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _as_tool(tool: Any, index: int) -> BaseTool:
    """A tool as FunctionAgent takes it: a BaseTool, or a function made a FunctionTool."""
    if isinstance(tool, BaseTool):
        return tool
    if callable(tool):
        return FunctionTool.from_defaults(tool)
    raise TypeError(f"tools[{index}] must be a LlamaIndex BaseTool or a function, got {type(tool).__name__}")


def _marked(speculative: Any, by_name: Dict[str, BaseTool]) -> List[str]:
    """The speculative tools' names, in order."""
    if isinstance(speculative, Mapping):
        raise TypeError("speculative is a list of tool names, tools or functions; give the expected seconds of "
                        f"one run as tool_seconds={{name: seconds}} (got the mapping {dict(speculative)!r})")
    if isinstance(speculative, (str, bytes)) or not isinstance(speculative, Iterable):
        raise TypeError(f"speculative must be a list of tool names, tools or functions, got {speculative!r}")
    return list(dict.fromkeys(_name_of(entry, by_name) for entry in speculative))


def _name_of(entry: Any, by_name: Dict[str, BaseTool]) -> str:
    """The name of one `speculative` entry, which must be one of the tools."""
    if isinstance(entry, str):
        name = entry
    elif isinstance(entry, BaseTool):
        name = entry.metadata.get_name()
    elif callable(entry):
        name = getattr(entry, "__name__", repr(entry))
    else:
        raise TypeError(f"speculative entries are tool names, tools or functions, got {entry!r}")
    if name not in by_name:
        raise ValueError(f"speculative names {name!r}, which is not one of the tools ({sorted(by_name)})")
    return name


def _speculative_run(tool: AsyncBaseTool, agent: AgentLoop) -> Callable[[Dict[str, Any]], Any]:
    """How the runner starts `tool` early, by the path the agent's `acall` takes: a tool whose async path
    is a sync function on a thread (a FunctionTool of a plain function, an adapted sync BaseTool) runs
    `call` on the runner's pool; any other runs `acall` on the agent's event loop (`agent.loop`), else
    on the runner's. Cancelling the run cancels its task there (quietly: a stdio session torn down by the
    cancellation may end it raising)."""
    threaded = isinstance(tool, BaseToolAsyncAdapter) or (
        isinstance(tool, FunctionTool) and getattr(tool.async_fn, "__code__", None) is _SYNC_TO_ASYNC)
    if threaded:
        return lambda arguments: tool.call(**arguments)

    async def run(arguments: Dict[str, Any]) -> Awaitable[ToolOutput]:
        return await run_on_loop(agent.loop, tool.acall(**arguments))
    return run


def _llm_id(llm: Any) -> int:
    from .base import OoOSpec  # base imports this module
    if not isinstance(llm, OoOSpec):
        raise TypeError(f"llm must be an OoOSpec (only it dispatches the predictions), got {type(llm).__name__}")
    return id(llm)


def _is_json(kwargs: Dict[str, Any]) -> bool:
    """Whether a call's keyword arguments are JSON, as a model's call is (`call_key` can key it)."""
    try:
        call_key("tool", kwargs)
    except ValueError:
        return False
    return True
