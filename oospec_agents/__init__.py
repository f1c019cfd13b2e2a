"""oospec-agents: lossless out-of-order semantic speculation for LLM tool calls."""
from .engine import Engine, Generation
from .events import LogprobsDelta, ReasoningDelta, TextDelta, ToolCallDelta
from .stats import DecodeStats
from .errors import (ChatFormatError, ContextLengthError, DeviceError, ModelLoadError, OoOSpecError,
                     SamplingError, ToolSchemaError, UnknownToolError)

__all__ = ["Engine", "Generation", "ReasoningDelta", "TextDelta", "ToolCallDelta", "LogprobsDelta", "DecodeStats", "OoOSpecError", "ToolSchemaError", "UnknownToolError", "ChatFormatError",
           "ContextLengthError", "DeviceError", "ModelLoadError", "SamplingError"]
__version__ = "0.1.0"
