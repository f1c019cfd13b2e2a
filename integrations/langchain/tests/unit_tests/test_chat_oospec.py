"""ChatOoOSpec's own behaviour, on the `Scripted` test double (see conftest.py): the real engine on a tiny
scripted model, no weights loaded."""
from __future__ import annotations

import functools
import json
import operator
from typing import TypedDict

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field

from langchain_oospec import ChatOoOSpec
from langchain_oospec._messages import to_openai_messages
from langchain_oospec.chat_models import _usage_metadata
from oospec_agents import Engine
from oospec_agents.errors import ToolSchemaError, UnknownToolError
from oospec_agents.frontend import Usage
from oospec_agents.testing import BAD_SAMPLING, BOOK_TABLE, CALL_ID, CALL_REPLIES, by_index


@tool
def get_current_weather(location: str) -> str:
    """Get the current weather in a city."""
    return f"It is sunny in {location}."


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


WEATHER_CALL = '<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Paris"}}\n</tool_call>'


def collect(chunks) -> AIMessageChunk:
    full = None
    for chunk in chunks:
        full = chunk if full is None else full + chunk
    return full


# ---------------------------------------------------------------- construction


def test_constructing_loads_no_engine(monkeypatch):
    monkeypatch.setattr(Engine, "shared", classmethod(lambda *a, **k: pytest.fail("engine loaded")))
    model = ChatOoOSpec(model="embedded", sidecar="embedded", target_device="cpu", max_tokens=8, stop=["x"])
    assert (model.model, model.method, model.max_tokens, model.stop) == ("embedded", "oospec", 8, ["x"])


def test_model_and_sidecar_may_be_paths(tmp_path):
    (tmp_path / "target.gguf").touch()  # paths that exist: a missing one is refused at construction
    (tmp_path / "sidecar").mkdir()
    model = ChatOoOSpec(model=tmp_path / "target.gguf", sidecar=tmp_path / "sidecar")
    assert (model.model, model.sidecar) == (str(tmp_path / "target.gguf"), str(tmp_path / "sidecar"))


def test_sidecar_false_reaches_the_engine_as_no_sidecar(monkeypatch, scripted):
    """None is the engine's default (the embedded sidecar, for every target); False loads none."""
    seen = []

    def shared(cls, model, sidecar, **options):
        seen.append((model, sidecar))
        return scripted("hi")
    monkeypatch.setattr(Engine, "shared", classmethod(shared))
    for sidecar in (False, None):
        ChatOoOSpec(model="Qwen/Qwen2.5-7B-Instruct", sidecar=sidecar).invoke("hi")
    assert seen == [("Qwen/Qwen2.5-7B-Instruct", False), ("Qwen/Qwen2.5-7B-Instruct", None)]


@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.1])
def test_a_sampling_temperature_is_accepted(temperature):
    """Agent templates copy temperature=0.7; OpenAI's default is 1; LlamaIndex's 0.1: all are served."""
    assert ChatOoOSpec(temperature=temperature).temperature == temperature


def test_temperature_zero_or_unset_is_accepted():
    assert ChatOoOSpec(temperature=0).temperature == 0
    assert ChatOoOSpec().temperature is None


@pytest.mark.parametrize("bad, says", [(bad, says) for _, bad, says in BAD_SAMPLING] + [
    ({"n": 0}, "n must be an integer from 1 to 8"),
    ({"n": 9}, "n must be an integer from 1 to 8"),
    ({"frequency_penalty": 0.5}, "frequency_penalty=0.5 is not served"),
    ({"presence_penalty": -1.0}, "presence_penalty=-1.0 is not served"),
    ({"logit_bias": {50256: -100}}, "logit_bias is not served"),
])
def test_bad_or_unserved_sampling_settings_are_clear_errors(scripted, bad, says):
    """At construction, and as a call's arguments (before the engine decodes anything)."""
    with pytest.raises(ValueError, match=says):
        ChatOoOSpec(**bad)
    engine = scripted("hi")
    with pytest.raises(ValueError, match=says):
        ChatOoOSpec(engine=engine).invoke("hello", **bad)
    assert engine.requests == []


def test_neutral_penalties_and_an_empty_logit_bias_are_accepted(scripted):
    model = ChatOoOSpec(engine=scripted("hi", "hi"), frequency_penalty=0, presence_penalty=0, logit_bias={})
    assert model.invoke("hello").content == model.invoke("hello", frequency_penalty=0.0, logit_bias={}).content


