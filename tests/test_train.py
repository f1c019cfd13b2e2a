"""Training: row expansion, the LoRA smoke test (tiny model), bad input, and the embedded pair."""
from __future__ import annotations

import json

import pytest
import torch

from oospec_testing import DATA, WEATHER, tiny_model
from oospec_agents.errors import ModelLoadError
from oospec_agents.sidecar.rows import Row
from oospec_agents.train.data import TrainDataError, load_records
from oospec_agents.train.lora import LoraConfigArgs, example_loss, train_lora
from oospec_agents.train.rows import pack, packed_loss, training_rows

TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}, "fmt": {"type": "string"}}}}}
# The value is not in the request, so any row that saw it would have been shown another row's answer.
TRACE = {"messages": [{"role": "user", "content": "How warm is it in the French capital? Use celsius."}],
         "tools": [WEATHER, TIME],
         "expected": [{"name": "get_current_weather", "arguments": {"city": "Paris"}}]}
OPEN = '<tool_call>\n{"name":'



@pytest.fixture(autouse=True)
def one_thread():
    """Training on a busy 2-core machine: one thread avoids OpenMP spin contention (10x here)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --------------------------------------------------------------------------- row expansion

def test_rows_are_exactly_as_specified():
    prefix, rows = training_rows(TRACE["messages"], TRACE["tools"], TRACE["expected"][0])
    slot = lambda tool, p: OPEN + f' "{tool}", "arguments": {{"{p}":'
    assert rows == [
        Row("function", None, None, OPEN, ' "get_current_weather"'),
        Row("slot", "get_current_weather", "city", slot("get_current_weather", "city"), ' "Paris"', required=True),
        Row("slot", "get_current_weather", "unit", slot("get_current_weather", "unit"), " null"),
        Row("slot", "get_time", "tz", slot("get_time", "tz"), " null"),
        Row("slot", "get_time", "fmt", slot("get_time", "fmt"), " null"),
    ]
    assert prefix.startswith("<|im_start|>system\n") and prefix.endswith("<|im_start|>assistant\n")
    assert "French capital" in prefix


def test_uncalled_tools_get_null_and_the_called_tools_missing_params_too():
    _, rows = training_rows(TRACE["messages"], TRACE["tools"], TRACE["expected"][0])
    assert [r.target for r in rows if r.tool == "get_time"] == [" null", " null"]
    assert {r.param: r.target for r in rows if r.tool == "get_current_weather"} == {"city": ' "Paris"',
                                                                                   "unit": " null"}


def test_a_no_call_record_teaches_the_function_row_to_decline(smollm2_tokenizer):
    """#20: a "no call" record (no offered tool fits) is one function row labelled null, what the wave's
    function row answers under tool_choice="auto" to decline; a record with no call and no such mark
    is skipped, as before."""
    from oospec_agents.train.sidecar_train import build_sidecar_examples
    prefix, rows = training_rows(TRACE["messages"], TRACE["tools"], None)
    assert rows == [Row("function", None, None, OPEN, " null")]
    assert prefix == training_rows(TRACE["messages"], TRACE["tools"], TRACE["expected"][0])[0]
    no_call = dict(TRACE, expected=[], meta={"no_call": True})
    unmarked = dict(TRACE, expected=[])
    examples, counts = build_sidecar_examples(smollm2_tokenizer, [TRACE, no_call, unmarked])
    assert counts["records"] == 2 and counts["no_call"] == 1 and counts["skipped"] == 1
    assert examples[1].kinds == ["function"]
    start, n_suffix, n_target = examples[1].rows[0]
    label = examples[1].ids[start + n_suffix:start + n_suffix + n_target]
    assert label == smollm2_tokenizer.encode(" null", add_special_tokens=False) + [smollm2_tokenizer.eos_token_id]


def test_the_no_call_share_is_capped_by_a_seeded_sample(smollm2_tokenizer):
    """#20: `max_no_call_share` keeps the "no call" examples at most that share of all examples (run 20h
    declined BFCL calls with them at a third); the calls all stay, and the dropped ones are counted."""
    from oospec_agents.train.sidecar_train import build_sidecar_examples
    no_calls = [dict(TRACE, id=f"n{i}", expected=[], meta={"no_call": True}) for i in range(10)]
    traces = [dict(TRACE, id=f"c{i}") for i in range(9)] + no_calls
    examples, counts = build_sidecar_examples(smollm2_tokenizer, traces, max_no_call_share=0.25)
    assert counts["records"] == 12 and counts["no_call"] == 3 and counts["no_call_dropped"] == 7
    assert sum(ex.kinds == ["function"] for ex in examples) == 3
    again, _ = build_sidecar_examples(smollm2_tokenizer, traces, max_no_call_share=0.25)
    assert [ex.ids for ex in again] == [ex.ids for ex in examples]
    _, uncapped = build_sidecar_examples(smollm2_tokenizer, traces)
    assert uncapped["no_call"] == 10 and uncapped["no_call_dropped"] == 0
    _, none = build_sidecar_examples(smollm2_tokenizer, traces, max_no_call_share=0)
    assert none["no_call"] == 0 and none["records"] == 9
    with pytest.raises(ValueError, match="max_no_call_share"):
        build_sidecar_examples(smollm2_tokenizer, traces, max_no_call_share=1.0)


def test_no_row_sees_another_rows_answer(smollm2_tokenizer):
    prefix, rows = training_rows(TRACE["messages"], TRACE["tools"], TRACE["expected"][0])
    for row in rows:
        seen = prefix + row.suffix
        assert row.target.strip() not in seen or row.target == " null"
        assert "Paris" not in seen                         # the only non-null value, in no row's input
        assert '"name": "get_current_weather", "arguments"' not in prefix  # no call in the shared prefix
    assert rows[0].suffix == OPEN                          # the function row is not told the tool
    ex = pack(smollm2_tokenizer, prefix, rows)
    allowed = ex.allowed()
    for a, (sa, na, ta) in enumerate(ex.rows):
        for b, (sb, nb, tb) in enumerate(ex.rows):
            if a != b:  # no token of one row attends to any token (hence any answer) of another
                assert not allowed[sa:sa + na + ta, sb:sb + nb + tb].any()
        assert allowed[sa:sa + na + ta, :ex.prefix_len].all()


def test_packed_rows_equal_rows_run_one_by_one(smollm2_tokenizer):
    model = tiny_model("llama", smollm2_tokenizer)
    prefix, rows = training_rows(TRACE["messages"], TRACE["tools"], TRACE["expected"][0])
    p = smollm2_tokenizer.encode(prefix, add_special_tokens=False)
    one_by_one = []
    for r in rows:
        s = smollm2_tokenizer.encode(r.suffix, add_special_tokens=False)
        t = smollm2_tokenizer.encode(r.target, add_special_tokens=False) + [smollm2_tokenizer.eos_token_id]
        one_by_one.append(example_loss(model, p + s + t, len(t)))
    with torch.no_grad():
        assert torch.allclose(packed_loss(model, pack(smollm2_tokenizer, prefix, rows)),
                              torch.stack(one_by_one).mean(), atol=1e-5)


def test_null_rows_are_subsampled_deterministically(smollm2_tokenizer):
    import random
    prefix, rows = training_rows(TRACE["messages"], TRACE["tools"], TRACE["expected"][0])
    a = pack(smollm2_tokenizer, prefix, rows, max_null_rows=1, rng=random.Random(3))
    b = pack(smollm2_tokenizer, prefix, rows, max_null_rows=1, rng=random.Random(3))
    assert a.ids == b.ids and len(a.rows) == 4  # function + the called tool's 2 slots + 1 of 2 nulls


def test_teacher_traces_keep_only_valid_calls(tiny_engine):
    from oospec_agents import Generation
    from oospec_agents.train.traces import build_traces
    recs = [dict(TRACE, id=str(i)) for i in range(4)]
    misfit = {"id": "m", "name": "get_time", "arguments": {"tz": 1}}
    scripted = iter([
        Generation("", [], [{"id": "c", "name": "get_time", "arguments": {"tz": "UTC"}}], [], {}),
        Generation("", [], [], [{"name": "get_time", "arguments": "{", "error": "bad"}], {}),
        Generation("plain text", [], [], [], {}),
        # a call whose arguments misfit the schema is a tool call (issue 48), and no trace to learn from
        Generation("", [], [misfit], [], {}, tool_call_problems=[{"id": "m", "name": "get_time", "error": "bad"}]),
    ])
    tiny_engine.generate = lambda *a, **k: next(scripted)
    try:
        traces, stats = build_traces(recs, tiny_engine, progress=False)
    finally:
        del tiny_engine.generate
    assert stats["kept"] == 1 and stats["invalid"] == 2 and stats["no_call"] == 1
    assert traces[0]["expected"] == [{"name": "get_time", "arguments": {"tz": "UTC"}}]
    assert build_traces(recs)[0] == [dict(r, trace="ground_truth") for r in recs]


def test_evaluate_target_counts_a_call_with_a_schema_problem_as_not_exact():
    """The eval's figures keep their meaning under issue 48's classes: a call that misfits its schema is
    a tool call now, but never an exact (or lenient) one, even with the expected arguments."""
    from types import SimpleNamespace

    from oospec_agents import Generation
    from oospec_agents.train.target import evaluate_target
    call = {"id": "c_0", "name": "get_current_weather", "arguments": {"city": "Paris"}}
    rec = dict(TRACE, id="0", source="bfcl_simple")
    problem = {"id": "c_0", "name": "get_current_weather", "error": "made up for the test"}
    for problems, exact in (([], 1.0), ([problem], 0.0)):
        gen = Generation("", [], [call], [], {}, tool_call_problems=problems)
        out = evaluate_target(SimpleNamespace(generate=lambda *a, **k: gen), [rec], progress=False)
        assert out["overall"] == {"n": 1, "right_tool": 1.0, "exact_args": exact, "lenient_args": exact}


# --------------------------------------------------------------------------- bad input

def test_bad_input_gets_a_clear_error(tmp_path):
    with pytest.raises(TrainDataError, match="does not exist"):
        load_records(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}], "tools": [], "expected": []}\n{oops\n')
    with pytest.raises(TrainDataError, match=r"bad.jsonl:2: malformed record"):
        load_records(bad)
    bad.write_text('{"messages": "hi", "tools": [], "expected": []}\n')
    with pytest.raises(TrainDataError, match="malformed record, 'messages'"):
        load_records(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(TrainDataError, match="empty training set"):
        load_records(empty)
    with pytest.raises(TrainDataError, match="empty"):
        train_lora(None, [], tmp_path / "out", LoraConfigArgs())
    from oospec_agents.train.run import load_base
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_base(str(tmp_path / "no-such-model"))


def test_several_training_files_globs_and_held_out_sources(tmp_path):
    from oospec_agents.train.data import expand_paths, load_many, source_counts

    def write(name, sources):
        (tmp_path / name).write_text("".join(json.dumps(
            {"id": f"{name}-{i}", "source": s, "messages": [{"role": "user", "content": "hi"}], "tools": [],
             "expected": [] if s == "none" else [{"name": "f", "arguments": {}}]}) + "\n"
            for i, s in enumerate(sources)))
    write("a.jsonl", ["x", "x", "none"])
    write("b-1.jsonl", ["y", "tooltalk"])
    write("b-2.jsonl", ["nestful"])
    assert expand_paths([tmp_path / "a.jsonl", str(tmp_path / "b-*.jsonl")]) == \
        [str(tmp_path / n) for n in ("a.jsonl", "b-1.jsonl", "b-2.jsonl")]
    records = load_many([tmp_path / "a.jsonl", str(tmp_path / "b-*.jsonl")], exclude_sources=["tooltalk", "nestful"])
    assert source_counts(records) == {"none": {"records": 1, "no_call": 1}, "x": {"records": 2, "no_call": 0},
                                      "y": {"records": 1, "no_call": 0}}
    assert [r["source"] for r in load_many(str(tmp_path / "*.jsonl"), sources=["nestful", "y"])] == ["y", "nestful"]
    with pytest.raises(TrainDataError, match="no data file matches"):
        load_many(str(tmp_path / "c-*.jsonl"))
    with pytest.raises(TrainDataError, match=r"no record of source\(s\) \['nope'\]"):
        load_many(tmp_path / "a.jsonl", sources=["nope"])
    with pytest.raises(TrainDataError, match="no records left"):
        load_many(tmp_path / "b-2.jsonl", exclude_sources=["nestful"])


def test_evaluation_prints_a_per_source_table():
    from oospec_agents.train.evaluate import source_table
    res = {"overall": {"n": 3, "function_index_acc": 0.6667, "arg_exact_match": 0.5},
           "by_source": {"a": {"n": 1, "function_index_acc": 1.0, "arg_exact_match": 0.5},
                         "b": {"n": 2, "function_index_acc": 0.5, "arg_exact_match": 0.5}}}
    assert source_table(res).splitlines() == [
        "| source | n | function_index_acc | arg_exact_match |", "|---|---|---|---|",
        "| a | 1 | 100.0% | 50.0% |", "| b | 2 | 50.0% | 50.0% |", "| **all** | 3 | 66.7% | 50.0% |"]


def _alarm_tools():
    """Tools a random model can finish under strict: bounded integers and enums end, strings would not."""
    def tool(name, properties, required):
        return {"type": "function", "function": {"name": name, "description": "", "parameters": {
            "type": "object", "properties": properties, "required": required}}}
    return [tool("set_alarm", {"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                               "day": {"type": "string", "enum": ["mon", "tue"]}}, ["hour", "day"]),
            tool("dim", {"level": {"type": "integer", "minimum": 0, "maximum": 10}}, ["level"])]


def test_written_calls_parse_and_validate_against_the_offered_schemas():
    from types import SimpleNamespace

    from oospec_agents.formats import HermesFormat
    from oospec_agents.train.evaluate import written_calls
    fmt, tools = HermesFormat(), _alarm_tools()

    def check(text, finish="stop"):
        return written_calls(fmt, SimpleNamespace(text=text, finish_reason=finish), tools)
    ok, bad = fmt.render_call("dim", {"level": 3}), fmt.render_call("dim", {"level": 11})  # 11 > maximum
    assert check(ok) == {"calls": 1, "parsed": 1, "valid": 1, "cut_off": 0}
    assert check("Sure. " + ok + "\n" + bad) == {"calls": 2, "parsed": 2, "valid": 1, "cut_off": 0}
    assert check(fmt.render_call("nope", {})) == {"calls": 1, "parsed": 1, "valid": 0, "cut_off": 0}  # not offered
    assert check('<tool_call>\n{"name": "dim", "arguments": {level: 3}}\n</tool_call>')["parsed"] == 0
    assert check(ok + "\n" + ok[:-8], "length") == {"calls": 2, "parsed": 1, "valid": 1, "cut_off": 1}
    assert check("no call at all") == {"calls": 0, "parsed": 0, "valid": 0, "cut_off": 0}


def test_evaluate_target_strict_on_a_random_model(tiny_engine, tmp_path, monkeypatch, capsys):
    """`evaluate target --strict` on 2 records (a third source filtered out): unconstrained, the random
    model's forced call never parses; strict, every call it writes validates, but for one that
    max_new_tokens cut off (it may call on and on)."""
    from oospec_agents.train import evaluate
    monkeypatch.setattr(evaluate, "target_engine", lambda adapter=None: tiny_engine)
    tools, dev = _alarm_tools(), tmp_path / "dev.jsonl"
    asks = [("bfcl_simple", "Wake me at 7 on Monday.", "set_alarm", {"hour": 7, "day": "mon"}),
            ("apibank_l1", "Dim the lights to 3.", "dim", {"level": 3}),
            ("bfcl_multiple", "Dim the lights to 2.", "dim", {"level": 2})]
    dev.write_text("".join(json.dumps({"id": f"r{i}", "source": src, "messages": [{"role": "user", "content": ask}],
                                       "tools": tools, "expected": [{"name": name, "arguments": args}], "meta": {}})
                           + "\n" for i, (src, ask, name, args) in enumerate(asks)))

    def run(*flags):
        out = tmp_path / "out.json"
        assert evaluate.main(["target", "--dev", str(dev), "--out", str(out), *flags]) == 0
        return json.loads(out.read_text()), capsys.readouterr().out

    free, _ = run("--tool-choice", "required")
    strict, printed = run("--tool-choice", "required", "--strict")
    for res, is_strict in ((free, False), (strict, True)):
        assert set(res["by_source"]) == {"bfcl_simple", "bfcl_multiple"} and res["overall"]["n"] == 2
        assert res["strict"] is is_strict and res["tool_choice"] == "required"
    assert free["overall"]["calls"] == 2 and free["overall"]["parse"] == free["overall"]["valid"] == 0
    o = strict["overall"]
    assert o["parse"] == o["valid"] > 0 and round(o["parse"] * o["calls"]) == o["calls"] - o["cut_off"], o
    assert o["cut_off"] <= 2 and (o["cut_off"] or o["parse"] == 1.0)
    assert "| source | n | right_tool | exact_args | lenient_args | calls | parse | valid | cut_off |" in printed
    # no call written under auto: no share to give ("-" in the table); --sources given twice
    auto, printed = run("--sources", "apibank_l1", "--sources", "bfcl_simple", "--limit", "1")
    assert set(auto["by_source"]) == {"apibank_l1", "bfcl_simple"} and auto["overall"]["calls"] == 0
    assert auto["overall"]["parse"] is None and "| **all** | 2 |" in printed and " - |" in printed
    with pytest.raises(SystemExit):
        evaluate.main(["target", "--dev", str(dev), "--sources", "bfcl_simple,nope"])
    assert "no record of source(s) ['nope']" in capsys.readouterr().err


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    from oospec_agents.cli import main
    rc = main(["train-target", "--train", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


# --------------------------------------------------------------------------- training smoke test (tiny model)

def _target_examples(tokenizer, model, n=2):
    from oospec_agents import Engine
    from oospec_agents.train.target import build_target_examples
    recs = [r for r in load_records(DATA / "train.jsonl", limit=40) if r["source"] == "bfcl_simple"][:n] or \
        load_records(DATA / "train.jsonl", limit=n)
    examples, _ = build_target_examples(Engine(model, tokenizer), recs, max_len=512, answer_frac=0.0,
                                        no_tool_frac=0)
    return examples


def _base(which, tok):
    if which == "tiny":
        return tiny_model("llama", tok)
    from oospec_agents import models
    return models.load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32)[0]


@pytest.mark.parametrize("which", ["tiny", pytest.param("embedded", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["target", "sidecar"])
def test_training_smoke_loss_goes_down_and_adapter_reloads(kind, which, tmp_path, smollm2_tokenizer):
    """A few steps on a handful of records. The tiny random model checks the mechanics; the
    embedded model (slow) checks that the loss really drops."""
    from peft import PeftModel
    from oospec_agents.train.sidecar_train import build_sidecar_examples
    tok = smollm2_tokenizer
    model = _base(which, tok)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    if kind == "target":
        examples = _target_examples(tok, model)
    else:
        examples, counts = build_sidecar_examples(tok, load_records(DATA / "train.jsonl", limit=2), max_len=2048)
        assert counts["function_rows"] == len(examples) and counts["slot_rows"] > 0
    # The embedded model's loss has more than halved by the third step (target 0.36 -> 0.05, sidecar
    # 6.4 -> 2.3 here); a step costs it seconds on CI's CPU, so it takes three where the tiny model takes six.
    steps = 6 if which == "tiny" else 3
    cfg = LoraConfigArgs(r=8, alpha=16, dropout=0.0, lr=1e-2 if which == "tiny" else 1e-3, epochs=steps,
                         batch_size=len(examples), seed=0, warmup=0.0, log_every=1, checkpoint_every=0,
                         autocast=None)
    peft_model, result = train_lora(model, examples, tmp_path / "adapter", cfg, progress=False)
    losses = [loss for _, loss in result.losses]
    assert result.steps == steps == len(losses) and losses[-1] < losses[0], losses
    if which == "embedded":
        assert losses[-1] < 0.5 * losses[0], losses
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    x = torch.tensor([examples[0][0] if kind == "target" else examples[0].ids])
    with torch.no_grad():
        before = peft_model(input_ids=x).logits
        fresh = _base(which, tok)
        fresh.load_state_dict(base_state)
        reloaded = PeftModel.from_pretrained(fresh, str(tmp_path / "adapter")).eval()
        assert torch.equal(before, reloaded(input_ids=x).logits)
        merged = reloaded.merge_and_unload()  # how Engine.from_pretrained loads it
        assert torch.allclose(before, merged(input_ids=x).logits, atol=1e-3)


def test_training_is_deterministic_and_resumes_exactly(tmp_path, smollm2_tokenizer):
    from safetensors.torch import load_file
    tok = smollm2_tokenizer
    examples = _target_examples(tok, tiny_model("llama", tok))
    cfg = dict(r=4, alpha=8, dropout=0.1, lr=5e-3, epochs=3, batch_size=1, seed=7, log_every=1, autocast=None)
    train_lora(tiny_model("llama", tok), examples, tmp_path / "a", LoraConfigArgs(**cfg, checkpoint_every=0),
               progress=False)
    # The same run, stopped at a checkpoint and resumed, lands on the same weights.
    _, res = train_lora(tiny_model("llama", tok), examples, tmp_path / "b", LoraConfigArgs(**cfg, checkpoint_every=0),
                        progress=False, stop_after=3)
    assert res.steps == 3 and (tmp_path / "b-checkpoint" / "trainer_state.pt").exists()
    _, res = train_lora(tiny_model("llama", tok), examples, tmp_path / "b", LoraConfigArgs(**cfg, checkpoint_every=0),
                        resume=True, progress=False)
    assert res.resumed_from == 3 and res.steps == 6
    train_lora(tiny_model("llama", tok), examples, tmp_path / "c", LoraConfigArgs(**cfg, checkpoint_every=0),
               progress=False)
    wc = load_file(tmp_path / "c" / "adapter_model.safetensors")
    wa = load_file(tmp_path / "a" / "adapter_model.safetensors")
    assert all(torch.equal(wa[k], wc[k]) for k in wa)  # the same seed, the same weights
    wb = load_file(tmp_path / "b" / "adapter_model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# --------------------------------------------------------------------------- the embedded pair (trained adapters)

@pytest.fixture(scope="module")
def embedded_pair():
    """Engine.from_pretrained("embedded") in float32: target + tool-calling adapter, sidecar + its adapter.
    The pay-back rule is off: these tests are about the trained sidecar's hint, which must be asked for
    whatever this CPU's costs say (tests/test_payback.py tests the rule)."""
    from oospec_agents import Engine, models
    assert models.EMBEDDED_TARGET_ADAPTER.exists(), "the target adapter is not committed"
    assert models.EMBEDDED_SIDECAR_ADAPTER.exists(), "the sidecar adapter is not committed"
    return Engine.from_pretrained("embedded", dtype=torch.float32, wave_payback=None)


