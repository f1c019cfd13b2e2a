"""α in `oospec bench`: the hint scored against the target's own call (bench/alpha.py), on known
cases by hand and in a real small run of the embedded target with scripted hints."""
from __future__ import annotations

import json

import pytest

from oospec_agents.bench import alpha
from oospec_agents.bench.metrics import summarize
from oospec_agents.bench.report import markdown
from oospec_agents.formats import HermesFormat

from oospec_testing import DATA

CALL = {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}


def test_a_hint_equal_to_the_targets_call_scores_whole():
    s = alpha.score([dict(CALL)], [CALL])
    assert (s["calls"], s["calls_ok"], s["functions_ok"], s["slots"], s["slots_ok"]) == (1, 1, 1, 2, 2)
    assert s["wrong_slots"] == {}


def test_a_wrong_slot_loses_the_call_and_that_slot_only():
    s = alpha.score([{"name": "get_weather", "arguments": {"city": "Paris", "days": 4}}], [CALL])
    assert (s["calls_ok"], s["functions_ok"], s["slots"], s["slots_ok"]) == (0, 1, 2, 1)
    assert s["wrong_slots"] == {"days": 4}
    # a number the target writes as 3 is not the hint's 3.0: their tokens differ
    assert alpha.score([{"name": "get_weather", "arguments": {"city": "Paris", "days": 3.0}}], [CALL])["slots_ok"] == 1
    # a slot the target left out, which the hint fills, costs the whole call but none of the target's slots
    extra = alpha.score([{"name": "get_weather", "arguments": {**CALL["arguments"], "unit": "C"}}], [CALL])
    assert (extra["calls_ok"], extra["slots_ok"]) == (0, 2)


def test_a_wrong_function_gets_no_slot():
    s = alpha.score([{"name": "get_time", "arguments": {"city": "Paris", "days": 3}}], [CALL])
    assert (s["calls"], s["calls_ok"], s["functions_ok"], s["slots"], s["slots_ok"]) == (1, 0, 0, 2, 0)
    assert s["function"] == "get_time"


def test_the_target_writing_no_call_makes_every_hint_wrong():
    s = alpha.score([dict(CALL)], [])
    assert (s["calls"], s["calls_ok"], s["slots"]) == (1, 0, 0)
    bad = alpha.score([dict(CALL)], [{"name": "get_weather", "arguments": "{oops", "error": "not JSON"}])
    assert (bad["calls"], bad["calls_ok"], bad["slots"]) == (1, 0, 0)
    assert alpha.score(None, [CALL]) is None  # no hint: nothing to score


def test_parallel_calls_are_matched_by_position():
    other = {"name": "get_time", "arguments": {"city": "Rome"}}
    s = alpha.score([dict(CALL)], [CALL, other])  # the hint named the first call only
    assert (s["calls"], s["calls_ok"], s["slots"], s["slots_ok"]) == (2, 1, 3, 2)


def test_aggregate_and_the_target_read_from_ar_text():
    fmt = HermesFormat()
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    target = alpha.target_calls(fmt, text)
    assert target == [CALL]
    scores = [alpha.score([dict(CALL)], target),
              alpha.score([{"name": "get_weather", "arguments": {"city": "Lyon", "days": 3}}], target),
              alpha.score([{"name": "x", "arguments": {}}], target), None]
    agg = alpha.aggregate(scores)
    assert agg == {"alpha_call": pytest.approx(1 / 3), "alpha_slots": pytest.approx(3 / 6),
                   "alpha_function": pytest.approx(2 / 3), "alpha_n": 3}
    assert alpha.aggregate([None]) == {"alpha_call": None, "alpha_slots": None, "alpha_function": None, "alpha_n": 0}


def _run(forwards, **extra):
    return {"new_tokens": 10, "prefill_s": 0.1, "decode_s": 1.0, "target_forwards": forwards,
            "check": {"verdict": "exact"}} | extra


