"""`oospec adapt` (#49): the call log read in order, repeats dropped, the newest share held out, a log too
small refused, and a short run on a tiny model that resumes and writes an adapter an engine loads."""
from __future__ import annotations

import json

import pytest
import torch

from oospec_testing import DATA, WEATHER, tiny_model
from oospec_agents.calllog import CallLog
from oospec_agents.cli import main
from oospec_agents.train.adapt import HOLDS, LACKS, adapt, dedupe, read_log, split_newest
from oospec_agents.train.data import TrainDataError

TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone.",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
CITIES = ["Paris", "Oslo", "Lima", "Cairo", "Quito", "Hanoi"]


pytestmark = pytest.mark.usefixtures("one_thread")  # training on a busy machine


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def record(i: int, text: str, call: dict, time: float | None) -> dict:
    meta = {} if time is None else {"time": time}
    return {"id": f"r{i}", "source": "call_log", "messages": ask(text), "tools": [WEATHER, TIME],
            "expected": [call], "meta": meta}


def weather(city):
    return {"name": "get_current_weather", "arguments": {"city": city}}


def write_log(path, calls) -> None:
    """A call log written by the engine's own writer: (question, call) in the order they were served."""
    log = CallLog(path)
    for text, call in calls:
        log.record(ask(text), [WEATHER, TIME], [call], method="toolspec")
    log.close()


# --------------------------------------------------------------------------- the log's records

def test_a_repeated_request_keeps_its_newest_record_at_its_place():
    a_old = record(0, "Weather in Paris?", weather("Paris"), 1.0)
    b = record(1, "Weather in Oslo?", weather("Oslo"), 2.0)
    a_new = record(2, "Weather in Paris?", weather("Paris, FR"), 3.0)  # the same request, answered anew
    other_tools = dict(record(3, "Weather in Paris?", weather("Paris"), 4.0), tools=[WEATHER])
    kept, dropped = dedupe([a_old, b, a_new, other_tools])
    assert [r["id"] for r in kept] == ["r1", "r2", "r3"] and dropped == 1


def test_the_log_is_read_in_time_order_and_its_newest_fifth_held_out(tmp_path):
    times = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 10.0, 4.0, 8.0, 6.0]  # several writers: lines not in time order
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(json.dumps(record(i, f"Weather in {i}?", weather(str(i)), t)) + "\n"
                            for i, t in enumerate(times)))
    records, order = read_log(path)
    assert order == "meta.time" and [r["meta"]["time"] for r in records] == sorted(times)
    train, held = split_newest(records, 0.2)
    assert [r["meta"]["time"] for r in held] == [9.0, 10.0] and len(train) == 8
    assert split_newest(records[:3], 0.2)[1] == records[2:3]  # at least one held out
    assert split_newest(records, 0)[1] == []
    # a record without a time: the file's order stands
    path.write_text(path.read_text() + json.dumps(record(10, "Weather?", weather("x"), None)) + "\n")
    records, order = read_log(path)
    assert order == "file" and [r["id"] for r in records] == [f"r{i}" for i in range(11)]