WEATHER_Q = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def test_thinking_examples_reason_in_a_block_then_answer(smollm2_tokenizer):
    """`train-target --thinking`: SmolLM2's own prompt (the template adds only Qwen3's `enable_thinking`
    switch), the answer preceded by a sentence of reasoning naming the call's function and short values;
    a seeded share rendered with thinking off (the empty block in the prompt, the answer at once)."""
    import copy

    from oospec_agents import Engine, models
    from oospec_agents.train.target import build_target_examples, call_thought
    recs = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()[:30]]
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = models.THINKING_CHAT_TEMPLATE.read_text()
    engine = Engine(tiny_model("llama", tok), tok)
    assert engine.reasoning is not None
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        smollm2_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    examples, counts = build_target_examples(engine, recs, thinking=True, answer_frac=0.0, no_tool_frac=0.0)
    assert counts["call"] == len(examples) == 30
    texts = [(tok.decode(ids[:-n]), tok.decode(ids[-n:])) for ids, n in examples]
    on = [(p, a) for p, a in texts if a.startswith("<think>\n")]
    off = [(p, a) for p, a in texts if p.endswith("<think>\n\n</think>\n\n")]
    assert len(on) + len(off) == 30 and 2 <= len(off) <= 12  # no_think_frac 0.2, seeded
    for prompt, answer in on:
        thought, after = answer[len("<think>\n"):].split("\n</think>\n\n", 1)
        assert after.startswith("<tool_call>\n") and prompt.endswith("<|im_start|>assistant\n")
        name = json.loads(after.split("\n")[1])["name"]
        assert name in thought
    for _, answer in off:
        assert answer.startswith("<tool_call>")
    rng = __import__("random").Random(0)
    assert "city \"Paris\"" in call_thought([{"name": "get_weather", "arguments": {"city": "Paris"}}], rng)
    two = call_thought([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}], rng)
    assert "a and b" in two


