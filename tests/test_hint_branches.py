"""The hint in the draft tree: it never displaces the schema's and retrieval's drafts when it is unsure
or wrong, the wave's runner-up calls are further branches, a parallel reply's calls are each hinted,
and a parameter the schema forces gets no row. Forwards are counted with scripted sidecars (test
doubles), never timed; replies are compared with transformers' greedy decoding in float32."""
from __future__ import annotations

import time

import pytest

from oospec_testing import greedy, load_records, on_target_of, tiny_model
from oospec_agents.chat import normalize_messages
from oospec_agents.drafters import Draft, ReplyState
from oospec_agents.drafters.base import HintText
from oospec_agents.drafters.hint import ALT_CHARS, HintDrafter, aligned, hint_calls
from oospec_agents.formats import HermesFormat
from oospec_agents.sidecar import HintRequest, SidecarBase
from oospec_agents.sidecar.join import encode_payload, join, render_payload
from oospec_agents.sidecar.protocol import Hint
from oospec_agents.sidecar.rows import expand_rows, forced_value
from oospec_agents.sidecar.runtime import wave_rows
from oospec_agents.sidecar.wave import Wave
from oospec_agents.tools import normalize_tools
from oospec_agents.verify import build_tree

FMT = HermesFormat()
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius"]}, "v": {"const": 2}},
    "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


# ---------------------------------------------------------------- the tree's node budget

def test_a_late_draft_takes_only_the_nodes_the_others_leave():
    hint = Draft(list(range(100, 140)), "hint", late=True)
    schema, retrieval = Draft([1, 2, 3], "schema"), Draft([1, 7, 8, 9], "retrieval")
    tree = build_tree(0, [hint, schema, retrieval], 10)
    assert tree.sources.count("schema") == 3 and tree.sources.count("retrieval") == 3  # all theirs
    assert tree.sources.count("hint") == 10 - 7 and len(tree.tokens) == 10
    # the same hint drafted first (a hint the reply agrees with, and not unsure) goes first
    first = build_tree(0, [Draft(hint.tokens, "hint"), schema, retrieval], 10)
    assert first.sources.count("hint") == 9
    # a chain (no tree mask) is the first draft that is not late
    assert build_tree(0, [hint, schema], 10, chain=True).sources[1:] == ["schema"] * 3
    assert build_tree(0, [hint], 10, chain=True).sources[1:] == ["hint"] * 9


# ---------------------------------------------------------------- the hint drafter

def _ctx(tok, hint, text=""):
    ids = tok.encode("<|im_start|>assistant\n" + text, add_special_tokens=False)
    return ReplyState(ids=ids, n_prompt=len(ids) - len(tok.encode(text, add_special_tokens=False)), text=text,
                      tools=normalize_tools([WEATHER, TIME]), fmt=FMT, tokenizer=tok, hint=hint)


def test_an_unsure_or_left_hint_drafts_late_and_a_sure_one_first(smollm2_tokenizer):
    call = FMT.render_call("get_weather", {"city": "Paris", "unit": "celsius"})
    for confidence, late in ((None, False), (0.9, False), (0.1, True)):
        drafts = HintDrafter().propose(_ctx(smollm2_tokenizer, HintText(call, confidence)))
        assert drafts and {d.late for d in drafts} == {late}, confidence
    # the reply wrote another city: the re-anchored rest of the hint is late, however sure it was
    left = _ctx(smollm2_tokenizer, HintText(call, 0.9), call[:call.index("Paris")] + 'Rome", "unit": ')
    drafts = HintDrafter().propose(left)
    assert drafts and all(d.late for d in drafts)
    assert smollm2_tokenizer.decode(drafts[0].tokens).startswith('"celsius"')


def test_runner_up_calls_are_late_short_branches_and_whole_once_the_reply_takes_them(smollm2_tokenizer):
    top = FMT.render_call("get_time", {"tz": "CET"})
    runner_up = FMT.render_call("get_weather", {"city": "Paris", "unit": "celsius"})
    hint = HintText(top, 0.9, [runner_up])
    drafts = HintDrafter().propose(_ctx(smollm2_tokenizer, hint))
    assert [d.late for d in drafts] == [False, False, True]  # the hint, its compact separator, the runner-up
    assert smollm2_tokenizer.decode(drafts[-1].tokens) == runner_up[:len('<tool_call>\n{"name": "get_') + ALT_CHARS]
    # once the reply has written the runner-up's name, it is drafted whole (the top call re-anchors)
    went = runner_up[:runner_up.index("Paris")]
    drafts = HintDrafter().propose(_ctx(smollm2_tokenizer, hint, went))
    assert any(smollm2_tokenizer.decode(d.tokens) == runner_up[len(went):] for d in drafts)