def test_a_log_too_small_is_refused_with_the_count_it_needs(tmp_path, capsys):
    path = tmp_path / "calls.jsonl"
    write_log(path, [(f"Weather in {c}?", weather(c)) for c in ["Paris", "Oslo", "Paris", "Lima", "Oslo"]])
    with pytest.raises(TrainDataError, match=r"3 distinct requests \(5 records, 2 repeats dropped\); adapting "
                                             r"needs at least 50 \(--min-records 50\), 47 more"):
        adapt(log=path, out=tmp_path / "out")
    rc = main(["adapt", "--log", str(path), "--out", str(tmp_path / "out"), "--min-records", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and "too small to learn from: 3 distinct requests" in err and "at least 4" in err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- a short run (tiny model)

@pytest.fixture(scope="module")
def tiny_sidecar(tmp_path_factory, smollm2_tokenizer):
    """A tiny random Llama saved as a model directory (the --base), and a LoRA adapter of it to start from."""
    from oospec_agents.train.lora import LoraConfigArgs, add_lora
    root = tmp_path_factory.mktemp("tiny")
    base = tiny_model("llama", smollm2_tokenizer)
    base.save_pretrained(root / "base")
    smollm2_tokenizer.save_pretrained(root / "base")
    add_lora(base, LoraConfigArgs(r=4, alpha=8, dropout=0.0, seed=1)).save_pretrained(str(root / "init"))
    return root / "base", root / "init"


@pytest.fixture(scope="module")
def tiny_log(tmp_path_factory):
    """Seven logged calls, one repeated: five weather calls to train on; held out, the newest two: one
    more weather call (a function the log holds) and a time call (one it lacks)."""
    path = tmp_path_factory.mktemp("log") / "calls.jsonl"
    calls = [(f"Weather in {c}?", weather(c)) for c in CITIES[:5]]
    calls += [("Weather in Paris?", weather("Paris"))]  # repeated: dropped, the newest kept in its place
    calls += [(f"Weather in {CITIES[5]}?", weather(CITIES[5])),
              ("Time in Tokyo?", {"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}})]
    write_log(path, calls)
    return path


def run_adapt(tiny_sidecar, tiny_log, out, *flags) -> dict:
    base, init = tiny_sidecar
    rc = main(["adapt", "--log", str(tiny_log), "--out", str(out), "--base", str(base), "--init-adapter", str(init),
               "--replay", str(DATA / "train.jsonl"), "--min-records", "5", "--holdout", "0.3", "--max-steps", "2",
               "--batch-size", "2", "--lr", "1e-2", "--autocast", "none", "--no-progress", *flags])
    assert rc == 0
    return json.loads((out / "metrics.json").read_text())


def test_adapt_trains_on_the_log_and_replay_and_measures_before_and_after(tiny_sidecar, tiny_log, tmp_path):
    from safetensors.torch import load_file
    m = run_adapt(tiny_sidecar, tiny_log, tmp_path / "out")
    assert m["records"] | {"dedupe": None} == {
        "read": 8, "order": "meta.time", "repeats_dropped": 1, "distinct": 7, "train": 5, "held_out": 2,
        "holdout": 0.3, "dedupe": None, "functions_in_train": 1}
    assert "newest" in m["records"]["dedupe"]
    # the paris call moved to the repeat's place: still in the training part, five weather examples
    assert m["examples"]["log"]["records"] == 5 and m["examples"]["log"]["function_rows"] == 5
    assert m["replay"]["share"] == 0.5 and m["replay"]["records"] == 2 == round(0.5 * 5)  # a seeded sample
    assert m["replay"]["of"] == 1095 and m["replay"]["files"] == [str((DATA / "train.jsonl").resolve())]
    assert m["examples"]["total"] == 7 and m["steps"] == m["total_steps"] == 2 and m["config"]["r"] == 4
    held = m["held_out"]
    for when in ("before", "after"):
        assert held[when][HOLDS]["n"] == held[when][LACKS]["n"] == 1 and held[when]["overall"]["n"] == 2
        for group in (HOLDS, LACKS, "overall"):
            fig = held[when][group]
            assert {"function_index_acc", "arg_exact_match", "call_exact", "token_agreement",
                    "tokens_right_per_call"} <= set(fig)
            assert 0 <= fig["token_agreement"] <= 1
    assert held["served_hint_tokens"]["overall"] == {"n": 0, "mean": None}  # logged with toolspec
    trained = load_file(tmp_path / "out" / "adapter_model.safetensors")
    init = load_file(tiny_sidecar[1] / "adapter_model.safetensors")
    assert trained.keys() == init.keys() and any(not torch.equal(trained[k], init[k]) for k in init)
    cfg = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert cfg["r"] == 4 and cfg["base_model_name_or_path"] == str(tiny_sidecar[0])


def test_adapt_resumes_where_it_stopped(tiny_sidecar, tiny_log, tmp_path):
    from safetensors.torch import load_file
    whole = run_adapt(tiny_sidecar, tiny_log, tmp_path / "whole", "--checkpoint-every", "0")
    stopped = run_adapt(tiny_sidecar, tiny_log, tmp_path / "out", "--checkpoint-every", "0", "--stop-after", "1")
    assert stopped["steps"] == 1 and stopped["total_steps"] == 2 and "held_out" not in stopped
    assert (tmp_path / "out-checkpoint" / "trainer_state.pt").exists()
    resumed = run_adapt(tiny_sidecar, tiny_log, tmp_path / "out", "--resume")
    assert resumed["resumed_from"] == 1 and resumed["steps"] == 2 and "after" in resumed["held_out"]
    a, b = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("whole", "out"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # the same trajectory as the run never stopped
    assert resumed["held_out"]["after"] == whole["held_out"]["after"]


def test_the_written_adapter_loads_into_an_engine(tiny_sidecar, tiny_log, tmp_path):
    from oospec_agents import Engine
    base, _ = tiny_sidecar
    run_adapt(tiny_sidecar, tiny_log, tmp_path / "out")
    engine = Engine.from_pretrained(str(base), str(base), sidecar_adapter=str(tmp_path / "out"),
                                    sidecar_placement="thread", dtype=torch.float32)
    try:
        assert engine.sidecar is not None
        gen = engine.generate(ask("Weather in Paris?"), [WEATHER, TIME], tool_choice="required",
                              max_new_tokens=8, method="oospec")
        assert gen.stats.new_tokens > 0
    finally:
        engine.close()


def test_requests_longer_than_max_len_are_named_not_silently_dropped(tiny_sidecar, tmp_path, capsys):
    """A deployment with long prompts (BFCL multi-turn, callnavi: 1.7k-6.5k tokens) would lose most of its
    log at adapt's default --max-len: adapt says how many requests it leaves out and the --max-len that
    keeps them, and metrics.json counts them."""
    log = tmp_path / "calls.jsonl"
    long = "Weather in Paris? I am asking for a friend who travels a lot. " * 40
    write_log(log, [(f"Weather in {c}?", weather(c)) for c in CITIES[:5]] + [(long, weather("Paris"))])
    m = run_adapt(tiny_sidecar, log, tmp_path / "out", "--holdout", "0", "--replay-share", "0", "--max-len", "200")
    err = capsys.readouterr().err
    counts = m["examples"]["log"]
    assert counts["too_long"] == 1 and counts["longest"] > 200 and counts["records"] == 5
    assert "1 of the log's 6 requests are longer than --max-len 200 tokens and are left out" in err
    assert f"--max-len {counts['longest']} keeps them all" in err
    kept = run_adapt(tiny_sidecar, log, tmp_path / "kept", "--holdout", "0", "--replay-share", "0",
                     "--max-len", str(counts["longest"]))
    assert kept["examples"]["log"]["too_long"] == 0 and kept["examples"]["log"]["records"] == 6
    assert "are left out" not in capsys.readouterr().err


def test_without_replay_data_it_says_what_to_pass(tiny_sidecar, tiny_log, tmp_path, capsys):
    """The tiny init adapter names no training data: adapt asks for --replay or --replay-share 0."""
    base, init = tiny_sidecar
    rc = main(["adapt", "--log", str(tiny_log), "--out", str(tmp_path / "out"), "--base", str(base),
               "--init-adapter", str(init), "--min-records", "5"])
    err = capsys.readouterr().err
    assert rc == 2 and "no replay data" in err and "--replay FILE" in err and "--replay-share 0" in err


# --------------------------------------------------------------------------- the embedded sidecar

@pytest.mark.slow
def test_adapting_the_shipped_sidecar_loads_like_the_shipped_one(tiny_log, tmp_path):
    """The real thing, one step: the shipped adapter, its training data replayed by default (the path its
    metrics.json names), and the adapter written loads as `Engine.from_pretrained("embedded", sidecar_adapter=DIR)`."""
    from oospec_agents import Engine
    out = tmp_path / "adapted"
    assert main(["adapt", "--log", str(tiny_log), "--out", str(out), "--min-records", "5", "--holdout", "0.3",
                 "--max-steps", "1", "--batch-size", "2", "--no-progress"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["replay"]["files"] == [str((DATA / "train.jsonl").resolve())]
    # two records drawn: each replayed, or left out as longer than --max-len in the shipped adapter's
    # documented rows (#56), which the adapted adapter keeps
    assert m["replay"]["records"] + m["examples"]["replay"]["too_long"] == 2
    from oospec_agents.models import EMBEDDED_SIDECAR_ADAPTER
    from oospec_agents.sidecar.rows import RowOptions
    assert RowOptions.for_adapter(out) == RowOptions.for_adapter(EMBEDDED_SIDECAR_ADAPTER) == RowOptions(param_docs=True)
    assert m["config"]["r"] == 16 and m["max_null_rows"] == 1  # the shipped adapter's shape and recipe
    assert m["held_out"]["after"]["overall"]["n"] == 2
    # float32 pinned, and the mechanics asserted, not the 135M target's words: which name it writes
    # here differs between float32 and bf16 (get_weather against get_current_weather)
    engine = Engine.from_pretrained("embedded", sidecar_adapter=str(out), sidecar_placement="thread",
                                    dtype=torch.float32)
    try:
        assert engine.sidecar.name.endswith("+adapted")
        messages = ask("What is the weather in Paris?")
        gen = engine.generate(messages, [WEATHER, TIME], max_new_tokens=32, method="oospec")
        ar = engine.generate(messages, [WEATHER, TIME], max_new_tokens=32, method="ar")
        assert gen.text == ar.text and len(gen.tool_calls) == 1, gen.text  # lossless, and a call parsed
    finally:
        engine.close()
