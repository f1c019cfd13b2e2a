"""OoOSpecProposer inside vLLM's in-process `LLM` (CPU build, float32): replies equal vLLM's own AR on 24
dev records (tool_choice auto), one at a time and batched; more drafts accepted than vLLM's `ngram`; a
prompt with no tools and one whose format is not recognised are served as AR serves them (the latter
with no drafts at all); tool_choice "required" against vLLM's structured outputs, on both sides."""
from __future__ import annotations

import pytest

from oospec_agents.bench.vllm_backend import required_schema, run_isolated

K, MAX_TOKENS, N_REQUIRED = 8, 96, 8


@pytest.fixture(scope="module")
def prompts(engine, records) -> dict[str, list]:
    """The records' prompts (tool_choice auto); one without tools, one in no chat format; then the first
    records again with tool_choice "required" as vLLM's server does it (the plain prompt, the reply held
    to its JSON schema of the calls by vLLM's structured outputs)."""
    plain = engine.tokenizer.encode("Q: what is 12 times 12?\nA: 12 times 12 is", add_special_tokens=False)
    auto = [engine.prompt_ids(r["messages"], r["tools"]) for r in records]
    return {"records": auto, "extra": [engine.prompt_ids(records[0]["messages"], None), plain],
            "required": auto[:N_REQUIRED], "schemas": [required_schema(r["tools"]) for r in records[:N_REQUIRED]]}


def run_method(method: str, model_dir: str, prompts: dict) -> dict:
    """All the prompts one at a time, then (but for ngram) all of them batched, in one vLLM."""
    every = prompts["records"] + prompts["extra"] + prompts["required"]
    schemas = [None] * (len(every) - N_REQUIRED) + prompts["schemas"]
    return run_isolated(method, model_dir, every, MAX_TOKENS, k=K, together=method != "vllm-ngram", schemas=schemas)





def test_replies_equal_vllm_ar_one_at_a_time(ar, oospec, records):
    n = len(records)
    assert n >= 24
    diffs = [i for i in range(n) if oospec["one"][i].token_ids != ar["one"][i].token_ids]
    assert diffs == [], [records[i]["id"] for i in diffs]
    assert sum(r.accepted for r in oospec["one"][:n]) > 0


def test_batched_replies_each_equal_vllm_ar(ar, oospec, records):
    """All submitted at once (vLLM batches them, drafts per row): each equals AR's batched reply."""
    n = len(records)
    diffs = [i for i in range(n) if oospec["together"][i].token_ids != ar["together"][i].token_ids]
    assert diffs == [], [records[i]["id"] for i in diffs]
    assert sum(r.accepted for r in oospec["together"][:n]) > 0


def test_more_drafts_accepted_than_ngram(ar, oospec, ngram, records):
    n = len(records)
    assert [r.token_ids for r in ngram["one"][:n]] == [r.token_ids for r in ar["one"][:n]]
    ours, theirs = (sum(r.accepted for r in run["one"][:n]) for run in (oospec, ngram))
    steps_ours, steps_ar = (sum(r.forwards for r in run["one"][:n]) for run in (oospec, ar))
    assert ours > theirs, (ours, theirs)
    assert steps_ours < steps_ar


def test_prompts_without_tools_or_format(ar, oospec, records):
    n = len(records)
    no_tools, plain = oospec["one"][n:n + 2]
    assert [no_tools.token_ids, plain.token_ids] == [r.token_ids for r in ar["one"][n:n + 2]]
    assert plain.drafted == 0  # not recognised: no drafts, no error


def test_required_against_vllms_structured_outputs(ar, oospec):
    """tool_choice "required" with vLLM's structured outputs on both sides: equal replies, each a JSON
    list of calls; vLLM drops the drafted tokens its grammar rejects before verifying the rest."""
    ours, theirs = oospec["one"][-N_REQUIRED:], ar["one"][-N_REQUIRED:]
    assert [r.token_ids for r in ours] == [r.token_ids for r in theirs]
    assert [r.token_ids for r in oospec["together"][-N_REQUIRED:]] == [r.token_ids for r in ar["together"][-N_REQUIRED:]]
    for r in theirs:
        assert r.text.lstrip().startswith("[")
