"""Read BFCL's own files (a `bfcl_eval/data` checkout) into the shared record format.

Layout: `DIR/BFCL_v*_<category>.json` holds one question per line
(`{"id", "question": [[{role, content}, ...]], "function": [...]}`), and
`DIR/possible_answer/<same name>` holds `{"id", "ground_truth": [{name: {arg: [acceptable, ...]}}]}`.

The conversion matches ../shared/data/toolcalls/README.md: BFCL types become JSON Schema types,
`expected` takes the first acceptable value per argument, and an optional argument that may be ""
is left out. Multi-turn, memory and web-search categories (which need an executor), questions without
a ground truth (irrelevance) and files that hold no questions (v4's format_sensitivity, a list of ids)
are skipped and counted.

`bfcl_data()` is the `bfcl-eval` package's copy of these files (`oospec bench --bfcl` with no DIR): the
installed package's, else its wheel's, fetched once into the cache through pip without its ~60
dependencies (oospec_agents/fetch.py). It is BFCL v4 as released on 2026-03-23; the project's own
records (docs/own-model.md, "Where the shipped adapters' data came from") were converted from BFCL v4 at
an earlier commit of its repository, so a few questions may differ.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path

from ..fetch import Wheel, unpacked

log = logging.getLogger(__name__)

#: the BFCL release `bfcl_data()` reads where the bfcl-eval package is not installed
BFCL_WHEEL = Wheel("bfcl-eval==2026.3.23", "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a")


def bfcl_data() -> Path:
    """The `bfcl_eval/data` directory: the installed bfcl-eval package's (found, not imported: its
    `__init__` needs its dependencies), else BFCL_WHEEL's, unpacked once into the cache."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is not None and spec.origin and (Path(spec.origin).parent / "data").is_dir():
        return Path(spec.origin).parent / "data"
    return unpacked(BFCL_WHEEL, "bfcl_eval/data/", error=ValueError)

TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}
FILE_RE = re.compile(r"^BFCL_(v\d+)_(.+)\.json$")


def read_bfcl(directory: str | Path) -> list[dict]:
    root = Path(directory)
    files = sorted(p for p in root.glob("BFCL_v*_*.json") if FILE_RE.match(p.name))
    if not files:
        raise ValueError(f"--bfcl {str(root)!r} holds no BFCL_v*_*.json files (expected BFCL's bfcl_eval/data)")
    records, skipped = [], 0
    for path in files:
        version, category = FILE_RE.match(path.name).groups()
        try:
            questions = _json_lines(path)
        except ValueError:  # not one question a line
            log.warning("BFCL: skipped %s, which holds no questions", path.name)
            continue
        answers = {a["id"]: a["ground_truth"] for a in _json_lines(root / "possible_answer" / path.name)}
        for q in questions:
            rec = _convert(q, answers.get(q.get("id")), version, category)
            if rec is None:
                skipped += 1
            else:
                records.append(rec)
    if skipped:
        log.warning("BFCL: skipped %d questions that are multi-turn or have no ground truth", skipped)
    if not records:
        raise ValueError(f"no single-turn BFCL question with a possible_answer under {str(root)!r}")
    return records


def _json_lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _convert(q: dict, truth: list | None, version: str, category: str) -> dict | None:
    turns, functions = q.get("question"), q.get("function")
    if truth is None or not functions or not isinstance(turns, list) or len(turns) != 1:
        return None
    messages = turns[0] if isinstance(turns[0], list) else turns
    tools = [{"type": "function", "function": {"name": f["name"], "description": f.get("description", ""),
                                               "parameters": _schema(f.get("parameters", {}))}} for f in functions]
    required = {f["name"]: set(f.get("parameters", {}).get("required", [])) for f in functions}
    expected = []
    for call in truth:
        (name, args), = call.items()
        expected.append({"name": name, "arguments": {
            k: _first(v[0]) for k, v in args.items()
            if v and not (k not in required.get(name, ()) and "" in v)}})
    source = "bfcl_" + category.removesuffix("_python")
    return {"id": f"bfcl/{q['id']}", "source": source, "messages": messages, "tools": tools, "expected": expected,
            "meta": {"dataset": f"BFCL_{version}", "category": category, "orig_id": q["id"],
                     "note": "expected = first acceptable value per arg; optional args omitted",
                     "possible_answer": truth}}


def _first(value):
    """An acceptable value with BFCL's nested answer lists resolved: inside a dict argument each key
    again holds a list of acceptable values, of which the first is taken ("" = may be left out)."""
    if isinstance(value, dict):
        return {k: _first(v[0]) for k, v in value.items() if isinstance(v, list) and v and v[0] != ""}
    if isinstance(value, list):
        return [_first(x) if isinstance(x, dict) else x for x in value]
    return value


def _schema(node):
    """BFCL's parameter types (dict, float, tuple, any) as JSON Schema, recursively."""
    if isinstance(node, list):
        return [_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _schema(v) for k, v in node.items()}
    if isinstance(out.get("type"), str):
        out["type"] = TYPE_MAP.get(out["type"], out["type"])
    return out
