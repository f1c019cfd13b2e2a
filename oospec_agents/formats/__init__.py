"""Tool-call text formats and their detection from a chat template."""
from __future__ import annotations

from .base import ToolFormat
from .hermes import HermesFormat
from .llama3_json import Llama3JsonFormat

FORMATS: dict[str, type[ToolFormat]] = {"hermes": HermesFormat, "llama3_json": Llama3JsonFormat}


def get_format(name: str) -> ToolFormat:
    try:
        return FORMATS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; known formats: {sorted(FORMATS)}") from None


def detect_format(chat_template: str | None) -> ToolFormat:
    """Llama-3 templates (ipython role / python_tag / eot_id) get llama3_json; everything else,
    ChatML and Qwen included, gets hermes."""
    t = chat_template or ""
    if "<|python_tag|>" in t or "ipython" in t or ("<|eot_id|>" in t and "<tool_call>" not in t):
        return Llama3JsonFormat()
    return HermesFormat()


__all__ = ["ToolFormat", "HermesFormat", "Llama3JsonFormat", "FORMATS", "get_format", "detect_format"]
