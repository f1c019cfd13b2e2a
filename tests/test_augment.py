"""More target call examples from the same records: trimmed tool lists, re-valued requests, distractor tools."""
from __future__ import annotations

import copy
import json
import random

import pytest

from oospec_testing import DATA, tiny_model
from oospec_agents.train.augment import add_distractors, revalue, string_pools, trim_tools
from oospec_agents.train.data import load_records, select, tool_name


def _tool(name, props, enum=None):
    props = {k: {"type": t} for k, t in props.items()}
    for k, values in (enum or {}).items():
        props[k]["enum"] = values
    return {"type": "function", "function": {"name": name, "description": f"{name} tool.",
                                             "parameters": {"type": "object", "properties": props}}}


BOOK = _tool("book_table", {"city": "string", "people": "integer", "budget": "number", "seating": "string",
                            "dishes": "array"}, enum={"seating": ["indoor", "outdoor"]})
REC = {"id": "r1", "source": "hand",
       "messages": [{"role": "system", "content": "You help with bookings."},
                    {"role": "user", "content": "Book a table in Paris for 4 people, outdoor, at most 62.5 euros, "
                                                "with Ramen and Sushi. We are 4 friends in total."}],
       "tools": [BOOK],
       "expected": [{"name": "book_table", "arguments": {
           "city": "Paris", "people": 4, "budget": 62.5, "seating": "outdoor", "dishes": ["Ramen", "Sushi"]}}]}
POOLS = {"city": ["Paris", "Rome", "new york"], "dishes": ["Ramen", "Sushi", "Tacos"]}


def test_revalue_swaps_each_spelled_out_value_in_request_and_call_alike():
    before = copy.deepcopy(REC)
    out = revalue(REC, POOLS, random.Random(0))
    assert REC == before, "the input record must not change"
    args = out["expected"][0]["arguments"]
    text = out["messages"][-1]["content"]
    # "Paris" -> the one pool value of the same shape (capitalised, one word); "new york" is not.
    assert args["city"] == "Rome" and "Rome" in text and "Paris" not in text
    # 62.5 -> another number with one decimal, spelt the same way in the request and the call.
    assert isinstance(args["budget"], float) and args["budget"] != 62.5 and repr(args["budget"]) in text
    # a list element is swapped like a scalar: "Ramen" -> "Tacos" in both places, "Sushi" stays
    # (its only other same-shaped pool value, "Ramen", is already in the request).
    assert args["dishes"] == ["Tacos", "Sushi"] and "Tacos" in text
    # "4" appears twice in the request, so which one the call copies is unknown: left alone.
    assert args["people"] == 4 and text.count(" 4 ") == 2
    # an enum member is never swapped, and the system message is untouched.
    assert args["seating"] == "outdoor" and out["messages"][0] == REC["messages"][0]
    # everything else in the text is as it was
    assert text.replace(repr(args["budget"]), "62.5").replace("Rome", "Paris").replace("Tacos", "Ramen") \
        == REC["messages"][-1]["content"]


def test_revalue_leaves_values_the_request_does_not_spell_out():
    rec = copy.deepcopy(REC)
    rec["messages"][-1]["content"] = "Book me something nice for the whole family."
    assert revalue(rec, POOLS, random.Random(0)) is None
    # a value also found in an earlier message is not swapped either (the two would disagree)
    rec = copy.deepcopy(REC)
    rec["messages"][0]["content"] = "The user lives in Paris. Budget 62.5 is usual. Likes Ramen."
    out = revalue(rec, POOLS, random.Random(0))
    assert out is None or out["expected"][0]["arguments"]["city"] == "Paris"


def test_revalue_is_seeded():
    a = revalue(REC, POOLS, random.Random(3))
    assert a == revalue(REC, POOLS, random.Random(3))


def test_string_pools_collect_values_per_argument_name():
    recs = [REC, dict(REC, expected=[{"name": "book_table", "arguments": {"city": "Oslo", "dishes": ["Pho"]}}])]
    pools = string_pools(recs)
    assert pools["city"] == ["Oslo", "Paris"] and pools["dishes"] == ["Pho", "Ramen", "Sushi"]
    assert "people" not in pools  # numbers are drawn, not pooled


