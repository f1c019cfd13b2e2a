"""Reasoning targets (#47): a reply is a `<think>` block, then content and calls.

Qwen3-style templates let the model open the block; DeepSeek-R1-style ones open it in the generation
prompt. The reasoning streams as `ReasoningDelta`s and lands in `Generation.reasoning`; content and
calls are read from the text after the block, and only there are calls drafted or forced. Tiny random
`qwen3` models with SmolLM2's tokenizer, float32; `ScriptedTarget` makes one write a given reply
through the real engine, with a draft source that proposes the whole script, so one round commits
the boundary cases at once.
"""
from __future__ import annotations

import json

import pytest

from oospec_agents import Engine, Generation, ReasoningDelta, TextDelta, ToolCallDelta
from oospec_agents.drafters import ReplyState
from oospec_agents.drafters.hint import HintDrafter
from oospec_agents.drafters.schema import forced_text
from oospec_agents.errors import ChatFormatError, TemplateArgumentError
from oospec_agents.events import ReplyEvents
from oospec_agents.formats import HermesFormat, PythonicFormat, Reasoning, detect_reasoning
from oospec_agents.grammar import Grammars
from oospec_agents.tools import normalize_tools
from oospec_testing import (TEMPLATES, ScriptDrafter, ScriptedTarget, chat_template, check_events, greedy,
                             masked_reference, tiny_qwen3, trace_stream)

METHODS = ("ar", "toolspec", "oospec")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris and in Rome?"}]
FMT = HermesFormat()


def call(city: str) -> str:
    return FMT.render_call("get_weather", {"city": city})


@pytest.fixture(scope="module", params=list(TEMPLATES))
def engine(request, with_template):
    """A tiny random qwen3 under a reasoning template (Qwen3-style, or R1-style opening the block)."""
    tok = with_template(TEMPLATES[request.param])
    return Engine(tiny_qwen3(tok), tok, model_name=f"tiny-qwen3-{request.param}")


# ---------------------------------------------------------------- reading a reply

def test_a_template_that_writes_think_blocks_reasons():
    assert detect_reasoning(TEMPLATES["qwen3"]) == Reasoning()
    assert detect_reasoning("{{ messages[0].content }}") is None


@pytest.mark.parametrize("prompt, reasoning", [
    ("<|im_start|>assistant\n", Reasoning()),                                  # Qwen3: the model opens it
    ("<|im_start|>assistant\n<think>\n", Reasoning(starts_open=True)),         # R1: the prompt opened it
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", None),                  # enable_thinking=False
])
def test_the_generation_prompt_says_where_a_reply_starts(prompt, reasoning):
    assert Reasoning().for_prompt(prompt) == reasoning


@pytest.mark.parametrize("reasoning, text, final, split", [
    (Reasoning(), "", False, (None, None)),                                    # may still open a block
    (Reasoning(), "<thi", False, (None, None)),
    (Reasoning(), "<thi", True, (None, "<thi")),
    (Reasoning(), "Hello", False, (None, "Hello")),                           # no block: all answer
    (Reasoning(), "<think>\nplan", False, ("\nplan", None)),
    (Reasoning(), "<think>\nplan</thi", False, ("\nplan", None)),             # maybe the closing marker
    (Reasoning(), "<think>\nplan</thi", True, ("\nplan</thi", "")),           # cut off: all reasoning
    (Reasoning(), "<think>\nI'd <tool_call>\n{}</think>\n\nHi", False, ("\nI'd <tool_call>\n{}", "\n\nHi")),
    (Reasoning(starts_open=True), "plan\n</think>\n\n<tool_call>", False, ("plan\n", "\n\n<tool_call>")),
    (Reasoning(starts_open=True), "<tool_call>\n{", False, ("<tool_call>\n{", None)),
])
def test_a_reply_splits_into_reasoning_and_answer(reasoning, text, final, split):
    assert reasoning.split(text, final) == split


