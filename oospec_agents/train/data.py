"""Training's view of the shared tool-call records: the reader lives in `oospec_agents.data`."""
from __future__ import annotations

from .. import data
from ..data import DataError, check_record  # noqa: F401  (re-exported)

# Training raises the shared reader's error under its historical name.
TrainDataError = DataError


def load_records(path, *, limit: int | None = None) -> list[dict]:
    """Training or dev records, read by the shared reader."""
    return data.load_records(path, limit=limit, kind="training")


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
