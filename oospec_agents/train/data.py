"""Training's view of the shared tool-call records: the reader lives in `oospec_agents.data`."""
from __future__ import annotations

from .. import data
from ..data import DataError, check_record  # noqa: F401  (re-exported)

# Training raises the shared reader's error under its historical name.
TrainDataError = DataError


def load_records(path, *, limit: int | None = None) -> list[dict]:
    """Training or dev records, read by the shared reader."""
    return data.load_records(path, limit=limit, kind="training")


def expand_paths(paths) -> list[str]:
    """Files named by one path or several, each a path or a glob (sorted); a glob that matches
    nothing is an error that names it."""
    import glob
    out = []
    for p in [paths] if isinstance(paths, (str, bytes)) or not hasattr(paths, "__iter__") else paths:
        p = str(p)
        if any(c in p for c in "*?["):
            found = sorted(glob.glob(p))
            if not found:
                raise data.DataError(f"no data file matches {p!r}")
            out += found
        else:
            out.append(p)
    return out


def load_many(paths, *, limit: int | None = None, sources=None, exclude_sources=None) -> list[dict]:
    """The records of every file `paths` names (see expand_paths), in order; only `sources` when
    given, never `exclude_sources` (whole held-out sources); then the first `limit` of them."""
    records = [r for path in expand_paths(paths) for r in load_records(path)]
    if sources:
        records = data.only_sources(records, sources, list(expand_paths(paths)))
    if exclude_sources:
        records = [r for r in records if r.get("source") not in set(exclude_sources)]
    if not records:
        raise data.DataError(f"no records left in {list(expand_paths(paths))} after the source filters")
    return records[:limit] if limit is not None else records


def source_counts(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per source: records, and how many of them are "no call" records (`expected` empty)."""
    out: dict[str, dict[str, int]] = {}
    for r in records:
        c = out.setdefault(r.get("source") or "?", {"records": 0, "no_call": 0})
        c["records"] += 1
        c["no_call"] += not r.get("expected")
    return dict(sorted(out.items()))


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
