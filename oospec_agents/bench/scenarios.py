"""What a measured request follows: nothing (cold), a request with the same tools (warm tools), the
agent's own first turn (agent loop), or the earlier records (history).

Each scenario gives every record two `Turn`s, measured side by side: "warm", the request as it
arrives after the unmeasured requests in `before`, with the prefix cache they left; and "cold", the
same request with the prefix cache emptied (and the same retrieval memory). So warm against cold is
the prefix cache's effect and nothing else.

    cold        the record as it is (no warm pass)
    warm_tools  before: one request with the same system prompt and tools and another user message;
                the retrieval memory is cleared after it, so no method sees the answer in advance
    agent_loop  before: the record itself (turn 1). Measured: turn 2, the same conversation plus the
                record's expected call(s) and a tool result for each, with tool_choice="auto", as a
                `create_agent` / `FunctionAgent` loop sends after every tool call. Retrieval keeps
                turn 1's reply: it is the same session.
    history     the record as it is, cold, but retrieval keeps the replies this method wrote to the
                earlier records (in record order, per tool set, as a deployment's call memory does):
                what cross-request drafting gains. No method recalls another's reply, and the
                warm-up's are forgotten, so none has seen the measured record's answer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

SCENARIOS = ("cold", "warm_tools", "agent_loop", "history")

#: the warm-up request's user message: same tools, a question no record asks
WARM_UP_QUESTION = "Hello! Which of your tools could help me today?"


@dataclass(frozen=True)
class Turn:
    messages: list[dict]
    tools: list[dict]
    tool_choice: str
    before: list[tuple[list[dict], str]] = field(default_factory=list)  # (messages, tool_choice), unmeasured
    keep_memory: bool = False   # retrieval keeps the replies of `before`
    cached: bool = True         # the prefix cache keeps what `before` left
    history: bool = False       # retrieval keeps this method's replies to the earlier records


def warm_up_messages(messages: list[dict]) -> list[dict]:
    """The conversation up to its last user message, which is replaced by `WARM_UP_QUESTION`."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None:
        raise ValueError("a warm-tools record needs a user message")
    return [dict(m) for m in messages[:last]] + [{"role": "user", "content": WARM_UP_QUESTION}]


def tool_result(call: dict) -> str:
    """The tool message for one expected call: a fixed success body (the records carry no tool output)."""
    return json.dumps({"name": call["name"], "status": "success"}, ensure_ascii=False)


def second_turn(rec: dict) -> list[dict]:
    """The record's conversation, then its expected call(s) as the assistant's turn, then their results."""
    calls = rec.get("expected") or []
    if not calls:
        raise ValueError(f"record {rec.get('id')!r} expects no call: the agent-loop scenario needs one")
    ids = [f"call_{i}" for i in range(len(calls))]
    assistant = {"role": "assistant", "content": "", "tool_calls": [
        {"id": i, "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
        for i, c in zip(ids, calls)]}
    results = [{"role": "tool", "tool_call_id": i, "content": tool_result(c)} for i, c in zip(ids, calls)]
    return [dict(m) for m in rec["messages"]] + [assistant] + results


def turns(rec: dict, scenario: str, tool_choice: str) -> dict[str, Turn]:
    """{"cold": Turn, "warm": Turn} for a warm scenario (cold runs first: its AR is the reference),
    {"cold": Turn} for the plain one."""
    msgs, tools = rec["messages"], rec["tools"]
    if scenario == "cold":
        return {"cold": Turn(msgs, tools, tool_choice)}
    if scenario == "history":
        return {"cold": Turn(msgs, tools, tool_choice, keep_memory=True, history=True)}
    if scenario == "warm_tools":
        warm = Turn(msgs, tools, tool_choice, before=[(warm_up_messages(msgs), tool_choice)])
        return {"cold": Turn(msgs, tools, tool_choice), "warm": warm}
    if scenario == "agent_loop":
        warm = Turn(second_turn(rec), tools, "auto", before=[(msgs, tool_choice)], keep_memory=True)
        return {"cold": Turn(warm.messages, tools, "auto", warm.before, keep_memory=True, cached=False), "warm": warm}
    raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")
