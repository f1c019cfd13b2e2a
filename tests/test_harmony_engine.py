"""The engine on a tiny random `gpt_oss` (float32) in the harmony format: every method lossless against
greedy and the masked reference; scripted replies come apart alike in every method, also with many
tokens a round."""
from __future__ import annotations

import json

import pytest

from oospec_agents import Engine, ReasoningDelta, TextDelta
from oospec_testing import ScriptDrafter, ScriptedTarget, greedy, masked_reference, trace_stream
from harmony_testing import (ANALYSIS, ASK, CALL, FINAL_JSON, METHODS, OK_SCHEMA, REPLIES, ROLE, STRICT_WEATHER, TIME,
                             WEATHER, harmony_tokenizer, joined, tiny_gpt_oss)

pytestmark = pytest.mark.usefixtures("harmony_vocabulary")  # openai-harmony offline


@pytest.mark.parametrize("effort", [None, "high"])
def test_every_method_is_lossless_against_greedy_generate(harmony_engine, effort):
    ids = harmony_engine.prompt_ids(ASK, [WEATHER], reasoning_effort=effort)
    assert "Reasoning: " + (effort or "medium") in harmony_engine.tokenizer.decode(ids)
    ref = greedy(harmony_engine, ids, 48)
    for method in METHODS:
        gen = harmony_engine.generate(ASK, [WEATHER], method=method, max_new_tokens=48, reasoning_effort=effort)
        assert gen.token_ids == ref, method


JSON_OK = {"type": "json_schema", "json_schema": {"name": "ok", "schema": OK_SCHEMA, "strict": True}}
CONSTRAINED = [  # (tools, tool_choice, strict, response_format)
    ([WEATHER, TIME], "required", False, None), ([WEATHER, TIME], "get_time", False, None),
    ([WEATHER, TIME], "required", True, None), ([WEATHER, TIME], "get_time", True, None),
    ([WEATHER, TIME], "auto", True, None), ([WEATHER, TIME], "auto", False, JSON_OK),
    ([WEATHER, TIME], "auto", True, {"type": "json_object"}), ([WEATHER, TIME], "none", False, JSON_OK),
    (None, "auto", False, JSON_OK), ([STRICT_WEATHER, TIME], "auto", False, None),
]


@pytest.mark.parametrize("tools, tool_choice, strict, response_format", CONSTRAINED)
def test_every_method_is_lossless_against_the_masked_reference(harmony_engine, tools, tool_choice, strict,
                                                               response_format):
    """A forced choice, strict and a JSON response_format: the reference is greedy decoding masked by the
    same grammar (`logits_processor(..., strict=False)` where the request is not strict)."""
    ref = masked_reference(harmony_engine, ASK, tools, tool_choice, 40, strict=strict, response_format=response_format)
    for method in METHODS:
        gen = harmony_engine.generate(ASK, tools, tool_choice=tool_choice, strict=strict, method=method,
                                      response_format=response_format, max_new_tokens=40,
                                      hint=CALL if method == "oospec" else None)
        assert gen.token_ids == ref, method
    calls = gen.tool_calls + gen.invalid_tool_calls
    if tool_choice in ("required", "get_time"):  # a call, and only a call, after the (here empty) analysis
        assert len(calls) == 1 and not gen.content and gen.text.startswith("<|channel|>commentary to=functions.")
        assert tool_choice == "required" or calls[0]["name"] == "get_time"
    if strict and gen.finish_reason == "tool_calls":
        assert gen.tool_calls and not gen.invalid_tool_calls
    if response_format is not None and not calls and gen.finish_reason == "stop":
        assert gen.text.startswith("<|channel|>final<|message|>") and isinstance(json.loads(gen.content), dict)


@pytest.mark.parametrize("name", ["think then call", "think then answer", "preamble then call",
                                  "a call written in the analysis"])
def test_a_scripted_reply_comes_apart_the_same_in_every_method(scripted, name):
    engine, target = scripted
    text, reasoning, content, calls = REPLIES[name]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    seen = []
    for method in METHODS:
        events = list(engine.stream(ASK, [WEATHER], method=method, max_new_tokens=120))
        gen = events[-1]
        assert gen.text == text and gen.reasoning == reasoning and gen.content == content, method
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls] == calls, method
        assert gen.finish_reason == ("tool_calls" if calls else "stop")
        assert joined(events[:-1]) == (reasoning or "", content, [c["arguments"] for c in calls]), method
        seen.append(gen.token_ids)
    assert seen[0] == seen[1] == seen[2]


def test_a_reply_cut_off_in_its_analysis_is_all_reasoning(scripted):
    engine, target = scripted
    target.script(engine.prompt_ids(ASK, [WEATHER]), "<|channel|>analysis<|message|>" + "Paris, " * 30)
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER], method=method, max_new_tokens=20)
        assert gen.finish_reason == "length" and gen.reasoning and not gen.content and not gen.tool_calls


