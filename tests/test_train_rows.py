"""Training rows: the sidecar's rows expanded from a record (none sees another's answer), the no-call share,
packing and the null rows' sample, and the rows' weights."""
from __future__ import annotations

import pytest
import torch

from oospec_testing import tiny_model
from train_testing import TRACE
from oospec_agents.sidecar.rows import Row
from oospec_agents.train.lora import LoraConfigArgs, example_loss
from oospec_agents.train.rows import pack, packed_loss, training_rows

pytestmark = pytest.mark.usefixtures("one_thread")  # training on a busy machine


OPEN = '<tool_call>\n{"name":'


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
