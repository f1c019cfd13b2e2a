"""OoOSpec's FunctionCallingLLM contract, method by method, over a scripted engine.

The engine here replays fixed replies, so these tests pin down the translation between LlamaIndex
and the engine: what each method sends, and what it makes of the reply.
"""
import json
import time

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock, ToolCallBlock
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from oospec_agents import Engine
from oospec_agents.frontend import aiterate
from oospec_agents.testing import BAD_SAMPLING, BOOK_TABLE, CALL_REPLIES, Scripted, by_index
from pydantic import BaseModel, ValidationError

from llama_index.llms.oospec import OoOSpec

from growing_calls import assert_call_grows, call_blocks


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def get_weather(city: str, unit: str = "celsius") -> str:
    """The current weather in a city."""
    return f"Sunny in {city}"


TOOLS = [FunctionTool.from_defaults(multiply), FunctionTool.from_defaults(add)]
WEATHER_TOOLS = [FunctionTool.from_defaults(get_weather)]
WEATHER_CALL = ("get_weather", {"city": "San Francisco", "unit": "celsius"})
CALL = ("multiply", {"a": 6, "b": 7})
TWO_CALLS = [CALL, ("add", {"a": 1, "b": 2})]
OPENAI_TOOLS = [t.metadata.to_openai_tool() for t in TOOLS]
USER = [ChatMessage(role="user", content="What is 6 times 7?")]


# ------------------------------------------------------------------ construction and metadata

def test_is_a_function_calling_llm_with_engine_metadata(scripted):
    llm, engine = scripted()
    assert isinstance(llm, FunctionCallingLLM)
    meta = llm.metadata
    assert meta.is_function_calling_model and meta.is_chat_model
    assert meta.context_window == engine.context_window == 4096
    assert meta.model_name == llm.model == "scripted-model"
    assert meta.num_output == llm.max_new_tokens
    assert llm.engine is engine


def test_engine_and_model_arguments_are_exclusive(scripted):
    _, engine = scripted()
    with pytest.raises(ValueError, match="either engine= or model=, target_device="):
        OoOSpec(model="embedded", target_device="cpu", engine=engine)


def test_engine_must_be_an_engine():
    with pytest.raises(TypeError, match="oospec_agents.Engine, got str"):
        OoOSpec(engine="embedded")


def test_constructing_loads_nothing_and_metadata_loads_the_engine(monkeypatch):
    loads = []

    def from_pretrained(target, sidecar=None, **kw):
        loads.append((target, kw))
        raise RuntimeError("loading")

    monkeypatch.setattr(Engine, "from_pretrained", from_pretrained)
    llm = OoOSpec(model="some-org/some-model", target_device="cpu")
    assert loads == []
    with pytest.raises(RuntimeError, match="loading"):
        llm.metadata  # the context window is the target's own
    assert loads == [("some-org/some-model", {"target_device": "cpu"})]


def test_prefix_cache_budget_reaches_the_engine(monkeypatch):
    loads = []
    monkeypatch.setattr(Engine, "_shared", {})
    monkeypatch.setattr(Engine, "from_pretrained", lambda target, sidecar=None, **kw: loads.append(kw) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        OoOSpec(prefix_cache_tokens=0).metadata
    assert loads == [{"prefix_cache_tokens": 0}]
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        OoOSpec(prefix_cache_tokens=-1)


def test_chat_template_reaches_the_engine(monkeypatch, tmp_path):
    loads = []
    monkeypatch.setattr(Engine, "_shared", {})
    monkeypatch.setattr(Engine, "from_pretrained", lambda target, sidecar=None, **kw: loads.append(kw) or 1 / 0)
    for template in ("{{ messages }}", tmp_path / "t.jinja"):
        with pytest.raises(ZeroDivisionError):
            OoOSpec(chat_template=template).metadata
    assert loads == [{"chat_template": "{{ messages }}"}, {"chat_template": str(tmp_path / "t.jinja")}]


def test_a_missing_model_path_fails_at_construction():
    with pytest.raises(ValueError, match="model path '/no/such/model' does not exist"):
        OoOSpec(model="/no/such/model")


def test_a_bad_device_fails_on_first_use():
    llm = OoOSpec(target_device="tpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        llm.chat(USER)


@pytest.mark.parametrize("bad", [{"method": "beam"}, {"max_new_tokens": 0}])
def test_bad_settings_are_rejected(scripted, bad):
    with pytest.raises(ValidationError):
        scripted(**bad)


# ------------------------------------------------------------------ chat

def test_chat_sends_the_chat_and_settings(scripted):
    llm, engine = scripted(("Hello!", []), method="toolspec", max_new_tokens=12)
    response = llm.chat([ChatMessage(role="system", content="Be brief."), *USER])
    assert engine.requests == [{
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "What is 6 times 7?"}],
        "tools": None, "tool_choice": "auto", "max_new_tokens": 12, "method": "toolspec", "stop": None}]
    assert response.message.role == "assistant"
    assert response.message.content == "Hello!"