def test_trim_tools_keeps_the_called_tools_and_drops_others_until_it_fits():
    others = [_tool(f"other_{i}", {"x": "string"}) for i in range(5)]
    rec = dict(REC, tools=others[:2] + [BOOK] + others[2:])
    fits = lambda r: r if len(r["tools"]) <= 3 else None  # noqa: E731
    out = trim_tools(rec, fits, random.Random(0))
    names = [tool_name(t) for t in out["tools"]]
    assert len(names) == 3 and "book_table" in names
    assert names == [n for n in (tool_name(t) for t in rec["tools"]) if n in names], "order is kept"
    assert out["expected"] == rec["expected"] and out["messages"] == rec["messages"]
    assert trim_tools(rec, lambda r: None, random.Random(0)) is None  # not even the called tool fits
    assert trim_tools(rec, fits, random.Random(0)) == out


def test_target_examples_gain_trimmed_and_revalued_calls_and_keep_the_rest(smollm2_tokenizer):
    """On real records: the flags only add call examples; each one ends with its record's call."""
    from oospec_agents import Engine
    from oospec_agents.train.target import build_target_examples
    tok = smollm2_tokenizer
    engine = Engine(tiny_model("llama", tok), tok)
    recs = select(load_records(DATA / "train.jsonl"), None, 15)  # 15 of each source
    plain, c0 = build_target_examples(engine, recs, max_len=900)
    more, c1 = build_target_examples(engine, recs, max_len=900, trim=True, revalued=1)
    assert c1["call_trimmed"] > 0 and c1["call_revalued"] > 0 and c1["too_long"] < c0["too_long"]
    for k in ("call", "answer", "answer_apibank", "no_tool"):
        assert c1[k] == c0[k]
    key = lambda ex: tuple(ex[0])  # noqa: E731
    assert {key(e) for e in plain} <= {key(e) for e in more}
    assert len(more) == len(plain) + c1["call_trimmed"] + c1["call_revalued"]
    assert all(len(ids) <= 900 for ids, _ in more)
    # every new example's answer is one of the records' calls (trimmed) or a re-valued call that the
    # example's own prompt spells out
    calls = {engine.fmt.render_calls(r["expected"]) for r in recs if r["expected"]}
    new = [e for e in more if key(e) not in {key(p) for p in plain}]
    for ids, n in new:
        answer = tok.decode(ids[-n:-1])
        prompt = tok.decode(ids[:-n])
        if answer in calls:
            continue
        call = json.loads(answer.split("<tool_call>")[1].split("</tool_call>")[0])
        values = [v for v in call["arguments"].values() if isinstance(v, (str, int, float))]
        assert any(str(v) in prompt for v in values), answer


def test_cli_takes_the_augment_flags(tmp_path, capsys):
    from oospec_agents.cli import main
    rc = main(["train-target", "--train", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o"),
               "--trim-tools", "--revalue", "1"])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def test_revalue_never_swaps_in_a_value_the_request_already_spells():
    """Swaps are applied one after another: 4 -> 7 then 7 -> 3 would turn both into 3."""
    rec = {"id": "r", "source": "hand", "tools": [_tool("f", {"a": "integer", "b": "integer"})],
           "messages": [{"role": "user", "content": "Add 4 and 7."}],
           "expected": [{"name": "f", "arguments": {"a": 4, "b": 7}}]}
    outs = [revalue(rec, {}, random.Random(seed)) for seed in range(300)]
    assert sum(o is not None for o in outs) > 250
    for out in filter(None, outs):
        a, b = out["expected"][0]["arguments"].values()
        assert out["messages"][0]["content"] == f"Add {a} and {b}."


def test_cli_rejects_a_negative_revalue_count(tmp_path, capsys):
    from oospec_agents.cli import main
    with pytest.raises(SystemExit) as e:
        main(["train-target", "--train", str(DATA / "train.jsonl"), "--out", str(tmp_path / "o"), "--revalue", "-1"])
    assert e.value.code == 2 and "--revalue: must be 0 or more, got -1" in capsys.readouterr().err


