"""`oospec bench --concurrency` (#58 item 6): the load bench's counting on a scripted client, its flags
and conflicts, and small runs in process and against a live `oospec serve` on the embedded target."""
from __future__ import annotations

import json
import threading

import pytest

from oospec_agents.bench.load import (SEQUENTIAL, LoadConfig, Reply, Request, command_line, load_requests, markdown,
                                      plot, row, run_load_bench)
from oospec_agents.cli import main

from oospec_testing import DATA

FIGURE_KEYS = {"n", "wall_s", "req_s", "tok_s", "new_tokens", "latency_p50_s", "latency_p95_s", "forwards_per_request",
               "forwards_total", "mean_batch", "x_sequential", "replies_differ", "rows", "hints", "mean_wave_batch"}
ROW_KEYS = {"id", "source", "latency_s", "new_tokens", "target_forwards", "distinct_forwards", "batch_sizes",
            "verify_forwards", "differs", "wave_batch", "tie"}
SMALL = ["--limit", "2", "--concurrency", "1,2", "--methods", "toolspec", "--max-new-tokens", "24", "--no-warmup",
         "--quiet"]


def _records(n: int) -> list[dict]:
    return [{"id": f"r{i}", "source": "s", "messages": [{"role": "user", "content": f"q{i}"}], "tools": [],
             "expected": [{"name": "f", "arguments": {"x": i}}]} for i in range(n)]


# ------------------------------------------------------------------ counting, on a scripted client

def test_a_shared_forward_counts_once_over_the_replies_that_shared_it():
    req = Request("r", "s", [], [], "required")
    # a prefill, then 3 verify forwards: alone, then shared by 2, then by 4
    r = row(req, Reply((1,), 10, 4, [1, 2, 4], 3), 0.5)
    assert r["distinct_forwards"] == pytest.approx(1 + 1 + 0.5 + 0.25)
    assert r["verify_shares"] == (3, pytest.approx(1.75))
    # no batch sizes (an engine without batched rounds): every forward the reply's own
    assert row(req, Reply((1,), 10, 4, [], 3), 0.5)["distinct_forwards"] == 4.0
    # a server that reports no forwards: none counted
    assert row(req, Reply((1,), 10, None, [], None), 0.5)["distinct_forwards"] is None


def test_a_reply_that_differs_at_a_near_tie_is_counted_a_tie():
    from oospec_agents.bench.load import _tie
    ref, ref_margins = (1, 2, 3), [5.0, 0.1, 5.0]
    assert _tie(ref, ref_margins, (1, 9, 3), None, 0.3) is True            # the reference's margin there is 0.1
    assert _tie(ref, [5.0, 2.0, 5.0], (1, 9, 3), [5.0, 0.2, 1.0], 0.3) is True   # the other side's
    assert _tie(ref, [5.0, 2.0, 5.0], (1, 9, 3), [5.0, 2.0, 1.0], 0.3) is False  # a loss
    assert _tie("text", None, "other", None, 0.3) is None                  # a server's text: no margins


class _Scripted:
    """A client: every reply 2 forwards (prefill + 1 verify); on the threads of a level >= 2 the verify is
    shared by 2, and request r1's reply differs from its sequential one."""

    def __init__(self):
        self.resets = []

    def reset(self, requests, method):
        self.resets.append((method, [r.id for r in requests]))

    def __call__(self, req, method):
        thread = threading.current_thread().name  # the pool's threads: load-<N>_<i>, load-sequential_0
        assert thread.startswith("load-"), "every pass runs on client threads, the sequential one too"
        shared = not thread.startswith(("load-1_", "load-sequential_"))
        same = (req.id, "other" if shared and req.id == "r1" else "")
        return Reply(same, 5, 2, [2] if shared else [1], 1, 0, 0.01, 0.02, "tool_calls",
                     wave_batch=(2 if shared else 1) if req.id != "r0" else None)  # r0: no hint


class _NoForwards(_Scripted):
    """A server's client that sees no forwards."""
    root, model = "http://h:1", "m"

    def __call__(self, req, method):
        return Reply((req.id,), 5, None, [], None)