PERSON_FORMAT = {"type": "json_schema", "json_schema": {
    "name": "Person", "strict": True,
    "schema": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
               "required": ["name", "age"]}}}


@pytest.mark.parametrize("call", ["chat", "stream_chat", "complete"])
def test_response_format_reaches_the_engine_as_openai_sends_it(scripted, call):
    """OpenAI's `response_format` as a chat keyword (as `llama_index.llms.openai.OpenAI` passes it):
    the engine decodes the reply under the schema's grammar; the reply's text is the JSON."""
    llm, engine = scripted(('{"name": "Ada", "age": 41}', []))
    if call == "complete":
        text = llm.complete("Ada, 41, as JSON", response_format=PERSON_FORMAT).text
    elif call == "chat":
        text = llm.chat(USER, response_format=PERSON_FORMAT).message.content
    else:
        text = list(llm.stream_chat(USER, response_format=PERSON_FORMAT))[-1].message.content
    assert json.loads(text) == {"name": "Ada", "age": 41}
    assert engine.requests[-1]["response_format"] == PERSON_FORMAT


@pytest.mark.parametrize("call", ["chat", "stream_chat", "complete"])
def test_a_prediction_reaches_the_engine(scripted, call):
    """OpenAI's Predicted Outputs as a keyword, like `response_format`: the engine drafts it."""
    llm, engine = scripted(("Hello!", []))
    prediction = {"type": "content", "content": "Hello!"}
    if call == "complete":
        llm.complete("Say hello", prediction=prediction)
    elif call == "chat":
        llm.chat(USER, prediction=prediction)
    else:
        list(llm.stream_chat(USER, prediction=prediction))
    assert engine.requests[-1]["prediction"] == prediction


def alike(value):
    """`value` (messages, responses' raw dicts, tuples and lists of them) less what differs between two
    replies to one request: the call ids (`by_index`) and the seconds the stats measured."""
    if isinstance(value, (list, tuple)):
        return [alike(v) for v in value]
    value = by_index(value.model_dump() if hasattr(value, "model_dump") else value)
    if isinstance(value, dict):
        return {k: alike(v) if isinstance(v, dict) else v for k, v in value.items() if not k.endswith("_s")}
    return value


