"""`oospec bench`: the lossless check, record spreading, the BFCL reader, and a small end-to-end run."""
from __future__ import annotations

import json

import pytest

from oospec_agents.bench.bfcl import read_bfcl
from oospec_agents.bench.metrics import compare, summarize
from oospec_agents.bench.records import spread
from oospec_agents.bench.report import markdown, plot
from oospec_agents.cli import main
from oospec_agents.sidecar.wave import PRIOR_WEIGHT

from oospec_testing import DATA

DESIGN_KEYS = {"n", "lossless", "speedup_decode", "speedup_e2e", "mean_accepted_tokens", "target_forwards",
               "numerical_ties"}
ALL_METHODS = ["ar", "hf_generate", "prompt_lookup", "assisted", "toolspec", "oospec", "oracle"]


# ------------------------------------------------------------------ the lossless check

def test_equal_tokens_are_exact():
    assert compare([1, 2, 3], [5.0, 5.0, 5.0], [1, 2, 3], 0.3)["verdict"] == "exact"


def test_divergence_at_a_near_tie_is_a_numerical_tie_not_a_loss():
    check = compare([1, 2, 3], [5.0, 0.125, 5.0], [1, 9, 9, 9], 0.3)
    assert check == {"verdict": "tie", "at": 1, "margin": 0.125}


def test_divergence_with_a_clear_margin_is_a_loss():
    assert compare([1, 2, 3], [5.0, 2.0, 5.0], [1, 9, 3], 0.3)["verdict"] == "loss"
    assert compare([1, 2, 3], [5.0, 0.01, 5.0], [1, 9, 3], 0.001)["verdict"] == "loss"  # fp32 tolerance


def test_stopping_early_or_late_is_a_divergence_too():
    assert compare([1, 2, 3], [5.0, 5.0, 5.0], [1, 2], 0.3)["verdict"] == "loss"
    assert compare([1, 2], [5.0, 5.0], [1, 2, 3], 0.3)["verdict"] == "loss"


def _row(tokens, decode, forwards, verdict="exact"):
    return {"new_tokens": tokens, "prefill_s": 0.5, "decode_s": decode, "target_forwards": forwards,
            "check": {"verdict": verdict}}


def test_summary_speedups_ties_and_oracle_closeness():
    records = [{"source": s, "runs": {"ar": _row(10, 2.0, 10), "toolspec": _row(10, 1.0, 5, "tie"),
                                      "oracle": _row(10, 0.5, 2)}} for s in ("a", "b")]
    s = summarize(records, ["ar", "toolspec", "oracle"])
    ts = s["methods"]["toolspec"]
    assert DESIGN_KEYS <= set(ts)
    assert ts["speedup_decode"] == pytest.approx(2.0) and ts["speedup_e2e"] == pytest.approx(5 / 3)
    assert ts["lossless"] and ts["numerical_ties"] == 2 and ts["mean_accepted_tokens"] == 2.0
    assert ts["vs_oracle"] == pytest.approx(0.5)
    assert set(s["sources"]) == {"a", "b"} and s["sources"]["a"]["oracle"]["speedup_decode"] == pytest.approx(4.0)



def test_host_time_per_round_and_its_share_of_decode():
    rows = [dict(_row(10, 1.0, 5), host_s=0.02), dict(_row(10, 1.0, 6), host_s=0.03)]
    figs = summarize([{"source": "a", "runs": {"toolspec": r}} for r in rows], ["toolspec"])["methods"]["toolspec"]
    assert figs["host_ms_per_round"] == pytest.approx(1000 * 0.05 / 9)  # 11 forwards, 2 of them prefills
    assert figs["host_share"] == pytest.approx(0.025)
    # a method that does not report host time (assisted, prompt_lookup) gets none, not a partial sum
    rows[1]["host_s"] = None
    figs = summarize([{"source": "a", "runs": {"assisted": r}} for r in rows], ["assisted"])["methods"]["assisted"]
    assert figs["host_ms_per_round"] is None and figs["host_share"] is None