def test_per_call_temperature_is_checked_too(scripted):
    model = ChatOoOSpec(engine=scripted("hi"))
    with pytest.raises(ValueError, match="temperature must be a number from 0 to 2 .*, got -0.5"):
        model.invoke("hello", temperature=-0.5)


def test_unknown_call_arguments_are_an_error(scripted):
    with pytest.raises(TypeError, match=r"unsupported call arguments \['verbosity'\]"):
        ChatOoOSpec(engine=scripted("hi")).invoke("hello", verbosity="low")


def test_sampling_settings_reach_the_engine(scripted):
    """Fields, then a call's arguments over them (through bind too), as ChatOpenAI takes them."""
    engine = scripted("a", "b", "c")
    model = ChatOoOSpec(engine=engine, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=3)
    model.invoke("x")
    model.invoke("x", temperature=1.0, seed=4, top_k=0)
    model.bind(temperature=0, logprobs=True, top_logprobs=2).invoke("x")
    sampling = ("temperature", "top_p", "top_k", "min_p", "seed", "logprobs")
    assert [{k: r[k] for k in sampling if k in r} for r in engine.requests] == [
        {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3},
        {"temperature": 1.0, "top_p": 0.9, "top_k": 0, "min_p": 0.05, "seed": 4},
        {"temperature": 0, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3, "logprobs": 2}]


def test_a_seed_reaches_the_engine_and_a_bad_one_is_an_error(scripted):
    """ChatOpenAI code passes `seed` for reproducible replies: the engine draws with it."""
    engine = scripted("hi", "hi")
    model = ChatOoOSpec(engine=engine)
    assert model.invoke("hello", seed=1).content == model.bind(seed=2).invoke("hello").content == "hi"
    assert [r["seed"] for r in engine.requests] == [1, 2]
    with pytest.raises(ValueError, match="seed must be an integer, got 'x'"):
        model.invoke("hello", seed="x")


@pytest.mark.parametrize("async_", [False, True])
async def test_n_gives_a_generation_per_choice_each_with_its_own_seed(scripted, async_):
    """As ChatOpenAI's `n`: several ChatGenerations in one ChatResult; choice i draws with seed + i."""
    engine = scripted("first", "second", "third")
    model = ChatOoOSpec(engine=engine, temperature=0.7, seed=10, n=3)
    result = await model.agenerate([[HumanMessage("hi")]]) if async_ else model.generate([[HumanMessage("hi")]])
    assert [g.message.content for g in result.generations[0]] == ["first", "second", "third"]
    assert [r["seed"] for r in engine.requests] == [10, 11, 12]
    assert all(g.message.usage_metadata["output_tokens"] >= 1 for g in result.generations[0])


def test_n_as_a_call_argument_and_without_a_seed(scripted):
    engine = scripted("a", "b")
    result = ChatOoOSpec(engine=engine, temperature=1.0).generate([[HumanMessage("hi")]], n=2)
    assert [g.text for g in result.generations[0]] == ["a", "b"]
    assert all("seed" not in r for r in engine.requests)  # each choice draws a fresh seed


def test_streaming_more_than_one_choice_is_an_error(scripted):
    with pytest.raises(ValueError, match="n must be 1 when streaming"):
        list(ChatOoOSpec(engine=scripted("a", "b"), n=2).stream("hi"))


@pytest.mark.parametrize("how", ["invoke", "stream", "generate"])
def test_logprobs_are_in_response_metadata_as_chat_openai_gives_them(scripted, how):
    """`response_metadata["logprobs"] == {"content": [{"token", "logprob", "bytes", "top_logprobs"}, ...]}`,
    one entry per generated token; streamed, each round's in a chunk, which the sum concatenates."""
    engine = scripted("Hello there, friend.")
    model = ChatOoOSpec(engine=engine, logprobs=True, top_logprobs=2)
    if how == "invoke":
        message = model.invoke("hi")
    elif how == "stream":
        chunks = list(model.stream("hi"))
        assert sum(1 for c in chunks if c.response_metadata.get("logprobs")) >= 2
        message = collect(chunks)
    else:
        generation = model.generate([[HumanMessage("hi")]]).generations[0][0]
        assert generation.generation_info["logprobs"] == generation.message.response_metadata["logprobs"]
        message = generation.message
    content = message.response_metadata["logprobs"]["content"]
    tok = engine.tokenizer
    assert len(content) == message.usage_metadata["output_tokens"] == len(tok.encode("Hello there, friend.")) + 1
    assert "".join(entry["token"] for entry in content) == "Hello there, friend." + tok.eos_token
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(entry["top_logprobs"]) == 2
        assert entry["bytes"] == list(entry["token"].encode())
        # greedy: the chosen token is the likeliest, top_logprobs[0], the next below it
        assert (entry["top_logprobs"][0]["token"], entry["top_logprobs"][0]["logprob"]) == (entry["token"], entry["logprob"])
        assert entry["logprob"] <= 0 and entry["top_logprobs"][1]["logprob"] <= entry["logprob"]


