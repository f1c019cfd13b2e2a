"""`oospec bench`'s records: spread round-robin over the sources, the BFCL reader (a directory, and the
bfcl-eval package's data), the bench reader's checks."""
from __future__ import annotations

import json

import pytest

from oospec_agents.bench.bfcl import read_bfcl
from oospec_agents.bench.records import spread
from oospec_agents.cli import main


# ------------------------------------------------------------------ records

def test_limit_is_spread_round_robin_over_sources():
    recs = [{"id": f"{s}{i}", "source": s} for s in "abc" for i in range(5)]
    assert [r["id"] for r in spread(recs, 5)] == ["a0", "b0", "c0", "a1", "b1"]
    assert len(spread(recs, None)) == 15


def test_bfcl_reader_parses_bfcls_own_layout(tmp_path):
    question = {"id": "simple_python_7", "question": [[{"role": "user", "content": "Area of a 3 by 4 rectangle?"}]],
                "function": [{"name": "geometry.area", "description": "Area of a rectangle.",
                              "parameters": {"type": "dict", "required": ["width", "height"], "properties": {
                                  "width": {"type": "float", "description": "Width."},
                                  "height": {"type": "integer", "description": "Height."},
                                  "corners": {"type": "tuple", "items": {"type": "float"}},
                                  "unit": {"type": "string", "description": "Unit."},
                                  "options": {"type": "dict", "properties": {"fast": {"type": "boolean"}}}}}}]}
    multi_turn = {"id": "multi_turn_base_0", "question": [[{"role": "user", "content": "a"}],
                                                          [{"role": "user", "content": "b"}]],
                  "function": question["function"]}
    irrelevant = {"id": "irrelevance_0", "question": [[{"role": "user", "content": "hi"}]],
                  "function": question["function"]}
    answer = {"id": "simple_python_7", "ground_truth": [
        {"geometry.area": {"width": [3.0, 3], "height": [4], "unit": ["", "m"],
                          "options": [{"fast": [True, False], "mode": ["", "x"]}]}}]}
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / "BFCL_v4_simple_python.json").write_text(json.dumps(question) + "\n")
    (tmp_path / "BFCL_v4_multi_turn_base.json").write_text(json.dumps(multi_turn) + "\n")
    (tmp_path / "BFCL_v4_irrelevance.json").write_text(json.dumps(irrelevant) + "\n")
    (tmp_path / "possible_answer" / "BFCL_v4_simple_python.json").write_text(json.dumps(answer) + "\n")
    (tmp_path / "possible_answer" / "BFCL_v4_multi_turn_base.json").write_text(
        json.dumps({"id": "multi_turn_base_0", "ground_truth": [["f()"]]}) + "\n")

    records = read_bfcl(tmp_path)

    assert len(records) == 1  # multi-turn and no-ground-truth questions are skipped
    rec = records[0]
    assert rec["id"] == "bfcl/simple_python_7" and rec["source"] == "bfcl_simple"
    assert rec["messages"] == [{"role": "user", "content": "Area of a 3 by 4 rectangle?"}]
    params = rec["tools"][0]["function"]["parameters"]
    assert params["type"] == "object" and params["properties"]["width"]["type"] == "number"
    assert params["properties"]["corners"] == {"type": "array", "items": {"type": "number"}}
    assert params["properties"]["options"]["type"] == "object"
    # first acceptable value per argument, nested answer lists too; optional "" values are left out
    assert rec["expected"] == [{"name": "geometry.area", "arguments": {"width": 3.0, "height": 4,
                                                                       "options": {"fast": True}}}]
    assert rec["meta"]["possible_answer"] == answer["ground_truth"]


def test_bfcl_reader_names_a_wrong_directory(tmp_path):
    with pytest.raises(ValueError, match="BFCL_v"):
        read_bfcl(tmp_path)


def test_bench_reader_requires_id_and_source(tmp_path):
    # The shared reader's own errors (missing file, bad JSON, bad fields) are tested in test_train_eval.py.
    from oospec_agents.bench.records import load_records
    from oospec_agents.data import DataError
    f = tmp_path / "recs.jsonl"
    f.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}], "tools": [], "expected": []}\n')
    with pytest.raises(DataError, match=r"recs.jsonl:1: malformed record, it lacks \['source'\]"):
        load_records(f)
    f.write_text("\n")
    with pytest.raises(DataError, match="empty benchmark set"):
        load_records(f)


def test_bench_with_bare_bfcl_reads_the_bfcl_eval_packages_data(monkeypatch, tmp_path):
    """`oospec bench --bfcl` (no DIR) from a clone with no ../shared: BFCL's questions from the bfcl-eval
    wheel, fetched through pip (without its ~60 dependencies) into a fresh cache, checked by its sha256."""
    import importlib.util

    from oospec_agents.bench import runner
    from oospec_agents.bench.bfcl import BFCL_WHEEL
    from oospec_agents.engine import Engine
    if importlib.util.find_spec("bfcl_eval") is None:
        monkeypatch.setenv("OOSPEC_CACHE", str(tmp_path / "cache"))  # the fetch itself, not an earlier run's copy
    seen = {}

    def bench(engine, records, config, **kw):
        seen.update(records=records, data=kw["data"])
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: object())
    monkeypatch.setattr(runner, "run_bench", bench)
    with pytest.raises(SystemExit):
        main(["bench", "--bfcl", "--sources", "bfcl_simple,bfcl_multiple", "--limit", "4", "--methods", "ar"])
    assert [r["source"] for r in seen["records"]] == ["bfcl_multiple", "bfcl_simple"] * 2
    assert all(r["expected"] and r["tools"] and r["messages"] for r in seen["records"])
    assert seen["data"].startswith(BFCL_WHEEL.requirement)
