"""OpenAI's `response_format` (structured outputs): a reply that calls no tool decoded under the grammar
of a JSON Schema (`json_schema`) or of any JSON object (`json_object`), by the same llguidance
machinery as strict tool calls; beside tools under `auto`, calls or that JSON. Lossless means what it
means under strict: every method's tokens equal transformers' greedy decoding masked by the same
grammar (`engine.logits_processor(..., response_format=...)`)."""
from __future__ import annotations

import json

import jsonschema
import pytest

import oospec_testing
from oospec_agents.errors import OoOSpecError, ResponseFormatError
from oospec_agents.grammar import response_schema

ASK = [{"role": "user", "content": "Describe the weather in Paris as JSON."}]
WEATHER = {"type": "object", "properties": {  # bounded strings and arrays: a random model rambles in them
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 0, "maximum": 14},
    "alerts": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    "wind": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 200}, {"type": "null"}]}},
    "required": ["city", "unit", "days", "alerts", "wind"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "",
                                         "parameters": {"type": "object", "properties": {}}}}


def json_schema(schema, strict=True, name="weather"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


def masked_reference(engine, messages, response_format, max_new_tokens, tools=None):
    """The shared masked reference (`transformers.generate` with the grammar's logits processor), for
    a reply under `response_format`: non-strict tools, as the requests here are."""
    return oospec_testing.masked_reference(engine, messages, tools, "auto", max_new_tokens, strict=False,
                                           response_format=response_format)


@pytest.mark.parametrize("response_format", [json_schema(WEATHER), {"type": "json_object"}],
                         ids=["json_schema", "json_object"])
def test_every_method_equals_the_masked_reference(tiny_engine, response_format):
    """A random model wants to write anything: the grammar decides what it may, and every method's
    reply is the masked greedy one, a JSON value of the schema whenever it ends before the limit."""
    n = 48
    ref = masked_reference(tiny_engine, ASK, response_format, n)
    for method in ("ar", "toolspec", "oospec"):
        gen = tiny_engine.generate(ASK, response_format=response_format, method=method, max_new_tokens=n)
        assert gen.token_ids == ref, method
        assert gen.tool_calls == [] and gen.invalid_tool_calls == []
        if gen.finish_reason == "stop":
            jsonschema.validate(json.loads(gen.text), response_schema(response_format))
        if response_format["type"] == "json_schema":
            assert gen.stats.accepted_by_source["grammar"] > 0, method  # the keys are forced: jump-forward


def test_a_finished_reply_validates_against_its_schema(tiny_engine):
    """With room to finish, the reply parses and validates: the required keys, the enum, the bounded
    string and array, the nullable integer and the closed object all come from the grammar, not from
    the random model."""
    gen = tiny_engine.generate(ASK, response_format=json_schema(WEATHER), max_new_tokens=200)
    assert gen.finish_reason == "stop", gen.text
    value = json.loads(gen.text)
    jsonschema.validate(value, WEATHER)
    assert list(value) == list(WEATHER["properties"])  # the schema's order, as OpenAI's strict mode writes it


def test_text_is_unconstrained_and_strict_closes_objects(tiny_engine):
    assert response_schema(None) is None and response_schema({"type": "text"}) is None
    assert response_schema({"type": "json_object"}) == {"type": "object"}
    open_schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert response_schema(json_schema(open_schema, strict=False)) == open_schema
    assert response_schema(json_schema(open_schema))["additionalProperties"] is False
    plain = tiny_engine.generate(ASK, max_new_tokens=8, method="ar")
    assert tiny_engine.generate(ASK, response_format={"type": "text"}, max_new_tokens=8,
                                method="ar").token_ids == plain.token_ids


def test_the_compiled_grammar_is_cached_per_schema(tiny_engine, monkeypatch):
    grammars = tiny_engine._grammars
    schema = {"type": "object", "properties": {"cached": {"type": "boolean"}}, "required": ["cached"]}
    tiny_engine.generate(ASK, response_format=json_schema(schema), max_new_tokens=4)
    before = grammars.compiles
    checks = []
    monkeypatch.setattr(grammars, "_schema_error", lambda styled: checks.append(styled))
    tiny_engine.generate(ASK, response_format=json_schema(schema), max_new_tokens=4)
    assert grammars.compiles == before and checks == []  # neither compiled nor checked again


@pytest.mark.parametrize("response_format, says", [
    ("json", "response_format must be an object"),
    ({"type": "xml"}, "response_format.type is 'xml'"),
    ({"type": "json_schema"}, "response_format.json_schema must be an object"),
    ({"type": "json_schema", "json_schema": {"schema": WEATHER}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": []}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER, "strict": "yes"}},
     "response_format.json_schema.strict"),
    (json_schema({"type": "string", "pattern": "(?<=a)b"}), "'pattern'"),  # a lookbehind: beyond the grammar
])
def test_a_bad_response_format_is_an_error_that_names_it(tiny_engine, response_format, says):
    with pytest.raises(ResponseFormatError, match=says.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")) as e:
        tiny_engine.generate(ASK, response_format=response_format, max_new_tokens=4)
    assert e.value.param == "response_format" and isinstance(e.value, OoOSpecError)


def test_beside_tools_the_json_is_the_reply_that_calls_nothing(tiny_engine):
    """As in OpenAI's API: under `auto` the reply is calls or the JSON (lossless against the masked
    reference, which holds both); a forced call is the reply, whatever the response_format; with
    tool_choice="none" the reply is the JSON."""
    rf = json_schema(WEATHER)
    ref = masked_reference(tiny_engine, ASK, rf, 48, tools=[TOOL])
    for method in ("ar", "toolspec", "oospec"):
        assert tiny_engine.generate(ASK, [TOOL], response_format=rf, method=method,
                                    max_new_tokens=48).token_ids == ref, method
    forced = tiny_engine.generate(ASK, [TOOL], tool_choice="required", max_new_tokens=12, method="ar")
    assert tiny_engine.generate(ASK, [TOOL], tool_choice="required", response_format=rf, max_new_tokens=12,
                                method="ar").token_ids == forced.token_ids
    none = tiny_engine.generate(ASK, [TOOL], tool_choice="none", response_format={"type": "json_object"},
                                max_new_tokens=4)
    assert none.text.startswith("{")


def test_a_format_that_writes_calls_as_bare_json_refuses_a_json_reply_beside_tools(smollm2_tokenizer):
    from oospec_agents.formats.llama3_json import Llama3JsonFormat
    from oospec_agents.grammar import Grammars
    from oospec_agents.tools import normalize_tools
    tok = smollm2_tokenizer
    grammars = Grammars(tok, Llama3JsonFormat(), {tok.eos_token_id}, len(tok))
    with pytest.raises(ResponseFormatError, match="'llama3_json' .*bare JSON"):
        grammars.guide(normalize_tools([TOOL]), "auto", None, strict=False, reply={"type": "object"})
    assert grammars.json_guide({"type": "object"}) is not None  # without tools, the JSON is the whole reply


@pytest.mark.slow
def test_embedded_replies_equal_the_masked_reference_and_parse(embedded_fp32):
    """The embedded target in float32, as the strict tests run it: every method's JSON reply equals
    the masked reference, ends, and validates (the 135M fills it sensibly: Paris, celsius, ...)."""
    asks = [[{"role": "user", "content": "It is 22 degrees and sunny in Paris today. Describe it as JSON."}],
            [{"role": "system", "content": "You answer in JSON."},
             {"role": "user", "content": "Give me a three-day forecast for Oslo."}]]
    for ask in asks:
        ref = masked_reference(embedded_fp32, ask, json_schema(WEATHER), 64)
        for method in ("ar", "toolspec", "oospec"):
            gen = embedded_fp32.generate(ask, response_format=json_schema(WEATHER), method=method, max_new_tokens=64)
            assert gen.token_ids == ref, (method, gen.text)
            assert gen.finish_reason == "stop", (method, gen.text)
            jsonschema.validate(json.loads(gen.text), WEATHER)
        assert gen.stats.accepted_by_source["grammar"] > 0