def test_no_logprobs_unless_asked(scripted):
    assert "logprobs" not in ChatOoOSpec(engine=scripted("hi")).invoke("hello").response_metadata


def test_an_agent_loop_at_temperature_0_7(scripted):
    """An agent whose code sets temperature=0.7 (as agent templates do) calls the tool, reads its
    result and answers, with no error."""
    from langchain.agents import create_agent
    engine = scripted(WEATHER_CALL, "It is sunny in Paris.")
    agent = create_agent(ChatOoOSpec(engine=engine, temperature=0.7), tools=[get_current_weather])
    messages = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]}, {"recursion_limit": 6})["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert messages[2].content == "It is sunny in Paris." and messages[3].content == "It is sunny in Paris."
    assert [r["temperature"] for r in engine.requests] == [0.7, 0.7]


def test_same_models_share_one_engine(monkeypatch, scripted):
    loads = []
    monkeypatch.setattr(Engine, "_shared", {})
    monkeypatch.setattr(Engine, "from_pretrained",
                        classmethod(lambda cls, *args, **kw: loads.append((args, kw)) or scripted("a", "b")))
    first, second = ChatOoOSpec(max_tokens=5), ChatOoOSpec(max_tokens=9)
    first.invoke("hi")
    second.invoke("hi")
    assert loads == [(("embedded", None), {})]
    assert first._engines.get() is second._engines.get()


def test_prefix_cache_budget_reaches_the_engine(monkeypatch, scripted):
    loads = []
    monkeypatch.setattr(Engine, "_shared", {})
    monkeypatch.setattr(Engine, "from_pretrained",
                        classmethod(lambda cls, *args, **kw: loads.append(kw) or scripted("a")))
    ChatOoOSpec(prefix_cache_tokens=0).invoke("hi")
    assert loads == [{"prefix_cache_tokens": 0}]


def test_chat_template_reaches_the_engine(monkeypatch, scripted, tmp_path):
    loads = []
    monkeypatch.setattr(Engine, "_shared", {})
    monkeypatch.setattr(Engine, "from_pretrained",
                        classmethod(lambda cls, *args, **kw: loads.append(kw) or scripted("a", "b")))
    ChatOoOSpec(chat_template="{{ messages }}").invoke("hi")
    ChatOoOSpec(chat_template=tmp_path / "t.jinja").invoke("hi")  # a path is passed as its string
    assert loads == [{"chat_template": "{{ messages }}"}, {"chat_template": str(tmp_path / "t.jinja")}]


def test_given_engine_names_the_model(scripted):
    assert ChatOoOSpec(engine=scripted()).model == "scripted-test-double"


def test_ls_params_honour_a_model_override():
    model = ChatOoOSpec(max_tokens=12, stop=["END"], temperature=0)
    assert model._get_ls_params() == {"ls_provider": "oospec", "ls_model_name": "embedded",
                                      "ls_model_type": "chat", "ls_max_tokens": 12, "ls_temperature": 0,
                                      "ls_stop": ["END"]}
    assert model._get_ls_params(model="other")["ls_model_name"] == "other"


# ---------------------------------------------------------------- bind_tools


def test_bind_tools_keeps_openai_dicts_under_tools():
    bound = ChatOoOSpec().bind_tools([get_current_weather, add])
    assert [t["function"]["name"] for t in bound.kwargs["tools"]] == ["get_current_weather", "add"]
    assert bound.kwargs["tools"][1] == {
        "type": "function",
        "function": {"name": "add", "description": "Add two integers.",
                     "parameters": {"type": "object", "required": ["a", "b"],
                                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
    assert "tool_choice" not in bound.kwargs


@pytest.mark.parametrize("choice, bound_as", [
    ("auto", "auto"), ("none", "none"), ("any", "required"), ("required", "required"), ("add", "add"),
    ({"type": "function", "function": {"name": "add"}}, "add"),
])
def test_tool_choice_forms(choice, bound_as):
    bound = ChatOoOSpec().bind_tools([get_current_weather, add], tool_choice=choice)
    assert bound.kwargs["tool_choice"] == bound_as


def test_any_with_a_single_tool_names_it():
    assert ChatOoOSpec().bind_tools([add], tool_choice="any").kwargs["tool_choice"] == "add"


def test_tool_choice_naming_no_bound_tool_is_an_error():
    with pytest.raises(UnknownToolError, match=r"unknown tool 'mul'; offered tools: \['add'\]"):
        ChatOoOSpec().bind_tools([add], tool_choice="mul")


def test_bad_tool_schema_is_an_error_at_bind_time():
    bad = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object",
                                                                            "properties": {"q": {"type": "text"}}}}}
    with pytest.raises(ToolSchemaError, match="tool 'lookup' has an invalid JSON Schema"):
        ChatOoOSpec().bind_tools([bad])


def test_object_that_is_no_tool_is_an_error():
    with pytest.raises(ToolSchemaError, match=r"tools\[1\] \(42\) cannot be converted to an OpenAI tool"):
        ChatOoOSpec().bind_tools([add, 42])


# ---------------------------------------------------------------- messages


def test_agent_history_converts_to_engine_dicts():
    history = [
        SystemMessage("Be brief."),
        HumanMessage("Weather in Paris, and 1+2?"),
        AIMessage("", tool_calls=[{"name": "get_current_weather", "args": {"location": "Paris"}, "id": "c1"},
                                  {"name": "add", "args": {"a": 1, "b": 2}, "id": "c2"}]),
        ToolMessage("It is sunny in Paris.", tool_call_id="c1", name="get_current_weather"),
        ToolMessage("3", tool_call_id="c2"),
        AIMessage("Sunny, and 3."),
        HumanMessage("Thanks!"),
    ]
    assert to_openai_messages(history) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris, and 1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_current_weather",
                                                          "arguments": {"location": "Paris"}}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "content": "It is sunny in Paris.", "tool_call_id": "c1", "name": "get_current_weather"},
        {"role": "tool", "content": "3", "tool_call_id": "c2"},
        {"role": "assistant", "content": "Sunny, and 3."},
        {"role": "user", "content": "Thanks!"},
    ]