REPLIES = [  # (reasoning, Qwen3-style reply text)
    (Reasoning(), "<think>\nParis first, then Rome.\n</think>\n\n" + call("Paris") + "\n" + call("Rome")),
    (Reasoning(), "<think>\nI could write <tool_call> here, but not yet.\n</think>\n\nIt is sunny."),
    (Reasoning(), "<think>\nThis never ends <tool_call>\n{\"name\": \"get_weather\""),
    (Reasoning(starts_open=True), "Plan: one call.\n</think>\n\nLet me check." + call("Paris")),
    (Reasoning(), "No block at all. " + call("Paris")),
]


@pytest.mark.parametrize("reasoning, text", REPLIES)
def test_events_fed_a_character_at_a_time_join_to_the_split_reply(reasoning, text):
    events = ReplyEvents(FMT, lambda i: f"call_{i}", reasoning)
    out = [e for end in range(1, len(text) + 1) for e in events.feed(text[:end])] + events.feed(text, final=True)
    thought, answer = reasoning.split(text, final=True)
    content, calls = FMT.parse(answer)
    assert "".join(e.text for e in out if isinstance(e, ReasoningDelta)) == (thought or "").strip()
    assert "".join(e.text for e in out if isinstance(e, TextDelta)) == content
    args = {}
    for e in out:
        if isinstance(e, ToolCallDelta):
            args[e.index] = args.get(e.index, "") + e.arguments
    assert [json.loads(a) if "error" not in c else a for a, c in zip(args.values(), calls)] == \
        [c["arguments"] for c in calls]
    # a reasoning delta never carries a marker, and nothing of the answer comes before the block has closed
    assert not any("</" in e.text or "<think>" in e.text for e in out if isinstance(e, ReasoningDelta))


def _state(text, reasoning=Reasoning(), hint=None, tok=None):
    ids = [1] if tok is None else [tok.eos_token_id] + tok.encode(text, add_special_tokens=False)
    return ReplyState(ids=ids, n_prompt=1, text=text, tools=normalize_tools([WEATHER]), fmt=FMT, tokenizer=tok,
                      hint=hint, reasoning=reasoning)