@pytest.mark.slow
def test_embedded_adapters_are_small_and_have_metrics():
    from oospec_agents import models
    for d in (models.EMBEDDED_TARGET_ADAPTER, models.EMBEDDED_SIDECAR_ADAPTER, models.EMBEDDED_THINKING_ADAPTER):
        files = list(d.iterdir())
        assert all(f.stat().st_size < 20 * 2**20 for f in files)
        assert {"adapter_config.json", "adapter_model.safetensors", "metrics.json"} <= {f.name for f in files}
        assert "config" in json.loads((d / "metrics.json").read_text())


@pytest.mark.slow
def test_the_embedded_thinking_target_reasons_then_calls_lossless(tmp_path):
    """`Engine.from_pretrained("embedded-thinking")` (float32, pinned) writes a `<think>` block first; every
    method gives greedy `generate`'s tokens under `auto`, and under `required` (the call forced after the
    block) the masked reference's; `enable_thinking=False` answers without a block."""
    from oospec_agents import Engine
    from oospec_agents.formats import Reasoning
    from oospec_testing import greedy
    engine = Engine.from_pretrained("embedded-thinking", sidecar=False, dtype=torch.float32)
    assert engine.reasoning == Reasoning() and engine.model_name.startswith("embedded-thinking")
    hint = engine.fmt.render_calls([{"name": "get_current_weather", "arguments": {"city": "Paris"}}])
    for choice in ("auto", "required"):
        ids = engine.prompt_ids(WEATHER_Q, [WEATHER], tool_choice=choice)
        if choice == "auto":
            reference = greedy(engine, ids, 96)
        else:
            masked = engine.logits_processor(WEATHER_Q, [WEATHER], tool_choice=choice, strict=False)
            out = engine.target.generate(torch.tensor([ids]), logits_processor=[masked], do_sample=False,
                                         max_new_tokens=96, pad_token_id=engine.tokenizer.eos_token_id)
            reference = out[0, len(ids):].tolist()
        for method in ("ar", "toolspec", "oospec"):
            gen = engine.generate(WEATHER_Q, [WEATHER], tool_choice=choice, max_new_tokens=96, method=method,
                                  hint=hint if method == "oospec" else None)
            assert gen.token_ids == reference, (choice, method)
            assert gen.reasoning and gen.text.startswith("<think>\n"), gen.text
            assert gen.stats.reasoning_forwards < gen.stats.target_forwards
            if choice == "required":
                assert [c["name"] for c in gen.tool_calls + gen.invalid_tool_calls] == ["get_current_weather"]
    off = engine.generate(WEATHER_Q, [WEATHER], max_new_tokens=48, method="toolspec",
                          chat_template_kwargs={"enable_thinking": False})
    assert off.reasoning is None and "<think>" not in off.text, off.text