def test_every_level_serves_the_same_requests_and_is_compared_with_the_sequential_pass():
    client = _Scripted()
    results = run_load_bench(None, _records(3), LoadConfig(("toolspec", "ar"), (2, 1), warmup=False, progress=False),
                             data="x.jsonl", client=client)
    assert results["config"]["levels"] == [1, 2] and results["config"]["n_requests"] == 3
    assert list(results["methods"]) == ["toolspec", "ar"]
    # per method: the sequential pass, then each level, each after a reset
    assert [m for m, _ in client.resets] == ["toolspec"] * 3 + ["ar"] * 3
    for figs in results["methods"].values():
        seq, levels = figs[SEQUENTIAL], figs["levels"]
        assert list(levels) == ["1", "2"]
        for f in (seq, *levels.values()):
            assert FIGURE_KEYS <= set(f) and [r["id"] for r in f["rows"]] == ["r0", "r1", "r2"]
            assert all(ROW_KEYS <= set(r) and "same" not in r for r in f["rows"])
        assert seq["replies_differ"] == levels["1"]["replies_differ"] == 0 and levels["2"]["replies_differ"] == 1
        assert levels["2"]["replies_tie"] is None  # the scripted replies carry no margins
        assert seq["mean_batch"] == levels["1"]["mean_batch"] == 1.0 and levels["2"]["mean_batch"] == 2.0
        assert seq["forwards_total"] == 6.0 and levels["2"]["forwards_total"] == 4.5
        assert seq["forwards_per_request"] == levels["2"]["forwards_per_request"] == 2.0
        assert (seq["hints"], seq["mean_wave_batch"]) == (2, 1.0) and levels["2"]["mean_wave_batch"] == 2.0
        assert seq["x_sequential"] == 1.0 and levels["2"]["x_sequential"] == pytest.approx(
            levels["2"]["req_s"] / seq["req_s"])
    results["env"] = {"target": "t", "dtype": "float32", "target_device_name": "cpu", "torch": "2", "torch_threads": 1}
    md = markdown(results)
    assert "## Scenario: cold" in md and "(command not recorded)" in md
    assert "| toolspec | sequential |" in md and "| ar | 2 |" in md and "| 1 of 3 | 2 (2.00) |" in md


def test_requests_fill_the_largest_level_and_the_agent_loop_warms_turn_one():
    recs = _records(2)
    reqs = load_requests(recs, [1, 4], "cold", "required")
    assert [r.id for r in reqs] == ["r0", "r1", "r0#2", "r1#2"] and all(not r.before for r in reqs)
    loop = load_requests(recs, [1], "agent_loop", "required")
    assert len(loop) == 2 and loop[0].tool_choice == "auto" and loop[0].before == [(recs[0]["messages"], "required")]
    assert [m["role"] for m in loop[0].messages] == ["user", "assistant", "tool"]
    with pytest.raises(ValueError, match="scenarios"):
        load_requests(recs, [1], "warm_tools", "required")


