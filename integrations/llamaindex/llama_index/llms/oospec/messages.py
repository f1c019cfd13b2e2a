"""Translate between LlamaIndex chat messages and the engine's OpenAI-style chat dicts."""
from __future__ import annotations

import json
from typing import Any, Sequence

from llama_index.core.base.llms.types import (
    CachePoint,
    ChatMessage,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms.llm import ToolSelection
from oospec_agents.frontend import join_text_parts

_ENGINE_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.TOOL: "tool",
}
# Blocks left out of a message's text: tool calls travel separately as "tool_calls", an assistant's
# reasoning as "reasoning_content" (the engine drops it for templates that do not read it); cache hints
# are for hosted APIs.
_NOT_TEXT = (ToolCallBlock, CachePoint, ThinkingBlock)


def to_engine_messages(messages: Sequence[ChatMessage]) -> list[dict]:
    """LlamaIndex messages as the engine's chat dicts: assistant tool calls and tool results included."""
    if isinstance(messages, (str, ChatMessage)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of ChatMessage, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty; pass at least one ChatMessage")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise TypeError(f"messages[{i}] must be a ChatMessage, got {type(message).__name__}")
        role = _ENGINE_ROLES.get(message.role)
        if role is None:
            raise ValueError(f"messages[{i}] has role {message.role.value!r}; OoOSpec accepts "
                             f"{sorted({r.value for r in _ENGINE_ROLES})}")
        entry: dict[str, Any] = {"role": role, "content": _text(message, i)}
        if role == "assistant":
            thoughts = [b.content for b in message.blocks if isinstance(b, ThinkingBlock) and b.content]
            if thoughts:
                entry["reasoning_content"] = join_text_parts(thoughts)
            calls = tool_calls_of(message)
            if calls:
                entry["tool_calls"] = [{"id": c.tool_id, "type": "function",
                                        "function": {"name": c.tool_name, "arguments": c.tool_kwargs}}
                                       for c in calls]
        elif role == "tool":
            entry["tool_call_id"] = message.additional_kwargs.get("tool_call_id")
            if message.additional_kwargs.get("name"):
                entry["name"] = message.additional_kwargs["name"]
        out.append(entry)
    return out


def tool_calls_of(message: ChatMessage) -> list[ToolSelection]:
    """The calls an assistant message carries: its ToolCallBlocks, or else the older
    `additional_kwargs["tool_calls"]` (OpenAI dicts or objects) that other integrations wrote."""
    blocks = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    if blocks:
        return [ToolSelection(tool_id=b.tool_call_id or b.tool_name, tool_name=b.tool_name,
                              tool_kwargs=_arguments(b.tool_kwargs, b.tool_name))
                for b in blocks]
    selections = []
    for call in message.additional_kwargs.get("tool_calls") or []:
        if hasattr(call, "model_dump"):
            call = call.model_dump()
        if not isinstance(call, dict):
            raise TypeError(f"additional_kwargs['tool_calls'] holds a {type(call).__name__}; "
                            "expected OpenAI-style tool call dicts")
        function = call.get("function") or {}
        name = function.get("name")
        if not name:
            raise ValueError(f"tool call {call!r:.120} has no function name")
        selections.append(ToolSelection(tool_id=call.get("id") or name, tool_name=name,
                                        tool_kwargs=_arguments(function.get("arguments"), name)))
    return selections


def assistant_message(content: str, tool_calls: list[dict], reasoning: str | None = None) -> ChatMessage:
    """The reply as a LlamaIndex message: its reasoning (a ThinkingBlock, when there is any), its text,
    then one ToolCallBlock per call (the order llama-index-llms-openai gives them)."""
    blocks: list = [ThinkingBlock(content=reasoning)] if reasoning else []
    blocks.append(TextBlock(text=content))
    blocks += [ToolCallBlock(tool_call_id=c["id"], tool_name=c["name"], tool_kwargs=c["arguments"])
               for c in tool_calls]
    return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)


def _text(message: ChatMessage, i: int) -> str:
    for block in message.blocks:
        if not isinstance(block, (TextBlock, *_NOT_TEXT)):
            raise ValueError(f"messages[{i}] holds a {type(block).__name__}; OoOSpec targets read "
                             "text only (TextBlock)")
    return join_text_parts(b.text for b in message.blocks if isinstance(b, TextBlock))


def _arguments(arguments: Any, name: str) -> dict:
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise ValueError(f"tool call {name!r} has arguments that are not valid JSON ({e}): "
                             f"{arguments!r:.120}") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"tool call {name!r} has arguments {arguments!r:.120}; expected a JSON object")
    return arguments
