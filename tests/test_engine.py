"""The engine core: lossless against transformers' greedy generate, fewer forwards, clear errors."""
import os

import pytest
import torch

from oospec_testing import ReferenceDrafter, check_events, greedy, trace_stream
from oospec_agents import Engine, Generation, TextDelta, ToolCallDelta
from oospec_agents.drafters import ReplyState
from oospec_agents.drafters.schema import forced_text
from oospec_agents.errors import (ChatFormatError, ContextLengthError, DeviceError, OoOSpecError, ToolSchemaError,
                                  UnknownToolError)
from oospec_agents.formats import HermesFormat
from oospec_agents.models import resolve_device
from oospec_agents.tools import normalize_tools

WEATHER = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris in celsius?"}]


# ---------------------------------------------------------------- lossless on tiny random models

@pytest.mark.parametrize("method", ["ar", "toolspec", "oospec"])
@pytest.mark.parametrize("tool_choice", ["auto", "required", "get_time", "none"])
def test_tiny_models_match_greedy_generate(tiny_engine, method, tool_choice):
    ids = tiny_engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice=tool_choice)
    gen = tiny_engine.generate(ASK, [WEATHER, TIME], tool_choice=tool_choice, max_new_tokens=24, method=method)
    assert gen.token_ids == greedy(tiny_engine, ids, 24)
    assert gen.stats["new_tokens"] == len(gen.token_ids) == 24


@pytest.mark.parametrize("wrong_at", [0, 1, 3, 6])
@pytest.mark.parametrize("branch", [False, True], ids=["chain", "tree"])
def test_kv_rollback_across_rejected_drafts(tiny_engine, wrong_at, branch, monkeypatch):
    ids = tiny_engine.prompt_ids(ASK, [WEATHER])
    ref = greedy(tiny_engine, ids, 40)
    drafting = tiny_engine.with_parts(drafters={"retrieval": ReferenceDrafter(ref, len(ids), wrong_at, branch)})
    gen = drafting.generate(ASK, [WEATHER], max_new_tokens=40, method="toolspec")
    assert gen.token_ids == ref
    # Each forward commits the accepted drafts plus one token of the target's own.
    per_forward = (8 if branch else wrong_at) + 1
    assert gen.stats["target_forwards"] <= 1 + -(-39 // per_forward) + 1


def test_stream_yields_events_then_the_generation(tiny_engine):
    items = list(tiny_engine.stream(ASK, [WEATHER], max_new_tokens=12, method="toolspec"))
    gen = items[-1]
    assert isinstance(gen, Generation)
    assert all(isinstance(d, (TextDelta, ToolCallDelta)) for d in items[:-1])
    assert "".join(d.text for d in items[:-1] if isinstance(d, TextDelta)) == gen.content
    assert all(d.text for d in items[:-1] if isinstance(d, TextDelta))


def test_stop_strings_cut_the_reply(tiny_engine):
    full = tiny_engine.generate(ASK, max_new_tokens=20, method="ar")
    stop = full.text[5:8]
    items = list(tiny_engine.stream(ASK, max_new_tokens=20, method="toolspec", stop=[stop]))
    gen = items[-1]
    assert gen.text == full.text[:full.text.index(stop)]
    # nothing streamed that the stop string later cut
    assert "".join(d.text for d in items[:-1]) == gen.content == gen.text.strip()
    assert gen.token_ids == full.token_ids[:len(gen.token_ids)]


def test_forced_tool_choice_is_part_of_prompt_ids(tiny_engine):
    tok = tiny_engine.tokenizer
    auto = tok.decode(tiny_engine.prompt_ids(ASK, [WEATHER, TIME]))
    required = tok.decode(tiny_engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice="required"))
    named = tok.decode(tiny_engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice={"type": "function",
                                                                                   "function": {"name": "get_time"}}))
    none = tok.decode(tiny_engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice="none"))
    assert required == auto + '<tool_call>\n{"name": "'
    assert named == auto + '<tool_call>\n{"name": "get_time"'
    assert "get_current_weather" not in none


