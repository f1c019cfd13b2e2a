"""OpenAI's Predicted Outputs (`prediction`): the caller's expected reply is one more draft source.

The reply is the target's greedy decoding whatever the prediction (right, edited, wrong, or under a
grammar); a right prediction saves target forwards; the usage counts say how much of it the reply has.
"""
from __future__ import annotations

import re

import pytest

from oospec_agents.drafters import PredictionDrafter, ReplyState
from oospec_agents.drafters.prediction import Prediction, matched_tokens, prediction_text
from oospec_agents.errors import PredictionError
from oospec_agents.formats import HermesFormat
from oospec_testing import greedy, masked_reference

METHODS = ("ar", "toolspec", "oospec")
ASK = [{"role": "user", "content": "Rewrite the paragraph in plain words."}]
ALARM = [{"type": "function", "function": {
    "name": "set_alarm", "description": "Set an alarm.",
    "parameters": {"type": "object", "properties": {"day": {"type": "string", "enum": ["monday", "tuesday"]},
                                                    "hour": {"type": "integer"}},
                   "required": ["day", "hour"], "additionalProperties": False}}}]


# ----------------------------------------------------------------------------- the field

@pytest.mark.parametrize("value, text", [
    (None, None), ("", None), ("def f(): pass", "def f(): pass"),
    ({"type": "content", "content": "a = 1"}, "a = 1"),
    ({"type": "content", "content": [{"type": "text", "text": "a = "}, {"type": "text", "text": "1"}]}, "a = 1"),
])
def test_the_prediction_is_openais_object_or_a_string(value, text):
    assert prediction_text(value) == text


