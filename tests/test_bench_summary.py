"""`oospec bench`'s figures: the lossless check (a near tie is no loss), the summary, host time per
round, a reasoning target's answer part; the report, the plot and the pay-back sweep."""
from __future__ import annotations

import pytest

from oospec_agents.bench.metrics import compare, summarize
from oospec_agents.bench.report import markdown, plot

from bench_testing import DESIGN_KEYS, describe_run, run_row


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


def test_summary_speedups_ties_and_oracle_closeness():
    records = [{"source": s, "runs": {"ar": run_row(10, 2.0, 10), "toolspec": run_row(10, 1.0, 5, "tie"),
                                      "oracle": run_row(10, 0.5, 2)}} for s in ("a", "b")]
    s = summarize(records, ["ar", "toolspec", "oracle"])
    ts = s["methods"]["toolspec"]
    assert DESIGN_KEYS <= set(ts)
    assert ts["speedup_decode"] == pytest.approx(2.0) and ts["speedup_e2e"] == pytest.approx(5 / 3)
    assert ts["lossless"] and ts["numerical_ties"] == 2 and ts["mean_accepted_tokens"] == 2.0
    assert ts["vs_oracle"] == pytest.approx(0.5)
    assert set(s["sources"]) == {"a", "b"} and s["sources"]["a"]["oracle"]["speedup_decode"] == pytest.approx(4.0)


def test_host_time_per_round_and_its_share_of_decode():
    rows = [dict(run_row(10, 1.0, 5), host_s=0.02), dict(run_row(10, 1.0, 6), host_s=0.03)]
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
        r = run_row(tokens, decode, forwards)
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
    describe_run(results)
    report = markdown(results)
    assert "## After the reasoning: the answer part" in report
    assert "| oospec | 1 | 21.0 | 9.0 | 1.0 | 9.00 | 4.50x | 2.25x |" in report
    plain = summarize([{"source": "a", "runs": {"ar": run_row(10, 1.0, 10)}}], ["ar"])["methods"]
    assert plain["ar"]["answer_part"] is None


def test_report_and_plot_render_from_results(tmp_path):
    records = [{"source": "a", "runs": {"ar": run_row(10, 2.0, 10), "oospec": run_row(10, 0.5, 3)}}]
    results = summarize(records, ["ar", "oospec"])
    describe_run(results)
    md = markdown(results)
    assert "| oospec | 1 | 4.00x |" in md
    assert "wave prefill s" not in md  # no sidecar profile, no wave table
    plot(results, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_report_profiles_the_sidecar_wave_against_the_target_call():
    prof = {"queued_s": 0.01, "prefix_tokens": 300, "cached_prefix_tokens": 240, "rows": 6, "prefill_s": 0.2, "steps": 9, "decode_s": 0.3,
            "wave_s": 0.5}
    oospec = run_row(10, 0.5, 3) | {"accepted_by_source": {"schema": 4, "retrieval": 0, "hint": 3},
                                 "hint_ready_s": 0.6, "sidecar_profile": prof}
    records = [{"source": "a", "runs": {"ar": run_row(10, 2.0, 10), "oospec": oospec}}]
    results = summarize(records, ["ar", "oospec"])
    f = results["methods"]["oospec"]
    assert f["hint_share"] == pytest.approx(0.3) and f["sidecar_wave"] == prof | {"n": 1}
    describe_run(results)
    md = markdown(results)
    # waves, prefix, cached, rows, queued, wave prefill, steps, wave decode, hint ready, target prefill, call, share
    assert "| oospec | 1 | 300 | 240 | 6.0 | 0.010 | 0.200 | 9.0 | 0.300 | 0.600 | 0.500 | 1.000 | 30% |" in md
    assert "## Tokens per target forward, per source" in md


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