def test_the_report_and_plot_render_without_forwards(tmp_path):
    """Through a server that reports no forwards, those columns say – and the plot still draws."""
    results = run_load_bench(None, _records(2), LoadConfig(("oospec",), (1, 2), warmup=False, progress=False),
                             client=_NoForwards())
    assert results["env"] == {"target": "m", "server": "http://h:1"} and results["config"]["server"] == "http://h:1"
    f = results["methods"]["oospec"]["levels"]["2"]
    assert f["forwards_total"] is None and f["mean_batch"] is None and f["forwards_per_request"] is None
    assert "through the server at http://h:1" in markdown(results) and "| – | – | – |" in markdown(results)
    plot(results, tmp_path / "load.png")
    assert (tmp_path / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_hides_the_api_key():
    assert command_line(["oospec", "bench", "--api-key", "sk-1", "--server", "http://h"]) == \
        "oospec bench --api-key '***' --server http://h"
    assert command_line(["oospec", "--api-key=sk-1"]) == "oospec '--api-key=***'"


# ------------------------------------------------------------------ the flags

@pytest.mark.parametrize("bad", ["0", "a", "", "2,0", "1,,2", "-1"])
def test_a_bad_concurrency_is_refused_naming_the_flag(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--data", str(DATA / "dev.jsonl"), "--concurrency", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --concurrency: expected comma-separated integers >= 1" in err and repr(bad) in err


@pytest.mark.parametrize("flags, named", [
    (["--agent"], "--agent"), (["--strict"], "--strict"), (["--temperature", "0.7"], "--temperature"),
    (["--layout", "split"], "--layout split"), (["--layout", "both"], "--layout both"),
    (["--warm-tools"], "--warm-tools"), (["--history"], "--history"),
    (["--methods", "toolspec,assisted"], "--methods from ar,toolspec,oospec"),
])
def test_the_load_bench_refuses_what_it_cannot_measure_before_loading_anything(flags, named, capsys, monkeypatch):
    from oospec_agents.engine import Engine
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: pytest.fail("loaded a model"))
    assert main(["bench", "--data", str(DATA / "dev.jsonl"), "--concurrency", "1,2", *flags]) == 2
    err = capsys.readouterr().err
    assert "oospec bench: error:" in err and named in err


# ------------------------------------------------------------------ end to end on the embedded target

@pytest.fixture
def fp32_engine(embedded_fp32, monkeypatch):
    """The CLI's engine load returns the session's fp32 embedded target (loaded once), after checking
    that the flags asked for it."""
    from oospec_agents.engine import Engine

    def load(target, sidecar, dtype=None, **kw):
        assert (target, sidecar, dtype) == ("embedded", False, "float32")
        return embedded_fp32
    monkeypatch.setattr(Engine, "from_pretrained", load)
    return embedded_fp32


def _check(out, server: bool) -> dict:
    results = json.loads((out / "results.json").read_text())
    cfg = results["config"]
    assert cfg["levels"] == [1, 2] and cfg["n_requests"] == 2 and cfg["methods"] == ["toolspec"]
    assert cfg["scenario"] == results["scenario"] == "cold" and bool(cfg["server"]) is server
    figs = results["methods"]["toolspec"]
    assert list(figs["levels"]) == ["1", "2"]
    for f in (figs[SEQUENTIAL], *figs["levels"].values()):
        assert FIGURE_KEYS <= set(f) and f["n"] == 2 and f["req_s"] > 0 and f["tok_s"] > 0
        assert 0 < f["latency_p50_s"] <= f["latency_p95_s"]
        assert 0 <= f["replies_differ"] <= 2  # reported, not failed
        assert f["forwards_per_request"] >= 2  # a prefill and at least one verify forward
        # a shared forward counts once: the distinct forwards are at most the replies' own, summed
        assert 0 < f["forwards_total"] <= f["forwards_per_request"] * 2 + 1e-9
        assert f["mean_batch"] >= 1.0
        for r in f["rows"]:
            assert ROW_KEYS <= set(r) and r["new_tokens"] <= 24
    assert figs[SEQUENTIAL]["x_sequential"] == 1.0 and figs[SEQUENTIAL]["mean_batch"] == 1.0
    report = (out / "report.md").read_text()
    assert "## Scenario: cold" in report and "| toolspec | sequential |" in report and "| toolspec | 2 |" in report
    assert "--concurrency 1,2" in report and "--methods toolspec" in report
    assert (out / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return results


@pytest.mark.slow
def test_a_small_load_bench_in_process(tmp_path, fp32_engine, capsys):
    out = tmp_path / "load"
    rc = main(["bench", "--data", str(DATA / "dev.jsonl"), "--dtype", "float32", "--sidecar", "none", *SMALL,
               "--out", str(out)])
    assert rc == 0 and "wrote " in capsys.readouterr().out
    results = _check(out, server=False)
    assert results["env"]["dtype"] == "float32"
    assert results["config"]["command"].startswith("oospec bench --data ")


@pytest.mark.slow
def test_a_small_load_bench_against_a_live_server(tmp_path, embedded_fp32):
    from oospec_agents.serve import create_app
    from serve_testing import running
    out = tmp_path / "load"
    with running(create_app(embedded_fp32, model="embedded")) as url:
        assert main(["bench", "--data", str(DATA / "dev.jsonl"), "--server", url, *SMALL, "--out", str(out)]) == 0
    results = _check(out, server=True)
    assert results["env"]["target"] == "embedded" and results["config"]["server"] == url