# ---------------------------------------------------------------- the schema drafter

def _ctx(text, tools=(WEATHER, TIME)):
    return ReplyState(ids=[1], n_prompt=1, text=text, tools=normalize_tools(list(tools)), fmt=HermesFormat(),
                        tokenizer=None)


@pytest.mark.parametrize("text, forced", [
    ("", '<tool_call>\n{"name": "'),
    ("<tool_call>", '\n{"name": "'),
    ('<tool_call>\n{"name": "get_c', 'urrent_weather", "arguments": {"city": "'),
    ('<tool_call>\n{"name": "get_', ""),  # two tools share the prefix: nothing is forced
    ('<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris"', ', "unit": "'),
    ('<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris", "unit": "c',
     'elsius"}}\n</tool_call>'),
    ('<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris", "u', 'nit": "'),
    ('<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}', "}\n</tool_call>"),
    ('<tool_call>\n{"name": "get_current_weather","arguments": {', '"city": "'),  # compact separator
    ('<tool_call>\n{"name":"get_current_weather"', ', "arguments": {"city": "'),
    ("Sure, here you go.", ""),
])
def test_schema_drafter_drafts_exactly_the_forced_stretches(text, forced):
    assert forced_text(_ctx(text)) == forced


@pytest.mark.parametrize("body", ["<", "\n", " ", '"name', "12", "tr"])
def test_schema_drafter_forces_nothing_before_a_calls_object_opens(body):
    """A call tag followed by something that is not yet a JSON object (seen from a trained target:
    "... within <tool_call>\n<tool_call>\n{...") has nothing forced, and must not crash the decode."""
    assert forced_text(_ctx("Use the format within <tool_call>\n" + body)) == ""


@pytest.mark.parametrize("reply", [
    'return a json object within <tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
    '<tool_call>\n[{"name": "get_time"}, 3, "x"]\n</tool_call>',
    '<tool_call>\n{"name": "get_current_weather", "arguments": {"city": 5ft 10in, "unit": ["c", {"k": [1]}]}}}}',
    '<tool_call>\n  \n"get_time" null true {"name": "nope", "arguments": "x"}</tool_call><tool_call>',
])
def test_schema_drafter_survives_every_prefix_of_a_messy_reply(reply):
    for i in range(len(reply) + 1):
        assert isinstance(forced_text(_ctx(reply[:i])), str)


def test_schema_drafter_drafts_both_argument_separators(smollm2_tokenizer):
    from oospec_agents.drafters import SchemaDrafter
    tok = smollm2_tokenizer
    text = '<tool_call>\n{"name": "get_c'
    ctx = ReplyState(ids=tok.encode(text, add_special_tokens=False), n_prompt=0, text=text,
                       tools=normalize_tools([WEATHER, TIME]), fmt=HermesFormat(), tokenizer=tok)
    drafts = [tok.decode(d.tokens) for d in SchemaDrafter().propose(ctx)]
    assert drafts == ['urrent_weather", "arguments": {"city": "', 'urrent_weather","arguments": {"city": "']
    # both are branches of one tree that share everything before the comma
    from oospec_agents.verify import build_tree
    a, b = SchemaDrafter().propose(ctx)
    shared = len(os.path.commonprefix([a.tokens, b.tokens]))
    assert shared > 0 and len(build_tree(0, [a, b], 64).tokens) == 1 + len(a.tokens) + len(b.tokens) - shared


