"""Training's input and evaluation: teacher traces, the target's eval, bad input with a clear error,
several training files, the per-source table, written calls against their schemas."""
from __future__ import annotations

import json

import pytest

from train_testing import TRACE
from oospec_agents.errors import ModelLoadError
from oospec_agents.train.data import TrainDataError, load_records
from oospec_agents.train.lora import LoraConfigArgs, train_lora

pytestmark = pytest.mark.usefixtures("one_thread")  # training on a busy machine


def test_teacher_traces_keep_only_valid_calls(tiny_engine):
    from oospec_agents import Generation
    from oospec_agents.train.traces import build_traces
    recs = [dict(TRACE, id=str(i)) for i in range(4)]
    misfit = {"id": "m", "name": "get_time", "arguments": {"tz": 1}}
    scripted = iter([
        Generation("", [], [{"id": "c", "name": "get_time", "arguments": {"tz": "UTC"}}], [], {}),
        Generation("", [], [], [{"name": "get_time", "arguments": "{", "error": "bad"}], {}),
        Generation("plain text", [], [], [], {}),
        # a call whose arguments misfit the schema is a tool call (issue 48), and no trace to learn from
        Generation("", [], [misfit], [], {}, tool_call_problems=[{"id": "m", "name": "get_time", "error": "bad"}]),
    ])
    tiny_engine.generate = lambda *a, **k: next(scripted)
    try:
        traces, stats = build_traces(recs, tiny_engine, progress=False)
    finally:
        del tiny_engine.generate
    assert stats["kept"] == 1 and stats["invalid"] == 2 and stats["no_call"] == 1
    assert traces[0]["expected"] == [{"name": "get_time", "arguments": {"tz": "UTC"}}]
    assert build_traces(recs)[0] == [dict(r, trace="ground_truth") for r in recs]


def test_evaluate_target_counts_a_call_with_a_schema_problem_as_not_exact():
    """The eval's figures keep their meaning under issue 48's classes: a call that misfits its schema is
    a tool call now, but never an exact (or lenient) one, even with the expected arguments."""
    from types import SimpleNamespace

    from oospec_agents import Generation
    from oospec_agents.train.target import evaluate_target
    call = {"id": "c_0", "name": "get_current_weather", "arguments": {"city": "Paris"}}
    rec = dict(TRACE, id="0", source="bfcl_simple")
    problem = {"id": "c_0", "name": "get_current_weather", "error": "made up for the test"}
    for problems, exact in (([], 1.0), ([problem], 0.0)):
        gen = Generation("", [], [call], [], {}, tool_call_problems=problems)
        out = evaluate_target(SimpleNamespace(generate=lambda *a, **k: gen), [rec], progress=False)
        assert out["overall"] == {"n": 1, "right_tool": 1.0, "exact_args": exact, "lenient_args": exact}


# --------------------------------------------------------------------------- bad input