def test_chat_reports_usage_and_speculation_stats(scripted):
    llm, engine = scripted(("Hello!", []))
    raw = llm.chat(USER).raw
    prompt, out = len(engine.prompt_ids(engine.requests[0]["messages"])), len(engine.tokenizer.encode("Hello!")) + 1
    assert raw["usage"] == {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
                            "cached_prompt_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    rounds = [list(r) for r in raw["stats"]["rounds"]]  # (tree nodes, accepted, past) tuples: JSON arrays
    assert type(raw["stats"]) is dict and json.loads(json.dumps(raw["stats"])) == {**raw["stats"], "rounds": rounds}
    # the engine's stats: each forward commits one token of its own, the drafts it accepted the rest
    assert raw["stats"]["target_forwards"] + sum(raw["stats"]["accepted_by_source"].values()) == out
    assert set(raw["stats"]["accepted_by_source"]) >= {"schema", "retrieval", "hint"}
    assert raw["finish_reason"] == "stop"
    assert raw["invalid_tool_calls"] == []


def test_chat_carries_tool_calls_as_blocks(scripted):
    llm, _ = scripted(("Let me compute.", [CALL]))
    message = llm.chat(USER, tools=OPENAI_TOOLS).message
    assert message.content == "Let me compute."
    [block] = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    assert (by_index(block.tool_call_id), block.tool_name, block.tool_kwargs) == ("call_0", "multiply", {"a": 6, "b": 7})
    assert "<tool_call>" not in message.content


async def test_achat_matches_chat(scripted):
    llm, _ = scripted(("Let me compute.", [CALL]), ("Let me compute.", [CALL]))
    sync = llm.chat(USER)
    response = await llm.achat(USER)
    assert alike(response.message) == alike(sync.message)  # but for the ids each reply gives its calls
    assert response.raw["usage"] == sync.raw["usage"]


def test_stream_chat_accumulates_message_and_yields_deltas(scripted):
    llm, _ = scripted(("Sure, computing 6 times 7 now.", [CALL]))
    chunks = list(llm.stream_chat(USER, tools=OPENAI_TOOLS))
    text = ""
    for chunk in chunks:
        text += chunk.delta
        assert chunk.message.content == text  # each chunk carries everything so far
    assert text == "Sure, computing 6 times 7 now."
    assert len(chunks) > 3
    final = chunks[-1]
    assert [c.tool_name for c in llm.get_tool_calls_from_response(final)] == ["multiply"]
    assert final.raw["usage"]["completion_tokens"] > 0
    assert all(c.raw is None for c in chunks[:-1])
    # the text comes first; the call's block appears once the text is over
    with_calls = [bool(llm.get_tool_calls_from_response(c, error_on_no_tool_call=False)) for c in chunks]
    assert with_calls == sorted(with_calls) and with_calls[0] is False


def test_stream_chat_hides_tool_call_markup(scripted):
    llm, _ = scripted(("", [CALL]))
    chunks = list(llm.stream_chat(USER, tools=OPENAI_TOOLS))
    assert "".join(c.delta for c in chunks) == ""
    assert chunks[-1].message.content == ""
    assert llm.get_tool_calls_from_response(chunks[-1])[0].tool_kwargs == {"a": 6, "b": 7}


async def test_astream_chat_matches_stream_chat(scripted):
    llm, _ = scripted(("Sure, computing.", [CALL]), ("Sure, computing.", [CALL]))
    sync = [(c.delta, c.message) for c in llm.stream_chat(USER)]
    gen = await llm.astream_chat(USER)
    assert alike([(c.delta, c.message) async for c in gen]) == alike(sync)


async def test_astream_chat_stopped_early_leaves_the_llm_usable(scripted):
    llm, _ = scripted(("A long answer that streams in many pieces.", []), ("Next.", []))
    gen = await llm.astream_chat(USER)
    async for _ in gen:
        break
    await gen.aclose()
    assert (await llm.achat(USER)).message.content == "Next."


async def test_a_stopped_async_stream_stops_its_worker_thread():
    produced, closed = [], []

    def slow_tokens():
        try:
            for i in range(100):
                produced.append(i)
                time.sleep(0.01)
                yield i
        finally:
            closed.append(True)

    stream = aiterate(slow_tokens)
    async for _ in stream:
        break
    await stream.aclose()
    assert len(produced) < 10 and closed == [True]


# ------------------------------------------------------------------ completion

def test_complete_sends_the_prompt_as_a_user_message(scripted):
    llm, engine = scripted(("Paris.", []))
    response = llm.complete("Capital of France?")
    assert response.text == "Paris."
    assert engine.requests[0]["messages"] == [{"role": "user", "content": "Capital of France?"}]
    assert response.raw["usage"]["prompt_tokens"] == len(engine.prompt_ids(engine.requests[0]["messages"]))


async def test_acomplete(scripted):
    llm, _ = scripted(("Paris.", []))
    assert (await llm.acomplete("Capital of France?")).text == "Paris."


def test_stream_complete(scripted):
    llm, _ = scripted(("Paris is the capital.", []))
    chunks = list(llm.stream_complete("Capital of France?"))
    assert "".join(c.delta for c in chunks) == chunks[-1].text == "Paris is the capital."


async def test_astream_complete(scripted):
    llm, _ = scripted(("Paris is the capital.", []))
    chunks = [c async for c in await llm.astream_complete("Capital of France?")]
    assert "".join(c.delta for c in chunks) == chunks[-1].text == "Paris is the capital."


def test_callbacks_count_tokens_from_usage(scripted):
    counter = TokenCountingHandler()
    llm, engine = scripted(("Paris.", []), ("Paris.", []), callback_manager=CallbackManager([counter]))
    llm.chat(USER)
    list(llm.stream_chat(USER))
    prompt = len(engine.prompt_ids(engine.requests[0]["messages"]))
    assert [e.prompt_token_count for e in counter.llm_token_counts] == [prompt, prompt]
    out = len(engine.tokenizer.encode("Paris.")) + 1  # and the end of sequence
    assert [e.completion_token_count for e in counter.llm_token_counts] == [out, out]


# ------------------------------------------------------------------ tools

def test_prepare_chat_with_tools(scripted):
    llm, _ = scripted()
    history = [ChatMessage(role="system", content="Use tools.")]
    kwargs = llm._prepare_chat_with_tools(TOOLS, user_msg="6 times 7?", chat_history=history)
    assert [m.content for m in kwargs["messages"]] == ["Use tools.", "6 times 7?"]
    assert len(history) == 1  # the caller's list is left alone
    assert [t["function"]["name"] for t in kwargs["tools"]] == ["multiply", "add"]
    assert kwargs["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
    assert kwargs["tool_choice"] == "auto"
    assert kwargs["allow_parallel_tool_calls"] is False


@pytest.mark.parametrize("extra, sent", [
    ({"tool_required": True}, "required"),
    ({"tool_choice": "add"}, "add"),
    ({"tool_choice": "none", "tool_required": True}, "none"),  # an explicit choice wins
    ({"tool_choice": {"type": "function", "function": {"name": "add"}}},
     {"type": "function", "function": {"name": "add"}}),
])
def test_tool_choice_reaches_the_engine(scripted, extra, sent):
    llm, engine = scripted(("", [("add", {"a": 1, "b": 2})]))
    llm.chat_with_tools(TOOLS, user_msg="1 plus 2?", **extra)
    assert engine.requests[0]["tool_choice"] == sent


def test_chat_with_tools_keeps_only_the_first_call_unless_parallel(scripted):
    llm, _ = scripted(("", TWO_CALLS), ("", TWO_CALLS))
    single = llm.chat_with_tools(TOOLS, user_msg="6*7 and 1+2?")
    both = llm.chat_with_tools(TOOLS, user_msg="6*7 and 1+2?", allow_parallel_tool_calls=True)
    assert [c.tool_name for c in llm.get_tool_calls_from_response(single)] == ["multiply"]
    assert [c.tool_name for c in llm.get_tool_calls_from_response(both)] == ["multiply", "add"]


def test_stream_chat_with_tools_keeps_only_the_first_call_unless_parallel(scripted):
    llm, _ = scripted(("", TWO_CALLS), ("", TWO_CALLS))
    single = list(llm.stream_chat_with_tools(TOOLS, user_msg="6*7 and 1+2?"))
    both = list(llm.stream_chat_with_tools(TOOLS, user_msg="6*7 and 1+2?", allow_parallel_tool_calls=True))
    assert len(llm.get_tool_calls_from_response(single[-1])) == 1
    assert len(llm.get_tool_calls_from_response(both[-1])) == 2
    # the calls in progress too
    assert max(len(call_blocks(c)) for c in single) == 1
    assert max(len(call_blocks(c)) for c in both) == 2


def test_stream_chat_with_tools_grows_the_tool_call_block(scripted):
    """The name comes first, then the arguments as their JSON text is committed, a string value
    included while it is still open; every response can be read by get_tool_calls_from_response,
    as FunctionAgent reads each one."""
    llm, _ = scripted(("", [WEATHER_CALL]))
    chunks = list(llm.stream_chat_with_tools(WEATHER_TOOLS, user_msg="Weather in San Francisco?"))
    seen = assert_call_grows(chunks, *WEATHER_CALL)
    assert len(seen) >= 4
    assert any(0 < len(kwargs.get("city", "")) < len("San Francisco") for kwargs in seen)
    for chunk in chunks:
        llm.get_tool_calls_from_response(chunk, error_on_no_tool_call=False)
    assert chunks[-1].raw["finish_reason"] == "tool_calls"


async def test_astream_chat_with_tools_grows_the_tool_call_block(scripted):
    llm, _ = scripted(("", [WEATHER_CALL]), ("", [WEATHER_CALL]))
    chunks = [c async for c in await llm.astream_chat_with_tools(WEATHER_TOOLS, user_msg="Weather in SF?")]
    assert len(assert_call_grows(chunks, *WEATHER_CALL)) >= 4
    sync = list(llm.stream_chat_with_tools(WEATHER_TOOLS, user_msg="Weather in SF?"))
    assert alike([(c.delta, c.message) for c in chunks]) == alike([(c.delta, c.message) for c in sync])


def test_a_call_that_misfits_its_schema_stays_a_call_with_its_problem_beside_it(scripted):
    """As LlamaIndex's OpenAI LLM reads OpenAI's calls (issue 48): arguments that parse make a call, the
    schema misfit reported in the message's additional_kwargs, in the stream's last response as in chat's."""
    llm, _ = scripted(("", [("multiply", {"a": "six", "b": 7})]), ("", [("multiply", {"a": "six", "b": 7})]))
    chunks = list(llm.stream_chat_with_tools(TOOLS, user_msg="six times 7?"))
    response = llm.chat_with_tools(TOOLS, user_msg="six times 7?")
    for last in (chunks[-1], response):
        [block] = call_blocks(last)
        assert (block.tool_name, block.tool_kwargs) == ("multiply", {"a": "six", "b": 7})
        [problem] = last.message.additional_kwargs["tool_call_problems"]
        assert (problem["id"], problem["name"]) == (block.tool_call_id, "multiply")
        assert "'six' is not of type 'integer'" in problem["error"]
        assert last.raw["invalid_tool_calls"] == [] and last.raw["finish_reason"] == "tool_calls"
    assert [(c.tool_name, c.tool_kwargs) for c in llm.get_tool_calls_from_response(response)] == [
        ("multiply", {"a": "six", "b": 7})]


def test_a_streamed_call_whose_arguments_do_not_parse_is_dropped_from_the_final_message(scripted):
    bad = '<tool_call>\n{"name": "multiply", "arguments": {"a": six, "b": 7}}\n</tool_call>'
    llm = OoOSpec(engine=Scripted(bad))
    chunks = list(llm.stream_chat_with_tools(TOOLS, user_msg="six times 7?"))
    assert call_blocks(chunks[-2])[0].tool_name == "multiply"  # shown while it streamed
    assert call_blocks(chunks[-1]) == [] and "tool_call_problems" not in chunks[-1].message.additional_kwargs
    [invalid] = chunks[-1].raw["invalid_tool_calls"]
    assert (invalid["name"], invalid["arguments"]) == ("multiply", '{"a": six, "b": 7}')
    assert "not valid JSON" in invalid["error"]
    assert chunks[-1].raw["finish_reason"] == "tool_calls"  # the reply holds a call, as OpenAI's would say


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("reply", list(CALL_REPLIES))
async def test_chat_and_stream_chat_give_the_same_message(reply, parallel):
    """Issue 48: chat, the last response of stream_chat, achat and astream_chat are one message (calls,
    their problems, raw), on a schema misfit, an unparseable call and two calls."""
    llm = OoOSpec(engine=Scripted(*[CALL_REPLIES[reply]] * 4))
    kw = dict(tools=[BOOK_TABLE], allow_parallel_tool_calls=parallel)
    ask = [ChatMessage(role="user", content="Book a table for 4 people at Da Michele at 19:30.")]
    responses = [llm.chat(ask, **kw), list(llm.stream_chat(ask, **kw))[-1], await llm.achat(ask, **kw),
                 [r async for r in await llm.astream_chat(ask, **kw)][-1]]
    assert all(alike((r.message, r.raw)) == alike((responses[0].message, responses[0].raw)) for r in responses)
    message, raw = responses[0].message, responses[0].raw
    blocks = [b for b in message.blocks if isinstance(b, ToolCallBlock)]
    problems = message.additional_kwargs.get("tool_call_problems", [])
    assert raw["finish_reason"] == "tool_calls"
    if reply == "misfit":
        assert [b.tool_kwargs["people"] for b in blocks] == ["4"] and [p["id"] for p in problems] == [blocks[0].tool_call_id]
    elif reply == "unparseable":
        assert blocks == [] and problems == [] and len(raw["invalid_tool_calls"]) == 1
    else:
        assert len(blocks) == (2 if parallel else 1)
        assert [p["id"] for p in problems] == [b.tool_call_id for b in blocks[1:]]


async def test_achat_and_astream_chat_with_tools_agree(scripted):
    llm, _ = scripted(("", [CALL]), ("", [CALL]))
    response = await llm.achat_with_tools(TOOLS, user_msg="6 times 7?", tool_required=True)
    chunks = [c async for c in await llm.astream_chat_with_tools(TOOLS, user_msg="6 times 7?", tool_required=True)]
    assert alike(llm.get_tool_calls_from_response(response)) == alike(llm.get_tool_calls_from_response(chunks[-1]))


def test_get_tool_calls_from_response_gives_tool_selections(scripted):
    llm, _ = scripted(("", TWO_CALLS))
    calls = llm.get_tool_calls_from_response(llm.chat_with_tools(TOOLS, user_msg="?", allow_parallel_tool_calls=True))
    assert [(by_index(c.tool_id), c.tool_name, c.tool_kwargs) for c in calls] == [
        ("call_0", "multiply", {"a": 6, "b": 7}), ("call_1", "add", {"a": 1, "b": 2})]
    assert calls[0].tool_id.rsplit("_", 1)[0] == calls[1].tool_id.rsplit("_", 1)[0]  # one reply's ids


def test_no_tool_call_is_empty_or_a_clear_error(scripted):
    llm, _ = scripted(("I can answer that myself: 42.", []))
    response = llm.chat_with_tools(TOOLS, user_msg="6 times 7?")
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="expected at least one tool call.*got none.*42"):
        llm.get_tool_calls_from_response(response)


def test_no_tool_call_error_names_a_call_that_could_not_be_read(scripted):
    llm, _ = scripted(("", []))
    response = llm.chat(USER)
    response.raw["invalid_tool_calls"] = [{"id": "call_0", "name": "multiply", "arguments": '{"a": six}',
                                           "error": "call is not valid JSON: Expecting value"}]
    with pytest.raises(ValueError, match="could not be read: call is not valid JSON"):
        llm.get_tool_calls_from_response(response)


def test_predict_and_call_runs_the_tool(scripted):
    llm, _ = scripted(("", [CALL]))
    result = llm.predict_and_call(TOOLS, user_msg="6 times 7?")
    assert result.response == "42"
    assert result.sources[0].tool_name == "multiply"


async def test_apredict_and_call_runs_the_tool(scripted):
    llm, _ = scripted(("", [("add", {"a": 1, "b": 2})]))
    assert (await llm.apredict_and_call(TOOLS, user_msg="1 plus 2?")).response == "3"


class Album(BaseModel):
    """An album."""
    title: str
    year: int


def test_structured_predict_returns_the_pydantic_object(scripted):
    llm, engine = scripted(("", [("Album", {"title": "Blue", "year": 1971})]))
    album = llm.structured_predict(Album, PromptTemplate("Name an album by {artist}."), artist="Joni Mitchell")
    assert album == Album(title="Blue", year=1971)
    request = engine.requests[0]
    assert request["tool_choice"] == "required"
    assert request["tools"][0]["function"]["name"] == "Album"
    assert "Joni Mitchell" in request["messages"][-1]["content"]


async def test_astructured_predict_returns_the_pydantic_object(scripted):
    llm, _ = scripted(("", [("Album", {"title": "Blue", "year": 1971})]))
    album = await llm.astructured_predict(Album, PromptTemplate("Name an album by {artist}."), artist="Joni")
    assert album == Album(title="Blue", year=1971)


# ------------------------------------------------------------------ histories

def test_history_with_tool_call_blocks_and_results(scripted):
    llm, engine = scripted(("6 times 7 is 42.", []))
    history = [
        *USER,
        ChatMessage(role="assistant", blocks=[TextBlock(text=""), ToolCallBlock(
            tool_call_id="call_9", tool_name="multiply", tool_kwargs={"a": 6, "b": 7})]),
        ChatMessage(role="tool", content="42", additional_kwargs={"tool_call_id": "call_9"}),
    ]
    llm.chat_with_tools(TOOLS, chat_history=history)
    assert engine.requests[0]["messages"][1:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_9"},
    ]


def test_the_text_blocks_of_a_message_are_joined_as_they_are(scripted):
    llm, engine = scripted(("Hi.", []))
    llm.chat([ChatMessage(role="user", blocks=[TextBlock(text="Hello, "), TextBlock(text="world.")])])
    assert engine.requests[0]["messages"] == [{"role": "user", "content": "Hello, world."}]


def test_history_with_older_additional_kwargs_tool_calls(scripted):
    llm, engine = scripted(("42.", []))
    legacy = ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [
        {"id": "abc", "type": "function", "function": {"name": "multiply", "arguments": json.dumps({"a": 6, "b": 7})}},
    ]})
    llm.chat([*USER, legacy, ChatMessage(role="tool", content="42", additional_kwargs={"tool_call_id": "abc"})])
    assert engine.requests[0]["messages"][1]["tool_calls"] == [
        {"id": "abc", "type": "function", "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}}]


def test_its_own_replies_go_back_into_the_history(scripted):
    llm, engine = scripted(("Computing.", [CALL]), ("It is 42.", []))
    first = llm.chat_with_tools(TOOLS, chat_history=list(USER)).message
    [call_id] = [b.tool_call_id for b in first.blocks if isinstance(b, ToolCallBlock)]
    result = ChatMessage(role="tool", content="42", additional_kwargs={"tool_call_id": call_id})
    llm.chat_with_tools(TOOLS, chat_history=[*USER, first, result])
    assert engine.requests[1]["messages"][1:] == [
        {"role": "assistant", "content": "Computing.", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}}]},
        {"role": "tool", "content": "42", "tool_call_id": call_id},
    ]


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("messages, error, match", [
    ("What is 6 times 7?", ValueError, "valid list"),  # caught by LlamaIndex's callback layer
    ([], ValueError, "messages is empty"),
    ([{"role": "user", "content": "hi"}], TypeError, r"messages\[0\] must be a ChatMessage, got dict"),
    ([ChatMessage(role="function", content="x")], ValueError, r"role 'function'; OoOSpec accepts"),
    ([ChatMessage(role="user", blocks=[ImageBlock(url="http://example.com/cat.png")])], ValueError,
     r"messages\[0\] holds a ImageBlock; OoOSpec targets read text only"),
    ([ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [
        {"id": "x", "function": {"name": "multiply", "arguments": "{a: 6"}}]})], ValueError,
     "'multiply' has arguments that are not valid JSON"),
])
def test_bad_messages_get_clear_errors(scripted, messages, error, match):
    llm, engine = scripted(("never reached", []))
    with pytest.raises(error, match=match):
        llm.chat(messages)
    assert engine.requests == []


