"""`oospec bench --agent` (#55): agent episodes with simulated tools, toolspec / oospec / oospec+tools.

Fast tests drive the CLI with `Scripted` (the real engine on a model scripted to write hermes replies, its
scripted sidecar predicting the call); the slow one runs the embedded model end to end."""
from __future__ import annotations

import json
import os
import threading

import pytest

from oospec_agents.bench import agent_tools
from oospec_agents.bench.agent_tools import Latency, Simulator, recorded_results
from oospec_agents.cli import main
from oospec_agents.testing import Scripted

from oospec_testing import DATA

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}
ROME = {"name": "get_weather", "arguments": {"city": "Rome"}}
KEYS = {"agent_wall_s", "model_s", "tool_s", "hidden_s", "hits", "predictions", "wasted", "alpha", "G", "g", "T",
        "bound_s", "captured", "speedup_vs_toolspec", "transcripts_equal", "target_forwards"}


def _call(call: dict) -> str:
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (call["name"], json.dumps(call["arguments"]))


class EpisodeEngine(Scripted):
    """Writes an episode by its step (the assistant turns in the request): step 0 calls Paris's weather,
    step 1 answers. With `predicted`, its sidecar predicts that call for step 0 (oospec's `CallPredicted`);
    with `wait_for`, the reply goes on only once that event is set (the tool finished: a reply longer than
    the tool, without a sleep). `engine` keywords go to the engine (`target_cores`: a split layout's)."""

    def __init__(self, predicted=PARIS, wait_for: threading.Event | None = None, **engine):
        super().__init__(predictions={}, **engine)
        self.predicted, self.wait_for = predicted, wait_for
        self.cleared = 0

    def stream(self, messages, tools=None, **kw):
        self.kw = kw
        step = sum(m["role"] == "assistant" for m in messages)
        self.script.add(_call(PARIS) if step == 0 else "It is sunny in Paris.",
                        predicted=[self.predicted] if step == 0 and self.predicted else None)
        events = super().stream(messages, tools, **kw)
        return self._gated(events) if self.wait_for is not None else events

    def _gated(self, events):
        for event in events:
            yield event
            if type(event).__name__ == "CallPredicted":
                assert self.wait_for.wait(10), "the speculative tool never finished"
                self.wait_for.clear()  # the next episode's tool has not run yet

    def clear_call_memory(self):
        self.cleared += 1
        super().clear_call_memory()


@pytest.fixture
def records(tmp_path):
    path = tmp_path / "records.jsonl"
    recs = [{"id": f"r{i}", "source": "s", "messages": [{"role": "user", "content": "Weather in Paris?"}],
             "tools": [WEATHER], "expected": [PARIS]} for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _bench(monkeypatch, engine, records, out, *flags, split=None):
    from oospec_agents.bench import cli
    from oospec_agents.engine import Engine
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: engine)
    if split is not None:
        monkeypatch.setattr(cli, "_split_engine", lambda *a, **kw: split)
    rc = main(["bench", "--agent", "--data", str(records), "--limit", "2", "--tool-latency", "0.01", "--no-warmup",
               "--quiet", "--sidecar", "none", "--out", str(out), *flags])
    assert rc == 0
    return json.loads((out / "results.json").read_text())


