"""The sidecar: its rows, its batched wave, its mailbox, and what it does to the target's output (nothing)."""
from __future__ import annotations

import logging
import statistics
import threading
import time

import pytest
import torch

from oospec_testing import InTime, check_events, greedy, on_target_of, tiny_model, trace_stream
from oospec_agents import Engine
from oospec_agents.chat import normalize_messages
from oospec_agents.drafters import ReplyState, HintDrafter
from oospec_agents.formats import HermesFormat, Llama3JsonFormat
from oospec_agents.sidecar import HintRequest, SidecarBase
from oospec_agents.sidecar.join import JoinError, encode_payload, join, render_payload
from oospec_agents.sidecar.rows import SUMMARY_CHARS, Row, expand_rows, parse_value, summarize, value_end
from oospec_agents.sidecar.wave import Wave
from oospec_agents.sidecar.hosts.thread import WaveSidecar
from oospec_agents.sidecar.load import load_sidecar
from oospec_agents.sidecar.runtime import wave_rows
from oospec_agents.tools import normalize_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city. A second sentence nobody needs.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}, "hours": {"type": "array", "items": {"type": "integer"}}},
    "required": ["tz"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
N = 24  # new tokens per request in the model tests: the call's name and first arguments


def _request(tool_choice=("required", None), fmt=None, messages=ASK, tools=(WEATHER, TIME)):
    return HintRequest(normalize_messages(messages), normalize_tools(list(tools)), fmt or HermesFormat(), tool_choice)


# ---------------------------------------------------------------- rows: the one definition

def test_rows_are_exactly_the_function_row_then_one_slot_row_per_parameter():
    prefix, rows = expand_rows(normalize_messages(ASK), normalize_tools([WEATHER, TIME]),
                               {"name": "get_weather", "arguments": {"city": "Paris"}})
    assert prefix == ('<|im_start|>system\nCall one of these tools. Reply with the call as JSON.\n'
                      '- get_weather(city: string, unit?: "celsius"|"fahrenheit"): Get the current weather in a city\n'
                      '- get_time(tz: string, hours?: array<integer>)<|im_end|>\n'
                      '<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n'
                      '<|im_start|>assistant\n')
    opener = '<tool_call>\n{"name": "get_weather", "arguments": {'
    assert rows == [
        Row("function", None, None, '<tool_call>\n{"name":', ' "get_weather"'),
        Row("slot", "get_weather", "city", opener + '"city":', ' "Paris"', required=True),
        Row("slot", "get_weather", "unit", opener + '"unit":', " null"),
        Row("slot", "get_time", "tz", '<tool_call>\n{"name": "get_time", "arguments": {"tz":', None, required=True),
        Row("slot", "get_time", "hours", '<tool_call>\n{"name": "get_time", "arguments": {"hours":', None),
    ]
    assert "nobody needs" not in prefix  # only a description's first sentence: the shared prefix stays compact


@pytest.mark.parametrize("description, summary", [
    ("Calculate the area of a triangle. Uses Heron's formula.", "Calculate the area of a triangle"),
    ("Uses v2.0 of the API. More.", "Uses v2.0 of the API"),
    ("First line\nsecond line", "First line"),
    ("", ""),
    ("x" * 100, "x" * (SUMMARY_CHARS - 3) + "..."),
])
def test_a_tool_is_summarised_by_its_descriptions_first_sentence(description, summary):
    assert summarize(description) == summary


def test_rows_without_a_call_are_unlabelled_and_history_is_compact():
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "x" * 1000}, {"role": "user", "content": "And Rome?"}]
    prefix, rows = expand_rows(normalize_messages(history), normalize_tools([WEATHER]))
    assert all(r.target is None for r in rows)
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}<|im_end|>' in prefix
    assert "Tool result: " + "x" * 400 + "...<|im_end|>" in prefix
    assert prefix.endswith("And Rome?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("text, end, value", [
    (' "Paris"}', 8, "Paris"), (" 10,", 3, 10), (" 10", None, 10), (" 24.", None, 24), (" 24.5}", 5, 24.5),
    (" null,", 5, None), (" [1, 2]}", 7, [1, 2]), (' {"a": true}', 12, {"a": True}), (" true", 5, True),
    (" garbage", None, None), ("", None, None), (' "unterminated', None, None)])
def test_a_row_ends_at_the_end_of_its_json_value(text, end, value):
    assert value_end(text) == end
    assert parse_value(text) == value


# ---------------------------------------------------------------- join and payload

def test_join_keeps_the_predicted_function_and_its_non_null_slots():
    req = _request()
    rows, _, _ = wave_rows(req)
    texts = [' "get_weather"', ' "Paris"', " null", ' "UTC"', " [1]"]
    call = join(rows, texts, req.tools, req.tool_choice)
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}
    payload = encode_payload(call)
    assert payload == b'{"f":"get_weather","a":{"city":"Paris"}}'
    assert render_payload(payload, HermesFormat()) == \
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert render_payload(payload, Llama3JsonFormat()) == '{"name": "get_weather", "parameters": {"city": "Paris"}}'


def test_named_tool_choice_needs_only_that_tools_rows():
    req = _request(("named", "get_time"))
    rows, _, choices = wave_rows(req)
    assert [r.param for r in rows] == ["tz", "hours"] and choices == {}
    assert join(rows, [' "UTC"', " null"], req.tools, req.tool_choice) == {"name": "get_time", "arguments": {"tz": "UTC"}}