@pytest.mark.slow
def test_embedded_target_calls_the_weather_tool_on_auto(embedded_pair):
    gen = embedded_pair.generate(WEATHER_Q, [WEATHER, TIME], tool_choice="auto", max_new_tokens=64, method="toolspec")
    assert [c["name"] for c in gen.tool_calls] == ["get_current_weather"], gen.text
    assert gen.tool_calls[0]["arguments"].get("city") == "Paris"
    assert gen.finish_reason == "tool_calls"


@pytest.mark.slow
def test_embedded_target_answers_in_text_after_a_tool_result(embedded_pair):
    msgs = WEATHER_Q + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_current_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "unit": "celsius", "condition": "sunny"}'}]
    gen = embedded_pair.generate(msgs, [WEATHER, TIME], tool_choice="auto", max_new_tokens=48, method="toolspec")
    assert not gen.tool_calls and not gen.invalid_tool_calls, gen.text
    assert gen.content and gen.finish_reason == "stop"
    assert "18" in gen.content or "sunny" in gen.content  # it reads the result


@pytest.mark.slow
def test_oospec_stays_lossless_with_the_trained_sidecar(embedded_pair):
    from oospec_testing import InTime, greedy
    if embedded_pair.sidecar is None:
        pytest.fail("the embedded sidecar did not load")
    msgs = [{"role": "user", "content": "What's the weather in Tokyo in fahrenheit?"}]
    ar = embedded_pair.generate(msgs, [WEATHER, TIME], tool_choice="auto", max_new_tokens=48, method="ar")
    # The target's prompt is cached now, so its prefill is one token and its reply may be over before
    # the sidecar's (cold) wave posts: lossless all the same, with or without the hint.
    warm = embedded_pair.generate(msgs, [WEATHER, TIME], tool_choice="auto", max_new_tokens=48, method="oospec")
    assert warm.stats.cached_prompt_tokens > 0 and warm.token_ids == ar.token_ids
    embedded_pair.clear_prefix_cache()  # cold, and the hint posted before the first round (InTime): whether
    in_time = embedded_pair.with_parts(sidecar=InTime(embedded_pair.sidecar))  # it lands in time must not depend
    oo = in_time.generate(msgs, [WEATHER, TIME], tool_choice="auto", max_new_tokens=48,  # on how busy CI's two
                          method="oospec")                                              # cores are
    assert oo.stats.cached_prompt_tokens == 0
    assert oo.token_ids == ar.token_ids
    assert oo.token_ids == greedy(embedded_pair, embedded_pair.prompt_ids(msgs, [WEATHER, TIME]), 48)
    assert oo.stats["sidecar_error"] is None and oo.stats["hint_ready_s"] is not None