def test_revalue_swaps_a_value_wherever_the_call_repeats_it():
    """The request spells "Alice" once; the call repeats it inside a list of objects: both change."""
    rec = {"id": "r", "source": "hand", "tools": [_tool("share", {"user": "string", "items": "array"})],
           "messages": [{"role": "user", "content": "Share the file with Alice."}],
           "expected": [{"name": "share", "arguments": {"user": "Alice", "items": [{"owner": "Alice", "n": 1}]}}]}
    out = revalue(rec, {"user": ["Alice", "Bruno"]}, random.Random(0))
    assert out["messages"][0]["content"] == "Share the file with Bruno."
    assert out["expected"][0]["arguments"] == {"user": "Bruno", "items": [{"owner": "Bruno", "n": 1}]}


POOL = [_tool("get_stock_price", {"ticker": "string"}), _tool("weather.forecast", {"city": "string"}),
        _tool("bookTableOutdoor", {"city": "string"}), _tool("translate_text", {"text": "string"}),
        _tool("book_table", {"x": "string"}), _tool("send_email", {"to": "string"}),
        _tool("get_weather_now", {"city": "string"})]


def test_add_distractors_inserts_unrelated_tools_and_keeps_the_call():
    before = copy.deepcopy(REC)
    seen = set()
    for seed in range(50):
        out = add_distractors(REC, POOL, random.Random(seed))
        names = [tool_name(t) for t in out["tools"]]
        assert REC == before, "the input record must not change"
        assert out["expected"] == REC["expected"] and out["messages"] == REC["messages"]
        assert 2 <= len(names) <= 4 and names.count("book_table") == 1 and len(set(names)) == len(names)
        # "book_table" itself, and "bookTableOutdoor" (shares "book" and "table"), are never added
        assert "bookTableOutdoor" not in names
        seen.update(names)
        assert add_distractors(REC, POOL, random.Random(seed)) == out, "seeded"
    # every unrelated tool comes up; "get"/"calculate"-like verbs alone do not make two tools related
    assert seen == {"book_table", "get_stock_price", "weather.forecast", "translate_text", "send_email",
                    "get_weather_now"}


def test_add_distractors_keeps_related_tools_out_and_stops_at_four():
    rec = dict(REC, tools=[_tool("get_current_weather", {"city": "string"})],
               expected=[{"name": "get_current_weather", "arguments": {"city": "Paris"}}])
    for seed in range(30):
        names = {tool_name(t) for t in add_distractors(rec, POOL, random.Random(seed))["tools"]}
        assert not names & {"weather.forecast", "get_weather_now"}
    full = dict(REC, tools=[BOOK] + POOL[:3])
    assert add_distractors(full, POOL, random.Random(0)) is None
    assert add_distractors(REC, [BOOK, POOL[2]], random.Random(0)) is None  # nothing unrelated to add


def test_target_examples_gain_distracted_calls(smollm2_tokenizer):
    from oospec_agents import Engine
    from oospec_agents.train.target import build_target_examples
    tok = smollm2_tokenizer
    engine = Engine(tiny_model("llama", tok), tok)
    recs = select(load_records(DATA / "train.jsonl"), None, 10)
    plain, c0 = build_target_examples(engine, recs, max_len=900)
    more, c1 = build_target_examples(engine, recs, max_len=900, distracted=1)
    assert c1["call_distracted"] > 0
    same = lambda c: {k: v for k, v in c.items() if k not in ("call_distracted", "too_long")}  # noqa: E731
    assert same(c1) == same(c0) and c1["too_long"] >= c0["too_long"]
    assert len(more) == len(plain) + c1["call_distracted"]
    calls = {engine.fmt.render_calls(r["expected"]) for r in recs if r["expected"]}
    old = {tuple(p[0]) for p in plain}
    new = [e for e in more if tuple(e[0]) not in old]
    assert len(new) == c1["call_distracted"]
    for ids, n in new:  # the answer is the record's own call, unchanged
        assert tok.decode(ids[-n:-1]) in calls


def test_cli_rejects_a_negative_distract_count(tmp_path, capsys):
    from oospec_agents.cli import main
    with pytest.raises(SystemExit) as e:
        main(["train-target", "--train", str(DATA / "train.jsonl"), "--out", str(tmp_path / "o"), "--distract", "-2"])
    assert e.value.code == 2 and "--distract: must be 0 or more, got -2" in capsys.readouterr().err