def test_the_function_row_may_choose_only_offered_tools():
    """...each with its lexical prior (tests/test_tool_prior.py): the question asks for the weather."""
    assert wave_rows(_request(("required", None)))[2] == {0: {' "get_weather"': 0.0, ' "get_time"': -1.0}}
    assert wave_rows(_request(("auto", None)))[2] == {0: {' "get_weather"': 0.0, ' "get_time"': -1.0, " null": 0.0}}


@pytest.mark.parametrize("texts, words", [
    ([' "launch_rockets"', ' "Paris"', " null", " null", " null"], "unknown function 'launch_rockets'"),
    ([" null"] * 5, "no call"), (["@@"] * 5, "no call"), ([' "get_weather"'], "5 rows"), (None, "5 rows")])
def test_join_refuses_what_is_not_a_call(texts, words):
    req = _request()
    rows, _, _ = wave_rows(req)
    with pytest.raises(JoinError, match=words):
        join(rows, texts, req.tools, req.tool_choice)


# ---------------------------------------------------------------- the wave on tiny models

@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A byte-level BPE tokenizer trained here, unlike SmolLM2's: the cross-tokenizer sidecar's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from oospec_testing import load_records
    texts = []
    for r in load_records("train")[:100]:
        prefix, rows = expand_rows(normalize_messages(r["messages"]), normalize_tools(r["tools"]), r["expected"][0])
        texts += [prefix] + [row.suffix + (row.target or "") for row in rows]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=700, special_tokens=["<|im_start|>", "<|im_end|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>")


