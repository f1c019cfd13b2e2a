"""`oospec bench --strict`: strict variants of the engine methods, compared with their non-strict selves."""
from __future__ import annotations

import pytest

from oospec_agents.bench.metrics import summarize
from oospec_agents.bench.records import spread
from oospec_agents.bench.report import markdown
from oospec_agents.cli import main
from oospec_agents.sidecar.wave import PRIOR_WEIGHT

from oospec_testing import DATA
from bench_testing import ALL_METHODS, DESIGN_KEYS, describe_run, run_row


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
        "ar": run_row(10, 2.0, 10), "oospec": run_row(10, 0.5, 3),
        "ar+strict": run_row(10, 1.0, 5) | {"accepted_by_source": grammar},
        "oospec+strict": run_row(10, 0.4, 2) | {"accepted_by_source": grammar}}}]
    methods = ["ar", "oospec", "ar+strict", "oospec+strict"]
    results = summarize(records, methods)
    figs = results["methods"]
    assert figs["oospec+strict"]["speedup_decode"] == pytest.approx(5.0)  # over the plain ar, as every row
    assert figs["oospec+strict"]["over_non_strict_decode"] == pytest.approx(0.5 / 0.4)
    assert figs["ar+strict"]["over_non_strict_decode"] == pytest.approx(2.0)
    assert "over_non_strict_decode" not in figs["oospec"]
    describe_run(results)
    results["config"]["strict"] = True
    md = markdown(results)
    assert "## Strict against non-strict" in md and "checked against `ar+strict`" in md
    assert "| oospec | 20.0 | 25.0 | 1.25x |" in md and "| 5.0 | 50% | yes |" in md
    assert "Goal: `oospec+strict` decodes at least as fast as `oospec`: 1.25x, **met**" in md
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
    assert "## Strict against non-strict" in report and "Goal: `oospec+strict` decodes at least as fast" in report
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