def test_hint_drafter_adds_a_short_compact_separator_branch(smollm2_tokenizer):
    from oospec_agents.drafters import HintDrafter
    tok = smollm2_tokenizer
    hint = '<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    ctx = ReplyState(ids=[tok.eos_token_id], n_prompt=1, text="", tools=normalize_tools([WEATHER, TIME]),
                       fmt=HermesFormat(), tokenizer=tok, hint=hint)
    first, alt = [tok.decode(d.tokens) for d in HintDrafter().propose(ctx)]
    assert first == hint
    assert alt == '<tool_call>\n{"name": "get_current_weather","arguments": {"city": "P'  # 24 chars past ","
    # once the reply took the compact separator, the hint re-anchors on its key and offers the rest
    ctx.text = '<tool_call>\n{"name": "get_current_weather","arguments": {"city": '
    ctx.ids = [tok.eos_token_id] + tok.encode(ctx.text, add_special_tokens=False)
    (rest,) = [tok.decode(d.tokens) for d in HintDrafter().propose(ctx)]
    assert rest == '"Paris", "unit": "celsius"}}\n</tool_call>'


def test_schema_draft_is_reencoded_at_the_token_boundary(smollm2_tokenizer):
    from oospec_agents.drafters import encode_after
    tok = smollm2_tokenizer
    ids = tok.encode('<tool_call>\n{"name": "get', add_special_tokens=False)
    draft = encode_after(tok, ids, '_current_weather", "arguments": {"')
    whole = tok.encode('<tool_call>\n{"name": "get_current_weather", "arguments": {"', add_special_tokens=False)
    assert ids + draft == whole


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("tools, error, words", [
    ([{"type": "function", "function": {"parameters": {}}}], ToolSchemaError, "missing its 'name'"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 3}}}],
     ToolSchemaError, "invalid JSON Schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}],
     ToolSchemaError, "invalid JSON Schema"),
    ([WEATHER, WEATHER], ToolSchemaError, "duplicate tool name 'get_current_weather'"),
])
def test_bad_tools_are_named(tiny_engine, tools, error, words):
    with pytest.raises(error, match=words):
        tiny_engine.generate(ASK, tools, max_new_tokens=2)


def test_unknown_tool_choice(tiny_engine):
    with pytest.raises(UnknownToolError, match="unknown tool 'get_stock'.*get_current_weather"):
        tiny_engine.generate(ASK, [WEATHER], tool_choice="get_stock")
    with pytest.raises(UnknownToolError, match="no tools were offered"):
        tiny_engine.generate(ASK, None, tool_choice="required")


@pytest.mark.parametrize("messages, words", [
    ([], "non-empty list"),
    ("hello", "non-empty list"),
    ([{"role": "robot", "content": "hi"}], "role 'robot'"),
    ([{"role": "user", "content": 5}], "content must be a string"),
    ([{"role": "system", "content": "only me"}], "only system messages"),
    ([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}], "not valid JSON"),
])
def test_invalid_chats_are_named(tiny_engine, messages, words):
    with pytest.raises(ChatFormatError, match=words):
        tiny_engine.generate(messages, max_new_tokens=2)


def test_prompt_over_the_context_window(tiny_engine):
    long = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(ContextLengthError, match=r"over the target's context window of 2048"):
        tiny_engine.generate(long)


@pytest.mark.parametrize("bad", [0, -3, 1.5])
def test_max_new_tokens_must_be_positive(tiny_engine, bad):
    with pytest.raises(OoOSpecError, match="max_new_tokens must be an integer >= 1"):
        tiny_engine.generate(ASK, max_new_tokens=bad)


def test_sampling_comes_whole_or_as_settings_never_both(tiny_engine):
    from oospec_agents.sampling import Sampling
    whole = tiny_engine.generate(ASK, max_new_tokens=12, sampling=Sampling(temperature=0.8, seed=7))
    settings = tiny_engine.generate(ASK, max_new_tokens=12, temperature=0.8, seed=7)
    assert whole.token_ids == settings.token_ids  # the same draw: one Sampling either way
    with pytest.raises(OoOSpecError, match="not both"):
        tiny_engine.generate(ASK, sampling=Sampling(temperature=0.8), seed=7)
    with pytest.raises(OoOSpecError, match="sampling must be an oospec_agents.sampling.Sampling, got dict"):
        tiny_engine.generate(ASK, sampling={"temperature": 0.8})