@pytest.fixture(scope="module")
def bpe_sidecar_model(bpe_tokenizer):
    """A tiny random Llama on the BPE vocabulary, initialised wide enough that its rows differ."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    tok = bpe_tokenizer
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      initializer_range=0.1, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = tok.eos_token_id
    return model


class StaggeredWave(Wave):
    """Rows end at arbitrary tokens, so rows leave the batch at different steps."""
    def _done(self, ids):
        return ids[-1] % 5 == 0


class EndlessWave(Wave):
    """Rows never reach the end of a value: only the cap, or being ruled out, stops them."""
    def _done(self, ids):
        return False


def _alone(model, ids: list[int], steps: int, eos: int, ends=lambda t: False) -> list[int]:
    """One row decoded by itself, to eos, to `ends`, or for `steps` tokens."""
    out = []
    for t in model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=steps)[0, len(ids):].tolist():
        if t == eos:
            break
        out.append(t)
        if ends(t):
            break
    return out


def test_the_batched_wave_equals_each_row_decoded_on_its_own(bpe_tokenizer, bpe_sidecar_model):
    tok, model = bpe_tokenizer, bpe_sidecar_model
    prefix, rows = expand_rows(normalize_messages(ASK), normalize_tools([WEATHER, TIME]))
    slot_rows = rows[1:]  # a function row would rule out its rivals' rows
    texts = StaggeredWave(model, tok, max_row_tokens=8)(prefix, slot_rows).texts
    lengths = set()
    for row, text in zip(slot_rows, texts):
        alone = _alone(model, tok.encode(prefix) + tok.encode(row.suffix), 8, tok.eos_token_id, lambda t: t % 5 == 0)
        assert text == tok.decode(alone, skip_special_tokens=True), row
        lengths.add(len(alone))
    assert len(lengths) > 2  # rows did leave the batch at different steps


def test_a_warm_wave_reuses_the_shared_prefix_and_answers_as_a_cold_one(bpe_tokenizer, bpe_sidecar_model):
    tok, model = bpe_tokenizer, bpe_sidecar_model
    tools = normalize_tools([WEATHER, TIME])
    turn1 = normalize_messages(ASK)
    turn2 = turn1 + [{"role": "assistant", "content": "Which city?"}, {"role": "user", "content": "Paris, please."}]
    warm, cold = StaggeredWave(model, tok, max_row_tokens=8), StaggeredWave(model, tok, max_row_tokens=8,
                                                                              prefix_cache_tokens=0)
    cached = []
    for turn in (turn1, turn2, turn2):
        prefix, rows = expand_rows(turn, tools)
        hot, fresh = warm(prefix, rows[1:]), cold(prefix, rows[1:])
        assert hot.texts == fresh.texts
        assert fresh.profile["cached_prefix_tokens"] == 0
        cached.append(hot.profile["cached_prefix_tokens"])
    # a miss; the next turn reuses the tools and the first turn; the same turn again reuses it all
    assert cached[0] == 0 and 0 < cached[1] < hot.profile["prefix_tokens"] < cached[2]


def test_the_function_row_picks_an_offered_name_and_rules_out_the_other_tools_rows(bpe_tokenizer, bpe_sidecar_model):
    req = _request()
    rows, prefix, choices = wave_rows(req)
    tok, model = bpe_tokenizer, bpe_sidecar_model
    texts = EndlessWave(model, tok, max_row_tokens=12)(prefix, rows, None, choices).texts
    assert texts[0] in choices[0]
    name = parse_value(texts[0])
    for row, text in list(zip(rows, texts))[1:]:
        alone = _alone(model, tok.encode(prefix) + tok.encode(row.suffix), 12, tok.eos_token_id)
        if row.tool == name:
            assert text == tok.decode(alone)
        else:  # stopped as soon as the function row had chosen
            assert text in [tok.decode(alone[:k]) for k in range(len(alone))], text


def test_a_required_parameters_row_never_answers_null(smollm2_tokenizer):
    """A call without a required parameter does not validate, so the wave keeps that row off `null`
    (every token that begins it) and it writes its best value; an optional parameter's row may still
    answer null. The model here wants ` null` above all, then ` "` (a hook on its output layer)."""
    from oospec_testing import tiny_model
    tok = smollm2_tokenizer
    model = tiny_model("llama", tok, seed=5)
    null, quote = (tok.encode(t, add_special_tokens=False) for t in (" null", ' "'))
    assert len(null) == len(quote) == 1

    def wants_null(module, args, logits):
        logits[..., null[0]] += 1e4
        logits[..., quote[0]] += 5e3
        return logits
    req = _request(("named", "get_weather"))
    rows, prefix, _ = wave_rows(req)
    assert [(r.param, r.required) for r in rows] == [("city", True), ("unit", False)]
    handle = model.lm_head.register_forward_hook(wants_null)
    try:
        city, unit = Wave(model, tok, max_row_tokens=4)(prefix, rows).texts
    finally:
        handle.remove()
    assert unit == " null" and city.startswith(' "'), (city, unit)
    # a required parameter whose schema takes null (OpenAI strict's optional parameters) may answer it
    strict_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": ["string", "null"]}, "b": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "c": {"type": "string"}, "d": {"type": "string"}}, "required": ["a", "b", "c"]}}}
    _, rows = expand_rows(normalize_messages(ASK), normalize_tools([strict_tool]))
    assert [(r.param, r.required) for r in rows[1:]] == [("a", False), ("b", False), ("c", True), ("d", False)]
    # every token the tokenizer spells with a leading "n" is kept off, after whitespace too
    banned = Wave(model, tok).null_starts().tolist()
    assert null[0] in banned and tok.encode("null", add_special_tokens=False)[0] in banned
    assert all(tok.decode([i]).lstrip().startswith("n") for i in banned) and quote[0] not in banned


@pytest.mark.parametrize("prior_weight", [None, 0.0])
def test_the_sidecar_is_scored_as_the_wave_computes_its_rows(bpe_tokenizer, bpe_sidecar_model, prior_weight):
    """evaluate_sidecar runs the runtime's wave as it serves (all rows, then join; #56): a random model's
    function row still names an offered tool or null (free decoding would write garbage), and each
    prediction is the wave's own, with the runtime's lexical prior (None) or the weight given; a wrong
    function scores no slot."""
    from oospec_agents.sidecar.wave import PRIOR_WEIGHT
    from oospec_agents.train.sidecar_train import evaluate_sidecar
    from oospec_testing import load_records
    recs = [r for r in load_records("dev") if r["source"] == "bfcl_multiple"][:4]
    res = evaluate_sidecar(bpe_sidecar_model, bpe_tokenizer, recs, progress=False, details=True,
                           prior_weight=prior_weight)
    assert res["overall"]["n"] == 4 and len(res["misses"]) == 4  # a random model writes no right value
    assert any(miss["function"] is not None for miss in res["misses"])  # a whole offered name, spelt out
    wave = Wave(bpe_sidecar_model, bpe_tokenizer, prior_weight=PRIOR_WEIGHT if prior_weight is None else prior_weight)
    for miss in res["misses"]:
        rec = next(r for r in recs if r["id"] == miss["id"])
        req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), HermesFormat(),
                          ("auto", None))
        rows, prefix, choices = wave_rows(req)
        assert miss["function"] in [t.name for t in req.tools] + [None]
        texts = wave(prefix, rows, None, choices).texts
        assert miss["function"] == parse_value(texts[0])
        if miss["function"] != miss["expected"]["name"]:
            assert miss["wrong_values"] == {}
            continue
        predicted = {r.param: parse_value(text) for r, text in zip(rows, texts) if r.tool == miss["function"]}
        assert miss["wrong_values"] == {k: v for k, v in predicted.items() if v != miss["expected"]["arguments"].get(k)}


def test_no_call_records_are_scored_by_whether_the_function_row_declines(bpe_tokenizer, bpe_sidecar_model):
    """#20: a "no call" record counts in `no_call` (declined = the wave's function row answered null),
    never in the function accuracy of the records with calls."""
    from oospec_agents.data import load_records as read
    from oospec_agents.train.sidecar_train import evaluate_sidecar
    from oospec_testing import DATA
    extra = [r for r in read(DATA / "train-extra.jsonl") if r["source"] == "bfcl_irrelevance"][:3]
    calls = [r for r in read(DATA / "dev.jsonl") if r["source"] == "bfcl_simple"][:2]
    res = evaluate_sidecar(bpe_sidecar_model, bpe_tokenizer, calls + extra, progress=False, details=True)
    assert res["overall"]["n"] == 2 and res["no_call"]["n"] == 3
    assert set(res["no_call"]["by_source"]) == {"bfcl_irrelevance"}
    wave = Wave(bpe_sidecar_model, bpe_tokenizer)
    declined = 0
    for rec in extra:
        req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), HermesFormat(),
                          ("auto", None))
        rows, prefix, choices = wave_rows(req)
        name = parse_value(wave(prefix, rows[:1], None, choices).texts[0])
        declined += name is None
        assert (name is None) == all(m["id"] != rec["id"] for m in res["misses"])
    assert res["no_call"]["declined"] == round(declined / 3, 4)


# ---------------------------------------------------------------- the mailbox

def test_poll_returns_at_once_while_the_wave_computes():
    release = threading.Event()

    def slow_wave(prefix, rows, cancel, choices):
        release.wait(10)
        return [' "get_weather"', ' "Paris"', " null", " null", " null"]
    ticket = WaveSidecar(slow_wave).submit(_request())
    t0 = time.perf_counter()
    polls = [ticket.poll() for _ in range(100)]
    assert time.perf_counter() - t0 < 0.5 and polls == [None] * 100
    release.set()
    while (hint := ticket.poll()) is None and ticket.error is None:
        time.sleep(0.001)
    assert hint.text == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert hint.payload_bytes == len(b'{"f":"get_weather","a":{"city":"Paris"}}') and hint.ready_s > 0


def _new_thread_count() -> int:
    """The intra-op thread count a thread started now begins with."""
    out = []
    thread = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return out[0]


def test_a_wave_runs_on_its_own_threads_and_leaves_every_other_threads_count_alone():
    """A wave thread sets its own count (`threads=1`); `torch.set_num_threads` also sets the count new
    threads start with, which must come back after the wave: a server's request threads started after
    the first wave would otherwise decode the target on one core."""
    before = (torch.get_num_threads(), _new_thread_count())
    seen = []

    def wave(prefix, rows, cancel, choices):
        seen.append(torch.get_num_threads())
        return [' "get_weather"', ' "Paris"', " null", " null", " null"]
    ticket = InTime(WaveSidecar(wave, threads=1)).submit(_request())
    assert ticket.poll() is not None and seen == [1]
    deadline = time.perf_counter() + 10
    while _new_thread_count() != before[1] and time.perf_counter() < deadline:  # the wave thread's finally
        time.sleep(0.01)
    assert (torch.get_num_threads(), _new_thread_count()) == before


def test_a_wave_begun_while_the_target_lent_it_cores_leaves_the_target_threads_count():
    """The engine lends a CPU wave the target thread's cores right after submitting it, and gives them
    back when the reply ends, maybe before the wave does. A wave thread that began inside the loan
    must not leave the loan's count to the threads started after it."""
    before = torch.get_num_threads()
    release = threading.Event()
    seen = []

    def wave(prefix, rows, cancel, choices):
        seen.append(torch.get_num_threads())
        release.wait(10)
        return [' "get_weather"', ' "Paris"', " null", " null", " null"]
    sidecar = WaveSidecar(wave, threads=1)
    host = sidecar.host
    with host._turn:                           # hold the wave thread until the loan has begun
        host._busy = True
    ticket = sidecar.submit(_request())
    torch.set_num_threads(max(before - 1, 1))  # the loan (session._lend_cores)
    with host._turn:
        host._busy = False
        host._turn.notify_all()
    while not seen:
        time.sleep(0.001)
    torch.set_num_threads(before)          # given back before the wave ends
    release.set()
    while ticket.poll() is None and ticket.error is None:
        time.sleep(0.001)
    assert (torch.get_num_threads(), _new_thread_count()) == (before, before)