@pytest.mark.parametrize("text, forced", [
    ("", ""),                                                       # the reply may open a block: nothing forced
    ("<think>\nI will call", ""),
    ("<think>\nwrite <tool_call>\n{\"name\": \"get_w", ""),         # a call inside the reasoning is reasoning
    ("<think>\nok\n</think>\n\n", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'),
    ("<think>\nok\n</think>\n\n<tool_call>\n{\"name\": \"get_w", 'eather", "arguments": {"city": "'),
])
def test_the_schema_drafter_drafts_calls_only_after_the_reasoning(text, forced):
    assert forced_text(_state(text)) == forced


def test_the_hint_is_a_draft_only_once_the_reasoning_has_closed(smollm2_tokenizer):
    tok, hint = smollm2_tokenizer, call("Paris")
    assert HintDrafter().propose(_state("<think>\nweather in Paris", hint=hint, tok=tok)) == []
    (first, *_) = HintDrafter().propose(_state("<think>\nweather in Paris\n</think>\n\n", hint=hint, tok=tok))
    assert tok.decode(first.tokens) == hint


# ---------------------------------------------------------------- the grammar: reasoning free, then the call

@pytest.fixture(scope="module")
def grammars(smollm2_tokenizer):
    return Grammars(smollm2_tokenizer, FMT, {smollm2_tokenizer.eos_token_id}, len(smollm2_tokenizer))


def takes(grammars, tok, text, mode="auto", name=None, strict=True, reasoning=Reasoning()) -> bool:
    guide = grammars.guide(normalize_tools([WEATHER]), mode, name, strict, reasoning=reasoning)
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    return guide.matcher.consume_tokens(ids) and guide.matcher.is_stopped() and not guide.matcher.is_error()


@pytest.mark.parametrize("text, mode, strict, ok", [
    ("<think>\nplan\n</think>\n\n" + call("Paris"), "auto", True, True),
    ("<think>\nplan\n</think>\n\nJust text.", "auto", True, True),
    ("<think>\nI'd write <tool_call>\n{\"oops\n</think>\n\n" + call("Paris"), "auto", True, True),  # reasoning is free
    ("<think>\nplan\n</think>\n\n" + call("Paris").replace('"Paris"', "7"), "auto", True, False),  # the call is strict
    ("<think>\nnever closed", "auto", True, False),
    ("<think>\nplan\n</think>\n\n" + call("Paris"), "required", True, True),
    ("<think>\nplan\n</think>\n\nText instead.", "required", True, False),
    (call("Paris"), "required", True, True),                                      # the block may be skipped
    ("<think>\nplan\n</think>\n\n" + call("Paris").replace('"Paris"', "7"), "required", False, True),  # opener only
    ("<think>\nplan\n</think>\n\nText instead.", "required", False, False),
    ("<think>\nplan\n</think>\n\n\n\n\n\n\n" + call("Paris"), "required", False, False),  # whitespace is bounded
])
def test_the_grammar_leaves_reasoning_free_and_constrains_what_follows(grammars, smollm2_tokenizer, text, mode,
                                                                      strict, ok):
    assert takes(grammars, smollm2_tokenizer, text, mode, strict=strict) is ok


def test_a_prompt_that_opened_the_block_starts_the_grammar_inside_it(grammars, smollm2_tokenizer):
    inside = Reasoning(starts_open=True)
    assert takes(grammars, smollm2_tokenizer, "plan\n</think>\n\n" + call("Rome"), "named", "get_weather",
                 reasoning=inside)
    assert not takes(grammars, smollm2_tokenizer, call("Rome"), "named", "get_weather", reasoning=inside)


def test_a_json_reply_and_a_forced_call_of_any_format_follow_the_reasoning(grammars, smollm2_tokenizer):
    tok = smollm2_tokenizer
    guide = grammars.json_guide({"type": "object", "properties": {"ok": {"type": "boolean"}}}, Reasoning())
    ids = tok.encode('<think>\nplan\n</think>\n\n{"ok": true}', add_special_tokens=False) + [tok.eos_token_id]
    assert guide.matcher.consume_tokens(ids) and guide.matcher.is_stopped()
    # calls the strict grammar does not cover: the opener is forced after the reasoning all the same
    pythonic = Grammars(tok, PythonicFormat(), {tok.eos_token_id}, len(tok))
    guide = pythonic.guide(normalize_tools([WEATHER]), "required", None, strict=False, reasoning=Reasoning())
    for text, ok in (
            ("<think>\nplan\n</think>\n[get_weather(city='Oslo')]", True), ("<think>\nplan\n</think>\nHi", False)):
        matcher = guide.matcher.deep_copy()
        assert matcher.consume_tokens(tok.encode(text, add_special_tokens=False)) is ok, text


# ---------------------------------------------------------------- template arguments and earlier turns

@pytest.fixture(scope="module")
def qwen3_engine(with_template):
    tok = with_template(TEMPLATES["qwen3"])
    return Engine(tiny_qwen3(tok), tok, model_name="tiny-qwen3")


def test_enable_thinking_false_closes_the_block_in_the_prompt(qwen3_engine):
    off = {"enable_thinking": False}
    req = qwen3_engine.prepare(ASK, [WEATHER], "required", chat_template_kwargs=off)
    assert req.reasoning is None and req.guide is None  # no reasoning: the forced opener is in the prompt again
    prompt = qwen3_engine.tokenizer.decode(req.prompt_ids)
    assert prompt.endswith("<think>\n\n</think>\n\n" + FMT.forced_prefix("get_weather"))
    gen = qwen3_engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=4, method="ar",
                                chat_template_kwargs=off)
    assert gen.reasoning is None
    on = qwen3_engine.prepare(ASK, [WEATHER], "required")
    assert on.reasoning == Reasoning() and not qwen3_engine.tokenizer.decode(on.prompt_ids).endswith("get_weather\"")