def test_summary_and_report_carry_alpha_per_source_and_the_forwards_over_toolspec(tmp_path):
    good = alpha.score([dict(CALL)], [CALL])
    wrong = alpha.score([{"name": "get_weather", "arguments": {"city": "Paris", "days": 4}}], [CALL])
    hinted = {"accepted_by_source": {"schema": 3, "retrieval": 1, "hint": 4}}
    records = [{"source": "a", "runs": {"ar": _run(10), "toolspec": _run(6), "oospec": _run(3, alpha=good, **hinted)}},
               {"source": "b", "runs": {"ar": _run(10), "toolspec": _run(6), "oospec": _run(6, alpha=wrong, **hinted)}}]
    res = summarize(records, ["ar", "toolspec", "oospec"])
    f = res["methods"]["oospec"]
    assert (f["alpha_call"], f["alpha_slots"], f["alpha_n"]) == (0.5, 0.75, 2)
    assert f["hint_share_of_accepted"] == pytest.approx(0.5)
    assert f["forwards_vs_toolspec"] == pytest.approx(0.75)
    assert res["sources"]["a"]["oospec"]["forwards_vs_toolspec"] == pytest.approx(0.5)
    assert "alpha_call" not in res["methods"]["toolspec"]  # no sidecar, no α
    res["env"] = {"target": "t", "target_device_name": "cpu", "dtype": "bfloat16", "torch": "2",
                  "transformers": "5", "torch_threads": 2, "git_commit": None}
    res["config"] = {"n_records": 2, "data": "x.jsonl", "tool_choice": "required", "max_new_tokens": 8,
                     "tie_tolerance": 0.3, "wall_s": 1.0, "hint_first": True}
    md = markdown(res)
    assert "## The hint against the target's own call (α)" in md
    assert "| a | oospec | 1 | 100% | 100% | 100% | 50% | 0.50 |" in md
    assert "| b | oospec | 1 | 0% | 50% | 100% | 50% | 1.00 |" in md
    assert "| **all** | oospec | 2 | 50% | 75% | 100% | 50% | 0.75 |" in md
    pytest.importorskip("matplotlib")
    assert alpha.plot(res, tmp_path / "alpha.png").read_bytes()[:4] == b"\x89PNG"


def test_no_plot_without_matplotlib(monkeypatch, tmp_path):
    import builtins
    real = builtins.__import__

    def no_mpl(name, *a, **kw):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_mpl)
    res = {"methods": {"oospec": {"alpha_n": 1}}, "sources": {}}
    assert alpha.plot(res, tmp_path / "alpha.png") is None and not (tmp_path / "alpha.png").exists()


# ------------------------------------------------------------------ a real run, scripted hints

@pytest.fixture(scope="module")
def record():
    recs = [json.loads(line) for line in (DATA / "dev.jsonl").read_text().splitlines() if line.strip()]
    return next(r for r in recs if len(r["tools"]) >= 2 and len(r["expected"]) == 1
                and len(r["expected"][0]["arguments"]) >= 2)


def _hint(call: dict) -> str:
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


@pytest.mark.parametrize("case", ["equal", "wrong_slot", "wrong_function"])
def test_a_real_bench_scores_scripted_hints_against_the_targets_own_call(embedded_fp32, record, case):
    """The embedded target (float32) writes its call (`ar`); the sidecar is a fixed hint built from that
    call: equal, with one slot changed, or naming another offered tool. α in results is what the case
    says, and the oracle (the target's reply as its hint) scores whole."""
    from oospec_agents.bench import BenchConfig, run_bench
    from oospec_agents.engine import Engine
    from oospec_agents.sidecar import FixedHint
    gen = embedded_fp32.generate(record["messages"], record["tools"], tool_choice="required", method="ar",
                                 max_new_tokens=96)
    assert gen.tool_calls, gen.text
    own = {"name": gen.tool_calls[0]["name"], "arguments": dict(gen.tool_calls[0]["arguments"])}
    slots = len(own["arguments"])
    hint = json.loads(json.dumps(own))
    if case == "wrong_slot":
        key = next(iter(hint["arguments"]))
        hint["arguments"][key] = "zzz-not-this" if hint["arguments"][key] != "zzz-not-this" else "other"
    elif case == "wrong_function":
        hint["name"] = next(t["function"]["name"] for t in record["tools"] if t["function"]["name"] != own["name"])
    engine = Engine(embedded_fp32.target, embedded_fp32.tokenizer, FixedHint(_hint(hint)), wave_payback=None)
    res = run_bench(engine, [record], BenchConfig(("ar", "oospec", "oracle"), max_new_tokens=96, warmup=False,
                                                  progress=False))
    f, o = res["methods"]["oospec"], res["methods"]["oracle"]
    assert f["lossless"] and o["lossless"]
    assert (o["alpha_call"], o["alpha_slots"], o["alpha_n"]) == (1.0, 1.0, 1)
    expect = {"equal": (1.0, 1.0, 1.0), "wrong_slot": (0.0, (slots - 1) / slots, 1.0),
              "wrong_function": (0.0, 0.0, 0.0)}[case]
    assert (f["alpha_call"], f["alpha_slots"], f["alpha_function"]) == pytest.approx(expect)
    row = res["records"][0]["runs"]["oospec"]
    assert row["predicted"] == [hint] and "alpha" not in res["records"][0]["runs"]["ar"]