class _SlowCPUSidecar(SidecarBase):
    """TEST DOUBLE: a sidecar on the target's CPU, with one thread of its own, whose waves never answer
    (the worker's own mailbox, never posted): the reply decodes on with the cores it lent."""
    device, threads, name = "cpu", 1, "slow-cpu"

    def submit(self, request):
        from oospec_agents.sidecar.protocol import Ticket
        return Ticket(request, timeout_s=600.0)


def test_a_stream_closed_on_another_thread_gives_the_lent_cores_back_to_the_thread_that_lent_them(smollm2_tokenizer):
    """`torch.set_num_threads` sets the calling thread's count. A reply lends its CPU wave the decoding
    thread's cores; closed from another thread (or collected there), it used to add them to that thread
    and leave the decoding thread short of them for good. The decoding thread takes them back at its
    next request, and the closing thread's count is untouched."""
    engine = Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, _SlowCPUSidecar(), wave_payback=None)
    counts: dict[str, int] = {}
    streams = []

    def decode(closed: threading.Event):
        torch.set_num_threads(2)
        counts["before"] = torch.get_num_threads()
        events = engine.stream(ASK, [WEATHER], tool_choice="required", max_new_tokens=24)
        next(events)                                   # the wave is asked for; its cores are lent
        counts["lent"] = torch.get_num_threads()
        streams.append(events)
        closed.wait(10)
        counts["after close"] = torch.get_num_threads()
        engine.generate(ASK, max_new_tokens=2, method="ar")  # the next request on this thread
        counts["next request"] = torch.get_num_threads()

    def close(closed: threading.Event):
        torch.set_num_threads(2)
        counts["closer before"] = torch.get_num_threads()  # (a thread's first get initialises its count)
        ready.set()
        while not streams:
            time.sleep(0.001)
        streams[0].close()                             # on this thread: the reply's finally runs here
        counts["closer"] = torch.get_num_threads()
        closed.set()

    closed, ready = threading.Event(), threading.Event()
    threads = [threading.Thread(target=close, args=(closed,)), threading.Thread(target=decode, args=(closed,))]
    mine = torch.get_num_threads()
    try:
        threads[0].start()
        ready.wait(10)  # the closer has its own count before the decoder lends any
        threads[1].start()
        for t in threads:
            t.join(30)
    finally:  # the threads' set_num_threads also set the count later threads start with: put it back
        torch.set_num_threads(mine)
    assert counts == {"before": 2, "lent": 1, "closer before": 2, "closer": 2, "after close": 1,
                      "next request": 2}, counts


# ---------------------------------------------------------------- follow-up waves: the function the target wrote

