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
