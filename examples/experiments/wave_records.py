"""What examples/experiments/wave_batch.py and examples/experiments/sidecar_size.py share: the records they time, and each one's
sidecar request as the engine would send it (tool_choice auto, Hermes format)."""
from __future__ import annotations

import json


def pick(files: list[str], sources: str | None, n: int) -> list[dict]:
    """`n` records of `files` spread round-robin over their sources (only `sources`, comma-separated)."""
    from oospec_agents.bench.records import spread
    recs = [json.loads(line) for f in files for line in open(f) if line.strip()]
    if sources:
        recs = [r for r in recs if r.get("source") in sources.split(",")]
    return spread(recs, n)


def request(record: dict):
    from oospec_agents.chat import normalize_messages
    from oospec_agents.formats import HermesFormat
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.tools import normalize_tools
    return HintRequest(normalize_messages(record["messages"]), normalize_tools(record["tools"]), HermesFormat(),
                       ("auto", None))


def save(path: str | None, result: dict) -> None:
    """The run's figures as JSON at `path` (None: nowhere)."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