class Aimed(SidecarBase):
    """TEST DOUBLE: a sidecar whose hint for a request names `first` (or the named tool_choice's tool),
    with the call text `calls[name]`; every request is recorded. `fail_named` makes a named submit raise."""

    def __init__(self, calls: dict[str, str], first: str, fail_named: bool = False):
        self.calls, self.first, self.fail_named, self.requests = calls, first, fail_named, []

    def submit(self, request):
        from oospec_agents.sidecar.protocol import FixedHint
        self.requests.append(request)
        mode, name = request.tool_choice
        if mode == "named" and self.fail_named:
            raise RuntimeError("the follow-up wave broke")
        if mode != "named" and self.first is None:
            return _Declined()
        return FixedHint(self.calls[name if mode == "named" else self.first]).submit(request)


class _Declined:
    error, declined = None, True

    def poll(self):
        return None

    def cancel(self):
        pass


def _session(sidecar, follow_up=True):
    """A session and the outcome it keeps (the engine copies it into the reply's stats)."""
    from oospec_agents.sidecar.cores import Place
    from oospec_agents.sidecar.session import HintSession
    hints = HintSession.open(sidecar, _request(), target=Place(torch.device("cpu")), faults=set(),
                             lend_cores=False, follow_up=follow_up)
    return hints, hints.outcome


WEATHER_CALL = HermesFormat().render_call("get_weather", {"city": "Paris"})
TIME_CALL = HermesFormat().render_call("get_time", {"tz": "Europe/Paris"})


def test_a_follow_up_wave_asks_for_the_function_the_target_wrote():
    side = Aimed({"get_weather": WEATHER_CALL, "get_time": TIME_CALL}, first="get_weather")
    hints, outcome = _session(side)
    assert hints.poll("") == WEATHER_CALL and hints.name == "get_weather"
    assert hints.poll('<tool_call>\n{"name": "get_ti') is None  # the name is not written in full yet
    assert hints.poll('<tool_call>\n{"name": "get_weather", "ar') is None  # the hint's own function
    assert len(side.requests) == 1 and outcome.follow_ups == 0
    reply = '<tool_call>\n{"name": "get_time", "'
    assert hints.poll(reply) == TIME_CALL  # asked now, and read in the same round: this sidecar is ready at once
    assert side.requests[-1].tool_choice == ("named", "get_time") and outcome.follow_ups == 1
    assert hints.name == "get_time"
    assert hints.poll(reply) is None and hints.poll(reply + 'arguments": {') is None
    assert len(side.requests) == 2  # each name once
    hints.close()
    assert outcome.error is None


def test_a_declining_wave_is_still_followed_up_when_the_target_writes_a_call():
    side = Aimed({"get_time": TIME_CALL}, first=None)
    hints, outcome = _session(side)
    assert hints.poll("") is None and hints.declined
    reply = '<tool_call>\n{"name": "get_time", "'
    assert hints.poll(reply) == TIME_CALL and hints.poll(reply) is None
    hints.close()
    assert outcome.declined and outcome.follow_ups == 1 and outcome.error is None


def test_no_follow_up_for_a_name_not_offered_nor_when_it_is_off():
    side = Aimed({"get_weather": WEATHER_CALL, "get_time": TIME_CALL}, first="get_weather")
    hints, outcome = _session(side)
    hints.poll("")
    assert hints.poll('<tool_call>\n{"name": "get_news", "') is None and len(side.requests) == 1
    hints, outcome = _session(side, follow_up=False)
    assert hints.poll("") == WEATHER_CALL
    assert hints.poll('<tool_call>\n{"name": "get_time", "') is None and outcome.follow_ups == 0
    assert hints.poll('<tool_call>\n{"name": "get_time", "') is None


def test_a_follow_up_that_fails_is_a_fault_and_no_hint():
    side = Aimed({"get_weather": WEATHER_CALL}, first="get_weather", fail_named=True)
    hints, outcome = _session(side)
    hints.poll("")
    assert hints.poll('<tool_call>\n{"name": "get_time", "') is None
    assert outcome.error.startswith("sidecar submit failed") and hints.text == WEATHER_CALL


def test_follow_ups_are_on_by_default_only_where_the_sidecar_has_cores_of_its_own():
    from oospec_agents.sidecar.cores import Place, shares_cpu
    from oospec_agents.sidecar.session import follows_up
    cpu, gpu = Place(torch.device("cpu")), Place(torch.device("cuda", 0))
    on_cpu = WaveSidecar(lambda *a: [], device="cpu")

    def shares(side, target):
        return shares_cpu(side.device, side.cores, target)
    assert not follows_up(None, shares(on_cpu, cpu)) and follows_up(True, shares(on_cpu, cpu))
    assert follows_up(None, shares(on_cpu, gpu)) and not follows_up(False, shares(on_cpu, gpu))
    assert follows_up(None, shares(Aimed({}, first=""), cpu))  # no CPU device of its own: a remote sidecar
    split = Place(torch.device("cpu"), frozenset({0}))
    assert follows_up(None, shares_cpu(torch.device("cpu"), frozenset({1}), split))  # a core set of its own


# ---------------------------------------------------------------- faults change nothing in the target's output

@pytest.fixture(scope="module")
def tiny_target(smollm2_tokenizer):
    return tiny_model("llama", smollm2_tokenizer, seed=7), smollm2_tokenizer


@pytest.fixture(scope="module")
def released():
    event = threading.Event()
    yield event
    event.set()  # lets the hung test doubles' threads end