def test_unknown_chat_options_are_rejected(scripted):
    llm, _ = scripted(("never reached", []))
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['frequency_penalty'\]"):
        llm.chat(USER, frequency_penalty=0.7)
    with pytest.raises(TypeError, match="unexpected keyword"):
        llm.stream_chat(USER, logit_bias={1: 5})  # raised at the call, not on the first chunk


# ------------------------------------------------------------------ sampling

def test_sampling_settings_reach_the_engine(scripted):
    """Fields (LlamaIndex's OpenAI LLM's names), then a call's keyword arguments over them."""
    llm, engine = scripted(("a", []), ("b", []), ("c", []), temperature=0.1, top_p=0.9, top_k=40, min_p=0.05, seed=3)
    llm.chat(USER)
    llm.chat(USER, temperature=0.7, seed=4)
    llm.complete("hi", temperature=0, logprobs=True, top_logprobs=2)
    sampling = ("temperature", "top_p", "top_k", "min_p", "seed", "logprobs")
    assert [{k: r[k] for k in sampling if k in r} for r in engine.requests] == [
        {"temperature": 0.1, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3},
        {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 4},
        {"temperature": 0, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3, "logprobs": 2}]


@pytest.mark.parametrize("bad, says", [(bad, says) for _, bad, says in BAD_SAMPLING] + [
    ({"logprobs": False, "top_logprobs": 3}, "top_logprobs=3 needs logprobs=true")])
