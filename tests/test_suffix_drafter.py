"""The suffix-tree drafter (drafters/suffix.py, Arctic Inference's SuffixDecodingCache) and the bench's
`suffix` method and `history` scenario. Arctic Inference is an optional dependency built from source
(`pip install oospec-agents[suffix]`): without it these tests are skipped, except the one that checks
the error a user gets."""
from __future__ import annotations

import importlib.util
import sys

import pytest

from oospec_testing import greedy

from oospec_agents.drafters import ReplyState

HAVE_ARCTIC = importlib.util.find_spec("arctic_inference") is not None
needs_arctic = pytest.mark.skipif(not HAVE_ARCTIC, reason="arctic_inference is not installed: the suffix tree is the "
                                  "optional extra 'suffix', built from source (docs/reports/suffix-tree.md)")

WEATHER = {"type": "function", "function": {"name": "get_current_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def state(ids: list[int], n_prompt: int, pool: list[list[int]]) -> ReplyState:
    return ReplyState(ids=ids, n_prompt=n_prompt, text="", tools=[], fmt=None, tokenizer=None, pool=pool)


def test_without_arctic_inference_the_error_says_what_to_install(monkeypatch):
    from oospec_agents.drafters.suffix import SuffixDrafter
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    with pytest.raises(ImportError, match=r"oospec-agents\[suffix\]"):
        SuffixDrafter()


@needs_arctic
def test_it_drafts_what_followed_the_reply_in_an_earlier_reply():
    from oospec_agents.drafters.suffix import SuffixDrafter
    drafter = SuffixDrafter()
    earlier = [7, 8, 9, 10, 11, 12, 13]
    ctx = state([1, 2, 3, 7, 8, 9], 3, [earlier])
    (draft,) = drafter.propose(ctx)
    assert draft.source == "retrieval" and draft.tokens == [10, 11, 12]  # as long as the match (vLLM's factor 1)
    ctx.ids += [10, 11]  # the engine commits in place: the drafter follows the same reply
    (draft,) = drafter.propose(ctx)
    assert draft.tokens == [12, 13]


@needs_arctic
def test_it_recalls_only_what_the_pool_holds():
    from oospec_agents.drafters.suffix import SuffixDrafter
    drafter = SuffixDrafter()
    drafter.propose(state([1, 2, 5, 6], 2, [[5, 6, 30, 31]]))
    # the next reply's pool has forgotten that reply (another tool set, a cleared memory): nothing is drafted
    assert drafter.propose(state([1, 2, 5, 6], 2, [])) == []
    # nor is the last reply itself kept, unless its pool hands it back
    assert drafter.propose(state([4, 5, 6], 1, [])) == []
    assert drafter.propose(state([4, 5, 6], 1, [[5, 6, 40]]))[0].tokens == [40]


@needs_arctic
def test_a_tree_draft_is_offered_as_its_root_to_leaf_paths():
    from oospec_agents.drafters.suffix import SuffixDrafter
    drafter = SuffixDrafter(tree=True)
    drafts = drafter.propose(state([0, 1, 2, 5, 6], 1, [[1, 2, 5, 6, 7, 8], [1, 2, 5, 6, 9, 8]]))
    assert sorted(d.tokens for d in drafts) == [[7, 8], [9, 8]]


@needs_arctic
def test_suffix_drafting_is_lossless_and_recalls_the_last_reply(tiny_engine, monkeypatch):
    from oospec_agents.drafters.suffix import SuffixDrafter
    tiny_engine.clear_call_memory()
    suffix = tiny_engine.with_parts(drafters={"retrieval": SuffixDrafter()})
    ref = greedy(tiny_engine, tiny_engine.prompt_ids(ASK, [WEATHER]), 32)
    first, again = (suffix.generate(ASK, [WEATHER], max_new_tokens=32, method="toolspec") for _ in range(2))
    tiny_engine.clear_call_memory()
    assert first.token_ids == again.token_ids == ref
    # the same request again: the suffix tree holds the first reply and drafts it
    assert again.stats["accepted_by_source"]["retrieval"] >= 24
    assert again.stats["target_forwards"] < first.stats["target_forwards"] // 2


@needs_arctic
def test_the_history_scenario_keeps_each_methods_own_replies_and_forgets_the_warm_up(tiny_engine):
    from oospec_agents.bench import BenchConfig, run_bench
    rec = {"id": "r", "source": "s", "messages": ASK, "tools": [WEATHER], "expected": []}
    records = [rec, rec | {"id": "r2"}]  # the same request twice: its second run may recall the first
    methods = ("ar", "toolspec", "suffix")

    def run(scenario):
        cfg = BenchConfig(methods, tool_choice="auto", max_new_tokens=24, progress=False, scenario=scenario)
        return run_bench(tiny_engine, records, cfg)["records"]

    cold, history = run("cold"), run("history")
    for m in methods:
        assert all(r["runs"][m]["check"]["verdict"] == "exact" for r in cold + history), m
        # the first record recalls nothing: the warm-up's reply (the same request) was forgotten
        assert history[0]["runs"][m]["target_forwards"] == cold[0]["runs"][m]["target_forwards"], m
    for m in ("toolspec", "suffix"):  # the second recalls its own method's reply to the first
        assert history[1]["runs"][m]["target_forwards"] < cold[1]["runs"][m]["target_forwards"] // 2, m
    assert history[1]["runs"]["ar"]["target_forwards"] == cold[1]["runs"]["ar"]["target_forwards"]