def test_the_cli_writes_results_report_and_plot_with_the_agent_keys(monkeypatch, records, tmp_path):
    engine, split = EpisodeEngine(), EpisodeEngine(target_cores=frozenset(os.sched_getaffinity(0)))
    out = tmp_path / "out"
    results = _bench(monkeypatch, engine, records, out, "--layout", "both", split=split)
    methods = ["toolspec", "toolspec@split", "oospec", "oospec@split", "oospec+tools", "oospec+tools@split"]
    assert list(results["methods"]) == methods
    for m, f in results["methods"].items():
        assert KEYS <= set(f), m
        assert f["transcripts_equal"] and f["n"] == 2 and f["steps"] == 2, m
        assert f["tool_s"] == pytest.approx(0.01) and f["T"] == pytest.approx(0.01)
    figs = results["methods"]
    assert figs["oospec+tools"]["hits"] == 2 and figs["oospec+tools@split"]["hits"] == 2
    assert figs["oospec+tools"]["alpha"] == 1.0 and figs["toolspec"]["alpha"] == 0.0
    assert figs["oospec"]["hits"] == 0 and figs["oospec"]["predictions"] == 2  # predicted, nothing started
    assert figs["toolspec"]["speedup_vs_toolspec"] == 1.0
    assert "speedup_vs_toolspec_shared" in figs["oospec+tools@split"]
    assert results["config"]["tool_latency"] == "0.01" and results["config"]["max_steps"] == 4
    # each episode starts a new session (call memory cleared), and the runner's row told the engine its tools
    assert engine.cleared == 6 and split.cleared == 6
    report = (out / "report.md").read_text()
    assert all(f"| {m} |" in report for m in methods)
    assert (out / "agent.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_oospec_plus_tools_hides_the_tool_time_on_a_scripted_hit(monkeypatch, records, tmp_path):
    """The prediction starts the tool during the reply; the reply ends only after the tool finished, so
    the agent waits for nothing after it: the tool's time is hidden (toolspec's is not)."""
    done = threading.Event()
    run = Simulator.acall

    async def acall(self, name, arguments):
        out = await run(self, name, arguments)
        done.set()
        return out
    monkeypatch.setattr(Simulator, "acall", acall)
    engine = EpisodeEngine(wait_for=done)
    results = _bench(monkeypatch, engine, records, tmp_path / "out", "--methods", "toolspec,oospec+tools",
                     "--tool-latency", "0.2")
    spec, tools = results["methods"]["toolspec"], results["methods"]["oospec+tools"]
    assert tools["hits"] == 2 and tools["wasted"] == 0 and tools["alpha"] == 1.0
    assert tools["hidden_s"] > 0.1 > spec["hidden_s"]  # most of the 0.2 s tool time against none
    assert tools["bound_s"] > 0.1 and tools["captured"] > 0.5
    for row in results["episodes"]:
        step = row["runs"]["oospec+tools"]["steps"][0]
        assert step["exact"] and step["tools_wall"] < 0.1  # the result was there when the reply ended
    assert set(engine.kw["speculative_tools"]) == {"get_weather"}  # the pay-back rule was told the tools


def test_a_wrong_prediction_is_wasted_and_the_call_runs_normally(monkeypatch, records, tmp_path):
    results = _bench(monkeypatch, EpisodeEngine(predicted=ROME), records, tmp_path / "out",
                     "--methods", "toolspec,oospec+tools")
    f = results["methods"]["oospec+tools"]
    assert f["hits"] == 0 and f["wasted"] == 2 and f["predictions"] == 2 and f["alpha"] == 0.0
    assert f["bound_s"] == 0.0 and f["captured"] is None and f["transcripts_equal"]


def test_a_different_transcript_is_reported_not_hidden():
    from oospec_agents.bench.agent import transcript_check
    from oospec_agents.bench.agent_tools import Latency as _L  # noqa: F401
    from oospec_agents.bench.agent import Step

    def step(ids, margins, results=("x",)):
        return Step(0.1, None, 0.0, 0.0, [], None, [], list(results), ids, margins, "t", "", 2, "stop", 0, None, None)
    ref = [step([1, 2, 3], [5.0, 0.1, 5.0])]
    assert transcript_check(ref, [step([1, 2, 3], None)], 0.3)["verdict"] == "exact"
    assert transcript_check(ref, [step([1, 9, 3], None)], 0.3)["verdict"] == "tie"  # the reference's margin
    assert transcript_check([step([1, 2, 3], [5.0, 5.0, 5.0])], [step([1, 9], [5.0, 0.2])], 0.3)["verdict"] == "tie"
    loss = transcript_check(ref, [step([7, 2, 3], [5.0, 5.0, 5.0])], 0.3)
    assert loss["verdict"] == "loss" and loss["step"] == 0 and loss["what"] == "tokens"
    assert transcript_check(ref, [step([1, 2, 3], None, ("y",))], 0.3)["what"] == "tool results"


def test_agent_is_its_own_flag_and_no_abbreviation_of_agent_loop(monkeypatch, records, capsys):
    from oospec_agents.bench import agent, runner
    from oospec_agents.engine import Engine
    seen = {}
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: EpisodeEngine())
    monkeypatch.setattr(agent, "run_agent_bench", lambda *a, **kw: seen.setdefault("agent", True) and exit(7))
    monkeypatch.setattr(runner, "run_bench", lambda e, r, config, **kw: seen.setdefault("scenario", config.scenario)
                        and exit(7))
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(records), "--agent", "--sidecar", "none"])
    assert seen == {"agent": True}
    with pytest.raises(SystemExit):
        main(["bench", "--data", str(records), "--agent-loop", "--sidecar", "none", "--methods", "toolspec"])
    assert seen["scenario"] == "agent_loop"
    with pytest.raises(SystemExit) as e:  # a prefix of a flag is no flag any more
        main(["bench", "--data", str(records), "--agent-lo"])
    assert e.value.code == 2 and "unrecognized arguments: --agent-lo" in capsys.readouterr().err


def test_tool_latency_values_parse_and_bad_ones_are_named(records, capsys):
    assert Latency.parse("0.25") == Latency(0.25) and Latency.parse("2").median == 2.0
    ln = Latency.parse("lognormal:0.5")
    assert ln.median == 0.5 and ln.sigma == agent_tools.LOGNORMAL_SIGMA and str(ln) == "lognormal:0.5:0.5"
    assert Latency.parse("lognormal:0.5:0.8").sigma == 0.8
    draws = [ln.draw("r0", step, "get_weather") for step in range(200)]
    assert draws == [ln.draw("r0", step, "get_weather") for step in range(200)]  # seeded: every method alike
    assert len(set(draws)) == 200 and sorted(draws)[100] == pytest.approx(0.5, rel=0.25)
    for bad in ("fast", "-1", "lognormal:0", "lognormal:x", "lognormal:1:-2", "2:3", "nan", "inf"):
        with pytest.raises(ValueError, match=f"--tool-latency: expected seconds >= 0 .*got '{bad}'"):
            Latency.parse(bad)
    with pytest.raises(SystemExit):
        main(["bench", "--agent", "--data", str(records), "--tool-latency", "lognormal:-1"])
    assert "argument --tool-latency: expected seconds >= 0" in capsys.readouterr().err
    # agent flags without --agent, and decode-bench flags with it, are refused by name
    assert main(["bench", "--data", str(records), "--tool-latency", "1"]) == 2
    assert "--tool-latency and --max-steps set up agent episodes: add --agent" in capsys.readouterr().err
    assert main(["bench", "--agent", "--data", str(records), "--tool-choice", "required"]) == 2
    assert "--agent asks every step with tool_choice=auto" in capsys.readouterr().err
    assert main(["bench", "--agent", "--data", str(records), "--methods", "ar,oospec+tools"]) == 2
    assert "unknown agent method(s) ['ar']" in capsys.readouterr().err


