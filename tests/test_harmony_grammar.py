"""The harmony grammar: the analysis is free, then what the request asks (a call, a strict call, a JSON
final message) is constrained."""
from __future__ import annotations

import pytest

from oospec_agents.errors import OoOSpecError
from oospec_agents.grammar import Grammars
from oospec_agents.tools import normalize_tools
from harmony_testing import (ANALYSIS, CALL, FINAL_JSON, FMT, H, OK_SCHEMA, REPLIES, ROLE, STRICT_WEATHER, TIME,
                             WEATHER, harmony_tokenizer)

pytestmark = pytest.mark.usefixtures("harmony_vocabulary")  # openai-harmony offline


@pytest.fixture(scope="module")
def grammars(smollm2_tokenizer):
    tok = harmony_tokenizer(smollm2_tokenizer)
    return Grammars(tok, FMT, {tok.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")}, len(tok))


BAD_ARGS = CALL.replace('"Paris"', "7")
TIME_CALL = FMT.render_call("get_time", {"tz": "CET"})
FREE_BODY = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>Paris, please<|call|>"


def takes(grammars, text, mode="auto", name=None, strict=True, reply=None, tools=(WEATHER, TIME)) -> bool:
    """Whether the grammar of the request takes `text` as a whole reply (ending at `<|call|>` or `<|return|>`)."""
    guide = grammars.guide(normalize_tools(list(tools)), mode, name, strict, reply=reply, reasoning=H) if tools \
        else grammars.json_guide(reply, H)
    ids = grammars.tokenizer.encode(text, add_special_tokens=False)
    return guide.matcher.consume_tokens(ids) and guide.matcher.is_stopped() and not guide.matcher.is_error()


@pytest.mark.parametrize("text, mode, name, strict, ok", [
    # auto, strict: free analysis, then a final answer, preambles, or one strict call
    (REPLIES["think then call"][0], "auto", None, True, True),
    (REPLIES["think then answer"][0], "auto", None, True, True),
    (REPLIES["preamble then call"][0], "auto", None, True, True),
    (REPLIES["a call written in the analysis"][0], "auto", None, True, True),     # the analysis is free text
    (CALL, "auto", None, True, True),                                             # no analysis at all
    (ANALYSIS + ROLE + BAD_ARGS, "auto", None, True, False),                      # the arguments are strict
    (REPLIES["recipient in the role"][0], "auto", None, True, False),             # the call in the drafted shape only
    ("<|channel|>analysis<|message|>never closed", "auto", None, True, False),
    (ANALYSIS + ROLE + CALL.replace("<|call|>", "<|return|>"), "auto", None, True, False),
    # a forced call: after any analysis, a call and nothing else
    (REPLIES["think then call"][0], "required", None, True, True),
    (ANALYSIS + ROLE + ANALYSIS + ROLE + CALL, "required", None, True, False),    # one analysis message, as one block
    (ANALYSIS + ROLE + ANALYSIS + ROLE + CALL, "auto", None, True, False),
    (CALL, "required", None, True, True),                                         # the analysis may be skipped
    (REPLIES["think then answer"][0], "required", None, True, False),
    (REPLIES["preamble then call"][0], "required", None, True, False),            # no text before a forced call
    (ANALYSIS + ROLE + BAD_ARGS, "required", None, True, False),
    (ANALYSIS + ROLE + TIME_CALL, "named", "get_time", True, True),
    (ANALYSIS + ROLE + CALL, "named", "get_time", True, False),                   # not the named tool
    # a forced call without strict: its markup (an offered tool's name), its arguments free text
    (ANALYSIS + ROLE + BAD_ARGS, "required", None, False, True),
    (ANALYSIS + ROLE + FREE_BODY, "required", None, False, True),
    (REPLIES["think then answer"][0], "required", None, False, False),
    (ANALYSIS + ROLE + CALL.replace("get_weather", "get_rain"), "required", None, False, False),
    (ANALYSIS + ROLE + CALL, "named", "get_time", False, False),
    (ANALYSIS + ROLE + CALL.replace("<|call|>", "<|return|>"), "required", None, False, False),
])
def test_the_grammar_leaves_the_analysis_free_and_constrains_what_follows(grammars, text, mode, name, strict, ok):
    assert takes(grammars, text, mode, name, strict) is ok


@pytest.mark.parametrize("text, tools, ok", [
    (ANALYSIS + ROLE + FINAL_JSON, [WEATHER], True),                 # the final message is the JSON value
    (FINAL_JSON, [WEATHER], True),
    (REPLIES["think then answer"][0], [WEATHER], False),             # not text
    (ANALYSIS + ROLE + FINAL_JSON.replace("true", "1"), [WEATHER], False),
    (REPLIES["think then call"][0], [WEATHER], True),                # or a call (any JSON object without strict)
    (ANALYSIS + ROLE + FREE_BODY, [WEATHER], False),
    (REPLIES["preamble then call"][0], [WEATHER], False),            # no text before the call, as OpenAI's
    (ANALYSIS + ROLE + FINAL_JSON, [], True),                        # no tools: the final JSON message only
    (REPLIES["think then call"][0], [], False),
])
def test_a_json_response_format_constrains_the_final_message(grammars, text, tools, ok):
    assert takes(grammars, text, strict=False, reply=OK_SCHEMA, tools=tools) is ok


@pytest.mark.parametrize("text, ok", [
    (ANALYSIS + ROLE + CALL, True),
    (ANALYSIS + ROLE + BAD_ARGS, False),                                      # the flagged tool is strict
    (ANALYSIS + ROLE + FMT.render_call("get_time", {"zone": 1}), True),      # the other: any JSON object
    (ANALYSIS + ROLE + TIME_CALL.replace('{"tz": "CET"}', "CET"), False),
    (REPLIES["think then answer"][0], True),
])
def test_a_tools_strict_flag_constrains_that_tools_calls(grammars, text, ok):
    assert takes(grammars, text, strict=False, tools=(STRICT_WEATHER, TIME)) is ok


def test_the_harmony_grammar_needs_harmonys_special_tokens(smollm2_tokenizer):
    plain = Grammars(smollm2_tokenizer, FMT, {smollm2_tokenizer.eos_token_id}, len(smollm2_tokenizer))
    with pytest.raises(OoOSpecError, match=r"harmony's markers are special tokens .*<\|start\|>"):
        plain.guide(normalize_tools([WEATHER]), "required", None, strict=False, reasoning=H)
    assert plain.guide(normalize_tools([WEATHER]), "auto", None, strict=False, reasoning=H) is None  # nothing to do