def test_list_content_keeps_text_and_drops_repeated_tool_blocks():
    message = AIMessage([{"type": "text", "text": "Let me add."},
                         {"type": "tool_use", "id": "c1", "name": "add", "input": {"a": 1, "b": 2}}],
                        tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1"}])
    (converted,) = to_openai_messages([message])
    assert converted["content"] == "Let me add."
    assert converted["tool_calls"][0]["function"] == {"name": "add", "arguments": {"a": 1, "b": 2}}


def test_non_text_content_is_an_error():
    image = HumanMessage([{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
    with pytest.raises(ValueError, match=r"messages\[0\]: ChatOoOSpec reads text only, got a 'image_url'"):
        to_openai_messages([image])


# ---------------------------------------------------------------- results


def test_invoke_returns_calls_with_ids_usage_and_stats(scripted):
    engine = scripted("Checking." + WEATHER_CALL)
    bound = ChatOoOSpec(engine=engine).bind_tools([get_current_weather], tool_choice="auto")
    message = bound.invoke("Weather in Paris?")
    assert message.content == "Checking."
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_current_weather", {"location": "Paris"})]
    assert CALL_ID.fullmatch(message.tool_calls[0]["id"])
    request = engine.requests[0]
    prompt = len(engine.prompt_ids(request["messages"], request["tools"]))  # the prompt as the engine renders it
    out = len(engine.tokenizer.encode("Checking." + WEATHER_CALL)) + 1  # and the end of sequence
    assert message.usage_metadata == {"input_tokens": prompt, "output_tokens": out, "total_tokens": prompt + out}
    meta = dict(message.response_metadata)
    stats = {k: meta.pop(k) for k in ("target_forwards", "accepted_by_source", "prefill_s", "decode_s")}
    assert meta == {"model_name": "scripted-test-double", "finish_reason": "tool_calls",
                    "tool_call_problems": [],  # every call fits its schema
                    "method": "oospec", "hint_bytes": None, "sidecar": None,  # it has no sidecar
                    # OpenAI's usage object, where ChatOpenAI keeps it
                    "token_usage": {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out,
                                    "prompt_tokens_details": {"cached_tokens": 0},
                                    "completion_tokens_details": {"accepted_prediction_tokens": 0,
                                                                  "rejected_prediction_tokens": 0}}}
    # the engine's stats: each forward commits one token of its own, the drafts it accepted the rest
    assert set(stats["accepted_by_source"]) >= {"schema", "retrieval", "hint"}
    assert stats["target_forwards"] + sum(stats["accepted_by_source"].values()) == out
    assert stats["accepted_by_source"]["schema"] > 0 and stats["target_forwards"] < out  # the call was drafted
    assert stats["prefill_s"] > 0 and stats["decode_s"] > 0
    request = engine.requests[0]
    assert request["tools"][0]["function"]["name"] == "get_current_weather"
    assert request["messages"] == [{"role": "user", "content": "Weather in Paris?"}]


def test_cached_prompt_tokens_are_reported_as_cache_reads():
    assert _usage_metadata(Usage(prompt_tokens=11, completion_tokens=3, cached_prompt_tokens=8)) == {
        "input_tokens": 11, "output_tokens": 3, "total_tokens": 14, "input_token_details": {"cache_read": 8}}
    assert "input_token_details" not in _usage_metadata(Usage(prompt_tokens=11, completion_tokens=3))


def test_a_call_that_misfits_its_schema_is_a_tool_call_with_its_problem_in_response_metadata(scripted):
    """As ChatOpenAI and ChatOllama class it (issue 48): its arguments parse, so it is a tool call; the
    validator's message is beside it, under its id. Only arguments that do not parse are invalid."""
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": "one", "b": 2}}\n</tool_call>'
    message = ChatOoOSpec(engine=scripted(reply)).bind_tools([add]).invoke("1+2?")
    assert message.invalid_tool_calls == []
    (call,) = message.tool_calls
    assert (call["name"], call["args"]) == ("add", {"a": "one", "b": 2})
    (problem,) = message.response_metadata["tool_call_problems"]
    assert (problem["id"], problem["name"]) == (call["id"], "add")
    assert "'one' is not of type 'integer'" in problem["error"]
    assert message.response_metadata["finish_reason"] == "tool_calls"


def test_arguments_that_do_not_parse_make_an_invalid_call_its_reason_in_response_metadata(scripted):
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": one, "b": 2}}\n</tool_call>'
    message = ChatOoOSpec(engine=scripted(reply)).bind_tools([add]).invoke("1+2?")
    assert message.tool_calls == []
    (bad,) = message.invalid_tool_calls
    assert (bad["name"], bad["args"], bad["error"]) == ("add", '{"a": one, "b": 2}', None)  # as a summed stream's
    (problem,) = message.response_metadata["tool_call_problems"]
    assert problem["id"] == bad["id"] and "not valid JSON" in problem["error"]
    assert message.response_metadata["finish_reason"] == "tool_calls"


def test_call_arguments_and_settings_reach_the_engine(scripted):
    engine = scripted("a", "b")
    model = ChatOoOSpec(engine=engine, max_tokens=7, stop=["END"], method="toolspec")
    model.invoke("x")
    model.invoke("x", stop=["STOP"], max_tokens=3, method="ar")
    assert [(r["max_new_tokens"], r["stop"], r["method"]) for r in engine.requests] == [
        (7, ["END"], "toolspec"), (3, ["STOP"], "ar")]


@pytest.mark.parametrize("how", ["invoke", "stream"])
def test_parallel_tool_calls_false_keeps_the_first_call_as_chat_openai_asks(scripted, how):
    """`bind_tools(tools, parallel_tool_calls=False)` (as LangGraph's guides bind ChatOpenAI): one call,
    the reply's first, in the stream and in the message, as the server keeps it."""
    second = WEATHER_CALL.replace("Paris", "Rome")
    engine = scripted(WEATHER_CALL + second, WEATHER_CALL + second)
    model = ChatOoOSpec(engine=engine)
    every = model.bind_tools([get_current_weather]).invoke("Paris and Rome?")
    bound = model.bind_tools([get_current_weather], parallel_tool_calls=False)
    message = bound.invoke("Paris and Rome?") if how == "invoke" else collect(bound.stream("Paris and Rome?"))
    assert [c["args"] for c in every.tool_calls] == [{"location": "Paris"}, {"location": "Rome"}]
    assert [(c["id"], c["args"]) for c in by_index(message.tool_calls)] == \
        [(by_index(every.tool_calls[0]["id"]), {"location": "Paris"})]  # the first call, in a reply of its own
    assert message.invalid_tool_calls == []


def test_a_prediction_reaches_the_engine_as_chat_openai_sends_it(scripted):
    engine = scripted("a")
    prediction = {"type": "content", "content": "a"}
    ChatOoOSpec(engine=engine).invoke("x", prediction=prediction)
    assert engine.requests[0]["prediction"] == prediction


# ---------------------------------------------------------------- streaming


def test_stream_yields_content_deltas_then_the_call_name_then_argument_fragments_then_usage(scripted):
    engine = scripted("Checking the weather." + WEATHER_CALL)
    bound = ChatOoOSpec(engine=engine).bind_tools([get_current_weather])
    chunks = list(bound.stream("Weather in Paris?"))
    texts = [c.content for c in chunks if c.content]
    assert len(texts) > 1 and "".join(texts) == "Checking the weather."
    assert not any("<tool" in t for t in texts)
    kinds = ["text" if c.content else "call" if c.tool_call_chunks else "last" for c in chunks]
    assert kinds == sorted(kinds, key=["text", "call", "last"].index), f"out of order: {kinds}"
    (name, *fragments) = [c.tool_call_chunks for c in chunks if c.tool_call_chunks]
    # the name (with the call's id) comes first, on its own; then only argument text
    assert by_index(name) == [{"name": "get_current_weather", "args": "", "id": "call_0", "index": 0,
                               "type": "tool_call_chunk"}]
    assert len(fragments) > 1, "the arguments should arrive in several fragments"
    assert all(len(f) == 1 and (f[0]["name"], f[0]["id"], f[0]["index"]) == (None, None, 0) for f in fragments)
    assert json.loads("".join(f[0]["args"] for f in fragments)) == {"location": "Paris"}
    last = chunks[-1]
    assert last.chunk_position == "last"
    assert last.usage_metadata["input_tokens"] == len(engine.prompt_ids(engine.requests[0]["messages"],
                                                                        engine.requests[0]["tools"]))
    assert last.response_metadata["model_name"] == "scripted-test-double"
    assert sum(1 for c in chunks if c.usage_metadata) == 1


def test_summed_call_chunks_equal_the_invoked_tool_calls(scripted):
    reply = '<tool_call>\n{"name": "add", "arguments": {"a": 19, "b": 23}}\n</tool_call>'
    model = ChatOoOSpec(engine=scripted(reply, reply)).bind_tools([get_current_weather, add])
    invoked = model.invoke("19+23?")
    call_chunks = [c for c in model.stream("19+23?") if c.tool_call_chunks]
    assert len(call_chunks) >= 2
    summed = functools.reduce(operator.add, call_chunks)
    assert by_index(summed.tool_calls) == by_index(invoked.tool_calls) == [
        {"name": "add", "args": {"a": 19, "b": 23}, "id": "call_0", "type": "tool_call"}]


def test_streamed_call_reassembles_to_the_invoked_call(scripted):
    reply = WEATHER_CALL + "\n" + '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    model = ChatOoOSpec(engine=scripted(reply, reply)).bind_tools([get_current_weather, add])
    invoked = model.invoke("Weather, and 1+2?")
    streamed = collect(model.stream("Weather, and 1+2?"))
    assert [c["index"] for c in streamed.tool_call_chunks] == [0, 1]
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == \
        [(c["name"], c["args"]) for c in invoked.tool_calls] == \
        [("get_current_weather", {"location": "Paris"}), ("add", {"a": 1, "b": 2})]
    assert streamed.content == invoked.content == ""
    assert streamed.usage_metadata == invoked.usage_metadata


def _message(message) -> dict:
    """What an agent reads of a message (an invoked AIMessage or a summed stream's AIMessageChunk), but the
    seconds its stats measured."""
    return {"content": message.content, "tool_calls": message.tool_calls, "invalid_tool_calls": message.invalid_tool_calls,
            "usage_metadata": message.usage_metadata,
            "response_metadata": {k: v for k, v in message.response_metadata.items() if not k.endswith("_s")}}


@pytest.mark.parametrize("parallel", [None, False])
@pytest.mark.parametrize("reply", list(CALL_REPLIES))
async def test_stream_and_invoke_give_the_same_message(scripted, reply, parallel):
    """Issue 48: invoke, the summed stream, ainvoke and the summed astream are one message, calls and
    their problems included: a schema misfit, an unparseable call, two calls."""
    text = CALL_REPLIES[reply]
    bound = ChatOoOSpec(engine=scripted(*[text] * 4)).bind_tools([BOOK_TABLE], parallel_tool_calls=parallel)
    invoked = bound.invoke("Book a table for 4 people at Da Michele at 19:30.")
    streamed = collect(bound.stream("Book a table for 4 people at Da Michele at 19:30."))
    ainvoked = await bound.ainvoke("Book a table for 4 people at Da Michele at 19:30.")
    astreamed = collect([c async for c in bound.astream("Book a table for 4 people at Da Michele at 19:30.")])
    # one message, but for the ids each reply gives its calls
    assert by_index(_message(streamed)) == by_index(_message(invoked)) == by_index(_message(ainvoked)) == \
        by_index(_message(astreamed))
    assert invoked.response_metadata["finish_reason"] == "tool_calls"
    calls = invoked.tool_calls + invoked.invalid_tool_calls
    assert len(calls) == (1 if reply != "two_calls" or parallel is False else 2)
    problems = invoked.response_metadata["tool_call_problems"]
    if reply == "misfit":
        assert [(c["args"]["people"], p["id"]) for c, p in zip(invoked.tool_calls, problems)] == [("4", calls[0]["id"])]
    elif reply == "unparseable":
        assert invoked.tool_calls == [] and [p["id"] for p in problems] == [calls[0]["id"]]
    else:
        assert [p["id"] for p in problems] == [c["id"] for c in invoked.tool_calls[1:]]


async def test_astream_and_ainvoke_match_their_sync_forms(scripted):
    reply = "Sure." + WEATHER_CALL
    model = ChatOoOSpec(engine=scripted(reply, reply, reply)).bind_tools([get_current_weather])
    streamed = collect([c async for c in model.astream("Weather?")])
    invoked = await model.ainvoke("Weather?")
    synced = collect(model.stream("Weather?"))
    for message in (streamed, invoked):
        assert message.content == synced.content == "Sure."
        assert [(c["name"], c["args"], by_index(c["id"])) for c in message.tool_calls] == \
            [(c["name"], c["args"], by_index(c["id"])) for c in synced.tool_calls]
    assert streamed.chunk_position == "last"


async def test_astream_stopped_early_releases_the_stream(scripted):
    engine = scripted("a long reply that the consumer abandons", "next")
    model = ChatOoOSpec(engine=engine)
    async for _ in model.astream("hi"):
        break
    assert (await model.ainvoke("hi")).content == "next"


def test_stream_errors_surface(scripted):
    with pytest.raises(ValueError, match="temperature"):
        list(ChatOoOSpec(engine=scripted("x")).stream("hi", temperature=-1.0))


# ---------------------------------------------------------------- structured output


class Person(BaseModel):
    """A person."""

    name: str = Field(description="their name")
    age: int


class PersonDict(TypedDict):
    """A person."""

    name: str
    age: int


PERSON_JSON_SCHEMA = {"title": "Person", "description": "A person.", "type": "object",
                      "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                      "required": ["name", "age"]}


def _person_reply(name: str = "Person", age: str = "41") -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"name": "Ada", "age": {age}}}}}\n</tool_call>'


@pytest.mark.parametrize("schema, expected", [
    (Person, Person(name="Ada", age=41)),
    (PersonDict, {"name": "Ada", "age": 41}),
    (PERSON_JSON_SCHEMA, {"name": "Ada", "age": 41}),
])
def test_structured_output_forces_the_schema_tool(scripted, schema, expected):
    name = "PersonDict" if schema is PersonDict else "Person"
    engine = scripted(_person_reply(name))
    assert ChatOoOSpec(engine=engine).with_structured_output(schema).invoke("Ada, 41") == expected
    assert engine.requests[0]["tool_choice"] == name
    assert engine.requests[0].get("response_format") is None


@pytest.mark.parametrize("schema, expected", [
    (Person, Person(name="Ada", age=41)),
    (PersonDict, {"name": "Ada", "age": 41}),
    (PERSON_JSON_SCHEMA, {"name": "Ada", "age": 41}),
])
@pytest.mark.parametrize("strict", [None, True])
def test_json_schema_binds_response_format_and_parses_the_reply_text(scripted, schema, expected, strict):
    """method="json_schema" is OpenAI's structured outputs, as in ChatOpenAI: the schema goes out as
    `response_format` (no tool is forced) and the reply's text is the JSON that is parsed."""
    engine = scripted('{"name": "Ada", "age": 41}')
    structured = ChatOoOSpec(engine=engine).with_structured_output(schema, method="json_schema", strict=strict)
    assert structured.invoke("Ada, 41") == expected
    request = engine.requests[-1]
    assert not request["tools"] and request["tool_choice"] in (None, "none", "auto")
    fmt = request["response_format"]
    assert fmt["type"] == "json_schema"
    spec = fmt["json_schema"]
    assert spec["name"] == ("PersonDict" if schema is PersonDict else "Person")
    assert spec["schema"]["properties"].keys() == {"name", "age"}
    assert spec.get("strict") is strict


@pytest.mark.parametrize("fmt", [
    {"name": "Person", "schema": PERSON_JSON_SCHEMA, "strict": True},
    {"type": "json_schema", "json_schema": {"name": "Person", "schema": PERSON_JSON_SCHEMA}},
])
def test_json_schema_keeps_a_response_format_it_is_given(scripted, fmt):
    engine = scripted('{"name": "Ada", "age": 41}')
    assert ChatOoOSpec(engine=engine).with_structured_output(fmt, method="json_schema").invoke("Ada") == {
        "name": "Ada", "age": 41}
    assert engine.requests[-1]["response_format"] == (fmt if "type" in fmt else {"type": "json_schema", "json_schema": fmt})


def test_json_schema_include_raw_reports_a_reply_that_is_not_the_schema(scripted):
    """The schema's grammar keeps a reply to the schema, but a reply cut off (`max_tokens`) is not a whole one."""
    reply = '{"name": "Ada", "age": 41}'
    result = ChatOoOSpec(engine=scripted(reply), max_tokens=5).with_structured_output(
        Person, method="json_schema", include_raw=True).invoke("Ada")
    assert result["parsed"] is None and result["parsing_error"] is not None
    assert reply.startswith(result["raw"].content) and result["raw"].content != reply
    assert result["raw"].response_metadata["finish_reason"] == "length"


def test_structured_output_include_raw(scripted):
    result = ChatOoOSpec(engine=scripted(_person_reply())).with_structured_output(
        Person, include_raw=True).invoke("Ada, 41")
    assert result["parsed"] == Person(name="Ada", age=41)
    assert result["parsing_error"] is None
    assert result["raw"].tool_calls[0]["args"] == {"name": "Ada", "age": 41}


def test_structured_output_reports_a_call_that_fails_the_schema(scripted):
    reply = _person_reply(age='"old"')
    structured = ChatOoOSpec(engine=scripted(reply, reply)).with_structured_output(Person, include_raw=True)
    result = structured.invoke("Ada")
    assert result["parsed"] is None
    assert "does not match the schema" in str(result["parsing_error"])
    with pytest.raises(Exception, match="does not match the schema"):
        ChatOoOSpec(engine=scripted(reply)).with_structured_output(Person).invoke("Ada")


@pytest.mark.parametrize("schema", [Person, "dict"])
def test_structured_output_reports_a_call_whose_arguments_misfit_or_do_not_parse(scripted, schema):
    """A call that misfits its schema is a tool call (issue 48), but structured output from it is an
    error naming the problem, not a dict of the wrong shape; nor is a call whose arguments do not parse
    a silent None."""
    schema = Person.model_json_schema() if schema == "dict" else schema
    for reply, says in ((_person_reply(age='"old"'), "'old' is not of type 'integer'"),
                        (_person_reply(age="old"), "not valid JSON")):
        result = ChatOoOSpec(engine=scripted(reply)).with_structured_output(schema, include_raw=True).invoke("Ada")
        assert result["parsed"] is None
        assert "does not match the schema" in str(result["parsing_error"]) and says in str(result["parsing_error"])


def test_structured_output_streams(scripted):
    chunks = list(ChatOoOSpec(engine=scripted(_person_reply())).with_structured_output(Person).stream("Ada"))
    assert chunks[-1] == Person(name="Ada", age=41)


def test_json_mode_parses_the_reply_text(scripted):
    reply = '{"name": "Ada", "age": 41}'
    engine = scripted(reply)
    assert ChatOoOSpec(engine=engine).with_structured_output(
        Person, method="json_mode").invoke("Ada as JSON") == Person(name="Ada", age=41)
    assert engine.requests[-1]["response_format"] == {"type": "json_object"}  # JSON mode's grammar, as ChatOpenAI


def test_unknown_structured_output_method_is_an_error():
    with pytest.raises(ValueError, match="method must be"):
        ChatOoOSpec().with_structured_output(Person, method="xml")