def _fault_sidecars(released):
    def raises(*a):
        raise RuntimeError("boom")

    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def hangs(*a):
        released.wait()
        return ["x"] * 5

    def late(prefix, rows, cancel, choices):
        cancel.wait(30)
        return [' "get_weather"', ' "Paris"', " null", " null", " null"]

    class SubmitRaises(SidecarBase):
        def submit(self, request):
            raise ConnectionError("mailbox down")

    class PollRaises(SidecarBase):
        def submit(self, request):
            return type("T", (), {"error": None, "poll": lambda s: 1 / 0, "cancel": lambda s: None})()
    return {
        "raises": WaveSidecar(raises),
        "out of memory": WaveSidecar(oom),
        "hangs": WaveSidecar(hangs, timeout_s=0.0),
        "is late": WaveSidecar(late),
        "returns garbage": WaveSidecar(lambda *a: ["}}garbage{{"] * 5),
        "names an unknown function": WaveSidecar(lambda *a: [' "launch_rockets"', ' "Paris"'] + [" 1"] * 3),
        "fails to submit": SubmitRaises(),
        "fails to poll": PollRaises(),
    }


FAULTS = {"raises": "sidecar failed", "out of memory": "sidecar out of memory", "hangs": "sidecar timeout",
          "is late": "sidecar hint late", "returns garbage": "sidecar gave no usable call",
          "names an unknown function": "sidecar gave no usable call", "fails to submit": "sidecar submit failed",
          "fails to poll": "sidecar poll failed"}


@pytest.fixture(scope="module")
def tiny_reference(tiny_target):
    engine = Engine(*tiny_target)
    return greedy(engine, engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice="required"), 12)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulty_sidecar_leaves_the_target_tokens_unchanged(fault, tiny_target, tiny_reference, released, caplog):
    model, tok = tiny_target
    engine = Engine(model, tok, _fault_sidecars(released)[fault])
    kind = FAULTS[fault]
    with caplog.at_level(logging.WARNING, logger="oospec_agents.engine"):
        gens = [engine.generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=12) for _ in range(2)]
    for gen in gens:
        assert gen.token_ids == tiny_reference
        assert gen.stats["new_tokens"] == 12 and gen.finish_reason == "length"
        assert gen.stats["sidecar_error"].startswith(kind), gen.stats["sidecar_error"]
        assert gen.stats["accepted_by_source"]["hint"] == 0
    assert sum(kind in r.getMessage() for r in caplog.records) == 1  # logged once, in stats every time


def test_a_sidecar_that_predicts_no_call_is_no_fault_under_auto(tiny_target, caplog):
    model, tok = tiny_target
    engine = Engine(model, tok, InTime(WaveSidecar(lambda prefix, rows, *a: [" null"] * len(rows))))
    ref = greedy(engine, engine.prompt_ids(ASK, [WEATHER, TIME]), 12)
    with caplog.at_level(logging.WARNING, logger="oospec_agents.engine"):
        gen = engine.generate(ASK, [WEATHER, TIME], max_new_tokens=12)  # tool_choice="auto"
    assert gen.token_ids == ref
    assert gen.stats["sidecar_error"] is None and gen.stats["sidecar_declined"] and gen.stats["hint_ready_s"] is None
    assert not caplog.records
    # when a call is required, "no call" is a wrong answer, and reported as such
    gen = engine.generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=12)
    assert gen.stats["sidecar_error"].startswith("sidecar gave no usable call") and not gen.stats["sidecar_declined"]


class _PostsAfter(SidecarBase):
    """TEST DOUBLE: a sidecar whose wave posts `call` as its hint `delay_s` after each submit, from a
    thread of its own (a wave slower than the reply)."""
    name = "posts-after"

    def __init__(self, call: dict, delay_s: float):
        self.call, self.delay_s = call, delay_s

    def submit(self, request):
        from oospec_agents.sidecar import Ticket
        ticket = Ticket(request, timeout_s=60.0)
        threading.Timer(self.delay_s, lambda: ticket.post(payload=encode_payload(self.call))).start()
        return ticket


def test_hint_first_has_the_target_wait_for_the_wave_so_every_hint_is_in_time(tiny_target, tiny_reference):
    """`oospec bench --hint-first`'s wrapper: the target's first poll finds the slow wave's hint, where
    without it the reply ends before the hint comes; the tokens are the target's either way."""
    from oospec_agents.sidecar.protocol import HintFirst
    model, tok = tiny_target
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    late = Engine(model, tok, _PostsAfter(call, 5.0)).generate(ASK, [WEATHER, TIME], tool_choice="required",
                                                                max_new_tokens=12)
    assert late.stats["sidecar_error"].startswith("sidecar hint late")
    waited = HintFirst(_PostsAfter(call, 0.3))
    assert waited.name == "posts-after" and waited.describe() == {"hint_first": True}
    first = Engine(model, tok, waited).generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=12)
    assert first.stats["sidecar_error"] is None and first.stats["hint_ready_s"] >= 0.3
    assert first.stats["hint_bytes"] == len(encode_payload(call))
    assert late.token_ids == first.token_ids == tiny_reference


def test_without_a_sidecar_oospec_is_toolspec(tiny_target):
    a, b = (Engine(*tiny_target).generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=16, method=m)
            for m in ("toolspec", "oospec"))
    assert a.token_ids == b.token_ids and a.stats["target_forwards"] == b.stats["target_forwards"]
    assert b.stats["sidecar_error"] is None and b.stats["hint_ready_s"] is None


# ---------------------------------------------------------------- cross-tokenizer, concurrency (tiny models)

