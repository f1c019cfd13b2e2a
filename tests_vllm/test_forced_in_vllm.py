"""OoOSpecProposer inside vLLM's in-process `LLM` (CPU build, float32) when vLLM holds the reply: tool_choice
"required" (its JSON list of calls), a named tool (its arguments object) and strict tools (its hermes
structural tag, under "required" and "auto"), held by vLLM's structured outputs as its server holds them
(`bench.vllm_backend.constraints`) on both sides: replies equal vLLM's AR one at a time and 8 in flight at
once (vLLM batches them, the proposer drafts per row), our drafts accepted, no request ended by vLLM's
grammar (FSM failure); the same prompt twice in flight at once. (test_in_vllm.py covers tool_choice auto.)"""
from __future__ import annotations

import pytest

from oospec_agents.bench.vllm_backend import constraints, run_isolated, strict_tools

K, MAX_TOKENS, N, IN_FLIGHT = 8, 96, 4, 8


@pytest.fixture(scope="module")
def prompts(engine, records) -> dict:
    """The first records' plain prompts under each way vLLM holds a forced or strict call; two auto
    prompts; the first record's prompt twice (identical requests at once)."""
    rs = records[:N]
    auto = [engine.prompt_ids(r["messages"], r["tools"]) for r in rs]
    strict = [dict(r, tools=strict_tools(r["tools"])) for r in rs]
    strict_ids = [engine.prompt_ids(r["messages"], r["tools"]) for r in strict]
    groups = {"required": (auto, constraints(rs, "required")),
              "named": (auto, constraints(rs, "named")),
              "strict_required": (strict_ids, constraints(strict, "required", strict=True)),
              "strict_auto": (strict_ids[:2], constraints(strict[:2], "auto", strict=True)),
              "auto": (auto[:2], [None, None]),
              "twice": ([auto[0], auto[0]], [None, None])}
    out, at = {"ids": [], "held": [], "at": {}}, 0
    for name, (ids, held) in groups.items():
        out["ids"] += ids
        out["held"] += held
        out["at"][name] = slice(at, at + len(ids))
        at += len(ids)
    return out


def run_method(method: str, model_dir: str, prompts: dict) -> dict:
    stats: dict = {}
    runs = run_isolated(method, model_dir, prompts["ids"], MAX_TOKENS, k=K, constraints=prompts["held"],
                        concurrency=[IN_FLIGHT], stats=stats)
    return dict(runs, stats=stats, at=prompts["at"])




def _ids(run: dict, group: str, name: str = "one") -> list[list[int]]:
    return [r.token_ids for r in run[name][run["at"][group]]]


def test_replies_equal_vllm_ar_one_at_a_time_and_in_flight(ar, oospec):
    for name in ("one", f"c{IN_FLIGHT}"):
        for group in ar["at"]:
            assert _ids(oospec, group, name) == _ids(ar, group, name), (name, group)


def test_forced_calls_written_as_vllm_holds_them_and_drafted(oospec):
    for group, opener in (("required", "["), ("named", "{"), ("strict_required", "<tool_call>")):
        rows = oospec["one"][oospec["at"][group]]
        assert all(r.text.lstrip().startswith(opener) for r in rows), (group, [r.text[:40] for r in rows])
        assert sum(r.accepted for r in rows) > 0, group
        assert all(r.finish_reason in ("stop", "length") for r in rows), group


def test_identical_prompts_in_flight(oospec):
    twice = oospec[f"c{IN_FLIGHT}"][oospec["at"]["twice"]]
    assert twice[0].token_ids == twice[1].token_ids
    assert twice[0].accepted > 0 and twice[1].accepted > 0


def test_no_fsm_failure_and_the_proposers_counts(ar, oospec):
    """No request ended by vLLM's grammar ("failed to advance FSM", from vLLM's log); the proposer's own
    counts came back from vLLM's worker."""
    assert ar["stats"]["fsm_logs"] == 0 and oospec["stats"]["fsm_logs"] == 0
    one = oospec["stats"]["one"]
    assert one["steps"] > 0 and one["draft_tokens"] > 0 and one["propose_s"] > 0
