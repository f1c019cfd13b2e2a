"""The engine's speculative-tool events as LangChain custom events, so any callback handler sees them.

`ChatOoOSpec` dispatches each `CallPredicted` (the sidecar's predicted call: never a verified one)
and `ToolCallReady` (a verified call whose arguments have closed, before the reply ends) of its
engine stream as a custom event of the model's own run, named `CALL_PREDICTED` / `TOOL_CALL_READY`,
its data the event's fields as a dict. A handler receives them in `on_custom_event`, and
`astream_events` yields them as `"on_custom_event"` events. One exception: LangChain's own
`BaseChatModel.stream` / `astream` keep the model's run manager to themselves, so there the events
are custom events of the run that called `stream` (a chain, a graph node, a RunnableLambda), and
`stream` called outside any run dispatches none. `invoke`, `ainvoke`, `batch`, agents and LangGraph's
`stream_mode="messages"` (which streams through `invoke`) dispatch them on the model's run.
`SpeculativeToolsMiddleware` is one such handler; `from_custom_event` turns the data back into the
engine's event.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from langchain_core.callbacks import (AsyncCallbackManager, AsyncCallbackManagerForLLMRun, CallbackManager,
                                      CallbackManagerForLLMRun)
from langchain_core.runnables.config import (ensure_config, get_async_callback_manager_for_config,
                                             get_callback_manager_for_config)

from oospec_agents.events import CallPredicted, ToolCallReady

#: the custom event of a `CallPredicted`: data {"calls": [{"name", "arguments": dict}], "confidence"}
CALL_PREDICTED = "oospec_call_predicted"
#: the custom event of a `ToolCallReady`: data {"index", "id", "name", "arguments": dict}
TOOL_CALL_READY = "oospec_tool_call_ready"

_NAMES = {CallPredicted: CALL_PREDICTED, ToolCallReady: TOOL_CALL_READY}
_EVENTS = {name: cls for cls, name in _NAMES.items()}

#: the engine events that become custom events
SpeculativeEvent = CallPredicted | ToolCallReady


def as_custom_event(event: SpeculativeEvent) -> tuple[str, dict]:
    """(name, data) of the custom event for `event`: the data a copy of its fields."""
    return _NAMES[type(event)], dataclasses.asdict(event)


def from_custom_event(name: str, data: Any) -> SpeculativeEvent | None:
    """The engine event a custom event carries, or None for any other custom event."""
    cls = _EVENTS.get(name)
    return None if cls is None else cls(**data)


def dispatch(run_manager: CallbackManagerForLLMRun | None, event: SpeculativeEvent) -> None:
    """Send `event` to the handlers of the model's run, as a custom event of that run (LLM run managers
    have no `on_custom_event`: a manager of the run's handlers sends it). Without a run manager (LangChain's
    `BaseChatModel.stream` gives `_stream` none) it goes to the run in context, as
    `langchain_core.callbacks.dispatch_custom_event` sends it; outside any run there is no handler to tell."""
    name, data = as_custom_event(event)
    if run_manager is not None:
        _manager(CallbackManager, run_manager).on_custom_event(name, data, run_id=run_manager.run_id)
    elif (manager := get_callback_manager_for_config(ensure_config())).parent_run_id is not None:
        manager.on_custom_event(name, data, run_id=manager.parent_run_id)


async def adispatch(run_manager: AsyncCallbackManagerForLLMRun | None, event: SpeculativeEvent) -> None:
    """`dispatch` for the async run managers of `_astream` / `_agenerate`."""
    name, data = as_custom_event(event)
    if run_manager is not None:
        await _manager(AsyncCallbackManager, run_manager).on_custom_event(name, data, run_id=run_manager.run_id)
    elif (manager := get_async_callback_manager_for_config(ensure_config())).parent_run_id is not None:
        await manager.on_custom_event(name, data, run_id=manager.parent_run_id)


def _manager(cls: type, run_manager: Any) -> Any:
    """A callback manager holding the handlers, tags and metadata of the model's run (LLM run managers
    have no `on_custom_event` of their own)."""
    return cls(handlers=run_manager.handlers, inheritable_handlers=run_manager.inheritable_handlers,
               parent_run_id=run_manager.run_id, tags=run_manager.tags, inheritable_tags=run_manager.inheritable_tags,
               metadata=run_manager.metadata, inheritable_metadata=run_manager.inheritable_metadata)
