"""`oospec bench --agent --mcp` (#65): the agent bench's tools served by a real MCP server process
(oospec_agents/mcp/server.py, FastMCP) over stdio or streamable HTTP, annotated by the stated name rule;
only the read-only ones start early, and `unsafe_early` counts what the server saw (always 0).

The engine is `EpisodeEngine` (tests/test_bench_agent.py), a `Scripted` engine writing one
tool step and an answer, its sidecar's prediction scripted."""
from __future__ import annotations

import json

import pytest

from oospec_agents.bench.agent_tools import WRITE_VERBS, annotations_for
from oospec_agents.cli import main
from test_bench_agent import PARIS, WEATHER, EpisodeEngine, _bench

BOOK_TOOL = {"type": "function", "function": {
    "name": "book_table", "description": "Book a table.",
    "parameters": {"type": "object", "properties": {"restaurant": {"type": "string"}}, "required": ["restaurant"]}}}
BOOK = {"name": "book_table", "arguments": {"restaurant": "Da Michele"}}


@pytest.fixture
def records(tmp_path):
    path = tmp_path / "records.jsonl"
    recs = [{"id": f"r{i}", "source": "s", "messages": [{"role": "user", "content": "Weather in Paris?"}],
             "tools": [WEATHER, BOOK_TOOL], "expected": [PARIS]} for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_the_mcp_bench_hits_read_only_tools_and_reports_no_unsafe_early_call(monkeypatch, records, tmp_path,
                                                                              transport):
    results = _bench(monkeypatch, EpisodeEngine(), records, tmp_path / "out", "--methods", "toolspec,oospec+tools",
                     "--mcp", transport)
    assert results["config"]["mcp"]["transport"] == transport
    assert results["config"]["mcp"]["read_only"] == ["get_weather"]      # book_table is a write: never early
    spec, tools = results["methods"]["toolspec"], results["methods"]["oospec+tools"]
    assert tools["hits"] == 2 and tools["transcripts_equal"] and spec["transcripts_equal"]
    assert (spec["mcp_calls"], spec["early_calls"], spec["unsafe_early"]) == (2, 0, 0)
    assert (tools["mcp_calls"], tools["early_calls"], tools["unsafe_early"]) == (2, 2, 0)  # each hit: one call
    steps = [row["runs"][m]["steps"][0] for row in results["episodes"] for m in ("toolspec", "oospec+tools")]
    assert len({json.dumps(s.get("results")) for s in steps if "results" in s}) == 1  # the same MCP answer
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| oospec+tools | 2 | 2 | 0 |" in report


def test_a_predicted_destructive_call_never_starts(monkeypatch, records, tmp_path):
    results = _bench(monkeypatch, EpisodeEngine(predicted=BOOK), records, tmp_path / "out",
                     "--methods", "toolspec,oospec+tools", "--mcp")
    tools = results["methods"]["oospec+tools"]
    assert tools["hits"] == 0 and tools["runner"]["not_speculative"] == 2 and tools["runner"]["started"] == 0
    # the weather calls did start early, from the verified call's ToolCallReady: they are read-only
    assert tools["early_calls"] == tools["runner"]["ready_started"] == 2 and tools["unsafe_early"] == 0
    assert tools["mcp_calls"] == 2 and tools["transcripts_equal"]


@pytest.mark.parametrize("name, destructive", [
    ("book_table", True), ("sendEmail", True), ("delete-file", True), ("calendar.CreateEvent", True), ("spotify.play", True),
    ("set_alarm", True), ("circle_properties.get", False),
    ("get_weather", False), ("search_flights", False), ("booking_status", False), ("calculate", False),
    ("list_settings", False),
])
def test_the_bench_server_annotates_by_the_name_rule(name, destructive):
    hints = annotations_for(name)
    assert hints["destructiveHint"] is destructive and hints["readOnlyHint"] is not destructive
    assert "book" in WRITE_VERBS and "get" not in WRITE_VERBS


def test_mcp_needs_agent(records, capsys):
    assert main(["bench", "--data", str(records), "--mcp", "--quiet"]) == 2
    assert "--mcp serves agent episodes' tools from an MCP server: add --agent" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--agent", "--data", str(records), "--mcp", "sse"])
    assert "invalid choice: 'sse'" in capsys.readouterr().err
