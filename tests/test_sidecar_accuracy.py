"""#56: the sidecar measured as it serves. The error taxonomy and the lenient scorer, the wave's
row log-probabilities and its calibrated confidence (fitted, shipped, carried by the Hint across a
thread, a worker process and into `CallPredicted`), and `evaluate_sidecar`'s figures adding up."""
from __future__ import annotations

import json
import math

import pytest
import torch

from oospec_testing import load_records, tiny_model
from oospec_agents import CallPredicted, Engine
from oospec_agents.chat import normalize_messages
from oospec_agents.formats import HermesFormat
from oospec_agents.sidecar import HintRequest, SidecarBase
from oospec_agents.sidecar.confidence import (CALIBRATION_FILE, Calibration, call_logprob, reliability,
                                              threshold_figures)
from oospec_agents.sidecar.join import encode_payload, join
from oospec_agents.sidecar.protocol import Ticket
from oospec_agents.sidecar.rows import Row
from oospec_agents.sidecar.runtime import WorkerSpec, call_confidence, load_wave, wave_rows
from oospec_agents.sidecar.wave import Wave
from oospec_agents.tools import normalize_tools
from oospec_agents.train.taxonomy import CLASSES, classify, lenient_right, possible_answer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"],
                                                                            "default": "c"}},
    "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


# ---------------------------------------------------------------- the taxonomy

@pytest.mark.parametrize("gold,predicted,cls", [
    (None, 1, "optional_filled"),
    ("inches", None, "optional_dropped"),
    ("Paris, FR", "Paris", "format"),                        # a superstring of the words
    ("Kuala Lumpur, MY", "Kuala Lumpur, Malaysia", "format"),  # the same head, another qualifier
    ("2023-03-14", "03/14", "format"),                       # a date in another shape
    ("2023-03-14", "March 14", "format"),
    (5, "5.0", "format"),                                    # one number, as text
    (["a", "b"], ["b", "a"], "format"),
    ("NEW YORK", "new-york", "format"),
    (1, 10, "wrong_value"),                                  # digits are words: 1 is not inside 10
    ("2023-03-14", "2023-03-15", "wrong_value"),
    ("Berlin", "Paris", "context"),                          # said earlier, not in the last user turn
    ("Rome", "Paris", "wrong_value"),                        # said nowhere
])
def test_every_wrong_slot_falls_in_one_class(gold, predicted, cls):
    messages = [{"role": "user", "content": "I live in Berlin."}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "What is the weather there?"}]
    assert cls in CLASSES and classify(gold, predicted, messages) == cls


def test_a_value_also_in_the_last_user_turn_is_not_context():
    messages = [{"role": "user", "content": "Berlin?"}, {"role": "user", "content": "Weather in Berlin"}]
    assert classify("Berlin", "Paris", messages) == "wrong_value"


def test_the_lenient_scorer_takes_any_possible_answer_and_an_omissible_default():
    spec = {"type": "string", "default": "c"}
    possible = {"city": ["Paris", "Paris, France"], "unit": ["c", ""]}
    assert lenient_right("city", "Paris", "Paris, France", possible=possible, spec=spec, required=True)
    assert not lenient_right("city", "Paris", "Lyon", possible=possible, spec=spec, required=True)
    assert lenient_right("unit", None, None, possible=possible, spec=spec, required=False)   # "" : may be left out
    assert lenient_right("unit", None, "c", possible=possible, spec=spec, required=False)    # or given its default
    assert not lenient_right("unit", None, "f", possible=possible, spec=spec, required=False)
    # without a possible answer: an optional argument the label leaves out may take its default
    assert lenient_right("unit", None, "c", possible=None, spec=spec, required=False)
    assert not lenient_right("unit", "f", "c", possible=None, spec=spec, required=False)
    rec = {"meta": {"possible_answer": [{"get_weather": possible}]}}
    assert possible_answer(rec, "get_weather") == possible and possible_answer(rec, "other") is None


# ---------------------------------------------------------------- calibration