@pytest.mark.parametrize("kwargs, effort, param, words", [
    (["enable_thinking"], None, "chat_template_kwargs", "chat_template_kwargs must be a dict .* got list"),
    ({"enable_thinkng": False}, None, "chat_template_kwargs",
     "key 'enable_thinkng' is not an argument of this chat template"),
    ({"tools": []}, None, "chat_template_kwargs", "key 'tools' is set by the engine"),
    ({"enable_thinking": "yes"}, None, "chat_template_kwargs",
     "rejects enable_thinking='yes': .*enable_thinking must be true or false"),
    (None, "high", "reasoning_effort", "takes no reasoning_effort"),
    (None, "max", "reasoning_effort", r"reasoning_effort must be one of \['low', 'medium', 'high'\]"),
])
def test_bad_template_arguments_are_named_before_anything_streams(qwen3_engine, kwargs, effort, param, words):
    with pytest.raises(TemplateArgumentError, match=words) as err:
        qwen3_engine.stream(ASK, [WEATHER], chat_template_kwargs=kwargs, reasoning_effort=effort)  # not iterated
    assert err.value.param == param and isinstance(err.value, ValueError)
    assert qwen3_engine.decoding == 0


def test_reasoning_effort_goes_to_a_template_that_takes_it(with_template, qwen3_engine):
    tok = with_template(chat_template(effort=True))
    engine = Engine(qwen3_engine.target, tok)
    assert "Reasoning: high" in tok.decode(engine.prompt_ids(ASK, reasoning_effort="high"))
    assert "Reasoning: low" in tok.decode(engine.prompt_ids(ASK, chat_template_kwargs={"reasoning_effort": "low"}))
    with pytest.raises(TemplateArgumentError, match="give it once"):
        engine.prompt_ids(ASK, chat_template_kwargs={"reasoning_effort": "low"}, reasoning_effort="high")