def test_a_sidecar_with_another_tokenizer_crosses_as_text(tiny_target, bpe_tokenizer, bpe_sidecar_model):
    model, tok = tiny_target
    assert bpe_tokenizer.get_vocab() != tok.get_vocab()
    side = WaveSidecar(Wave(bpe_sidecar_model, bpe_tokenizer, max_row_tokens=8))
    engine = Engine(model, tok, InTime(side))
    for tools in ([WEATHER], [WEATHER, TIME]):
        ids = engine.prompt_ids(ASK, tools, tool_choice="required")
        gen = engine.generate(ASK, tools, tool_choice="required", max_new_tokens=N)
        assert gen.token_ids == greedy(engine, ids, N)
        assert gen.stats["sidecar_error"] is None and gen.stats["hint_bytes"] > 10
        # where the wave's time went travels with the hint, for the benchmark's profile
        prof = gen.stats["sidecar_profile"]
        req = engine.prepare(ASK, tools, "required")
        rows, _, _ = wave_rows(HintRequest(req.messages, req.tools, engine.fmt, req.choice))
        assert prof["rows"] == len(rows) and prof["prefix_tokens"] > 0 and 1 <= prof["steps"] <= 8
        assert 0 <= prof["queued_s"] and 0 < prof["prefill_s"] + prof["decode_s"] <= prof["wave_s"]


def test_requests_from_several_threads_take_one_forward_at_a_time_and_are_unchanged(tiny_target, bpe_tokenizer, bpe_sidecar_model):
    model, tok = tiny_target
    engine = Engine(model, tok, WaveSidecar(Wave(bpe_sidecar_model, bpe_tokenizer, max_row_tokens=8)))
    asks = [[{"role": "user", "content": f"Weather in city number {i}?"}] for i in range(4)]
    expected = [greedy(engine, engine.prompt_ids(a, [WEATHER, TIME], tool_choice="required"), 12) for a in asks]
    inside, most, lock = 0, 0, threading.Lock()
    forward = model.forward

    def counting_forward(*a, **kw):
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            time.sleep(0.002)  # widen the window in which an unserialised request would overlap
            return forward(*a, **kw)
        finally:
            with lock:
                inside -= 1
    results = [None] * len(asks)

    def run(i):
        results[i] = engine.generate(asks[i], [WEATHER, TIME], tool_choice="required", max_new_tokens=12).token_ids
    model.forward = counting_forward
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(asks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        del model.forward
    assert results == expected
    assert most == 1  # one forward at a time owns the target (the replies' rounds may share it: batching.py)


# ---------------------------------------------------------------- the embedded pair (SmolLM2-135M-Instruct, fp32)

@pytest.fixture(scope="module")
def oospec_traces(embedded_fp32, embedded_sidecar, dev_records20):
    """Per record: the oospec engine's streamed events with their rounds (the hint in time)."""
    oospec = on_target_of(embedded_fp32, InTime(embedded_sidecar))
    return oospec, [trace_stream(oospec, r["messages"], r["tools"], tool_choice="required", max_new_tokens=N,
                                 method="oospec") for r in dev_records20]


@pytest.fixture(scope="module")
def runs20(embedded_fp32, dev_records20, embedded_greedy48, oospec_traces):
    """Per record: plain greedy (the session's first N tokens of greedy's 48), toolspec, and oospec
    with the embedded sidecar's hint in time."""
    toolspec = on_target_of(embedded_fp32)
    runs = []
    for r, greedy48, (events, _) in zip(dev_records20, embedded_greedy48, oospec_traces[1]):
        ref = greedy48[:N]
        ts = toolspec.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N, method="toolspec")
        runs.append((r, ref, ts, events[-1][1]))
    return runs


@pytest.mark.slow
def test_oospec_streams_each_call_as_it_is_committed(dev_records20, oospec_traces):
    engine, traces = oospec_traces
    for r, (events, committed) in zip(dev_records20, traces):
        check_events(engine, engine.prepare(r["messages"], r["tools"], "required").prefix, events, committed)


@pytest.mark.slow
def test_oospec_is_lossless_on_20_dev_records(runs20):
    assert len({r["source"] for r, *_ in runs20}) >= 4
    for r, ref, ts, oo in runs20:
        assert oo.token_ids == ref, r["id"]
        assert ts.token_ids == ref, r["id"]


@pytest.mark.slow
def test_oospec_takes_fewer_target_forwards_than_toolspec(runs20):
    ts = sum(t.stats["target_forwards"] for *_, t, _ in runs20)
    oo = sum(o.stats["target_forwards"] for *_, o in runs20)
    hint = sum(o.stats["accepted_by_source"]["hint"] for *_, o in runs20)
    print(f"\ntarget forwards on 20 dev records: toolspec {ts}, oospec {oo}; hint tokens accepted {hint}; "
          f"median hint_bytes {statistics.median(o.stats['hint_bytes'] for *_, o in runs20)}")
    assert oo < ts and hint > 0
    assert all(o.stats["sidecar_error"] is None and o.stats["hint_bytes"] > 0 for *_, o in runs20)


@pytest.mark.slow
def test_an_oracle_hint_takes_a_call_in_a_few_forwards(embedded_fp32, runs20):
    engine = on_target_of(embedded_fp32)
    for r, ref, ts, _ in runs20[:3]:
        gen = engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N,
                                     method="oospec", hint=ts.text)
        assert gen.token_ids == ref
        assert gen.stats["target_forwards"] <= 4 < ts.stats["target_forwards"]
        assert gen.stats["accepted_by_source"]["hint"] >= N // 2


