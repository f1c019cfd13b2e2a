"""Teacher traces: the calls the adapters learn to write.

With a teacher model, each record's request is decoded greedily by the teacher
(`tool_choice="auto"`), and only records where the teacher wrote at least one call, all of them
valid against the offered schemas, are kept, with the teacher's calls as `expected`. Without a
teacher, the data's ground-truth calls stand in for the traces.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def target_label(rec: dict, gen) -> dict:
    """What the target wrote for `rec` (its `Generation`), as a label: `calls` (`{"name", "arguments"}`,
    the parsed calls, valid or not), `kind` ("call": every call parses and fits its schema; "invalid";
    "no_call": it wrote none), and its tokens and forwards."""
    calls = [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls]
    kind = "invalid" if gen.invalid_tool_calls or gen.tool_call_problems else "call" if calls else "no_call"
    return {"id": rec.get("id"), "source": rec.get("source"), "kind": kind, "calls": calls,
            "new_tokens": len(gen.token_ids), "target_forwards": getattr(gen.stats, "target_forwards", None)}


def label_records(records: list[dict], engine, *, tool_choice: str = "auto", method: str = "toolspec",
                  max_new_tokens: int = 256, batch_size: int = 1, on_batch=None, bar=None):
    """Yield `target_label` for each record, decoded greedily by `engine` (a lossless method: the
    target's own tokens), in order. `batch_size` > 1 sends that many requests at once, which the engine
    decodes in shared rounds; `on_batch(labels, seconds)` is called after each batch; `bar` (tqdm) is
    advanced per record."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    def one(rec):
        return target_label(rec, engine.generate(rec["messages"], rec["tools"], tool_choice=tool_choice,
                                                 max_new_tokens=max_new_tokens, method=method))
    pool = ThreadPoolExecutor(batch_size) if batch_size > 1 else None
    try:
        for i in range(0, len(records), batch_size):
            batch, t0 = records[i:i + batch_size], time.perf_counter()
            labels = list(pool.map(one, batch)) if pool else [one(r) for r in batch]
            if bar is not None:
                bar.update(len(batch))
            if on_batch is not None:
                on_batch(labels, time.perf_counter() - t0)
            yield from labels
    finally:
        if pool:
            pool.shutdown()


def teacher_traces(records: list[dict], teacher, *, max_new_tokens: int = 256, progress: bool = True,
                   method: str = "toolspec", batch_size: int = 1) -> tuple[list[dict], dict]:
    """(traces, stats). `teacher` is an Engine or a model reference for `Engine.from_pretrained`."""
    from tqdm.auto import tqdm
    from ..engine import Engine
    engine = teacher if isinstance(teacher, Engine) else Engine.from_pretrained(teacher, sidecar=False)
    kept, stats = [], {"records": len(records), "kept": 0, "no_call": 0, "invalid": 0}
    bar = tqdm(total=len(records), disable=not progress, desc="teacher")
    for rec, label in zip(records, label_records(records, engine, max_new_tokens=max_new_tokens, method=method,
                                                 batch_size=batch_size, bar=bar)):
        if label["kind"] == "call":
            kept.append(dict(rec, expected=label["calls"], trace="teacher"))
        else:  # a call that does not parse or misfits its schema; or no call
            stats[label["kind"]] += 1
    bar.close()
    stats["kept"] = len(kept)
    return kept, stats


def build_traces(records: list[dict], teacher=None, **kw) -> tuple[list[dict], dict]:
    if teacher is None:
        return [dict(r, trace="ground_truth") for r in records], {"records": len(records), "kept": len(records),
                                                                   "source": "ground_truth"}
    traces, stats = teacher_traces(records, teacher, **kw)
    stats["source"] = f"teacher:{teacher if isinstance(teacher, str) else type(teacher).__name__}"
    return traces, stats