@pytest.mark.parametrize("value, says", [
    (3, "prediction must be an object"),
    ({"type": "text", "content": "x"}, "prediction.type is 'text'"),
    ({"type": "content"}, "prediction.content must be a string or a list of text parts, got NoneType"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": {}}]}, "prediction.content[0]"),
])
def test_a_bad_prediction_is_an_error_that_names_it(value, says, tiny_engine):
    with pytest.raises(PredictionError, match=re.escape(says)) as e:
        prediction_text(value)
    assert e.value.param == "prediction"
    with pytest.raises(PredictionError):  # eagerly, before any decoding
        tiny_engine.stream(ASK, prediction=value)


def test_a_prediction_longer_than_the_context_window_is_refused(tiny_engine):
    with pytest.raises(PredictionError, match=f"over the target's context window of {tiny_engine.context_window}"):
        tiny_engine.stream(ASK, prediction="word " * (tiny_engine.context_window + 1))


# ----------------------------------------------------------------------------- the drafter

def _propose(pred: list[int], new: list[int], prediction: Prediction | None = None, **kw) -> list[int]:
    """What the drafter proposes after `new`; the same `prediction` across calls keeps its place in it."""
    prediction = Prediction(pred) if prediction is None else prediction
    ctx = ReplyState(ids=[7, 7] + new, n_prompt=2, text="", tools=[], fmt=HermesFormat(), tokenizer=None,
                     prediction=prediction)
    drafts = PredictionDrafter(**kw).propose(ctx)
    assert all(d.source == "prediction" for d in drafts)
    return drafts[0].tokens if drafts else []


def test_the_drafter_follows_the_prediction_from_its_start():
    pred = list(range(100, 150))
    assert _propose(pred, [100], max_tokens=5) == [101, 102, 103, 104, 105]
    assert _propose(pred, pred[:20], max_tokens=5) == pred[20:25]
    assert _propose(pred, pred) == []  # all of it written


def test_after_an_edit_the_drafter_rejoins_the_prediction_where_the_reply_does():
    pred = list(range(100, 150))
    inserted = pred[:10] + [1, 2, 3, 4]            # the reply added words the prediction has not
    assert _propose(pred, inserted) == []
    rejoined = inserted + pred[12:15]               # and went on with the prediction, two tokens further on
    assert _propose(pred, rejoined, max_tokens=4) == pred[15:19]


def test_a_repeated_passage_is_read_in_the_predictions_order():
    line = [5, 6, 7, 8]
    pred = line + [20, 21] + line + [30, 31]       # the same line twice, followed by different tokens
    kept = Prediction(pred)
    assert _propose(pred, [1] + line, kept, max_tokens=2) == [20, 21]   # first: the first occurrence
    assert _propose(pred, [1] + line + [20, 21] + line, kept, max_tokens=2) == [30, 31]  # longest match: the second
    assert _propose(pred, [9, 9] + line[1:], kept, max_tokens=2) == [30, 31]  # a tie: at or after the last match


def test_matched_tokens_count_the_predictions_tokens_in_the_reply():
    assert matched_tokens([1, 2, 3, 4], [1, 2, 3, 4]) == 4
    assert matched_tokens([1, 2, 3, 4], [1, 9, 3, 4, 5]) == 3
    assert matched_tokens([1, 2], []) == 0


# ----------------------------------------------------------------------------- lossless

def _predictions(tokenizer, ref: list[int]) -> dict[str, str]:
    text = tokenizer.decode(ref, skip_special_tokens=True)
    cut = len(text) // 3
    return {"right": text, "edited": text[:cut] + " and some other words " + text[2 * cut:],
            "first half": text[:len(text) // 2], "wrong": "The quick brown fox jumps over the lazy dog. " * 4}


def test_every_method_is_lossless_whatever_the_prediction(tiny_engine):
    ref = greedy(tiny_engine, tiny_engine.prompt_ids(ASK), 64)
    for name, prediction in _predictions(tiny_engine.tokenizer, ref).items():
        for method in METHODS:
            gen = tiny_engine.generate(ASK, method=method, max_new_tokens=64, prediction=prediction)
            assert gen.token_ids == ref, (name, method)
            s = gen.stats
            assert s.prediction_tokens == len(tiny_engine.tokenizer.encode(prediction, add_special_tokens=False))
            assert 0 <= s.prediction_matched <= min(s.prediction_tokens, len(ref))
            if method == "ar":
                assert s.accepted_by_source["prediction"] == 0 and s.target_forwards == len(ref)


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_under_strict_a_prediction_keeps_the_masked_reference(tiny_engine, tool_choice):
    ref = masked_reference(tiny_engine, ASK, ALARM, tool_choice, 48)
    call = '<tool_call>\n{"name": "set_alarm", "arguments": {"day": "monday", "hour": 7}}\n</tool_call>'
    for method in METHODS:
        for prediction in (call, tiny_engine.tokenizer.decode(ref)):
            gen = tiny_engine.generate(ASK, ALARM, tool_choice=tool_choice, method=method, max_new_tokens=48,
                                       strict=True, prediction=prediction)
            assert gen.token_ids == ref, (method, prediction)


@pytest.mark.slow
def test_on_the_embedded_target_a_right_prediction_saves_most_forwards_and_an_edited_one_some(embedded_fp32):
    eng = embedded_fp32
    ask = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]
    ref = greedy(eng, eng.prompt_ids(ask), 64)
    predictions = _predictions(eng.tokenizer, ref)

    def run(method, name):
        eng.clear_call_memory()  # retrieval would draft the earlier runs' replies: each run sees its prediction only
        return eng.generate(ask, method=method, max_new_tokens=64, prediction=predictions.get(name))

    # without tools and without a sidecar (this engine has none) `oospec` drafts as `toolspec` does
    runs = {name: run("toolspec", name) for name in ("none", "right", "edited", "wrong")}
    runs["oospec right"] = run("oospec", "right")
    eng.clear_call_memory()
    for key, gen in runs.items():
        assert gen.token_ids == ref, key
    forwards = {name: gen.stats.target_forwards for name, gen in runs.items()}
    assert forwards["right"] * 3 <= forwards["none"], forwards       # measured: 3 against 59 (edited 26)
    assert forwards["right"] < forwards["edited"] < forwards["none"], forwards
    assert forwards["wrong"] <= forwards["none"] and forwards["oospec right"] == forwards["right"], forwards
    right = runs["right"].stats
    assert right.accepted_by_source["prediction"] >= len(ref) // 2, right.accepted_by_source
    assert right.prediction_matched >= right.prediction_tokens - 2  # the reply has (nearly) all of it
    wrong = runs["wrong"].stats
    assert wrong.prediction_matched < wrong.prediction_tokens // 4
