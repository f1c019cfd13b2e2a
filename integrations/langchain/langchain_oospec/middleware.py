"""SpeculativeToolsMiddleware: `langchain.agents.create_agent` runs read-only tools before the call is written.

Add it with the tools that are safe to run early, and the agent's tool step finds their results ready:

```python
from langchain.agents import create_agent
from langchain_oospec import ChatOoOSpec, SpeculativeToolsMiddleware

speculative = SpeculativeToolsMiddleware(speculative=[get_weather, "search_docs"])
agent = create_agent(ChatOoOSpec(model="embedded"), tools=[get_weather, search_docs, send_email],
                     middleware=[speculative])
agent.invoke({"messages": [("user", "Weather in Paris?")]})
speculative.stats   # {"predictions": 1, "started": 1, "hits": 1, "wasted": 0, ...}
```

`wrap_model_call` runs the model call as a model step of `SpeculativeToolCalls` (speculative_tools.py):
ChatOoOSpec's predictions reach the runner through LangChain's callbacks, and the reply's tool calls
settle it. `wrap_tool_call` hands an identical run over through the agent's own ToolNode execution, or
runs the tool normally. The middleware needs the `langchain` package (the `agents` extra).
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError as e:  # langchain-oospec itself needs only langchain-core
    raise ImportError('SpeculativeToolsMiddleware needs the langchain package (LangChain v1 agents), which '
                      'langchain-oospec does not install by default: pip install "langchain-oospec[agents]"') from e

from .chat_models import ChatOoOSpec
from .speculative_tools import SpeculativeToolCalls


class SpeculativeToolsMiddleware(SpeculativeToolCalls, AgentMiddleware):
    """Agent middleware that starts the speculative tools from ChatOoOSpec's predicted call, sync and async.

    Args:
        speculative: the tools that may run before the agent runs them (read-only and idempotent:
            lookups, searches, GETs; docs/speculative-tools.md), each a tool, a tool's name or the
            function the agent's tool was made from. Tools not named are never started early.
        max_in_flight: at most this many speculative runs at once.
        min_confidence: when set, a prediction whose confidence is below it (or unknown) starts nothing.
        tool_seconds: the expected seconds of speculative tools until measured; with ChatOoOSpec the
            engine's pay-back rule weighs them (the wave runs where the tool time a hit hides pays for it).

    `stats`: the runner's counters, `predictions`, `started`, `hits` and `wasted` among them. Place it
    before middleware that selects or rewrites tools, so it sees the agent's own tools. `close()` stops
    the runner's threads.
    """

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        request = self._request(request)
        return self.model_step(lambda: handler(request))

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        request = self._request(request)
        return await self.amodel_step(lambda: handler(request))

    def _request(self, request: Any) -> Any:
        """The model request, its named tools resolved; to a ChatOoOSpec it also says which speculative
        tools are on offer and their expected seconds (`speculative_tools=`, for the pay-back rule)."""
        self.offer(request.tools)
        if not isinstance(request.model, ChatOoOSpec):
            return request
        return request.override(model_settings={**request.model_settings,
                                                "speculative_tools": self.speculative_tools()})