def test_a_hint_of_several_calls_offers_each_after_the_one_before():
    a, b = FMT.render_call("get_time", {"tz": "CET"}), FMT.render_call("get_time", {"tz": "EST"})
    hint = FMT.render_calls([{"name": "get_time", "arguments": {"tz": "CET"}},
                             {"name": "get_time", "arguments": {"tz": "EST"}}])
    assert hint_calls(hint, FMT) == [a, b]
    assert aligned("", hint, FMT) == (hint, True)
    assert aligned(a, hint, FMT) == (FMT.call_sep + b, True)
    assert aligned(a + FMT.call_sep + b[:20], hint, FMT) == (b[20:], True)
    # one call's hint at the second call: offered again, as a guess the reply has not confirmed
    assert aligned(a, a, FMT) == (FMT.call_sep + a, False)


# ---------------------------------------------------------------- rows the schema forces

def test_a_parameter_whose_value_the_schema_forces_gets_no_row_and_the_join_writes_it():
    assert forced_value({"enum": ["celsius"]}) == ("celsius",) and forced_value({"const": 2}) == (2,)
    assert forced_value({"enum": ["c", "f"]}) is None and forced_value({"type": "string"}) is None
    tools = normalize_tools([WEATHER, TIME])
    _, rows = expand_rows(normalize_messages(ASK), tools)
    assert [(r.tool, r.param) for r in rows] == [(None, None), ("get_weather", "city"), ("get_time", "tz")]
    call = join(rows, [' "get_weather"', ' "Paris"', ' "CET"'], tools, ("required", None))
    assert call == {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "v": 2}}
    assert render_payload(encode_payload(call), FMT) == FMT.render_call("get_weather", call["arguments"])
    # a named request for the tool: its one free row; its training rows skip the forced ones too
    named = HintRequest(normalize_messages(ASK), tools, FMT, ("named", "get_weather"))
    assert [r.param for r in wave_rows(named)[0]] == ["city"]
    _, labelled = expand_rows(normalize_messages(ASK), tools, call)
    assert [r.target for r in labelled if r.tool == "get_weather"] == [' "Paris"']


# ---------------------------------------------------------------- the function row's runner-up

def test_an_unsure_function_row_sends_its_runner_up_along():
    tools = normalize_tools([WEATHER, TIME])
    _, rows = expand_rows(normalize_messages(ASK), tools)
    texts = [' "get_time"', ' "Paris"', ' "CET"']
    unsure = join(rows, texts, tools, ("required", None), {0: (' "get_weather"', 0.3)})
    assert unsure["alternatives"] == [{"name": "get_weather", "arguments": {"unit": "celsius", "v": 2}}]
    hint = render_payload(encode_payload(unsure), FMT)
    assert hint == FMT.render_call("get_time", {"tz": "CET"})
    assert hint.alternatives == (FMT.render_call("get_weather", {"unit": "celsius", "v": 2}),)
    assert "alternatives" not in join(rows, texts, tools, ("required", None), {0: (' "get_weather"', 5.0)})


def test_the_wave_reports_where_its_function_row_was_unsure(smollm2_tokenizer):
    wave = Wave(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, max_row_tokens=8)
    request = HintRequest(normalize_messages(ASK), normalize_tools([WEATHER, TIME]), FMT, ("required", None))
    rows, prefix, choices = wave_rows(request, priors=False)
    result = wave(prefix, rows, None, choices)
    chosen = result.texts[0]
    runner_up, margin = result.runner_ups[0]
    assert {chosen, runner_up} == {' "get_weather"', ' "get_time"'} and margin >= 0


# ---------------------------------------------------------------- with the embedded target (float32)

class Scripted(SidecarBase):
    """TEST DOUBLE: a sidecar whose hint is the given text (and runner-up calls), with the given
    confidence, ready at the first round."""

    def __init__(self, text: str, confidence: float | None = None, alternatives=()):
        self.hint = HintText(text, confidence, alternatives)
        self.name = "scripted"

    def submit(self, request):
        return _Ready(Hint(self.hint, len(self.hint.encode()), time.perf_counter() - request.arrived, None,
                           self.hint.confidence))


class _Ready:
    error, declined = None, False

    def __init__(self, hint):
        self.hint = hint

    def poll(self):
        return self.hint

    def cancel(self):
        pass


#: new tokens for a multiple-function record's reply: its whole call (bfcl/exec_multiple_1's is 86 tokens)
N_CALL = 128


def _records(source: str, n: int) -> list[dict]:
    return [r for r in load_records("train-extra") if r["source"] == source][:n]


def _run(engine, r, max_new_tokens: int, method: str = "oospec"):
    return engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=max_new_tokens,
                           method=method)