def test_unknown_method(tiny_engine):
    with pytest.raises(OoOSpecError, match="unknown method 'fast'"):
        tiny_engine.generate(ASK, method="fast")


@pytest.mark.parametrize("device, words", [("gpu:7", "unknown device 'gpu:7'"),
                                           ("tpu", "unknown device"),
                                           ("cuda", "no CUDA GPU"), ("cuda:3", "CUDA")])
def test_bad_devices(device, words):
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.device_count() > 3:
        pytest.skip("this machine has that many GPUs")
    with pytest.raises(DeviceError, match=words):
        resolve_device(device)
    with pytest.raises(DeviceError):
        Engine.from_pretrained("embedded", target_device=device)


def test_hitting_max_new_tokens_inside_a_call_reports_it_invalid(tiny_engine):
    gen = tiny_engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=3, method="toolspec")
    assert gen.finish_reason == "length"
    assert gen.tool_calls == []
    assert "unterminated tool call" in gen.invalid_tool_calls[0]["error"]
    assert "max_new_tokens" in gen.invalid_tool_calls[0]["error"]


def test_a_model_that_ends_its_reply_inside_a_call_is_told_from_one_cut_off(smollm2_tokenizer):
    """A call the model itself ended (its end-of-sequence token inside the forced call) is invalid
    for that reason, not for a max_new_tokens or stop string that never came. The reply holds a call,
    unreadable as it is, so it finishes as OpenAI's would: "tool_calls" (issue 48)."""
    from oospec_testing import tiny_model
    model = tiny_model("llama", smollm2_tokenizer)
    eos = smollm2_tokenizer.eos_token_id

    def ends_at_once(module, args, out):  # the model wants its end-of-sequence token above all
        out.logits[..., eos] += 1e4
    model.register_forward_hook(ends_at_once)
    engine = Engine(model, smollm2_tokenizer, model_name="tiny-ends")
    ids = engine.prompt_ids(ASK, [WEATHER], tool_choice="required")
    assert greedy(engine, ids, 8) == [eos]
    for method in ("ar", "toolspec", "oospec"):
        gen = engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=8, method=method)
        assert gen.token_ids == [eos] and gen.finish_reason == "tool_calls" and gen.tool_calls == []
        (call,) = gen.invalid_tool_calls
        assert call["error"] == "unterminated tool call: the model ended its reply (end of sequence) inside the call"


# ---------------------------------------------------------------- the embedded model

@pytest.fixture(scope="module")
def embedded_traces(embedded_fp32, dev_records20):
    """Per record and method: the streamed events with their rounds, and the commit schedule."""
    return [{m: trace_stream(embedded_fp32, rec["messages"], rec["tools"], tool_choice="required",
                             max_new_tokens=48, method=m) for m in ("ar", "toolspec")} for rec in dev_records20]


@pytest.fixture(scope="module")
def embedded_runs(dev_records20, embedded_traces, embedded_greedy48):
    runs = []
    for rec, traces, reference in zip(dev_records20, embedded_traces, embedded_greedy48):
        out = {m: events[-1][1] for m, (events, _) in traces.items()}
        runs.append((rec, reference, out))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ar", "toolspec"])
def test_embedded_streams_each_call_as_it_is_committed(embedded_fp32, dev_records20, embedded_traces, method):
    early = 0
    for rec, traces in zip(dev_records20, embedded_traces):
        events, committed = traces[method]
        check_events(embedded_fp32, embedded_fp32.prepare(rec["messages"], rec["tools"], "required").prefix,
                     events, committed)
        rounds = [r for r, e in events if isinstance(e, ToolCallDelta) and e.index == 0]
        early += bool(rounds) and rounds[0] < rounds[-1]
    assert early >= 15  # the name arrives rounds before the call's last argument token on most records


@pytest.mark.slow
def test_embedded_is_lossless_on_20_dev_records(embedded_runs):
    assert len({rec["source"] for rec, _, _ in embedded_runs}) >= 4
    for rec, reference, out in embedded_runs:
        for method, gen in out.items():
            assert gen.token_ids == reference, f"{method} diverged from greedy on {rec['id']}"


