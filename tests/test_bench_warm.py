"""`oospec bench`'s warm scenarios (`--warm-tools`, `--agent-loop`): the cached request beside the cold one."""
from __future__ import annotations

import json

import pytest

from oospec_agents.bench.records import spread
from oospec_agents.bench.report import markdown

from oospec_testing import DATA
from bench_testing import DESIGN_KEYS


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