def test_earlier_analysis_is_kept_between_a_call_and_its_result_and_dropped_after_a_final_answer(harmony_engine):
    turn = [{"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
             "tool_calls": [{"id": "c0", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "sunny"}]
    decode = harmony_engine.tokenizer.decode
    pending = decode(harmony_engine.prompt_ids(ASK + turn, [WEATHER]))
    assert "<|channel|>analysis<|message|>Need the weather.<|end|>" in pending
    answered = decode(harmony_engine.prompt_ids(ASK + turn + [{"role": "assistant", "content": "Sunny."},
                                                              {"role": "user", "content": "And Rome?"}], [WEATHER]))
    assert "Need the weather." not in answered and "<|channel|>final<|message|>Sunny.<|end|>" in answered


@pytest.mark.parametrize("tool_choice, strict", [("required", False), ("get_weather", False), ("required", True),
                                                 ("get_weather", True)])
def test_a_forced_call_comes_after_the_analysis(scripted, tool_choice, strict):
    """The model reasons, then wants to answer on the final channel: a call follows the analysis instead
    (its markup forced, its arguments strict or free), and every method equals the masked reference."""
    engine, target = scripted
    tools = [WEATHER, TIME]
    target.script(engine.prompt_ids(ASK, tools, tool_choice=tool_choice), REPLIES["think then answer"][0])
    reference = masked_reference(engine, ASK, tools, tool_choice, 40, strict=strict)
    header = ANALYSIS + ROLE + "<|channel|>commentary to=functions." + ("get_weather" if tool_choice != "required"
                                                                        else "")
    for method in METHODS:
        gen = engine.generate(ASK, tools, tool_choice=tool_choice, strict=strict, max_new_tokens=40, method=method)
        assert gen.token_ids == reference, method
        assert gen.reasoning == "The user wants Paris." and not gen.content
        assert gen.text.startswith(header), gen.text
        assert len(gen.tool_calls + gen.invalid_tool_calls) == 1
        if strict and gen.finish_reason == "tool_calls":
            assert gen.tool_calls and not gen.invalid_tool_calls


@pytest.mark.parametrize("tool_choice, strict", [("required", True), ("get_weather", True), ("auto", True),
                                                 ("required", False)])
def test_a_call_the_grammar_takes_is_written_as_scripted(scripted, tool_choice, strict):
    engine, target = scripted
    text, reasoning, _, calls = REPLIES["think then call"]
    target.script(engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice=tool_choice), text)
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER, TIME], tool_choice=tool_choice, strict=strict, max_new_tokens=60,
                              method=method)
        assert (gen.text, gen.reasoning, gen.finish_reason) == (text, reasoning, "tool_calls"), method
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls] == calls


@pytest.mark.parametrize("tools, tool_choice", [(None, "auto"), ([WEATHER], "auto"), ([WEATHER], "none")])
def test_a_json_response_format_is_the_final_message_after_the_analysis(scripted, tools, tool_choice):
    engine, target = scripted
    text = ANALYSIS + ROLE + FINAL_JSON
    target.script(engine.prompt_ids(ASK, tools, tool_choice=tool_choice), text)
    for method in METHODS:
        gen = engine.generate(ASK, tools, tool_choice=tool_choice, response_format=JSON_OK, max_new_tokens=60,
                              method=method)
        assert (gen.text, gen.reasoning, gen.finish_reason) == (text, "The user wants Paris.", "stop"), method
        assert json.loads(gen.content) == {"ok": True}
    # text where the JSON is due: the mask makes the final message JSON
    target.script(engine.prompt_ids(ASK, tools, tool_choice=tool_choice), REPLIES["think then answer"][0])
    reference = masked_reference(engine, ASK, tools, tool_choice, 40, strict=False, response_format=JSON_OK)
    for method in METHODS:
        gen = engine.generate(ASK, tools, tool_choice=tool_choice, response_format=JSON_OK, max_new_tokens=40,
                              method=method)
        assert gen.token_ids == reference, method
        assert gen.text.startswith(ANALYSIS + ROLE + "<|channel|>final<|message|>{") and gen.reasoning
        assert gen.finish_reason != "stop" or isinstance(json.loads(gen.content)["ok"], bool)


def test_the_sidecars_hint_is_drafted_once_the_analysis_has_closed(scripted):
    engine, target = scripted
    text = REPLIES["think then call"][0]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    gen = engine.generate(ASK, [WEATHER], method="oospec", max_new_tokens=120, hint=CALL)
    assert gen.text == text and gen.stats["accepted_by_source"]["hint"] > 0


# ---------------------------------------------------------------- boundary cases, many tokens a round

@pytest.fixture(scope="module")
def drafted_whole(smollm2_tokenizer):
    """A scripted tiny gpt-oss whose retrieval drafter proposes the script itself, up to 90 tokens a round."""
    tok = harmony_tokenizer(smollm2_tokenizer)
    engine = Engine(tiny_gpt_oss(tok, seed=2), tok, model_name="tiny-gpt-oss-whole", max_draft_nodes=96)
    target = ScriptedTarget(engine.target, tok)
    engine = engine.with_parts(drafters={"retrieval": ScriptDrafter(target)})
    return engine, target