def test_bad_sampling_settings_are_clear_errors(scripted, bad, says):
    """At construction, and as a call's keyword arguments, before anything is decoded."""
    with pytest.raises(ValueError, match=says):
        scripted(**bad)
    llm, engine = scripted(("never reached", []))
    with pytest.raises(ValueError, match=says):
        llm.chat(USER, **bad)
    with pytest.raises(ValueError, match=says):
        llm.stream_chat(USER, **bad)  # raised at the call, not on the first chunk
    assert engine.requests == []


@pytest.mark.parametrize("top_logprobs", [0, 2])
def test_logprobs_fill_the_chat_response(scripted, top_logprobs):
    """`ChatResponse.logprobs`: per token, its top alternatives as LogProbs (as llama-index-llms-openai gives
    them), or the chosen token alone when none are asked for. Streamed, each response has them so far."""
    llm, engine = scripted(("Hello there, friend.", []), ("Hello there, friend.", []), logprobs=True,
                           top_logprobs=top_logprobs)
    response = llm.chat(USER)
    tok = engine.tokenizer
    assert len(response.logprobs) == response.raw["usage"]["completion_tokens"] == \
        len(tok.encode("Hello there, friend.")) + 1  # and the end of sequence
    assert all(len(token) == max(1, top_logprobs) for token in response.logprobs)
    # greedy: the likeliest token first, the others below it
    assert all([t.logprob for t in token] == sorted((t.logprob for t in token), reverse=True) for token in response.logprobs)
    if not top_logprobs:
        assert "".join(token[0].token for token in response.logprobs) == "Hello there, friend." + tok.eos_token
    streamed = list(llm.stream_chat(USER))
    counts = [len(r.logprobs or []) for r in streamed]
    assert counts == sorted(counts) and streamed[-1].logprobs == response.logprobs


def test_no_logprobs_unless_asked(scripted):
    llm, _ = scripted(("Hi.", []))
    assert llm.chat(USER).logprobs is None


async def test_a_function_agent_at_temperature_0_1(scripted):
    """LlamaIndex's OpenAI-style default, temperature=0.1: a FunctionAgent calls the tool, reads its
    result and answers, with no error."""
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    llm, engine = scripted(("", [CALL]), ("6 times 7 is 42.", []), temperature=0.1)
    handler = FunctionAgent(tools=TOOLS, llm=llm).run("What is 6 times 7?", max_iterations=4)
    events = [event async for event in handler.stream_events()]
    response = await handler
    assert [e.tool_output.content for e in events if isinstance(e, ToolCallResult)] == ["42"]
    assert "42" in str(response)
    assert [r["temperature"] for r in engine.requests] == [0.1, 0.1]


def test_tools_must_be_llamaindex_tools(scripted):
    llm, _ = scripted()
    with pytest.raises(TypeError, match=r"tools\[0\] must be a LlamaIndex BaseTool .*got function"):
        llm.chat_with_tools([multiply], user_msg="6 times 7?")
