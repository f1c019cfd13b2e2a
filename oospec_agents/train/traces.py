"""Teacher traces: the calls the adapters learn to write.

With a teacher model, each record's request is decoded greedily by the teacher
(`tool_choice="auto"`), and only records where the teacher wrote at least one call, all of them
valid against the offered schemas, are kept, with the teacher's calls as `expected`. Without a
teacher, the data's ground-truth calls stand in for the traces.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def teacher_traces(records: list[dict], teacher, *, max_new_tokens: int = 256, progress: bool = True,
                   method: str = "toolspec") -> tuple[list[dict], dict]:
    """(traces, stats). `teacher` is an Engine or a model reference for `Engine.from_pretrained`."""
    from tqdm.auto import tqdm
    from ..engine import Engine
    engine = teacher if isinstance(teacher, Engine) else Engine.from_pretrained(teacher, sidecar=False)
    kept, stats = [], {"records": len(records), "kept": 0, "no_call": 0, "invalid": 0}
    for rec in tqdm(records, disable=not progress, desc="teacher"):
        gen = engine.generate(rec["messages"], rec["tools"], tool_choice="auto", max_new_tokens=max_new_tokens,
                              method=method)
        if gen.invalid_tool_calls or gen.tool_call_problems:  # a call that does not parse, or misfits its schema
            stats["invalid"] += 1
        elif not gen.tool_calls:
            stats["no_call"] += 1
        else:
            kept.append(dict(rec, expected=[{"name": c["name"], "arguments": c["arguments"]}
                                            for c in gen.tool_calls], trace="teacher"))
    stats["kept"] = len(kept)
    return kept, stats


def build_traces(records: list[dict], teacher=None, **kw) -> tuple[list[dict], dict]:
    if teacher is None:
        return [dict(r, trace="ground_truth") for r in records], {"records": len(records), "kept": len(records),
                                                                   "source": "ground_truth"}
    traces, stats = teacher_traces(records, teacher, **kw)
    stats["source"] = f"teacher:{teacher if isinstance(teacher, str) else type(teacher).__name__}"
    return traces, stats