def test_a_fitted_calibration_is_monotone_and_round_trips(tmp_path):
    logprobs = [-0.01 * i for i in range(50)] + [-1 - 0.1 * i for i in range(50)]
    exact = [i % 5 != 0 for i in range(50)] + [i % 4 == 0 for i in range(50)]
    cal = Calibration.fit(logprobs, exact, fitted_on="test")
    assert cal.kind == "platt" and cal.a > 0 and cal.n == 100
    ps = [cal(x) for x in sorted(logprobs)]
    assert ps == sorted(ps) and all(0 < p < 1 for p in ps)
    assert cal(-0.05) > 0.6 > 0.4 > cal(-5)
    cal.save(tmp_path / CALIBRATION_FILE)
    assert Calibration.for_adapter(tmp_path) == cal
    assert Calibration.for_adapter(tmp_path / "elsewhere") == Calibration.raw()  # no file: the raw product
    assert Calibration.raw()(math.log(0.25)) == pytest.approx(0.25) and cal(None) is None


def test_a_bad_calibration_file_is_an_error_naming_it(tmp_path):
    bad = tmp_path / CALIBRATION_FILE
    bad.write_text('{"kind": "isotonic"}')
    with pytest.raises(ValueError, match="confidence calibration .*confidence.json"):
        Calibration.for_adapter(tmp_path)
    bad.write_text('{"kind": "platt", "a": "steep", "b": 0}')
    with pytest.raises(ValueError, match="not a finite platt or raw map"):
        Calibration.for_adapter(tmp_path)
    bad.write_text("not json")
    with pytest.raises(ValueError, match=str(bad)):
        Calibration.load(bad)


def test_the_shipped_calibration_loads_and_was_fitted_on_training_records():
    from oospec_agents.models import EMBEDDED_SIDECAR_ADAPTER
    cal = Calibration.for_adapter(EMBEDDED_SIDECAR_ADAPTER)
    assert cal.kind == "platt" and cal.a > 0 and cal.n
    assert "train" in cal.fitted_on and "dev" not in cal.fitted_on


def test_reliability_and_thresholds_count_what_they_say():
    points = [(0.05, False), (0.1, True), (0.55, True), (0.45, False), (0.95, True), (1.0, True)]
    table = reliability(points)
    assert [b["n"] for b in table] == [2, 2, 2] and table[-1]["bin"] == "0.8-1.0"  # 1.0 is in the last bin
    assert table[1] == {"bin": "0.4-0.6", "n": 2, "mean_confidence": 0.5, "observed_exact": 0.5}
    assert threshold_figures(points, 0.5) == {"threshold": 0.5, "acted": 3, "of": 6, "precision": 1.0,
                                              "recall": 0.75}
    assert threshold_figures(points, 0.99)["acted"] == 1 and threshold_figures([], 0.5)["precision"] is None


def test_a_calls_log_probability_sums_its_function_row_and_its_tools_slot_rows():
    rows = [Row("function", None, None, ""), Row("slot", "f", "a", ""), Row("slot", "f", "b", ""),
            Row("slot", "g", "c", "")]
    call = {"name": "f", "arguments": {"a": 1}}
    assert call_logprob(rows, [-0.1, -0.2, -0.3, None], call, ("auto", None)) == pytest.approx(-0.6)
    assert call_logprob(rows[1:], [-0.2, -0.3, -9.0], call, ("named", "f")) == pytest.approx(-0.5)
    assert call_logprob(rows, [-0.1, None, -0.3, -1.0], call, ("auto", None)) is None  # a row not decoded
    assert call_logprob(rows, None, call, ("auto", None)) is None                        # a wave without them
    assert call_confidence(lambda *a: [], rows, call, ("auto", None), None) is None     # a plain wave function


# ---------------------------------------------------------------- the wave's log-probabilities

@pytest.fixture(scope="module")
def tiny_sidecar(smollm2_tokenizer):
    return tiny_model("llama", smollm2_tokenizer, seed=3), smollm2_tokenizer


def _request(tools=(WEATHER,), choice=("auto", None)):
    return HintRequest(normalize_messages(ASK), normalize_tools(list(tools)), HermesFormat(), choice)


def test_each_decoded_row_has_its_log_probability_and_an_undecoded_one_none(tiny_sidecar):
    wave = Wave(*tiny_sidecar, max_row_tokens=6)
    rows, prefix, choices = wave_rows(_request())
    logprobs = wave(prefix, rows, None, choices).row_logprobs
    assert len(logprobs) == len(rows) and all(lp is not None and lp <= 0 for lp in logprobs)
    # many tools: two phases, and the rows of tools the function row did not choose are not decoded
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object", "properties": {
        f"p{j}": {"type": "string"} for j in range(3)}}}} for i in range(8)]
    wave = Wave(*tiny_sidecar, max_row_tokens=6, max_rows=4)
    rows, prefix, choices = wave_rows(_request(tools, ("required", None)))
    result = wave(prefix, rows, None, choices)
    texts = result.texts
    decoded = [lp is not None for lp in result.row_logprobs]
    assert decoded[0] and decoded.count(True) <= 4 and decoded.count(False) >= len(rows) - 4
    call = join(rows, texts, _request(tools).tools, ("required", None))
    assert call_logprob(rows, result.row_logprobs, call, ("required", None)) is not None


