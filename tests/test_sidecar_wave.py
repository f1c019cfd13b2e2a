"""The sidecar's batched wave on tiny models: each row as if decoded alone, the warm prefix, the function
row's choice, null kept off required rows, and the sidecar's evaluation scoring the wave it serves."""
from __future__ import annotations

import pytest
import torch

from sidecar_testing import ASK, TIME, WEATHER, hint_request
from oospec_agents.chat import normalize_messages
from oospec_agents.formats import HermesFormat
from oospec_agents.sidecar import HintRequest
from oospec_agents.sidecar.rows import expand_rows, parse_value
from oospec_agents.sidecar.runtime import wave_rows
from oospec_agents.sidecar.wave import Wave
from oospec_agents.tools import normalize_tools


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
    req = hint_request()
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
    req = hint_request(("named", "get_weather"))
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