@pytest.mark.slow
def test_toolspec_needs_at_most_0_6x_the_forwards_of_ar(embedded_runs):
    ar = sum(out["ar"].stats["target_forwards"] for _, _, out in embedded_runs)
    ts = sum(out["toolspec"].stats["target_forwards"] for _, _, out in embedded_runs)
    assert ts <= 0.6 * ar, (ts, ar)
    accepted = {s: sum(out["toolspec"].stats["accepted_by_source"][s] for _, _, out in embedded_runs)
                for s in ("schema", "retrieval")}
    assert accepted["schema"] > 0 and accepted["retrieval"] > 0


def test_stream_rejects_bad_input_before_the_first_chunk(tiny_engine):
    with pytest.raises(UnknownToolError):
        tiny_engine.stream(ASK, [WEATHER], tool_choice="nope")


def test_required_with_a_single_tool_names_it(tiny_engine):
    tok = tiny_engine.tokenizer
    auto = tok.decode(tiny_engine.prompt_ids(ASK, [WEATHER]))
    assert tok.decode(tiny_engine.prompt_ids(ASK, [WEATHER], tool_choice="required")) == \
        auto + '<tool_call>\n{"name": "get_current_weather"'


def test_shared_engines_ignore_unset_arguments(monkeypatch):
    made = []
    monkeypatch.setattr(Engine, "from_pretrained", classmethod(lambda cls, *a, **kw: made.append(a) or object()))
    monkeypatch.setattr(Engine, "_shared", {})
    assert Engine.shared("some/model", target_device=None) is Engine.shared("some/model")
    assert Engine.shared("some/model", dtype="float32") is not Engine.shared("some/model")
    assert len(made) == 2


def test_partial_stop_strings_are_held_back():
    from oospec_agents.reply import partial_stop
    assert partial_stop("Thank yo", ["you", "\nObservation:"]) == 2
    assert partial_stop("Thank\nObs", ["you", "\nObservation:"]) == 4
    assert partial_stop("Thanks", ["you"]) == 0


def test_decode_time_splits_into_target_forwards_and_host_work(tiny_engine):
    gen = tiny_engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=16, method="toolspec")
    s = gen.stats
    assert s.forward_s > 0 and s.host_s > 0
    assert s.forward_s + s.host_s == pytest.approx(s.decode_s, abs=1e-9)
    # the acceptance trace: one (nodes, accepted, context) per verify forward, adding up to the reply
    assert len(s.rounds) == s.target_forwards - 1
    assert sum(acc + 1 for _, acc, _ in s.rounds) + 1 == len(gen.token_ids)
    assert s.rounds[0][2] == s.prompt_tokens and all(n >= acc + 1 for n, acc, _ in s.rounds)


def test_stats_are_typed_and_still_read_as_a_mapping(tiny_engine):
    import json
    stats = tiny_engine.generate(ASK, [WEATHER], max_new_tokens=8, method="toolspec").stats
    assert stats.method == "toolspec" and stats.target_forwards >= 1 and stats.new_tokens == 8
    assert stats["target_forwards"] == stats.target_forwards and stats.get("hint_ready_s") is None
    assert stats.accepted_tokens == sum(stats.accepted_by_source.values())
    assert json.loads(json.dumps(stats.to_dict()))["mean_accepted_tokens"] == stats.mean_accepted_tokens


def test_call_memory_is_per_tool_set_bounded_and_switchable():
    from oospec_agents.drafters.retrieval import CallMemory
    weather, time_ = normalize_tools([WEATHER]), normalize_tools([TIME])
    memory = CallMemory(size=2)
    for i in range(3):
        memory.remember(weather, [i])
    assert memory.recall(weather) == [[1], [2]] and memory.recall(time_) == []
    memory.recall(weather)[0].append(99)  # a copy: drafting never edits the memory
    assert memory.recall(weather) == [[1], [2]]
    memory.clear()
    assert memory.recall(weather) == []
    off = CallMemory(size=0)
    off.remember(weather, [1])
    assert off.recall(weather) == [] and len(off) == 0
    with pytest.raises(ValueError, match="memory_size"):
        CallMemory(size=-1)