def test_the_function_rows_log_probability_is_its_constrained_choice(tiny_sidecar):
    """The function row's log-probability is that of the name it wrote among the offered ones: with
    one offered name and no null (tool_choice required), it is certain."""
    wave = Wave(*tiny_sidecar, max_row_tokens=6)
    rows, prefix, choices = wave_rows(_request(choice=("required", None)))
    assert wave(prefix, rows, None, choices).row_logprobs[0] == pytest.approx(0.0, abs=1e-6)


# ---------------------------------------------------------------- the confidence reaches the consumer

@pytest.fixture(scope="module")
def tiny_spec(tmp_path_factory, smollm2_tokenizer) -> WorkerSpec:
    """A tiny random sidecar on disk, with a calibration beside it (its "adapter" directory)."""
    path = tmp_path_factory.mktemp("tiny-sidecar")
    tiny_model("llama", smollm2_tokenizer, seed=3).save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    Calibration("platt", 2.0, 1.0, "test").save(path / CALIBRATION_FILE)
    return WorkerSpec(str(path), "cpu", torch.float32, None, 8, 4096, 1)


def test_the_hint_carries_the_waves_calibrated_confidence_from_a_thread_and_a_process(tiny_spec):
    from oospec_agents.sidecar.hosts.process import ProcessSidecar
    from oospec_agents.sidecar.hosts.thread import WaveSidecar
    from oospec_agents.sidecar.protocol import wait_for_wave
    loaded = load_wave(tiny_spec)
    assert loaded.calibration == Calibration.raw()  # no adapter: the raw product
    calibration = Calibration.load(f"{tiny_spec.ref}/{CALIBRATION_FILE}")
    wave = _Kept(Wave(loaded.model, loaded.tokenizer, max_row_tokens=tiny_spec.max_row_tokens,
                      prefix_cache_tokens=tiny_spec.prefix_cache_tokens, calibration=calibration,
                      row_options=loaded.row_options))
    thread = WaveSidecar(wave)
    hint = wait_for_wave(thread.submit(_request(choice=("required", None))), 60).poll()
    rows, _, _ = wave_rows(_request(choice=("required", None)))
    call = json.loads(hint.text.split("\n")[1])
    logprobs = wave.results[-1].row_logprobs
    expected = calibration(call_logprob(rows, logprobs, call, ("required", None)))
    assert hint.confidence == pytest.approx(expected) and 0 < hint.confidence < 1
    # a worker process loads the same wave: its calibration is its adapter's (here: raw), and it crosses
    process = ProcessSidecar(tiny_spec, timeout_s=60.0, name="tiny")
    try:
        process.wait_ready()
        far = wait_for_wave(process.submit(_request(choice=("required", None))), 60).poll()
        assert far is not None and far.text == hint.text
        raw = Calibration.raw()(call_logprob(rows, logprobs, call, ("required", None)))
        assert far.confidence == pytest.approx(raw, rel=1e-4)
    finally:
        process.close()


class _Kept:
    """TEST DOUBLE around a real wave: keeps each `WaveResult` it returned (the wave keeps none)."""

    def __init__(self, wave):
        self.wave, self.results = wave, []

    def __getattr__(self, name):  # calibration, row_options, estimate: the real wave's
        return getattr(self.wave, name)

    def __call__(self, *args):
        self.results.append(self.wave(*args))
        return self.results[-1]


def test_an_adapters_calibration_is_loaded_with_its_wave(tiny_spec, monkeypatch):
    """`load_wave` reads the adapter directory's confidence.json (the embedded adapter ships one)."""
    import dataclasses

    import oospec_agents.models as models
    calls = []
    monkeypatch.setattr(models, "load_model", lambda ref, **kw: calls.append(kw["adapter"]) or _tiny(tiny_spec))
    wave = load_wave(dataclasses.replace(tiny_spec, adapter=tiny_spec.ref))
    assert calls == [tiny_spec.ref] and wave.calibration == Calibration("platt", 2.0, 1.0, "test")