def test_a_reasoning_targets_answer_part_is_counted_after_its_block_closed():
    """`--thinking`: the figures after the forward that closed the reasoning, over the records where
    every method's reply closed it; the report adds them, with the ratio over toolspec."""
    def row(tokens, decode, forwards, before):
        r = _row(tokens, decode, forwards)
        if before is not None:
            r["reasoning_tokens"], r["reasoning_forwards"], r["reasoning_s"] = before
        return r
    records = [{"source": "a", "runs": {"ar": row(30, 3.0, 30, (20, 20, 2.0)), "toolspec": row(30, 1.5, 12, (20, 8, 1.0)),
                                        "oospec": row(30, 1.2, 9, (21, 8, 1.0))}},
               {"source": "a", "runs": {"ar": row(10, 1.0, 10, None), "toolspec": row(10, 0.5, 4, None),
                                        "oospec": row(10, 0.5, 4, None)}}]  # cut off inside the block
    methods = summarize(records, ["ar", "toolspec", "oospec"])["methods"]
    ar, ts, oo = (methods[m]["answer_part"] for m in ("ar", "toolspec", "oospec"))
    assert ar["n"] == ts["n"] == oo["n"] == 1
    assert (ts["new_tokens"], ts["target_forwards"], ts["decode_s"]) == (10, 4, pytest.approx(0.5))
    assert ts["mean_accepted_tokens"] == 2.5 and oo["mean_accepted_tokens"] == 9 / 1
    assert ts["speedup_decode"] == pytest.approx((1.0 / 10) / (0.5 / 10))
    assert oo["speedup_decode"] == pytest.approx((1.0 / 10) / (0.2 / 9))
    results = {"methods": methods, "sources": {}}
    _describe_run(results)
    report = markdown(results)
    assert "## After the reasoning: the answer part" in report
    assert "| oospec | 1 | 21.0 | 9.0 | 1.0 | 9.00 | 4.50x | 2.25x |" in report
    plain = summarize([{"source": "a", "runs": {"ar": _row(10, 1.0, 10)}}], ["ar"])["methods"]
    assert plain["ar"]["answer_part"] is None


def test_the_thinking_flag_benches_the_embedded_thinking_target(monkeypatch, capsys):
    from oospec_agents.engine import Engine
    seen = {}

    def load(target, sidecar, **kw):
        seen["target"] = target
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", load)
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "1", "--thinking"])
    assert seen["target"] == "embedded-thinking"
    assert main(["bench", "--data", str(DATA / "dev.jsonl"), "--thinking", "--target", "Qwen/Qwen3-8B"]) != 0
    assert "--thinking benches the embedded thinking target" in capsys.readouterr().err


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
    # The shared reader's own errors (missing file, bad JSON, bad fields) are tested in test_train.py.
    from oospec_agents.bench.records import load_records
    from oospec_agents.data import DataError
    f = tmp_path / "recs.jsonl"
    f.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}], "tools": [], "expected": []}\n')
    with pytest.raises(DataError, match=r"recs.jsonl:1: malformed record, it lacks \['source'\]"):
        load_records(f)
    f.write_text("\n")
    with pytest.raises(DataError, match="empty benchmark set"):
        load_records(f)


# ------------------------------------------------------------------ end to end on the embedded default

@pytest.mark.slow
def test_small_bench_run_writes_valid_outputs_and_is_lossless(tmp_path, capsys):
    out = tmp_path / "bench"
    # --no-warmup keeps the CPU suite short; the warm-up is one more pass over the first record.
    rc = main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "2", "--max-new-tokens", "12", "--no-warmup",
               "--methods", ",".join(ALL_METHODS), "--out", str(out), "--quiet"])
    assert rc == 0

    results = json.loads((out / "results.json").read_text())
    assert list(results["methods"]) == ALL_METHODS
    for name, figs in results["methods"].items():
        assert DESIGN_KEYS <= set(figs), name
        assert figs["n"] == 2
        assert figs["lossless"], (name, [r["runs"][name]["check"] for r in results["records"]])
    assert results["methods"]["ar"]["speedup_decode"] == pytest.approx(1.0)
    assert results["methods"]["ar"]["mean_accepted_tokens"] == pytest.approx(1.0)
    assert results["methods"]["oracle"]["hint_bytes"] > 0
    for m in ("ar", "toolspec", "oospec"):  # the engine's methods split decode into forwards and host work
        assert 0 < results["methods"][m]["host_share"] < 1, m
        assert all(len(r["runs"][m]["rounds"]) == r["runs"][m]["target_forwards"] - 1 for r in results["records"])
    assert len(results["sources"]) == 2  # --limit 2 takes one record from each of two sources
    for key in ("target_device_name", "dtype", "torch", "transformers", "torch_threads"):
        assert results["env"][key], key
    # the default is the embedded sidecar, in a thread here: oospec is not silently toolspec
    assert results["env"]["sidecar"].startswith("embedded:SmolLM2-135M-Instruct"), results["env"]["sidecar"]
    assert results["env"]["sidecar_runtime"] == "WaveSidecar"
    report = (out / "report.md").read_text()
    assert all(f"| {m} |" in report for m in ALL_METHODS)
    assert (out / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("given, loaded", [([], None), (["--sidecar", "none"], False), (["--sidecar", "None"], False),
                                           (["--sidecar", "my/sidecar"], "my/sidecar")])
def test_the_sidecar_flag_reaches_the_engine(monkeypatch, given, loaded):
    """No --sidecar is the engine's default (None: the embedded sidecar); only the word 'none' loads none."""
    from oospec_agents.engine import Engine
    seen = {}

    def load(target, sidecar, **kw):
        seen.update(sidecar=sidecar, **kw)
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", load)
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "1", "--sidecar-placement", "process", *given])
    assert seen["sidecar"] == loaded and seen["sidecar_placement"] == "process"


