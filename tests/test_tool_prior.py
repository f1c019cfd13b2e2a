"""The lexical prior over the offered tools (#20, `sidecar/rank.py`): BM25 of the user's words against
each tool, added to the function row's logits as `Wave(prior_weight=...) x prior`. The model still
chooses; a weight of 0 is the wave without a prior."""
from __future__ import annotations

import pytest

from oospec_testing import tiny_model
from oospec_agents.chat import normalize_messages
from oospec_agents.formats import HermesFormat
from oospec_agents.sidecar import HintRequest
from oospec_agents.sidecar.rank import tool_prior, words
from oospec_agents.sidecar.rows import parse_value
from oospec_agents.sidecar.wave import PRIOR_WEIGHT, Wave
from oospec_agents.sidecar.runtime import wave_rows
from oospec_agents.tools import normalize_tools


def _tool(name, description="", **params):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()}}}}


TOOLS = [_tool("get_weather", "Current conditions in a city.", city="The city"),
         _tool("bookFlight", "Reserve a seat on a plane.", origin="Departure airport", destination="Arrival"),
         _tool("convert.currency", "Change an amount of money from one currency to another.", amount="How much")]


def _user(text):
    return normalize_messages([{"role": "user", "content": text}])


def _request(text, tools=TOOLS, tool_choice=("auto", None)):
    return HintRequest(_user(text), normalize_tools(list(tools)), HermesFormat(), tool_choice)


def test_identifiers_are_split_into_words():
    assert words("getWeather_now") == "get Weather now"
    assert words("convert.currency-rate/v2") == "convert currency rate v2"


@pytest.mark.parametrize("text, best", [("What's the weather in Oslo?", 0), ("Book me a flight to Rome", 1),
                                        ("Convert 20 dollars to yen, which currency is cheaper", 2)])
def test_the_tool_the_request_names_has_the_top_prior(text, best):
    prior = tool_prior(_user(text), normalize_tools(TOOLS))
    assert prior[best] == 0.0 and all(-1.0 <= p < 0.0 for i, p in enumerate(prior) if i != best), prior


def test_no_opinion_without_a_shared_word_or_a_choice():
    tools = normalize_tools(TOOLS)
    assert tool_prior(_user("Hello there!"), tools) == [0.0, 0.0, 0.0]
    assert tool_prior(_user("weather in Oslo"), tools[:1]) == [0.0]
    assert tool_prior([], tools) == [0.0, 0.0, 0.0]
    # tools whose names and descriptions hold no word BM25 keeps (stop words, single characters)
    assert tool_prior(_user("the a b"), normalize_tools([_tool("the"), _tool("a", "is")])) == [0.0, 0.0]
    # only the user's turns are read: a system prompt naming a tool gives it no prior
    messages = normalize_messages([{"role": "system", "content": "You may book flights."},
                                   {"role": "user", "content": "Hi!"}])
    assert tool_prior(messages, tools) == [0.0, 0.0, 0.0]


def test_wave_rows_carry_each_names_prior_and_null_at_zero():
    _, _, choices = wave_rows(_request("weather in Oslo?"))
    assert list(choices[0]) == [' "get_weather"', ' "bookFlight"', ' "convert.currency"', " null"]
    assert choices[0][' "get_weather"'] == 0.0 == choices[0][" null"] and choices[0][' "bookFlight"'] < 0
    _, _, choices = wave_rows(_request("weather in Oslo?", tool_choice=("required", None)))
    assert " null" not in choices[0]
    assert wave_rows(_request("weather", tool_choice=("named", "get_weather")))[2] == {}
    # the pay-back estimate needs only the rows: no ranking, every prior 0, the same rows and prefix
    rows, prefix, choices = wave_rows(_request("weather in Oslo?"), priors=False)
    assert set(choices[0].values()) == {0.0} and (rows, prefix) == wave_rows(_request("weather in Oslo?"))[:2]


@pytest.fixture(scope="module")
def tiny_sidecar(smollm2_tokenizer):
    return tiny_model("llama", smollm2_tokenizer, seed=5), smollm2_tokenizer


def test_weight_zero_is_the_wave_without_a_prior(tiny_sidecar):
    model, tok = tiny_sidecar
    rows, prefix, choices = wave_rows(_request("Book me a flight to Rome"))
    plain = {0: list(choices[0])}  # the same names, no prior
    wave = Wave(model, tok, max_row_tokens=6, prior_weight=0)
    assert wave(prefix, rows, None, choices).texts == wave(prefix, rows, None, plain).texts
    assert Wave(model, tok).prior_weight == PRIOR_WEIGHT


@pytest.mark.parametrize("max_rows, top_tools", [(16, 0), (3, 0), (3, 1)])
@pytest.mark.parametrize("text, want", [("Book me a flight to Rome", "bookFlight"),
                                        ("Convert 20 dollars, which currency", "convert.currency")])
def test_a_heavy_prior_makes_a_random_model_write_the_named_tool(tiny_sidecar, text, want, max_rows, top_tools):
    """In one batch and in a two-phase wave alike: the prior reaches every step of the name's tokens,
    and the chosen tool's rows follow it."""
    model, tok = tiny_sidecar
    rows, prefix, choices = wave_rows(_request(text, tool_choice=("required", None)))
    wave = Wave(model, tok, max_row_tokens=6, max_rows=max_rows, top_tools=top_tools, prior_weight=1e4)
    result = wave(prefix, rows, None, choices)
    texts = result.texts
    assert parse_value(texts[0]) == want
    assert all(t for r, t in zip(rows[1:], texts[1:]) if r.tool == want)  # its slot rows were decoded
    if top_tools:
        assert result.profile["top_tools"] == [want]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "6"])
def test_the_weight_is_checked(bad):
    with pytest.raises(ValueError, match="prior_weight"):
        Wave(None, None, prior_weight=bad)


def test_the_weight_is_an_option_of_every_placement(tmp_path, smollm2_tokenizer):
    """`sidecar_prior_weight` (load_sidecar, Engine.from_pretrained) reaches the Wave, in a thread here and
    through the WorkerSpec that a process or a Ray actor loads from; the default is PRIOR_WEIGHT."""
    import torch
    from oospec_agents.sidecar.runtime import WorkerSpec
    from oospec_agents.sidecar.load import load_sidecar
    from oospec_agents.sidecar.runtime import load_wave
    tiny_model("llama", smollm2_tokenizer, seed=3).save_pretrained(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    cpu = torch.device("cpu")
    kw = dict(device=cpu, dtype=torch.float32, sidecar_placement="thread")
    assert load_sidecar(str(tmp_path), **kw).wave.prior_weight == PRIOR_WEIGHT
    assert load_sidecar(str(tmp_path), **kw, sidecar_prior_weight=0).wave.prior_weight == 0
    spec = WorkerSpec(str(tmp_path), "cpu", torch.float32, None, 8, 0, 1, 16, 2.5)
    assert load_wave(spec).prior_weight == 2.5
    assert WorkerSpec(*list(spec.__dict__.values())[:8]).prior_weight == PRIOR_WEIGHT
    with pytest.raises(ValueError, match="prior_weight"):
        load_sidecar(str(tmp_path), **kw, sidecar_prior_weight=-2)
