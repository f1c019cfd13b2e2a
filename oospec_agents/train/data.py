"""Reading the shared tool-call JSONL format, with clear errors for bad input."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import OoOSpecError


class TrainDataError(OoOSpecError):
    """A training/dev file is missing, malformed, or yields no examples."""


def load_records(path, *, limit: int | None = None) -> list[dict]:
    """Records of the shared format: {"id", "messages", "tools", "expected", ...}, checked."""
    p = Path(path)
    if not p.is_file():
        raise TrainDataError(f"data file {str(path)!r} does not exist")
    out = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p.name}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise TrainDataError(f"{where}: malformed record, not valid JSON: {e}") from None
            check_record(rec, where)
            out.append(rec)
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise TrainDataError(f"{str(path)!r} holds no records (empty training set)")
    return out


def check_record(rec, where: str = "record") -> None:
    if not isinstance(rec, dict):
        raise TrainDataError(f"{where}: malformed record, expected a JSON object")
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
        raise TrainDataError(f"{where}: malformed record, 'messages' must be a non-empty list of chat dicts")
    tools = rec.get("tools", [])
    if not isinstance(tools, list):
        raise TrainDataError(f"{where}: malformed record, 'tools' must be a list")
    exp = rec.get("expected")
    if not isinstance(exp, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                            and isinstance(c.get("arguments", {}), dict) for c in exp):
        raise TrainDataError(f"{where}: malformed record, 'expected' must be a list of "
                             "{\"name\": str, \"arguments\": object}")


def tool_name(t: dict) -> str:
    return (t.get("function") or t).get("name")


def select(records: list[dict], sources=None, limit_per_source: int | None = None) -> list[dict]:
    """Records of the given sources (all if None), at most `limit_per_source` of each, in file order."""
    seen: dict[str, int] = {}
    out = []
    for r in records:
        if sources and r.get("source") not in sources:
            continue
        if limit_per_source is None or seen.get(r.get("source"), 0) < limit_per_source:
            seen[r.get("source")] = seen.get(r.get("source"), 0) + 1
            out.append(r)
    return out