def _tiny(spec):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(spec.ref), AutoTokenizer.from_pretrained(spec.ref)


class _Confident(SidecarBase):
    """A sidecar whose wave predicts get_weather(Lyon) with confidence 0.73."""
    name = "confident"

    def submit(self, request):
        ticket = Ticket(request, 30.0)
        ticket.post(payload=encode_payload({"name": "get_weather", "arguments": {"city": "Lyon"}}), confidence=0.73)
        return ticket


def test_call_predicted_carries_the_hints_confidence(smollm2_tokenizer):
    engine = Engine(tiny_model("llama", smollm2_tokenizer, seed=3), smollm2_tokenizer, _Confident())
    events = list(engine.stream(ASK, [WEATHER], tool_choice="required", max_new_tokens=8, method="oospec"))
    predicted = [e for e in events if isinstance(e, CallPredicted)]
    assert predicted == [CallPredicted([{"name": "get_weather", "arguments": {"city": "Lyon"}}], 0.73)]


# ---------------------------------------------------------------- evaluate_sidecar

def test_the_evaluation_adds_up(tiny_sidecar):
    """On a random model: each wrong slot has one class, the optional counts stay within the slots,
    every predicted call has a confidence point, and the misses agree with the figures."""
    from oospec_agents.train.sidecar_eval import evaluate_sidecar
    recs = [r for r in load_records("dev") if r["source"] in ("bfcl_simple", "apibank_l1")]
    recs = [r for r in recs if r["source"] == "bfcl_simple"][:3] + [r for r in recs if r["source"] == "apibank_l1"][:2]
    res = evaluate_sidecar(*tiny_sidecar, recs, progress=False, details=True, points=True)
    for src, row in res["by_source"].items():
        wrong = sum(res["errors"]["by_source"].get(src, {}).values())
        assert round(row["slots"] * (1 - (row["arg_exact_match"] or 0))) == wrong
        assert (row["arg_exact_lenient"] or 0) >= (row["arg_exact_match"] or 0)
        assert row["call_exact_lenient"] >= row["call_exact"]
        assert row["alpha_call"] == row["call_exact"] and 0 <= (row["alpha_slots"] or 0) <= 1  # α, against the labels
    opt = res["optional"]["overall"]
    assert opt["both"] <= min(opt["predicted"], opt["labelled"])
    assert res["confidence"]["n"] == len(res["points"]) == sum(b["n"] for b in res["confidence"]["reliability"])
    assert all(lp <= 0 for lp, _, _ in res["points"])
    exact = sum(ex for _, ex, _ in res["points"])
    assert exact == round(sum(r["call_exact"] * r["n"] for r in res["by_source"].values()))
    for miss in res["misses"]:
        assert set(miss["classes"]) == set(miss["wrong_values"]) and set(miss["classes"].values()) <= set(CLASSES)


def test_target_labels_are_the_targets_first_valid_call():
    from oospec_agents.train.sidecar_eval import target_labelled

    class Target:
        def generate(self, messages, tools, **kw):
            assert kw["tool_choice"] == "auto" and kw["method"] == "toolspec"
            calls = [] if "none" in messages[-1]["content"] else [{"id": "c0", "name": "get_weather",
                                                                  "arguments": {"city": "Oslo"}}]
            return type("G", (), {"tool_calls": calls})()
    recs = [{"id": "a", "source": "s", "messages": ASK, "tools": [WEATHER],
             "expected": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
             "meta": {"possible_answer": [{"get_weather": {"city": ["Paris"]}}]}},
            {"id": "b", "source": "s", "messages": [{"role": "user", "content": "none"}], "tools": [WEATHER],
             "expected": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}]
    labelled, left = target_labelled(recs, Target(), progress=False)
    assert left == 1 and [r["id"] for r in labelled] == ["a"]
    assert labelled[0]["expected"] == [{"name": "get_weather", "arguments": {"city": "Oslo"}}]
    assert "possible_answer" not in labelled[0]["meta"]  # the gold's acceptable values are not the target's


def test_calibrate_refuses_dev_records(capsys):
    from oospec_agents.train.evaluate import main
    with pytest.raises(SystemExit):
        main(["calibrate", "--dev", "../shared/data/toolcalls/dev.jsonl", "--out", "x.json"])
    assert "training records only" in capsys.readouterr().err


