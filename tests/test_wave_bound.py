"""The wave's bound on large tool sets (#20): above `MAX_ROWS` rows the function row decides first and
only the chosen tool's rows follow, so a 70-100-tool request decodes a few rows instead of one per
parameter of every tool. Small tool sets decode exactly as before."""
from __future__ import annotations

import time

import pytest
import torch

from oospec_testing import load_records, tiny_model
from oospec_agents.chat import normalize_messages
from oospec_agents.formats import HermesFormat
from oospec_agents.sidecar import HintRequest
from oospec_agents.sidecar.join import join
from oospec_agents.sidecar.rows import expand_rows, parse_value
from oospec_agents.sidecar.wave import MAX_ROWS, Wave
from oospec_agents.sidecar.runtime import wave_rows
from oospec_agents.tools import check_calls, normalize_tools

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"type": "string"}, "hours": {"type": "array", "items": {"type": "integer"}}},
    "required": ["tz"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
UNBOUNDED = 10 ** 9


def _request(messages=ASK, tools=(WEATHER, TIME), tool_choice=("required", None)):
    return HintRequest(normalize_messages(messages), normalize_tools(list(tools)), HermesFormat(), tool_choice)


@pytest.fixture(scope="module")
def tiny_sidecar(smollm2_tokenizer):
    return tiny_model("llama", smollm2_tokenizer, seed=5), smollm2_tokenizer


# ---------------------------------------------------------------- small tool sets: as before

def test_every_dev_tool_set_fits_under_the_bound_so_its_wave_is_unchanged():
    for rec in load_records("dev"):
        rows, _, _ = wave_rows(_request(rec["messages"], rec["tools"]))
        assert len(rows) <= MAX_ROWS, rec["id"]


def test_a_small_tool_set_decodes_the_same_rows_as_an_unbounded_wave(tiny_sidecar):
    model, tok = tiny_sidecar
    rows, prefix, choices = wave_rows(_request())
    bounded, unbounded = Wave(model, tok, max_row_tokens=6), Wave(model, tok, max_row_tokens=6, max_rows=UNBOUNDED)
    assert not bounded.two_phases(rows, choices)
    one, other = bounded(prefix, rows, None, choices), unbounded(prefix, rows, None, choices)
    assert one.texts == other.texts
    assert one.profile["rows"] == other.profile["rows"] == one.profile["rows_offered"] == len(rows) == 5
    assert one.profile["steps"] == other.profile["steps"]
    assert "phases" not in one.profile


# ---------------------------------------------------------------- above the bound: two phases

@pytest.mark.parametrize("top_tools", [0, 1, 2])
def test_above_the_bound_the_chosen_tools_rows_answer_as_in_the_unbounded_wave(tiny_sidecar, top_tools):
    """max_rows=3 puts the 5-row request above the bound: the function row chooses as it does in one
    batch, its tool's rows give the same text, and every other row is left empty."""
    model, tok = tiny_sidecar
    rows, prefix, choices = wave_rows(_request())
    full = Wave(model, tok, max_row_tokens=6, max_rows=UNBOUNDED)(prefix, rows, None, choices).texts
    wave = Wave(model, tok, max_row_tokens=6, max_rows=3, top_tools=top_tools)
    assert wave.two_phases(rows, choices)
    result = wave(prefix, rows, None, choices)
    texts = result.texts
    name = parse_value(texts[0])
    assert texts[0] == full[0] and name in ("get_weather", "get_time")
    for row, text, alone in zip(rows[1:], texts[1:], full[1:]):
        if row.tool == name:
            assert text == alone, row
        elif not top_tools:
            assert text == "", row
    prof = result.profile
    assert prof["rows_offered"] == 5 and prof["max_rows"] == 3 and prof["phases"] in (1, 2)
    assert prof["rows"] <= 3 + 2  # the first phase: at most max_rows rows; the second: max_rows - 1
    if not top_tools:
        assert prof["phases"] == 2 and prof["rows"] == 1 + 2  # the function row, then its tool's 2 rows
    assert join(rows, texts, _request().tools, ("required", None))["name"] == name


def test_the_bound_is_checked():
    with pytest.raises(ValueError, match="max_rows"):
        Wave(None, None, max_rows=1)
    with pytest.raises(ValueError, match="top_tools"):
        Wave(None, None, top_tools=-1)


def test_the_bound_is_an_option_of_every_placement(tmp_path, smollm2_tokenizer):
    """`sidecar_max_rows` (load_sidecar, Engine.from_pretrained) reaches the Wave, in a thread here and
    through the WorkerSpec a process or a Ray actor loads from; the default is MAX_ROWS."""
    from oospec_agents.sidecar.runtime import WorkerSpec
    from oospec_agents.sidecar.load import load_sidecar
    from oospec_agents.sidecar.runtime import load_wave
    tiny_model("llama", smollm2_tokenizer, seed=3).save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    cpu = torch.device("cpu")
    assert load_sidecar(str(tmp_path), device=cpu, dtype=torch.float32, sidecar_placement="thread").wave.max_rows == MAX_ROWS
    side = load_sidecar(str(tmp_path), device=cpu, dtype=torch.float32, sidecar_placement="thread", sidecar_max_rows=40)
    assert side.wave.max_rows == 40
    spec = WorkerSpec(str(tmp_path), "cpu", torch.float32, None, 8, 0, 1, 24)
    assert load_wave(spec).max_rows == 24 and WorkerSpec(*list(spec.__dict__.values())[:7]).max_rows == MAX_ROWS
    with pytest.raises(ValueError, match="max_rows"):
        load_sidecar(str(tmp_path), device=cpu, dtype=torch.float32, sidecar_placement="thread", sidecar_max_rows=1)


# ---------------------------------------------------------------- a real 70+-tool record, the embedded sidecar

def _big_record(n_tools: int = 70) -> dict:
    """The first callnavi record of train-extra.jsonl offering at least `n_tools` tools."""
    return next(r for r in load_records("train-extra") if r["source"] == "callnavi" and len(r["tools"]) >= n_tools)


@pytest.mark.slow
def test_a_70_tool_wave_stays_under_the_bound_and_hints_a_valid_call(embedded_sidecar):
    rec = _big_record()
    req = _request(rec["messages"], rec["tools"])
    rows, _, _ = wave_rows(req)
    assert len(rows) > 3 * MAX_ROWS  # one row per parameter of every tool: far above the bound
    ticket = embedded_sidecar.submit(req)
    deadline = time.perf_counter() + 300
    while (hint := ticket.poll()) is None and ticket.error is None and not ticket.declined:
        assert time.perf_counter() < deadline, "no hint in 300 s"
        time.sleep(0.05)
    assert ticket.error is None and hint is not None
    prof = hint.profile
    assert prof["rows_offered"] == len(rows) and prof["max_rows"] == MAX_ROWS
    assert prof["rows"] <= MAX_ROWS, prof
    assert prof["steps"] <= 2 * embedded_sidecar.wave.max_row_tokens
    _, calls = req.fmt.parse(hint.text)
    valid, invalid, problems = check_calls(calls, req.tools)
    assert len(calls) == 1 and valid and not invalid and not problems, (hint.text, invalid, problems)
    assert calls[0]["name"] in {t.name for t in req.tools}
    print(f"\n{rec['id']}: {len(rec['tools'])} tools, rows {prof['rows']} of {prof['rows_offered']}, "
          f"steps {prof['steps']}, wave {prof['wave_s']:.2f} s (prefill {prof['prefill_s']:.2f} s), "
          f"hint {hint.text!r}, expected {rec['expected'][0]}")