def test_earlier_reasoning_goes_back_to_a_template_that_reads_it_and_no_other(with_template, qwen3_engine):
    history = ASK + [{"role": "assistant", "content": "", "reasoning_content": "Rome needs a call too.",
                      "tool_calls": [{"id": "c1", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    prompts = {}
    for name, template in TEMPLATES.items():
        engine = Engine(qwen3_engine.target, with_template(template))
        prompts[name] = engine.tokenizer.decode(engine.prompt_ids(history, [WEATHER]))
    assert "<think>\nRome needs a call too.\n</think>" in prompts["qwen3"]
    assert "Rome needs a call too." not in prompts["r1"]
    with pytest.raises(ChatFormatError, match="reasoning_content must be a string on an assistant message"):
        qwen3_engine.prompt_ids([{"role": "user", "content": "hi", "reasoning_content": "no"}])


# ---------------------------------------------------------------- a random qwen3: lossless against generate

@pytest.mark.parametrize("tool_choice", ["auto", "none", "required", "get_weather"])
def test_every_method_is_lossless_on_a_tiny_qwen3(engine, tool_choice):
    """Greedy `generate` is the reference; where a call is forced after the reasoning, the reference is
    greedy decoding masked to force it there (`logits_processor(strict=False)`), as strict's is."""
    ids = engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice)
    if tool_choice in ("auto", "none"):
        reference = greedy(engine, ids, 24)
    else:
        reference = masked_reference(engine, ASK, [WEATHER], tool_choice, 24, strict=False)
    hint = call("Paris")
    for method in METHODS:
        events, committed = trace_stream(engine, ASK, [WEATHER], tool_choice=tool_choice, max_new_tokens=24,
                                         method=method, hint=hint if method == "oospec" else None)
        gen = events[-1][1]
        assert gen.token_ids == reference, method
        check_events(engine, "", events, committed)
        _check_reasoning_is_timely(engine, events, committed)


# ---------------------------------------------------------------- boundary cases, many tokens a round

@pytest.fixture(scope="module", params=list(TEMPLATES))
def scripted(request, with_template):
    """(engine, script, opens): `script(text, tool_choice)` makes the next reply `text` (after the block's
    opener where the template's prompt opens it, `opens`), drafted whole by the retrieval drafter."""
    tok = with_template(TEMPLATES[request.param])
    engine = Engine(tiny_qwen3(tok), tok, model_name=f"scripted-{request.param}", max_draft_nodes=96)
    target = ScriptedTarget(engine.target, tok)
    engine = engine.with_parts(drafters={"retrieval": ScriptDrafter(target)})

    def script(text: str, tool_choice="auto"):
        target.script(engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice), text)
    return engine, script, request.param == "r1"


BOUNDARY = {  # name -> (reasoning, answer after it; None: the block never closes), max_new_tokens
    "close and call opener in one round": ("The user asks for Paris.", call("Paris"), 120),
    "two whole calls in one round": ("Two cities, two calls.", call("Paris") + "\n" + call("Rome"), 160),
    "reasoning that never closes": ("Let me think about Paris and Rome and " * 6, None, 30),
    "call opener inside the reasoning": ("I could write " + call("Paris") + " but I know it.", "It is sunny.", 120),
}


@pytest.mark.parametrize("case", list(BOUNDARY))
def test_boundary_cases_stream_what_they_return_alike_in_every_method(scripted, case):
    engine, script, opens = scripted
    thought, answer, limit = BOUNDARY[case]
    text = ("" if opens else "<think>\n") + thought + ("" if answer is None else "\n</think>\n\n" + answer)
    script(text)
    messages = {}
    for strict in (False, True):
        for method in METHODS:
            events, committed = trace_stream(engine, ASK, [WEATHER], max_new_tokens=limit, method=method,
                                             strict=strict, hint=call("Paris") if method == "oospec" else None)
            gen = events[-1][1]
            check_events(engine, "", events, committed)
            _check_reasoning_is_timely(engine, events, committed)
            assert _joined([e for _, e in events[:-1]]) == _said(gen)[:4], (method, strict)
            messages[method, strict] = _said(gen) + (gen.text, gen.token_ids)
            if method != "ar":
                _check_one_round(case, engine, gen, committed)
    assert len(set(map(repr, messages.values()))) == 1, "the methods differ"
    reasoning, content, calls, invalid, finish, text_out, _ = messages["ar", False]
    if answer is None:  # cut off inside the reasoning: what it has reasoned, no call, no content, and said so
        assert reasoning and thought.startswith(reasoning) and text_out == text[:len(text_out)]
        assert (content, calls, invalid, finish) == ("", [], [], "length")
    else:
        assert reasoning == thought.strip()
        assert text_out == text
        expected = FMT.parse(answer)
        assert (content, [c["arguments"] for c in calls]) == (expected[0], [c["arguments"] for c in expected[1]])
        assert finish == ("tool_calls" if expected[1] else "stop")


@pytest.mark.parametrize("tool_choice", ["required", "get_weather"])
def test_a_forced_call_comes_after_the_reasoning(scripted, tool_choice):
    """The model reasons, then wants to answer in text: the forced opener follows the closed block
    (masked, as under strict), and every method equals that masked reference."""
    engine, script, opens = scripted
    script(("" if opens else "<think>\n") + "Short plan.\n</think>\n\nThe weather is fine.", tool_choice)
    ids = engine.prompt_ids(ASK, [WEATHER], tool_choice=tool_choice)
    assert not engine.tokenizer.decode(ids).endswith(FMT.forced_prefix())  # the opener is no prompt prefix
    reference = masked_reference(engine, ASK, [WEATHER], tool_choice, 40, strict=False)
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER], tool_choice=tool_choice, max_new_tokens=40, method=method)
        assert gen.token_ids == reference, method
        assert gen.reasoning == "Short plan."
        after = gen.text.split("</think>", 1)[1]
        assert after.lstrip().startswith(FMT.forced_prefix()), gen.text
        assert gen.tool_calls or gen.invalid_tool_calls


