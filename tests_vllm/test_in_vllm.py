"""OoOSpecProposer inside vLLM's in-process `LLM` (CPU build, float32): replies equal vLLM's own AR on 24
dev records (tool_choice auto), one at a time and 8 in flight at once (vLLM batches them); more drafts
accepted than vLLM's `ngram`; a prompt with no tools and one whose format is not recognised are served as
AR serves them (the latter with no drafts at all); tool_choice "required", a named tool and strict tools
held by vLLM's structured outputs as its server holds them (`constraints`), on both sides, with no
request ended by vLLM's grammar (FSM failure); the same prompt twice in flight at once."""
from __future__ import annotations

import pytest

from oospec_agents.bench.vllm_backend import constraints, run_isolated, strict_tools

K, MAX_TOKENS, N_REQUIRED, N_NAMED, N_STRICT, IN_FLIGHT = 8, 96, 8, 4, 4, 8


@pytest.fixture(scope="module")
def prompts(engine, records) -> dict[str, list]:
    """The records' prompts (tool_choice auto); one without tools, one in no chat format; then the first
    records again as vLLM's server serves tool_choice "required" and a named tool (the plain prompt, the reply
    held to its JSON schema by vLLM's structured outputs), then with every tool strict (its hermes structural
    tag) under "required" and "auto"; last, the first record's prompt twice (identical requests at once)."""
    plain = engine.tokenizer.encode("Q: what is 12 times 12?\nA: 12 times 12 is", add_special_tokens=False)
    auto = [engine.prompt_ids(r["messages"], r["tools"]) for r in records]
    strict = [dict(r, tools=strict_tools(r["tools"])) for r in records[:N_STRICT]]
    strict_ids = [engine.prompt_ids(r["messages"], r["tools"]) for r in strict]
    groups = {"records": (auto, [None] * len(auto)),
              "extra": ([engine.prompt_ids(records[0]["messages"], None), plain], [None, None]),
              "required": (auto[:N_REQUIRED], constraints(records[:N_REQUIRED], "required")),
              "named": (auto[:N_NAMED], constraints(records[:N_NAMED], "named")),
              "strict_required": (strict_ids, constraints(strict, "required", strict=True)),
              "strict_auto": (strict_ids, constraints(strict, "auto", strict=True)),
              "twice": ([auto[0], auto[0]], [None, None])}
    out, at = {"ids": [], "held": [], "at": {}}, 0
    for name, (ids, held) in groups.items():
        out["ids"] += ids
        out["held"] += held
        out["at"][name] = slice(at, at + len(ids))
        at += len(ids)
    return out


def _run(method: str, model_dir: str, prompts: dict) -> dict:
    """All the prompts one at a time, then (but for ngram) 8 kept in flight at once, in one vLLM."""
    stats: dict = {}
    runs = run_isolated(method, model_dir, prompts["ids"], MAX_TOKENS, k=K, constraints=prompts["held"],
                        concurrency=[IN_FLIGHT] if method != "vllm-ngram" else None, stats=stats)
    return dict(runs, stats=stats, at=prompts["at"])


def _ids(run: dict, group: str, name: str = "one") -> list[list[int]]:
    return [r.token_ids for r in run[name][run["at"][group]]]


@pytest.fixture(scope="module")
def ar(model_dir, prompts):
    return _run("vllm-ar", model_dir, prompts)


@pytest.fixture(scope="module")
def oospec(model_dir, prompts):
    return _run("vllm-oospec", model_dir, prompts)


@pytest.fixture(scope="module")
def ngram(model_dir, prompts):
    return _run("vllm-ngram", model_dir, prompts)


def test_replies_equal_vllm_ar_one_at_a_time(ar, oospec, records):
    assert len(records) >= 24
    for group in ar["at"]:
        mine, theirs = _ids(oospec, group), _ids(ar, group)
        diffs = [i for i in range(len(mine)) if mine[i] != theirs[i]]
        assert diffs == [], (group, diffs)
    assert sum(r.accepted for r in oospec["one"][oospec["at"]["records"]]) > 0


def test_in_flight_replies_each_equal_vllm_ar(ar, oospec):
    """8 kept in flight at once (vLLM batches them, the proposer drafts per row): each equals AR's reply,
    under every tool_choice and strict, the same prompt twice at once included."""
    name = f"c{IN_FLIGHT}"
    for group in ar["at"]:
        assert _ids(oospec, group, name) == _ids(ar, group, name), group
    twice = oospec[name][oospec["at"]["twice"]]
    assert twice[0].token_ids == twice[1].token_ids and twice[0].accepted > 0 and twice[1].accepted > 0
    assert sum(r.accepted for r in oospec[name][oospec["at"]["records"]]) > 0


def test_more_drafts_accepted_than_ngram(ar, oospec, ngram, records):
    at = ar["at"]["records"]
    assert _ids(ngram, "records") == _ids(ar, "records")
    ours, theirs = (sum(r.accepted for r in run["one"][at]) for run in (oospec, ngram))
    steps_ours, steps_ar = (sum(r.forwards for r in run["one"][at]) for run in (oospec, ar))
    assert ours > theirs, (ours, theirs)
    assert steps_ours < steps_ar


def test_prompts_without_tools_or_format(ar, oospec):
    no_tools, plain = oospec["one"][oospec["at"]["extra"]]
    assert [no_tools.token_ids, plain.token_ids] == _ids(ar, "extra")
    assert plain.drafted == 0  # not recognised: no drafts, no error


def test_forced_calls_held_by_vllms_structured_outputs(ar, oospec):
    """tool_choice "required" (a JSON list of calls), a named tool (its arguments object) and strict tools
    (hermes's structural tag): equal replies, written as vLLM's grammar holds them, our drafts accepted."""
    for group, opener in (("required", "["), ("named", "{"), ("strict_required", "<tool_call>")):
        assert _ids(oospec, group) == _ids(ar, group), group
        rows = oospec["one"][oospec["at"][group]]
        assert all(r.text.lstrip().startswith(opener) for r in rows), (group, [r.text[:40] for r in rows])
        assert sum(r.accepted for r in rows) > 0, group
        assert all(r.finish_reason in ("stop", "length") for r in rows), group


def test_no_fsm_failure_and_the_proposers_counts(ar, oospec, ngram):
    """No request of any method ended by vLLM's grammar ("failed to advance FSM", from vLLM's log); the
    proposer's own counts came back from vLLM's worker."""
    for run in (ar, oospec, ngram):
        assert run["stats"]["fsm_logs"] == 0
    one = oospec["stats"]["one"]
    assert one["steps"] > 0 and one["draft_tokens"] > 0 and one["propose_s"] > 0