@pytest.mark.slow
def test_a_wrong_hint_costs_no_forward_over_toolspec_on_multiple_function_records(embedded_fp32):
    """Another offered function's call as the hint, as unsure as the shipped sidecar is of a wrong
    call: the reply is the target's greedy one, and never takes more forwards than toolspec's."""
    total = {"toolspec": 0, "wrong": 0}
    for r in _records("bfcl_exec_multiple", 3):
        ref = greedy(embedded_fp32, embedded_fp32.prompt_ids(r["messages"], r["tools"], tool_choice="required"), N_CALL)
        ts = _run(on_target_of(embedded_fp32), r, N_CALL, "toolspec")
        call = ts.tool_calls[0]
        other = next(t["function"] for t in r["tools"] if t["function"]["name"] != call["name"])
        wrong = FMT.render_call(other["name"], {p: "x" for p in other["parameters"].get("properties", {})})
        gen = _run(on_target_of(embedded_fp32, Scripted(wrong, 0.2)), r, N_CALL)
        assert ts.token_ids == ref and gen.token_ids == ref, r["id"]
        assert gen.stats["sidecar_error"] is None and gen.stats["hint_bytes"]
        assert gen.stats["target_forwards"] <= ts.stats["target_forwards"], r["id"]
        total["toolspec"] += ts.stats["target_forwards"]
        total["wrong"] += gen.stats["target_forwards"]
    print(f"\nforwards on 3 bfcl_exec_multiple records: {total}")


@pytest.mark.slow
def test_a_right_runner_up_saves_forwards_over_the_wrong_top_call_alone(embedded_fp32):
    saved = 0
    for r in _records("bfcl_exec_multiple", 3):
        ref = greedy(embedded_fp32, embedded_fp32.prompt_ids(r["messages"], r["tools"], tool_choice="required"), N_CALL)
        call = _run(on_target_of(embedded_fp32), r, N_CALL, "toolspec").tool_calls[0]
        other = next(t["function"]["name"] for t in r["tools"] if t["function"]["name"] != call["name"])
        top, right = FMT.render_call(other, call["arguments"]), FMT.render_call(call["name"], call["arguments"])
        alone = _run(on_target_of(embedded_fp32, Scripted(top, 0.3)), r, N_CALL)
        branched = _run(on_target_of(embedded_fp32, Scripted(top, 0.3, [right])), r, N_CALL)
        assert alone.token_ids == ref and branched.token_ids == ref, r["id"]
        assert branched.stats["target_forwards"] <= alone.stats["target_forwards"], r["id"]
        saved += alone.stats["target_forwards"] - branched.stats["target_forwards"]
    assert saved > 0


# ---------------------------------------------------------------- a follow-up wave for the next call

class Queue(SidecarBase):
    """TEST DOUBLE: answers its n-th request with the n-th text; records the requests."""

    def __init__(self, *texts: str):
        self.texts, self.requests = list(texts), []

    def submit(self, request):
        from oospec_agents.sidecar.protocol import FixedHint
        self.requests.append(request)
        return FixedHint(self.texts[len(self.requests) - 1]).submit(request)


def test_a_reply_that_goes_on_past_a_call_asks_for_its_next_call():
    import torch

    from oospec_agents.sidecar.cores import Place
    from oospec_agents.sidecar.session import HintSession
    first, second = FMT.render_call("get_time", {"tz": "CET"}), FMT.render_call("get_time", {"tz": "EST"})
    side = Queue(first, second)
    request = HintRequest(normalize_messages(ASK), normalize_tools([WEATHER, TIME]), FMT, ("required", None))
    hints = HintSession.open(side, request, target=Place(torch.device("cpu")), faults=set(), lend_cores=False,
                             follow_up=True)
    assert hints.poll("") == first
    assert hints.poll(first) is None and len(side.requests) == 1  # a closed call may be the reply's last
    hint = hints.poll(first + FMT.call_sep)  # it goes on: the next call is asked, after the one written
    assert hint == second and hint.after_calls == 1  # the call the reply wrote is no prediction of the wave
    asked = side.requests[-1]
    assert asked.tool_choice == ("required", None) and asked.messages[-1]["role"] == "assistant"
    assert asked.messages[-1]["tool_calls"] == [{"name": "get_time", "arguments": {"tz": "CET"}}]
    assert aligned(first + FMT.call_sep, hint, FMT) == (second, True)
    assert aligned(first + FMT.call_sep + second[:12], hint, FMT) == (second[12:], True)
    assert hints.poll(first + FMT.call_sep + second[:12]) is None and len(side.requests) == 2  # asked once
    assert hints.close().follow_ups == 1
    # and the wave's rows read the closed call as the assistant's turn before the new one
    prefix, _ = expand_rows(asked.messages, asked.tools)
    assert prefix.endswith('"arguments": {"tz":"CET"}}<|im_end|>\n<|im_start|>assistant\n')


def test_a_slot_row_that_nearly_answered_null_offers_the_call_without_it():
    tools = normalize_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                              "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a"]}}}])
    _, rows = expand_rows(normalize_messages(ASK), tools)
    texts = [' "f"', ' "x"', ' 3']
    call = join(rows, texts, tools, ("required", None), {1: (' "', 0.1), 2: (" null", 0.5)})
    assert call["arguments"] == {"a": "x", "b": 3}
    assert call["alternatives"] == [{"name": "f", "arguments": {"a": "x"}}]  # `a` is required: never left out
    assert "alternatives" not in join(rows, texts, tools, ("required", None), {2: (" null", 3.0)})