def test_stats_split_the_reply_where_the_reasoning_closed(scripted):
    """`stats.reasoning_*` (what `oospec bench --thinking` reports the answer part from): the tokens,
    forwards and seconds up to and including the forward that committed `</think>`."""
    engine, script, opens = scripted
    text = ("" if opens else "<think>\n") + "The user asks for Paris.\n</think>\n\n" + call("Paris")
    script(text)
    tok = engine.tokenizer
    for method in METHODS:
        gen = engine.generate(ASK, [WEATHER], max_new_tokens=120, method=method)
        s = gen.stats
        before = tok.decode(gen.token_ids[:s.reasoning_tokens])
        assert "</think>" in before, (method, before)
        assert s.reasoning_forwards <= s.target_forwards and 0 <= s.reasoning_s <= s.decode_s
        if method == "ar":  # a token a forward: the split is exactly at the block's end
            assert s.reasoning_forwards == s.reasoning_tokens and before.endswith("</think>")
        else:  # the closing round committed the block's end and, drafted whole, the call after it
            assert s.reasoning_forwards < s.reasoning_tokens
    gen = engine.generate(ASK, [WEATHER], max_new_tokens=8, method="toolspec")  # cut off inside the block
    assert gen.stats.reasoning_forwards is None and gen.stats.reasoning_tokens is None


def test_a_reply_that_does_not_reason_has_no_split(qwen3_engine):
    gen = qwen3_engine.generate(ASK, [WEATHER], max_new_tokens=4, method="ar",
                                chat_template_kwargs={"enable_thinking": False})
    assert gen.stats.reasoning_forwards is None and gen.stats.reasoning_s is None


# ---------------------------------------------------------------- helpers

def _joined(events) -> tuple:
    """The stream's message: reasoning, content, calls (index-named ids; arguments parsed where they parse)."""
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            c = calls.setdefault(e.index, {"id": f"call {e.index}", "name": e.name, "arguments": ""})
            c["arguments"] += e.arguments
    valid, invalid = [], []
    for c in calls.values():
        try:
            valid.append(dict(c, arguments=json.loads(c["arguments"])))
        except json.JSONDecodeError:
            invalid.append(c)
    return thought, content, valid, invalid


def _said(gen: Generation) -> tuple:
    """The Generation's message, as `_joined` gives the stream's, and its finish_reason."""
    def place(c):
        return dict({k: c[k] for k in ("name", "arguments")}, id=f"call {c['id'].rsplit('_', 1)[1]}")
    return (gen.reasoning or "", gen.content, [place(c) for c in gen.tool_calls],
            [place(c) for c in gen.invalid_tool_calls], gen.finish_reason)


def _check_reasoning_is_timely(engine, events, committed) -> None:
    """After round r, the reasoning sent covers the committed reasoning, less what may still be the
    closing marker and the whitespace the reasoning strips."""
    gen = events[-1][1]
    reasoning = engine.prepare(ASK, [WEATHER]).reasoning if engine.reasoning else None
    if reasoning is None:
        assert gen.reasoning is None
        return
    tok = engine.tokenizer
    for r, n in enumerate(committed, 1):
        thought, _ = reasoning.split(tok.decode(gen.token_ids[:n], skip_special_tokens=True).rstrip("\ufffd"))
        sent = "".join(e.text for rr, e in events[:-1] if rr <= r and isinstance(e, ReasoningDelta))
        due = len((thought or "").strip())
        assert (gen.reasoning or "").startswith(sent) and len(sent) >= due - len(reasoning.close), f"late in round {r}"


def _check_one_round(case: str, engine, gen: Generation, committed: list[int]) -> None:
    """Speculation took the boundary in one round: the round that commits the closing marker also
    commits the first call's opener; the round that commits the first call also commits the second."""
    tok = engine.tokenizer
    texts = [tok.decode(gen.token_ids[:n], skip_special_tokens=True) for n in committed]

    def first_round(found) -> int:
        return next(r for r, t in enumerate(texts) if found(t))
    close = "</think>"
    if case == "close and call opener in one round":
        opened = first_round(lambda t: close in t and "<tool_call>" in t.split(close)[1])
        assert first_round(lambda t: close in t) == opened
    if case == "two whole calls in one round":
        assert first_round(lambda t: "</tool_call>" in t) == first_round(lambda t: t.count("</tool_call>") == 2)
