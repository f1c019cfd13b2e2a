"""LangChain messages to the OpenAI-style chat dicts that `Engine.generate` reads."""
from __future__ import annotations

from typing import Any, Sequence

from langchain_core.messages import (AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage,
                                     ToolMessage)

from oospec_agents.frontend import join_text_parts

# Blocks that are not the message's text: what `AIMessage.tool_calls` already carries (Anthropic-style
# `tool_use`, v1 `tool_call`), and reasoning (LangChain's standard `reasoning` block, which goes back as
# `reasoning_content`; another provider's `thinking`, which no chat template here reads).
_SKIPPED_BLOCKS = frozenset({"tool_use", "tool_call", "tool_call_chunk", "invalid_tool_call",
                             "reasoning", "thinking"})
_CHAT_ROLES = {"human": "user", "ai": "assistant"}


def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict]:
    """Convert a LangChain history, in any order agents produce, to engine chat dicts."""
    return [_convert(message, f"messages[{i}]") for i, message in enumerate(messages)]


def _convert(message: BaseMessage, where: str) -> dict:
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": _text(message.content, where)}
    if isinstance(message, HumanMessage):
        return {"role": "user", "content": _text(message.content, where)}
    if isinstance(message, AIMessage):
        out: dict[str, Any] = {"role": "assistant", "content": _text(message.content, where)}
        if reasoning := _reasoning(message):
            out["reasoning_content"] = reasoning
        if message.tool_calls:
            out["tool_calls"] = [{"id": call["id"], "type": "function",
                                  "function": {"name": call["name"], "arguments": call["args"]}}
                                 for call in message.tool_calls]
        return out
    if isinstance(message, ToolMessage):
        out = {"role": "tool", "content": _text(message.content, where), "tool_call_id": message.tool_call_id}
        if message.name:
            out["name"] = message.name
        return out
    if isinstance(message, ChatMessage):
        return {"role": _CHAT_ROLES.get(message.role, message.role), "content": _text(message.content, where)}
    raise ValueError(f"{where}: ChatOoOSpec does not accept {type(message).__name__}; expected a System, "
                     "Human, AI, Tool or Chat message")


def _reasoning(message: AIMessage) -> str | None:
    """An earlier reply's reasoning, for templates that write it back: `additional_kwargs["reasoning_content"]`
    (ChatOoOSpec's, ChatOllama's, ChatDeepSeek's), else its standard reasoning blocks joined (a message
    made with `output_version="v1"`, or by hand). The engine drops it for templates that do not read it."""
    given = message.additional_kwargs.get("reasoning_content")
    if isinstance(given, str):
        return given
    if isinstance(message.content, str):
        return None
    parts = [b.get("reasoning", "") for b in message.content if isinstance(b, dict) and b.get("type") == "reasoning"]
    return join_text_parts(parts) if parts else None


def _text(content: str | list, where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") not in _SKIPPED_BLOCKS:
            raise ValueError(f"{where}: ChatOoOSpec reads text only, got a {block.get('type')!r} content block")
    return join_text_parts(parts)