@pytest.mark.parametrize("name", ["think then call", "preamble then call", "a call written in the analysis"])
def test_the_analysis_end_and_what_follows_in_one_round_stream_alike_in_every_method(drafted_whole, name):
    engine, target = drafted_whole
    text, reasoning, content, calls = REPLIES[name]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    seen = {}
    for method in METHODS:
        events, committed = trace_stream(engine, ASK, [WEATHER], max_new_tokens=120, method=method,
                                         hint=CALL if method == "oospec" else None)
        gen = events[-1][1]
        body = [e for _, e in events[:-1]]
        assert gen.text == text and (gen.reasoning, gen.content) == (reasoning, content), method
        assert joined(body) == (reasoning or "", content, [c["arguments"] for c in gen.tool_calls]), method
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls] == calls
        if method != "ar":  # the whole reply in one round after the prefill's token
            assert len(committed) == 2, (method, committed)
        seen[method] = (gen.token_ids, gen.reasoning, gen.content, gen.finish_reason)
    assert seen["ar"] == seen["toolspec"] == seen["oospec"]


def test_an_analysis_that_never_ends_is_cut_off_alike_in_every_method(drafted_whole):
    engine, target = drafted_whole
    target.script(engine.prompt_ids(ASK, [WEATHER]), "<|channel|>analysis<|message|>" + "Paris and Rome, " * 20)
    seen = set()
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER], max_new_tokens=30, method=method)
        assert gen.finish_reason == "length" and gen.reasoning.startswith("Paris and Rome")
        assert not gen.content and not gen.tool_calls and not gen.invalid_tool_calls
        seen.add((tuple(gen.token_ids), gen.reasoning))
    assert len(seen) == 1


@pytest.mark.parametrize("name, tool_choice", [
    ("think then call", "auto"), ("preamble then call", "auto"), ("a call written in the analysis", "auto"),
    ("think then call", "required"), ("think then call", "get_weather")])
def test_under_strict_the_analysis_end_and_a_whole_call_in_one_round_stream_alike(drafted_whole, name, tool_choice):
    """Strict (and a forced choice): the round that commits the analysis's end also commits the next
    header, the call's header and its strict arguments; the reply is the script, in every method alike."""
    engine, target = drafted_whole
    text, reasoning, content, calls = REPLIES[name]
    target.script(engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice), text)
    seen = {}
    for method in METHODS:
        events, committed = trace_stream(engine, ASK, [WEATHER], tool_choice=tool_choice, strict=True,
                                         max_new_tokens=120, method=method, hint=CALL if method == "oospec" else None)
        gen = events[-1][1]
        assert gen.text == text and (gen.reasoning, gen.content) == (reasoning, content), method
        assert joined([e for _, e in events[:-1]]) == (reasoning or "", content,
                                                       [c["arguments"] for c in gen.tool_calls]), method
        assert [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls] == calls
        if method != "ar":  # the whole reply in one round after the prefill's token (and the forced ones)
            assert len(committed) == 2, (method, committed)
        seen[method] = (gen.token_ids, gen.reasoning, gen.content, gen.finish_reason)
    assert seen["ar"] == seen["toolspec"] == seen["oospec"]


@pytest.mark.parametrize("tool_choice", ["auto", "required", "get_weather"])
def test_under_strict_an_analysis_that_never_ends_is_cut_off_alike(drafted_whole, tool_choice):
    engine, target = drafted_whole
    target.script(engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice),
                  "<|channel|>analysis<|message|>" + "Paris and Rome, " * 20)
    reference = masked_reference(engine, ASK, [WEATHER], tool_choice, 30, strict=True)
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER], tool_choice=tool_choice, strict=True, max_new_tokens=30, method=method)
        assert gen.token_ids == reference, method
        assert gen.finish_reason == "length" and gen.reasoning.startswith("Paris and Rome")
        assert not gen.content and not gen.tool_calls and not gen.invalid_tool_calls


@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_under_strict_a_call_written_in_the_analysis_is_reasoning_and_the_forced_call_follows(drafted_whole,
                                                                                               tool_choice):
    """The analysis holds a call's text (with arguments the schema refuses): it is reasoning, free; the
    final answer the script goes on to is masked into the forced call, alike in every method."""
    engine, target = drafted_whole
    text, reasoning, _, _ = REPLIES["a call written in the analysis"]
    target.script(engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice), text)
    reference = masked_reference(engine, ASK, [WEATHER], tool_choice, 60, strict=True)
    analysis = text[:text.index("<|end|>") + len("<|end|>")]
    for method in METHODS:
        events, _ = trace_stream(engine, ASK, [WEATHER], tool_choice=tool_choice, strict=True, max_new_tokens=60,
                                 method=method, hint=CALL if method == "oospec" else None)
        gen = events[-1][1]
        assert gen.token_ids == reference, method
        assert gen.reasoning == reasoning and not gen.content
        assert gen.text.startswith(analysis + ROLE + "<|channel|>commentary to=functions.get_weather"), gen.text
        assert len(gen.tool_calls + gen.invalid_tool_calls) == 1
        said = [e for _, e in events[:-1]]
        assert "".join(e.text for e in said if isinstance(e, ReasoningDelta)) == reasoning
        assert not any(isinstance(e, TextDelta) for e in said)
