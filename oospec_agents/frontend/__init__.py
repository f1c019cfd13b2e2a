"""The seam every front-end stands on: LangChain's ChatOoOSpec, LlamaIndex's OoOSpec and the server.

- The typed request and its sampling rules (request.py, re-exported here): `ChatRequest` (`ChatRequest.of`
  builds it from a front-end's settings, `settings` reads them over layers), `read_sampling`,
  `choice_count`, `openai_logprobs`, `check_penalties`.
- engines.py: `EngineLike`, what a front-end asks of an engine; `LazyEngine`, engine selection, loaded on
  first use and shared between chat-model objects.
- bridge.py: `Bridge`, the one sync-to-async bridge for the engine's blocking event stream; `aiterate` runs
  it on the loop's executor, the server's scheduler (serve/scheduler.py) on its queue's worker.
- replies.py: what a front-end reads off a reply: `Usage`, `CallsSoFar` (tool calls folded from
  `ToolCallDelta`s), `ParallelToolCalls` (the `parallel_tool_calls=False` rule), `call_problems`.
- `join_text_parts`: how the text parts of one message become its text (chat.py).

Framework idioms stay in the front-ends; nothing here imports LangChain, LlamaIndex, FastAPI or the
server's package (serve/ imports this package, never the other way).
"""
from ..chat import join_text_parts
from ..request import (MAX_CHOICES, OPENAI_SETTINGS, PENALTIES, SETTINGS, ChatRequest, check_penalties,
                       choice_count, openai_logprobs, read_sampling, settings)
from .bridge import Bridge, aiterate
from .engines import EngineLike, LazyEngine
from .replies import CallsSoFar, ParallelToolCalls, Usage, call_problems

__all__ = ["join_text_parts", "MAX_CHOICES", "OPENAI_SETTINGS", "PENALTIES", "SETTINGS", "ChatRequest",
           "check_penalties", "choice_count", "openai_logprobs", "read_sampling", "settings", "Bridge", "aiterate",
           "EngineLike", "LazyEngine", "CallsSoFar", "ParallelToolCalls", "Usage", "call_problems"]
