"""A finished reply, read: what `Generation` reports that its text decides.

Its content, its calls classed as OpenAI classes them (`tools.check_calls`), its reasoning, and its
`finish_reason`, read from the reply's text as its stream read it (`events.ReplyEvents`).
"""
from __future__ import annotations

from .events import ReplyEvents
from .formats.base import ENDED_INSIDE, UNTERMINATED
from .tools import Tool, check_calls


def read_reply(events: ReplyEvents, text: str, tools: list[Tool], id_prefix: str, finish: str,
               ended: bool = False) -> dict:
    """`Generation`'s fields that the finished reply's `text` decides: `content`, `tool_calls`,
    `invalid_tool_calls`, `tool_call_problems`, `reasoning` and `finish_reason`, read as `events`
    read the stream. `finish` is why decoding stopped ("stop" or "length"): a reply that stopped holding
    any call, readable or not, finishes with "tool_calls", as OpenAI's. `ended`: the model ended the reply
    itself (an end-of-sequence token), so a call still open was not cut off but ended inside. The calls'
    ids are `<id_prefix>_<i>`."""
    thought, answer = events.read(text, final=True)
    content, parsed = events.fmt.parse(answer)
    if ended:
        parsed = [dict(c, error=ENDED_INSIDE) if c.get("error") == UNTERMINATED else c for c in parsed]
    calls, invalid, problems = check_calls(events.settle(answer, parsed), tools, id_prefix=id_prefix)
    if (calls or invalid) and finish == "stop":
        finish = "tool_calls"
    return {"content": content, "tool_calls": calls, "invalid_tool_calls": invalid, "tool_call_problems": problems,
            "reasoning": None if thought is None else thought.strip(), "finish_reason": finish}
