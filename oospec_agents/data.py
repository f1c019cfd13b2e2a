"""The one reader of the shared tool-call JSONL format (training, dev and benchmark records), with
clear errors for bad input: a missing file, a malformed record (`file:line`), an empty file."""
from __future__ import annotations

import json
from pathlib import Path

from .errors import OoOSpecError


class DataError(OoOSpecError):
    """A data file (training, dev or benchmark records) is missing, malformed, or yields nothing."""


def load_records(path, *, limit: int | None = None, require: tuple[str, ...] = (), kind: str = "data") -> list[dict]:
    """Records of the shared format: {"id", "messages", "tools", "expected", ...}, checked.

    `require` names further keys every record must have (the benchmark needs "id" and "source");
    `kind` names the set in the empty-file error ("training", "benchmark", ...).
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file {str(path)!r} does not exist")
    out = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{p.name}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: malformed record, not valid JSON: {e}") from None
            check_record(rec, where)
            missing = [k for k in require if k not in rec]
            if missing:
                raise DataError(f"{where}: malformed record, it lacks {missing}")
            out.append(rec)
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise DataError(f"{str(path)!r} holds no records (empty {kind} set)")
    return out


def check_record(rec, where: str = "record") -> None:
    if not isinstance(rec, dict):
        raise DataError(f"{where}: malformed record, expected a JSON object")
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m for m in msgs):
        raise DataError(f"{where}: malformed record, 'messages' must be a non-empty list of chat dicts")
    tools = rec.get("tools", [])
    if not isinstance(tools, list):
        raise DataError(f"{where}: malformed record, 'tools' must be a list")
    exp = rec.get("expected")
    if not isinstance(exp, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                            and isinstance(c.get("arguments", {}), dict) for c in exp):
        raise DataError(f"{where}: malformed record, 'expected' must be a list of "
                        "{\"name\": str, \"arguments\": object}")


def only_sources(records: list[dict], sources, where) -> list[dict]:
    """The records of `sources` (a comma-separated string or a list), in file order. A source with no
    record in `where` (the files read) is an error that names it, so that a typo never measures or
    trains on an empty or a different set."""
    wanted = {s.strip() for s in (sources.split(",") if isinstance(sources, str) else sources) if s.strip()}
    have = {r.get("source") for r in records}
    missing = sorted(wanted - have)
    if missing:
        raise DataError(f"no record of source(s) {missing} in {where}; the data has "
                        f"{sorted(h for h in have if h is not None)}")
    return [r for r in records if r.get("source") in wanted]