def test_weigh_rows_makes_every_row_count_alike(smollm2_tokenizer):
    """#20: by default each packed example weighs alike, so a "no call" example's one null function row
    weighs as much as every row of a call example together (run 20i's function row learnt to decline);
    `weigh_rows` weighs an example by its rows, making the batch loss the mean over all its rows."""
    from oospec_agents.train.lora import example_weight
    from oospec_agents.train.sidecar_train import build_sidecar_examples
    no_call = dict(TRACE, expected=[], meta={"no_call": True})
    (call, decline), _ = build_sidecar_examples(smollm2_tokenizer, [TRACE, no_call])
    assert len(decline.rows) == 1 and len(call.rows) > 1
    assert example_weight(call, LoraConfigArgs()) == example_weight(decline, LoraConfigArgs()) == 1.0
    rows = LoraConfigArgs(weigh_rows=True)
    assert example_weight(call, rows) == len(call.rows) and example_weight(decline, rows) == 1.0
    assert example_weight(([1, 2, 3], 1), rows) == 1.0  # target examples (ids, n_target) are not packed
    model = tiny_model("llama", smollm2_tokenizer)
    per_row = []
    with torch.no_grad():
        for ex in (call, decline):
            for k in range(len(ex.rows)):  # each row alone: the same prefix, one row packed
                one = pack_rows(ex, k)
                per_row.append(float(example_loss(model, one)))
        weighted = sum(float(example_loss(model, ex)) * example_weight(ex, rows) for ex in (call, decline)) / \
            sum(example_weight(ex, rows) for ex in (call, decline))
    assert weighted == pytest.approx(sum(per_row) / len(per_row), rel=1e-4)


def pack_rows(ex, k):
    """The packed example `ex` with its k-th row alone after the prefix."""
    from oospec_agents.train.rows import PackedExample
    start, ns, nt = ex.rows[k]
    return PackedExample(ex.ids[:ex.prefix_len] + ex.ids[start:start + ns + nt], ex.prefix_len,
                         [(ex.prefix_len, ns, nt)], [ex.kinds[k]])
