"""Tool-call text formats and their detection from a chat template."""
from __future__ import annotations

import re

from .base import ToolFormat
from .harmony import HarmonyFormat, HarmonyReasoning, detect_harmony
from .hermes import HermesFormat
from .llama3_json import Llama3JsonFormat
from .mistral import MistralFormat
from .pythonic import PythonicFormat
from .reasoning import Reasoning, detect_reasoning

FORMATS: dict[str, type[ToolFormat]] = {"hermes": HermesFormat, "llama3_json": Llama3JsonFormat,
                                        "mistral": MistralFormat, "pythonic": PythonicFormat,
                                        "harmony": HarmonyFormat}

# The pythonic instruction as Llama 3.2 / Llama 4 / Gemma 3 pythonic templates write it:
# "[func_name1(params_name1=params_value1, ...), func_name2(params)]" or "[func_name1(param1=value1, ...)]"
_PYTHONIC = re.compile(r"\[func_name1\(param")


def get_format(name: str) -> ToolFormat:
    try:
        return FORMATS[name]()
    except KeyError:
        raise ValueError(f"unknown tool-call format {name!r}; known formats: {sorted(FORMATS)}") from None


def detect_format(chat_template: str | None) -> ToolFormat:
    """In order: a harmony template (gpt-oss's channels) gets harmony; a template that asks for a
    python list of calls gets pythonic (Llama 3.2/4 pythonic templates have Llama's ipython role too,
    so this comes first); one with Mistral's `[TOOL_CALLS]`
    or `[AVAILABLE_TOOLS]` gets mistral; Llama-3 templates (ipython role / python_tag / eot_id) get
    llama3_json; everything else, ChatML and Qwen included, gets hermes."""
    t = chat_template or ""
    if detect_harmony(t):
        return HarmonyFormat()
    if _PYTHONIC.search(t):
        return PythonicFormat()
    if "[TOOL_CALLS]" in t or "[AVAILABLE_TOOLS]" in t:
        return MistralFormat()
    if "<|python_tag|>" in t or "ipython" in t or ("<|eot_id|>" in t and "<tool_call>" not in t):
        return Llama3JsonFormat()
    return HermesFormat()


__all__ = ["ToolFormat", "HarmonyFormat", "HarmonyReasoning", "HermesFormat", "Llama3JsonFormat", "MistralFormat",
           "PythonicFormat", "FORMATS", "get_format", "detect_format", "Reasoning", "detect_reasoning"]
