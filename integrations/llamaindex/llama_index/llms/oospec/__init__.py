"""LlamaIndex integration for oospec-agents: the `OoOSpec` LLM, and speculative tools for its agents."""
from llama_index.llms.oospec.base import OoOSpec
from llama_index.llms.oospec.events import CallPredictedEvent, ReplyEndEvent, ToolCallReadyEvent
from llama_index.llms.oospec.speculative import (OoOSpecSpeculativeTools, SpeculativeFunctionTool, SpeculativeTool,
                                                 SpeculativeToolsHandler)

__all__ = ["OoOSpec", "CallPredictedEvent", "ToolCallReadyEvent", "ReplyEndEvent", "OoOSpecSpeculativeTools",
           "SpeculativeTool", "SpeculativeFunctionTool", "SpeculativeToolsHandler"]