def test_bad_input_gets_a_clear_error(tmp_path):
    with pytest.raises(TrainDataError, match="does not exist"):
        load_records(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}], "tools": [], "expected": []}\n{oops\n')
    with pytest.raises(TrainDataError, match=r"bad.jsonl:2: malformed record"):
        load_records(bad)
    bad.write_text('{"messages": "hi", "tools": [], "expected": []}\n')
    with pytest.raises(TrainDataError, match="malformed record, 'messages'"):
        load_records(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TrainDataError, match="empty training set"):
        load_records(empty)
    with pytest.raises(TrainDataError, match="empty"):
        train_lora(None, [], tmp_path / "out", LoraConfigArgs())
    from oospec_agents.train.run import load_base
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_base(str(tmp_path / "no-such-model"))


def test_several_training_files_globs_and_held_out_sources(tmp_path):
    from oospec_agents.train.data import expand_paths, load_many, source_counts

    def write(name, sources):
        (tmp_path / name).write_text("".join(json.dumps(
            {"id": f"{name}-{i}", "source": s, "messages": [{"role": "user", "content": "hi"}], "tools": [],
             "expected": [] if s == "none" else [{"name": "f", "arguments": {}}]}) + "\n"
            for i, s in enumerate(sources)))
    write("a.jsonl", ["x", "x", "none"])
    write("b-1.jsonl", ["y", "tooltalk"])
    write("b-2.jsonl", ["nestful"])
    assert expand_paths([tmp_path / "a.jsonl", str(tmp_path / "b-*.jsonl")]) == \
        [str(tmp_path / n) for n in ("a.jsonl", "b-1.jsonl", "b-2.jsonl")]
    records = load_many([tmp_path / "a.jsonl", str(tmp_path / "b-*.jsonl")], exclude_sources=["tooltalk", "nestful"])
    assert source_counts(records) == {"none": {"records": 1, "no_call": 1}, "x": {"records": 2, "no_call": 0},
                                      "y": {"records": 1, "no_call": 0}}
    assert [r["source"] for r in load_many(str(tmp_path / "*.jsonl"), sources=["nestful", "y"])] == ["y", "nestful"]
    with pytest.raises(TrainDataError, match="no data file matches"):
        load_many(str(tmp_path / "c-*.jsonl"))
    with pytest.raises(TrainDataError, match=r"no record of source\(s\) \['nope'\]"):
        load_many(tmp_path / "a.jsonl", sources=["nope"])
    with pytest.raises(TrainDataError, match="no records left"):
        load_many(tmp_path / "b-2.jsonl", exclude_sources=["nestful"])


def test_evaluation_prints_a_per_source_table():
    from oospec_agents.train.evaluate import source_table
    res = {"overall": {"n": 3, "function_index_acc": 0.6667, "arg_exact_match": 0.5},
           "by_source": {"a": {"n": 1, "function_index_acc": 1.0, "arg_exact_match": 0.5},
                         "b": {"n": 2, "function_index_acc": 0.5, "arg_exact_match": 0.5}}}
    assert source_table(res).splitlines() == [
        "| source | n | function_index_acc | arg_exact_match |", "|---|---|---|---|",
        "| a | 1 | 100.0% | 50.0% |", "| b | 2 | 50.0% | 50.0% |", "| **all** | 3 | 66.7% | 50.0% |"]


def _alarm_tools():
    """Tools a random model can finish under strict: bounded integers and enums end, strings would not."""
    def tool(name, properties, required):
        return {"type": "function", "function": {"name": name, "description": "", "parameters": {
            "type": "object", "properties": properties, "required": required}}}
    return [tool("set_alarm", {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                               "day": {"type": "string", "enum": ["mon", "tue"]}}, ["hour", "day"]),
            tool("dim", {"level": {"type": "integer", "minimum": 0, "maximum": 10}}, ["level"])]


def test_written_calls_parse_and_validate_against_the_offered_schemas():
    from types import SimpleNamespace

    from oospec_agents.formats import HermesFormat
    from oospec_agents.train.evaluate import written_calls
    fmt, tools = HermesFormat(), _alarm_tools()

    def check(text, finish="stop"):
        return written_calls(fmt, SimpleNamespace(text=text, finish_reason=finish), tools)
    ok, bad = fmt.render_call("dim", {"level": 3}), fmt.render_call("dim", {"level": 11})  # 11 > maximum
    assert check(ok) == {"calls": 1, "parsed": 1, "valid": 1, "cut_off": 0}
    assert check("Sure. " + ok + "\n" + bad) == {"calls": 2, "parsed": 2, "valid": 1, "cut_off": 0}
    assert check(fmt.render_call("nope", {})) == {"calls": 1, "parsed": 1, "valid": 0, "cut_off": 0}  # not offered
    assert check('<tool_call>\n{"name": "dim", "arguments": {level: 3}}\n</tool_call>')["parsed"] == 0
    assert check(ok + "\n" + ok[:-8], "length") == {"calls": 2, "parsed": 1, "valid": 1, "cut_off": 1}
    assert check("no call at all") == {"calls": 0, "parsed": 0, "valid": 0, "cut_off": 0}


def test_evaluate_target_strict_on_a_random_model(tiny_engine, tmp_path, monkeypatch, capsys):
    """`evaluate target --strict` on 2 records (a third source filtered out): unconstrained, the random
    model's forced call never parses; strict, every call it writes validates, but for one that
    max_new_tokens cut off (it may call on and on)."""
    from oospec_agents.train import evaluate
    monkeypatch.setattr(evaluate, "target_engine", lambda adapter=None: tiny_engine)
    tools, dev = _alarm_tools(), tmp_path / "dev.jsonl"
    asks = [("bfcl_simple", "Wake me at 7 on Monday.", "set_alarm", {"hour": 7, "day": "mon"}),
            ("apibank_l1", "Dim the lights to 3.", "dim", {"level": 3}),
            ("bfcl_multiple", "Dim the lights to 2.", "dim", {"level": 2})]
    dev.write_text("".join(json.dumps({"id": f"r{i}", "source": src, "messages": [{"role": "user", "content": ask}],
                                       "tools": tools, "expected": [{"name": name, "arguments": args}], "meta": {}})
                           + "\n" for i, (src, ask, name, args) in enumerate(asks)))

    def run(*flags):
        out = tmp_path / "out.json"
        assert evaluate.main(["target", "--dev", str(dev), "--out", str(out), *flags]) == 0
        return json.loads(out.read_text()), capsys.readouterr().out

    free, _ = run("--tool-choice", "required")
    strict, printed = run("--tool-choice", "required", "--strict")
    for res, is_strict in ((free, False), (strict, True)):
        assert set(res["by_source"]) == {"bfcl_simple", "bfcl_multiple"} and res["overall"]["n"] == 2
        assert res["strict"] is is_strict and res["tool_choice"] == "required"
    assert free["overall"]["calls"] == 2 and free["overall"]["parse"] == free["overall"]["valid"] == 0
    o = strict["overall"]
    assert o["parse"] == o["valid"] > 0 and round(o["parse"] * o["calls"]) == o["calls"] - o["cut_off"], o
    assert o["cut_off"] <= 2 and (o["cut_off"] or o["parse"] == 1.0)
    assert "| source | n | right_tool | exact_args | lenient_args | calls | parse | valid | cut_off |" in printed
    # no call written under auto: no share to give ("-" in the table); --sources given twice
    auto, printed = run("--sources", "apibank_l1", "--sources", "bfcl_simple", "--limit", "1")
    assert set(auto["by_source"]) == {"apibank_l1", "bfcl_simple"} and auto["overall"]["calls"] == 0
    assert auto["overall"]["parse"] is None and "| **all** | 2 |" in printed and " - |" in printed
    with pytest.raises(SystemExit):
        evaluate.main(["target", "--dev", str(dev), "--sources", "bfcl_simple,nope"])
    assert "no record of source(s) ['nope']" in capsys.readouterr().err


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    from oospec_agents.cli import main
    rc = main(["train-target", "--train", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
