"""oospec-agents: lossless out-of-order semantic speculation for LLM tool calls."""
from .engine import Engine, Generation
from .request import ChatRequest
from .events import CallPredicted, LogprobsDelta, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallReady
from .stats import DecodeStats
from .errors import (ChatFormatError, ContextLengthError, DeviceError, ModelLoadError, OoOSpecError,
                     SamplingError, ToolSchemaError, UnknownToolError)

__all__ = ["Engine", "Generation", "ChatRequest", "ReasoningDelta", "TextDelta", "ToolCallDelta", "LogprobsDelta", "CallPredicted", "ToolCallReady", "DecodeStats", "OoOSpecError", "ToolSchemaError", "UnknownToolError", "ChatFormatError",
           "ContextLengthError", "DeviceError", "ModelLoadError", "SamplingError"]
__version__ = "0.1.0"