def test_sources_sidecar_adapter_and_tree_budget_reach_the_run(monkeypatch, capsys):
    """#20: `--sources` benches only those sources' records (a source with none is an error naming it),
    `--sidecar-adapter` and `--sidecar-prior-weight` reach the engine's sidecar loader, and
    `--max-draft-nodes` the engine (0 is refused by name)."""
    from oospec_agents.bench import runner
    from oospec_agents.engine import Engine
    seen = {}

    def load(target, sidecar, **kw):
        seen.update(kw)
        return object()

    def bench(engine, records, config, **kw):
        seen.update(records=records, data=kw["data"])
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", load)
    monkeypatch.setattr(runner, "run_bench", bench)
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--sources", "apibank_l1,bfcl_simple", "--limit", "4",
              "--methods", "ar,toolspec", "--sidecar-adapter", "some/adapter", "--sidecar-prior-weight", "0",
              "--max-draft-nodes", "12"])
    assert [r["source"] for r in seen["records"]] == ["bfcl_simple", "apibank_l1"] * 2
    assert seen["max_draft_nodes"] == 12
    assert seen["sidecar_adapter"] == "some/adapter" and seen["data"].endswith("(sources apibank_l1,bfcl_simple)")
    assert seen["sidecar_prior_weight"] == 0.0
    with pytest.raises(SystemExit):  # argparse: exit status 2, the flag and the value named
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--max-draft-nodes", "0"])
    assert "--max-draft-nodes: expected an integer >= 1, got '0'" in capsys.readouterr().err
    assert main(["bench", "--data", str(DATA / "dev.jsonl"), "--sources", "tooltalk", "--methods", "ar"]) != 0
    err = capsys.readouterr().err  # the one check of oospec_agents/data.py, shared with training and evaluate
    assert "no record of source(s) ['tooltalk']" in err and "dev.jsonl" in err and "'bfcl_simple'" in err


def test_hint_first_wraps_the_sidecar_and_the_report_says_so(monkeypatch):
    """`--hint-first`: the engine's sidecar is wrapped (the target waits for the wave: every hint in
    time), results.json's config records it, and the report says the wall clock is no speed figure."""
    from oospec_agents.bench import runner
    from oospec_agents.engine import Engine
    from oospec_agents.sidecar import FixedHint
    from oospec_agents.sidecar.protocol import HintFirst
    seen = {}

    class _Engine:
        sidecar = FixedHint("x")

    def bench(engine, records, config, **kw):
        seen["sidecar"] = engine.sidecar
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: _Engine())
    monkeypatch.setattr(runner, "run_bench", bench)
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "1", "--methods", "toolspec", "--hint-first"])
    assert isinstance(seen["sidecar"], HintFirst) and seen["sidecar"].inner.text == "x"
    records = [{"source": "a", "runs": {"ar": _row(10, 2.0, 10), "oospec": _row(10, 0.5, 3)}}]
    results = summarize(records, ["ar", "oospec"])
    _describe_run(results)
    assert "--hint-first" not in markdown(results)
    results["config"]["hint_first"] = True
    assert "**--hint-first**: the target waited for the sidecar's wave" in markdown(results)


def _describe_run(results):
    results["env"] = {"target": "t", "target_device_name": "cpu", "dtype": "bfloat16", "torch": "2",
                      "transformers": "5", "torch_threads": 2, "git_commit": None}
    results["config"] = {"n_records": 1, "data": "x.jsonl", "tool_choice": "required", "max_new_tokens": 8,
                         "tie_tolerance": 0.3, "wall_s": 1.0}