def test_tools_answer_with_the_datasets_own_result_else_a_canned_echo():
    rec = {"id": "t1", "source": "tooltalk", "meta": {"conversation_id": "c1"}, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rainy"},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}]}
    results = recorded_results([rec])
    sim = Simulator(Latency(0.0), results)
    sim.at({"id": "t2", "source": "tooltalk", "meta": {"conversation_id": "c1"}}, 0)  # a later record of it
    assert sim.call("get_weather", {"city": "Paris"}) == "sunny" and sim.call("get_weather", {"city": "Rome"}) == "rainy"
    assert json.loads(sim.call("get_weather", {"city": "Oslo"})) == {"name": "get_weather", "status": "success",
                                                                     "arguments": {"city": "Oslo"}}
    sim.at({"id": "x", "source": "tooltalk", "meta": {"conversation_id": "other"}}, 0)
    assert json.loads(sim.call("get_weather", {"city": "Paris"}))["status"] == "success"  # another conversation's
    # the shared data: ToolTalk's later records hold the responses to the earlier calls
    from oospec_agents import data
    recorded = recorded_results(data.load_records(DATA / "train-extra.jsonl"))
    assert sum(len(v) for k, v in recorded.items() if k[0] == "tooltalk") > 100


@pytest.mark.slow
def test_agent_episodes_on_the_embedded_model_keep_every_transcript(tmp_path):
    """Two dev episodes, every method, the real engine and sidecar: the same transcripts, and results.json's keys."""
    out = tmp_path / "agent"
    rc = main(["bench", "--agent", "--data", str(DATA / "dev.jsonl"), "--limit", "2", "--tool-latency", "0.01",
               "--max-new-tokens", "32", "--max-steps", "2", "--no-warmup", "--quiet", "--dtype", "float32",
               "--out", str(out)])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["methods"]) == ["toolspec", "oospec", "oospec+tools"]
    for m, f in results["methods"].items():
        assert KEYS <= set(f) and f["transcripts_equal"], (m, [r["runs"][m]["check"] for r in results["episodes"]])
        assert f["target_forwards"] > 0
    assert results["methods"]["oospec+tools"]["runner"] is not None


def test_the_two_device_projection_hides_exact_steps_tool_time_behind_toolspecs_model_time():
    from oospec_agents.bench.agent_report import two_devices

    def step(G, g, T, exact, forwards=10):
        return {"G": G, "g": g, "T": T, "exact": exact, "target_forwards": forwards}
    rows = [{"runs": {"toolspec": {"steps": [step(2.0, None, 1.0, None), step(1.0, None, 0.0, None)]},
                      "oospec+tools@split": {"steps": [step(3.0, 0.5, 1.0, True, 6), step(1.5, None, 0.0, None, 5)]}}},
            {"runs": {"toolspec": {"steps": [step(2.0, None, 1.0, None)]},
                      "oospec+tools@split": {"steps": [step(2.5, 0.5, 1.0, False, 8)]}}},
            {"runs": {"toolspec": {"steps": [step(0.4, None, 1.0, None)]},  # exact, but after the reply's end
                      "oospec+tools@split": {"steps": [step(0.8, 0.5, 1.0, True, 8)]}}},
            {"runs": {"toolspec": {"steps": [step(2.0, None, 1.0, None)]},  # transcripts differ: left out
                      "oospec+tools@split": {"steps": [step(2.0, 0.5, 1.0, True), step(1.0, None, 0.0, None)]}}}]
    proj = two_devices(rows, ["toolspec", "oospec+tools@split"])
    # episode 1: max(2, 0.5 + 1) + 1 = 3 against 4; episode 2 (a miss): 3 against 3; episode 3: 1.4 against 1.4
    assert proj["n"] == 3 and proj["from"] == "oospec+tools@split"
    assert proj["toolspec_wall_s"] == pytest.approx(8.4 / 3) and proj["oospec+tools_wall_s"] == pytest.approx(7.4 / 3)
    assert proj["speedup"] == pytest.approx(8.4 / 7.4) and proj["forwards_ratio"] == pytest.approx(27 / 40)
    assert two_devices(rows, ["toolspec", "oospec"]) is None
