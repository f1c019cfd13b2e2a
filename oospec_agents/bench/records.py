"""The shared tool-call records (see ../shared/data/toolcalls/README.md): read, then spread a limit."""
from __future__ import annotations

import json
from pathlib import Path

REQUIRED_KEYS = ("id", "source", "messages", "tools")


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--data {str(path)!r} is not a file (expected a JSONL file of tool-call records)")
    records = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON: {e}") from None
            missing = [k for k in REQUIRED_KEYS if k not in rec]
            if missing:
                raise ValueError(f"{path}:{n}: record lacks {missing}; expected keys {list(REQUIRED_KEYS)}")
            records.append(rec)
    if not records:
        raise ValueError(f"{path} holds no records")
    return records


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