def test_report_and_plot_render_from_results(tmp_path):
    records = [{"source": "a", "runs": {"ar": _row(10, 2.0, 10), "oospec": _row(10, 0.5, 3)}}]
    results = summarize(records, ["ar", "oospec"])
    _describe_run(results)
    md = markdown(results)
    assert "| oospec | 1 | 4.00x |" in md
    assert "wave prefill s" not in md  # no sidecar profile, no wave table
    plot(results, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_report_profiles_the_sidecar_wave_against_the_target_call():
    prof = {"queued_s": 0.01, "prefix_tokens": 300, "rows": 6, "prefill_s": 0.2, "steps": 9, "decode_s": 0.3,
            "wave_s": 0.5}
    oospec = _row(10, 0.5, 3) | {"accepted_by_source": {"schema": 4, "retrieval": 0, "hint": 3},
                                 "hint_ready_s": 0.6, "sidecar_profile": prof}
    records = [{"source": "a", "runs": {"ar": _row(10, 2.0, 10), "oospec": oospec}}]
    results = summarize(records, ["ar", "oospec"])
    f = results["methods"]["oospec"]
    assert f["hint_share"] == pytest.approx(0.3) and f["sidecar_wave"] == prof | {"n": 1}
    _describe_run(results)
    md = markdown(results)
    # waves, prefix, rows, queued, wave prefill, steps, wave decode, hint ready, target prefill, call, share
    assert "| oospec | 1 | 300 | 6.0 | 0.010 | 0.200 | 9.0 | 0.300 | 0.600 | 0.500 | 1.000 | 30% |" in md
    assert "## Tokens per target forward, per source" in md


# ------------------------------------------------------------------ strict (`--strict`)

STRICT_RUN = ["ar", "toolspec", "oospec", "ar+strict", "toolspec+strict", "oospec+strict"]


def test_strict_variants_follow_the_engine_methods_only():
    from oospec_agents.bench.runner import check_methods, with_strict
    assert with_strict(check_methods(ALL_METHODS)) == ALL_METHODS + ["ar+strict", "toolspec+strict", "oospec+strict"]
    assert with_strict(check_methods(["oospec", "hf_generate"])) == ["ar", "oospec", "hf_generate", "ar+strict",
                                                                     "oospec+strict"]


def test_strict_rows_are_compared_with_their_non_strict_selves():
    grammar = {"schema": 2, "grammar": 5}
    records = [{"source": "a", "runs": {
        "ar": _row(10, 2.0, 10), "oospec": _row(10, 0.5, 3),
        "ar+strict": _row(10, 1.0, 5) | {"accepted_by_source": grammar},
        "oospec+strict": _row(10, 0.4, 2) | {"accepted_by_source": grammar}}}]
    methods = ["ar", "oospec", "ar+strict", "oospec+strict"]
    results = summarize(records, methods)
    figs = results["methods"]
    assert figs["oospec+strict"]["speedup_decode"] == pytest.approx(5.0)  # over the plain ar, as every row
    assert figs["oospec+strict"]["over_non_strict_decode"] == pytest.approx(0.5 / 0.4)
    assert figs["ar+strict"]["over_non_strict_decode"] == pytest.approx(2.0)
    assert "over_non_strict_decode" not in figs["oospec"]
    _describe_run(results)
    results["config"]["strict"] = True
    md = markdown(results)
    assert "## Strict against non-strict" in md and "checked against `ar+strict`" in md
    assert "| oospec | 20.0 | 25.0 | 1.25x |" in md and "| 5.0 | 50% | yes |" in md
    assert "Goal (#19), `oospec+strict` decodes at least as fast as `oospec`: 1.25x, **met**" in md
    assert "| ar+strict | 2 | 0 | 0 | 5 |" in md  # the drafter table's grammar column


def test_the_strict_flag_reaches_the_benchmark(monkeypatch, capsys):
    from oospec_agents.bench import runner
    from oospec_agents.engine import Engine
    seen = {}

    def bench(engine, records, config, **kw):
        seen["config"] = config
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: object())
    monkeypatch.setattr(runner, "run_bench", bench)
    for flags, strict in (([], False), (["--strict"], True)):
        with pytest.raises(SystemExit):
            main(["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "1", "--methods", "ar,toolspec", *flags])
        assert seen["config"].strict is strict
    assert main(["bench", "--data", str(DATA / "dev.jsonl"), "--server", "http://x", "--methods", "oospec",
                 "--strict"]) == 2
    assert "--strict measures in process" in capsys.readouterr().err


@pytest.mark.slow
def test_a_strict_bench_runs_every_engine_method_strict_too_and_is_lossless(tmp_path):
    from oospec_agents import Engine
    from oospec_agents.bench import BenchConfig, run_bench
    from oospec_agents.bench.records import load_records
    from oospec_agents.bench.report import write_all
    records = spread(load_records(DATA / "dev.jsonl"), 2)
    config = BenchConfig(("ar", "toolspec", "oospec"), max_new_tokens=12, warmup=False, progress=False, strict=True)
    results = run_bench(Engine.shared("embedded"), records, config, data=str(DATA / "dev.jsonl"))
    paths = write_all(results, tmp_path)

    assert list(results["methods"]) == results["config"]["methods"] == STRICT_RUN
    assert results["config"]["strict"] is True
    assert results["config"]["sidecar_prior_weight"] == PRIOR_WEIGHT  # the engine's sidecar, recorded
    figs = results["methods"]
    for m in STRICT_RUN:
        assert figs[m]["n"] == 2 and DESIGN_KEYS <= set(figs[m]), m
        # strict rows against ar+strict (the masked reference), the others against ar
        assert figs[m]["lossless"], (m, [r["runs"][m]["check"] for r in results["records"]])
        grammar = (figs[m]["accepted_by_source"] or {}).get("grammar", 0)
        assert grammar > 0 if m.endswith("+strict") else grammar == 0, (m, figs[m]["accepted_by_source"])
    for m in ("ar", "toolspec", "oospec"):
        assert figs[m + "+strict"]["over_non_strict_decode"] > 0 and figs[m + "+strict"]["speedup_decode"] > 0
    assert figs["ar+strict"]["target_forwards"] < figs["ar"]["target_forwards"]  # jump-forward
    assert all(r["runs"]["ar+strict"]["check"]["verdict"] == "exact" and r["runs"]["ar+strict"]["text"]
               for r in results["records"])
    report = paths["report"].read_text()
    assert all(f"| {m} |" in report for m in STRICT_RUN)
    assert "## Strict against non-strict" in report and "Goal (#19)" in report
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ warm scenarios (`--warm-tools`, `--agent-loop`)

def test_warm_up_request_keeps_the_conversation_and_tools_and_asks_another_question():
    from oospec_agents.bench.scenarios import WARM_UP_QUESTION, turns
    rec = {"id": "r", "source": "s", "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
           "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "first"},
                        {"role": "assistant", "content": "ok"}, {"role": "user", "content": "the question"}],
           "expected": [{"name": "f", "arguments": {"a": 1}}]}
    assert list(turns(rec, "cold", "required")) == ["cold"]
    t = turns(rec, "warm_tools", "required")
    assert list(t) == ["cold", "warm"]  # cold first: its AR is the reference
    (before, choice), = t["warm"].before
    assert before[:3] == rec["messages"][:3] and before[3] == {"role": "user", "content": WARM_UP_QUESTION}
    assert choice == "required" and t["warm"].messages == rec["messages"] and not t["warm"].keep_memory
    assert t["cold"].before == [] and t["warm"].tools is rec["tools"]


def test_agent_loop_turn_two_appends_the_expected_call_and_its_result():
    from oospec_agents.bench.scenarios import turns
    rec = {"id": "r", "source": "s", "tools": [], "messages": [{"role": "user", "content": "q"}],
           "expected": [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]}
    t = turns(rec, "agent_loop", "required")
    warm, cold = t["warm"], t["cold"]
    assert warm.before == [(rec["messages"], "required")] and warm.tool_choice == "auto" and warm.keep_memory
    assistant, r1, r2 = warm.messages[1:]
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["f", "g"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
    assert [r1["tool_call_id"], r2["tool_call_id"]] == [c["id"] for c in assistant["tool_calls"]]
    assert json.loads(r1["content"])["name"] == "f"
    assert cold.messages == warm.messages and cold.before == warm.before and not cold.cached and warm.cached
    with pytest.raises(ValueError, match="expects no call"):
        turns(rec | {"expected": []}, "agent_loop", "required")
    with pytest.raises(ValueError, match="unknown scenario"):
        turns(rec, "hot", "required")


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["warm_tools", "agent_loop"])
def test_a_warm_scenario_measures_the_cached_request_beside_the_cold_one(scenario):
    from oospec_agents import Engine
    from oospec_agents.bench import BenchConfig, run_bench
    from oospec_agents.bench.records import load_records
    records = spread(load_records(DATA / "dev.jsonl"), 5)
    records = [records[0], records[4]]  # bfcl_simple, and apibank_l1 (a system prompt and earlier turns)
    assert records[1]["source"] == "apibank_l1"
    methods = ("ar", "toolspec", "oospec", "oracle")
    results = run_bench(Engine.shared("embedded"), records,
                        BenchConfig(methods, max_new_tokens=12, warmup=False, progress=False, scenario=scenario))
    assert results["env"]["scenario"] == results["config"]["scenario"] == scenario
    assert results["env"]["warm_tools"] is (scenario == "warm_tools")
    assert results["env"]["agent_loop"] is (scenario == "agent_loop")
    warm, cold = results["records"], results["cold"]["records"]
    for m in methods:
        assert results["methods"][m]["lossless"] and results["cold"]["methods"][m]["lossless"], m
        assert DESIGN_KEYS <= set(results["methods"][m]) and DESIGN_KEYS <= set(results["cold"]["methods"][m])
        for w, c in zip(warm, cold):
            w, c = w["runs"][m], c["runs"][m]
            assert c["cached_prompt_tokens"] == 0 and w["prompt_tokens"] == c["prompt_tokens"], m
            # the question (warm tools) or turn 2's new messages (agent loop) are never cached
            assert 0 < w["cached_prompt_tokens"] < w["prompt_tokens"], m
            if scenario == "agent_loop":  # turn 1's whole prompt is reused
                assert w["cached_prompt_tokens"] > w["prompt_tokens"] // 2, m
    md = markdown(results)
    assert "## Warm against cold" in md and ("**agent loop**" if scenario == "agent_loop" else "**warm tools**") in md


def test_the_payback_sweep_replaces_skipped_waves_with_toolspecs_time():
    from oospec_agents.bench.report import payback_sweep

    def rec(ts_s, oo_s, wave_s, decode_s):
        return {"runs": {"toolspec": {"prefill_s": 0.0, "decode_s": ts_s},
                         "oospec": {"prefill_s": 0.0, "decode_s": oo_s, "wave_estimate_s": wave_s,
                                    "decode_estimate_s": decode_s, "call_estimate_s": 99.0}}}
    records = [rec(2.0, 1.0, 0.5, 2.0),   # a cheap wave that paid back
               rec(2.0, 3.0, 3.0, 2.0),   # a dear one that lost (the call estimate is not what it is weighed by)
               rec(1.0, 1.0, None, 2.0)]  # no estimate yet: never skipped
    sweep = payback_sweep(records, ratios=(0.1, 1.0))
    assert sweep[float("inf")] == {"skipped": 0, "over_toolspec": pytest.approx(5.0 / 5.0)}
    assert sweep[1.0] == {"skipped": 1, "over_toolspec": pytest.approx(5.0 / 4.0)}
    assert sweep[0.1] == {"skipped": 2, "over_toolspec": pytest.approx(5.0 / 5.0)}


@pytest.mark.slow
def test_a_sampling_bench_draws_one_seed_per_record_for_every_method(tmp_path):
    """`--temperature`: ar, toolspec and oospec sample with the record's seed; in float32 the verify
    forward's logits are ar's, so every method draws ar's very tokens (`lossless`), with fewer forwards."""
    import torch
    from oospec_agents import Engine
    from oospec_agents.bench import BenchConfig, run_bench
    from oospec_agents.bench.records import load_records
    from oospec_agents.bench.report import write_all
    records = spread(load_records(DATA / "dev.jsonl"), 2)
    engine = Engine.from_pretrained("embedded", sidecar=False, dtype=torch.float32)
    config = BenchConfig(("ar", "toolspec"), max_new_tokens=24, warmup=False, progress=False, temperature=0.7, seed=5)
    results = run_bench(engine, records, config, data=str(DATA / "dev.jsonl"))
    write_all(results, tmp_path)
    assert results["config"]["temperature"] == 0.7 and results["config"]["seed"] == 5
    figs = results["methods"]
    assert figs["toolspec"]["lossless"], [r["runs"]["toolspec"]["check"] for r in results["records"]]
    assert figs["toolspec"]["target_forwards"] < figs["ar"]["target_forwards"]
    assert "`--temperature 0.7`" in (tmp_path / "report.md").read_text()
    with pytest.raises(ValueError, match="engine's methods only"):
        run_bench(engine, records, BenchConfig(("ar", "prompt_lookup"), temperature=0.7, progress=False))


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