@pytest.mark.slow
def test_the_embedded_sidecars_prediction_carries_its_calibrated_confidence(embedded_fp32, embedded_sidecar):
    """End to end on the embedded pair: the shipped adapter's calibration is loaded with its wave, and
    the engine's CallPredicted carries the confidence of the wave's call (a probability); the reply is
    the target's own (lossless)."""
    from oospec_testing import on_target_of
    from oospec_agents.models import EMBEDDED_SIDECAR_ADAPTER
    from oospec_agents.sidecar.protocol import HintFirst
    wave = embedded_sidecar.host.wave
    assert wave.calibration == Calibration.for_adapter(EMBEDDED_SIDECAR_ADAPTER) and wave.calibration.kind == "platt"
    rec = next(r for r in load_records("dev") if r["source"] == "bfcl_simple")
    engine = on_target_of(embedded_fp32, HintFirst(embedded_sidecar), wave_payback=None)
    embedded_sidecar.host.wave = kept = _Kept(wave)  # the wave's results, kept for the check below
    try:
        events = list(engine.stream(rec["messages"], rec["tools"], tool_choice="auto", max_new_tokens=48,
                                    method="oospec"))
    finally:
        embedded_sidecar.host.wave = wave
    predicted = [e for e in events if isinstance(e, CallPredicted)]
    assert len(predicted) == 1 and isinstance(predicted[0].confidence, float) and 0 < predicted[0].confidence < 1
    rows, _, _ = wave_rows(HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]),
                                       HermesFormat(), ("auto", None)))
    call = predicted[0].calls[0]
    logprobs = kept.results[-1].row_logprobs
    assert predicted[0].confidence == pytest.approx(wave.calibration(call_logprob(rows, logprobs, call,
                                                                                   ("auto", None))))
    plain = embedded_fp32.generate(rec["messages"], rec["tools"], tool_choice="auto", max_new_tokens=48,
                                   method="toolspec")
    assert events[-1].token_ids == plain.token_ids


def test_adapts_agreement_reports_the_classes_before_and_after(tiny_sidecar):
    """`oospec adapt`'s agreement carries the wrong slots by class and the optional-slot decision per
    group, and its table shows them before -> after."""
    from oospec_agents.train.adapt import HOLDS, LACKS, agreement, table
    held = [r for r in load_records("dev") if r["source"] == "bfcl_simple"][:2]
    got = agreement(*tiny_sidecar, held, {held[0]["expected"][0]["name"]}, progress=False)
    assert set(got["errors"]["by_source"]) <= {HOLDS, LACKS} and set(got["errors"]["overall"]) == set(CLASSES)
    assert {"precision", "recall"} <= set(got["optional"]["overall"])
    after = json.loads(json.dumps(got))
    after["errors"]["overall"]["format"] += 1
    text = table({"before": got, "after": after})
    assert "| wrong slots | " + " | ".join(CLASSES) + " |" in text
    assert f"{got['errors']['overall']['format']} -> {got['errors']['overall']['format'] + 1}" in text
    assert "optional slots filled: precision" in text


@pytest.mark.slow
def test_the_cli_scores_the_shipped_sidecar_with_its_tables(tmp_path, capsys):
    """`python -m oospec_agents.train.evaluate sidecar`: the JSON (with each call's point and the labels
    used), then the per-source, class, optional-slot and confidence tables; the shipped calibration."""
    from oospec_agents.train.evaluate import main
    from oospec_testing import DATA
    out = tmp_path / "res.json"
    assert main(["sidecar", "--dev", str(DATA / "dev.jsonl"), "--sources", "bfcl_simple", "--limit", "2",
                 "--threads", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["labels"] == {"kind": "gold", "records": 2, "left_out": 0}
    assert len(res["points"]) == res["confidence"]["n"]
    assert res["confidence"]["calibration"] == "platt" and "train.jsonl" in res["confidence"]["fitted_on"]
    text = capsys.readouterr().out
    assert "| source | " + " | ".join(CLASSES) in text and "| threshold | acted on | precision | recall |" in text
    assert "| source | wave fills | label fills | both | precision | recall |" in text


# ---------------------------------------------------------------- item 2: a slot row reads its parameter (a flag)

DOCUMENTED = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string", "description": "City and state, e.g. Berkeley, CA", "examples": ["Oslo", "Rome"]},
    "unit": {"type": "string", "default": "c"}, "days": {"type": "integer"}}, "required": ["city"]}}}