@pytest.mark.slow
def test_the_threaded_sidecar_races_the_target_without_changing_it(embedded_fp32, embedded_sidecar, runs20):
    engine = on_target_of(embedded_fp32, embedded_sidecar)
    for r, ref, ts, _ in runs20[:5]:
        gen = engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N)
        assert gen.token_ids == ref
        s = gen.stats
        assert s["sidecar_error"] is None or s["sidecar_error"].startswith("sidecar hint late"), s["sidecar_error"]
        print(f"\n{r['id']}: hint_ready_s={s['hint_ready_s']} call_s={s['prefill_s'] + s['decode_s']:.2f} "
              f"hint_bytes={s['hint_bytes']} forwards={s['target_forwards']} (toolspec {ts.stats['target_forwards']})")


@pytest.mark.slow
def test_a_real_target_is_lossless_with_hints_from_a_sidecar_with_another_tokenizer(
        embedded_fp32, bpe_tokenizer, bpe_sidecar_model, runs20):
    side = WaveSidecar(Wave(bpe_sidecar_model, bpe_tokenizer, max_row_tokens=8))
    engine = on_target_of(embedded_fp32, InTime(side))
    for r, ref, *_ in runs20[:4]:
        gen = engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N)
        assert gen.token_ids == ref and gen.stats["hint_bytes"] and gen.stats["sidecar_error"] is None
    # What the target is offered is the hint's text in the target's own tokens.
    r = runs20[1][0]
    req = engine.prepare(r["messages"], r["tools"], "required")
    ticket = InTime(side).submit(HintRequest(req.messages, req.tools, engine.fmt, req.choice))
    hint = ticket.poll().text
    ctx = ReplyState(ids=list(req.prompt_ids), n_prompt=len(req.prompt_ids), text=req.prefix, tools=req.tools,
                       fmt=engine.fmt, tokenizer=engine.tokenizer, hint=hint)
    draft, *alternatives = HintDrafter().propose(ctx)
    assert req.prefix + engine.tokenizer.decode(draft.tokens) == hint[:len(req.prefix) + 160]
    assert len(alternatives) <= 1  # at most the compact-separator branch


# ---------------------------------------------------------------- every target gets the shipped sidecar

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.slow
def test_a_target_with_another_tokenizer_gets_the_embedded_sidecar(tmp_path, bpe_tokenizer):
    """Any target loaded by reference gets the embedded sidecar: its hint, rendered as text in the
    target's format, is tokenized by the target's own (BPE) tokenizer, polled and verified, and the
    reply is still the target's greedy output. `sidecar=False` loads none."""
    import copy

    from transformers import AutoModelForCausalLM, Qwen2Config
    tok = copy.deepcopy(bpe_tokenizer)
    tok.chat_template = CHATML
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)

    assert Engine.from_pretrained(str(tmp_path), sidecar=False, dtype="float32").sidecar is None
    engine = Engine.from_pretrained(str(tmp_path), dtype="float32", wave_payback=None)
    assert engine.sidecar.name == "embedded:SmolLM2-135M-Instruct+smollm2-sidecar"
    engine.sidecar = InTime(engine.sidecar)  # the hint is there at the first round
    ids = engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice="required")
    gen = engine.generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=24, method="oospec")
    assert gen.stats.sidecar == "embedded:SmolLM2-135M-Instruct+smollm2-sidecar"
    assert gen.stats.sidecar_error is None and gen.stats.hint_bytes > 0  # posted, and polled by the target
    assert gen.token_ids == greedy(engine, ids, 24)
    toolspec = engine.generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=24, method="toolspec")
    assert toolspec.stats.sidecar is None


@pytest.mark.slow
def test_a_follow_up_wave_corrects_a_misaimed_hint_without_changing_the_tokens(embedded_fp32, runs20):
    """The first hint calls another offered tool; the follow-up, asked once the target has written its
    function's name, brings that function's call. Lossless either way, and fewer forwards with it."""
    fmt = embedded_fp32.fmt
    picked = [(r, ref) for r, ref, *_ in runs20 if len(r["tools"]) > 1][:3]
    assert len(picked) == 3
    forwards = {False: 0, True: 0}
    for r, ref in picked:
        whole = on_target_of(embedded_fp32).generate(r["messages"], r["tools"], tool_choice="required",
                                                     max_new_tokens=128, method="toolspec")
        call = whole.tool_calls[0]  # the target's whole first call: the follow-up's hint
        other = next(t["function"]["name"] for t in r["tools"] if t["function"]["name"] != call["name"])
        calls = {call["name"]: fmt.render_call(call["name"], call["arguments"]), other: fmt.render_call(other, {})}
        runs = {}
        for follow_up in (False, True):
            side = Aimed(calls, first=other)
            engine = on_target_of(embedded_fp32, side, hint_follow_up=follow_up)
            gen = engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N, method="oospec")
            assert gen.token_ids == ref, (r["id"], follow_up)
            assert gen.stats["sidecar_error"] is None
            assert gen.stats["hint_follow_ups"] == int(follow_up)
            assert [q.tool_choice for q in side.requests][1:] == ([("named", call["name"])] if follow_up else [])
            runs[follow_up] = gen.stats
        assert runs[True]["target_forwards"] <= runs[False]["target_forwards"], r["id"]
        assert runs[True]["accepted_by_source"]["hint"] > runs[False]["accepted_by_source"]["hint"], r["id"]
        for follow_up in runs:
            forwards[follow_up] += runs[follow_up]["target_forwards"]
    assert forwards[True] < forwards[False], forwards