def test_retrieval_never_drafts_another_tool_sets_reply(tiny_engine):
    tiny_engine.clear_call_memory()
    tiny_engine.generate(ASK, [WEATHER], max_new_tokens=6, method="toolspec")
    assert len(tiny_engine.memory.recall(normalize_tools([WEATHER]))) == 1
    assert tiny_engine.memory.recall(normalize_tools([TIME])) == []
    tiny_engine.clear_call_memory()
    assert len(tiny_engine.memory) == 0


def test_sidecar_keywords_without_a_sidecar_are_not_an_engine_argument(monkeypatch, tiny_engine):
    from oospec_agents import models
    monkeypatch.setattr(models, "load_model", lambda *a, **kw: (tiny_engine.target, tiny_engine.tokenizer))
    engine = Engine.from_pretrained("some/model", sidecar=False, sidecar_timeout_s=5, memory_size=4)
    assert engine.sidecar is None and engine.memory.size == 4
    # Every target gets the embedded sidecar by default, and the keywords configure it.
    engine = Engine.from_pretrained("some/model", sidecar_timeout_s=5, memory_size=4)
    assert engine.sidecar.name.startswith("embedded:") and engine.sidecar.timeout_s == 5


def test_a_tool_built_by_hand_validates_its_calls():
    from oospec_agents.tools import Tool
    tool = Tool("f", "", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    assert tool.validate({"a": 1}) is None
    assert "'a' is a required property" in tool.validate({})
    with pytest.raises(ToolSchemaError, match="invalid JSON Schema"):
        Tool("g", "", {"type": "object", "properties": {"a": {"type": 3}}})


def test_cancel_ends_a_reply_after_the_round_in_progress_even_without_an_event(tiny_engine):
    import threading
    cancel = threading.Event()
    # cancel is polled every round, not only when an event is sent (a round may send none)
    stream = tiny_engine.stream(ASK, max_new_tokens=200, method="ar", cancel=cancel)
    forwards = []
    real = tiny_engine._verifier.verify
    tiny_engine._verifier.verify = lambda *a, **kw: forwards.append(1) or real(*a, **kw)
    try:
        next(stream)
        cancel.set()
        done_at = len(forwards)
        rest = list(stream)
    finally:
        del tiny_engine._verifier.verify
    assert len(forwards) - done_at <= 1
    assert not any(isinstance(e, Generation) for e in rest)
    assert tiny_engine.decoding == 0


def test_reply_text_keeps_a_formats_special_markers(smollm2_tokenizer):
    """Mistral's [TOOL_CALLS] is a special token in its tokenizer: plain decode drops it, and the
    call parser needs it."""
    import copy

    from oospec_agents.engine import ReplyText
    from oospec_agents.formats import get_format
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    call = '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]'
    ids = tok.encode("Sure. " + call, add_special_tokens=False) + [tok.eos_token_id]
    assert "[TOOL_CALLS]" not in tok.decode(ids, skip_special_tokens=True)
    text = ReplyText(tok, get_format("mistral"))(ids)
    assert text == "Sure. " + call
    assert get_format("mistral").parse(text)[1] == [{"name": "f", "arguments": {"a": 1}}]
    # where the markup is plain text (hermes' tags in SmolLM2's vocabulary) the plain decode stands
    plain = ReplyText(smollm2_tokenizer, HermesFormat())
    assert plain.keep == {}
    hermes_ids = smollm2_tokenizer.encode('<tool_call>\n{"name": "f"}\n</tool_call>', add_special_tokens=False)
    assert plain(hermes_ids) == smollm2_tokenizer.decode(hermes_ids, skip_special_tokens=True)