def test_the_shipped_adapter_reads_each_parameters_documentation_and_one_without_rows_json_todays_rows():
    """#56: the shipped adapter was retrained on documented slot rows (its rows.json says so); an adapter
    without the file (an older one, a fresh `oospec adapt` of one) gets the rows it was trained on."""
    from oospec_agents.models import EMBEDDED_SIDECAR_ADAPTER
    from oospec_agents.sidecar.rows import RowOptions, expand_rows
    assert RowOptions.for_adapter(EMBEDDED_SIDECAR_ADAPTER) == RowOptions(param_docs=True)
    assert RowOptions.for_adapter(None) == RowOptions()
    msgs, tools = normalize_messages(ASK), normalize_tools([DOCUMENTED])
    today = expand_rows(msgs, tools)
    assert expand_rows(msgs, tools, options=RowOptions()) == today
    assert today[1][1].suffix == '<tool_call>\n{"name": "get_weather", "arguments": {"city":'
    shipped = expand_rows(msgs, tools, options=RowOptions.for_adapter(EMBEDDED_SIDECAR_ADAPTER))
    assert "City and state, e.g. Berkeley, CA" in shipped[1][1].suffix
    assert shipped[1][1].suffix.endswith('<tool_call>\n{"name": "get_weather", "arguments": {"city":')


def test_param_docs_put_each_documented_parameter_before_its_rows_call(tmp_path):
    from oospec_agents.sidecar.rows import PARAM_DOC_CHARS, ROWS_FILE, RowOptions, expand_rows, param_doc
    msgs, tools = normalize_messages(ASK), normalize_tools([DOCUMENTED])
    today = expand_rows(msgs, tools)[1]
    prefix, rows = expand_rows(msgs, tools, options=RowOptions(param_docs=True))
    assert prefix == expand_rows(msgs, tools)[0] and rows[0] == today[0]  # the prefix and the function row stay
    by = {r.param: r.suffix for r in rows[1:]}
    assert by["city"] == '# city: City and state, e.g. Berkeley, CA; examples "Oslo", "Rome"\n' + today[1].suffix
    assert by["unit"] == '# unit: default "c"\n' + today[2].suffix
    assert by["days"] == today[3].suffix  # nothing documented: today's row
    assert len(param_doc("x", {"description": "word " * 100})) == PARAM_DOC_CHARS + 1  # clipped, plus its newline
    RowOptions().save(tmp_path)
    assert not (tmp_path / ROWS_FILE).exists()  # today's rows need no file
    RowOptions(param_docs=True).save(tmp_path)
    assert RowOptions.for_adapter(tmp_path) == RowOptions(param_docs=True)
    (tmp_path / ROWS_FILE).write_text('{"param_docs": "yes"}')
    with pytest.raises(ValueError, match="row options .*rows.json.*param_docs must be true or false"):
        RowOptions.for_adapter(tmp_path)
    (tmp_path / ROWS_FILE).write_text('{"docs": true}')
    with pytest.raises(ValueError, match="cannot read the sidecar's row options"):
        RowOptions.for_adapter(tmp_path)


def test_the_runtime_and_training_write_an_adapters_rows_alike(tiny_spec, monkeypatch, tmp_path):
    """An adapter directory with rows.json: `load_wave` gives the wave its options, the runtime's wave
    decodes those rows, and training labels the same rows."""
    import dataclasses

    import oospec_agents.models as models
    from oospec_agents.sidecar.rows import RowOptions
    from oospec_agents.sidecar.runtime import WaveHost
    from oospec_agents.train.rows import training_rows
    RowOptions(param_docs=True).save(tmp_path)
    monkeypatch.setattr(models, "load_model", lambda ref, **kw: _tiny(tiny_spec))
    wave = load_wave(dataclasses.replace(tiny_spec, adapter=str(tmp_path)))
    assert wave.row_options == RowOptions(param_docs=True)
    seen = []
    inner = wave.__call__

    class Spy:
        row_options, calibration = wave.row_options, None

        def __call__(self, prefix, rows, cancel=None, choices=None):
            seen.append([r.suffix for r in rows])
            return inner(prefix, rows, cancel, choices)
    request = HintRequest(normalize_messages(ASK), normalize_tools([DOCUMENTED]), HermesFormat(), ("auto", None))
    WaveHost(Spy()).run(0, request)
    _, trained = training_rows(ASK, [DOCUMENTED], {"name": "get_weather", "arguments": {"city": "Oslo"}},
                               RowOptions(param_docs=True))
    assert seen[0] == [r.suffix for r in trained] and seen[0][1].startswith("# city: City and state")
