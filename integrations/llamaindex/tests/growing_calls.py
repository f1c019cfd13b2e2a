"""What a streamed tool call must look like in LlamaIndex terms (a uniquely named module: the test
folders' conftest modules all share the name `conftest`)."""
from __future__ import annotations

from llama_index.core.base.llms.types import ToolCallBlock


def call_blocks(response) -> list[ToolCallBlock]:
    return [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]


def assert_call_grows(chunks, name: str, arguments: dict) -> list[dict]:
    """Check the stream of one tool call: its block appears with the call's id and name and no
    arguments yet, then its `tool_kwargs` only grow (a value is kept or extended, never changed)
    until the last response holds the validated call. Returns the distinct `tool_kwargs` seen."""
    states = [call_blocks(c)[0] for c in chunks if call_blocks(c)]
    assert states, "no response carried a ToolCallBlock"
    assert (states[0].tool_name, states[0].tool_kwargs) == (name, {})
    assert {(b.tool_call_id, b.tool_name) for b in states} == {(states[0].tool_call_id, name)}
    seen = [s.tool_kwargs for s in states]
    for before, after in zip(seen, seen[1:]):
        assert all(k in after and str(after[k]).startswith(str(v)) for k, v in before.items()), \
            f"tool_kwargs went from {before} to {after}"
    assert seen[-1] == arguments
    return [s for i, s in enumerate(seen) if s not in seen[:i]]
