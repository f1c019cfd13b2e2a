"""Benchmark records (the format: docs/own-model.md#records): read, then spread a limit."""
from __future__ import annotations

from .. import data


def load_records(path) -> list[dict]:
    """Benchmark records, read by the shared reader; each needs an "id" and a "source"."""
    return data.load_records(path, require=("id", "source"), kind="benchmark")


def spread(records: list[dict], limit: int | None) -> list[dict]:
    """The first `limit` records taken round-robin over sources, in file order within each source.

    60 dev records over 5 sources gives 12 of each, so no source dominates the mean.
    """
    if limit is None or limit >= len(records):
        return list(records)
    if limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    by_source: dict[str, list[dict]] = {}
    for rec in records:
        by_source.setdefault(rec["source"], []).append(rec)
    queues = [iter(v) for v in by_source.values()]
    picked: list[dict] = []
    while len(picked) < limit:
        for q in list(queues):
            rec = next(q, None)
            if rec is None:
                queues.remove(q)
            elif len(picked) < limit:
                picked.append(rec)
    return picked
