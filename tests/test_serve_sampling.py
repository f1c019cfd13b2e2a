"""`oospec serve` samples as OpenAI's Chat Completions does, keeping the target's distribution:
`temperature`, `top_p`, `seed`, `n`, `logprobs`/`top_logprobs` (and vLLM's `top_k`, `min_p`), driven by
the official `openai` client, LangChain's `ChatOpenAI` and LlamaIndex's `OpenAILike` with their default
settings. What is not served (penalties, `logit_bias`) and bad values are 400s naming the field.

A tiny random model checks the mechanics (its words are noise; its distribution is near uniform, so
two seeds give two replies); agent loops run on a scripted engine, whose replies are a tool call
and then an answer, whatever the sampling settings.
"""
from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from serve_testing import running

from oospec_agents import Engine
from oospec_agents.serve import create_app
from oospec_agents.testing import BAD_SAMPLING, Scripted
from oospec_testing import tiny_model

MODEL = "tiny"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SAMPLED = dict(model=MODEL, messages=ASK, max_tokens=12, temperature=1.0)


@pytest.fixture(scope="module")
def engine(smollm2_tokenizer):
    return Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, model_name="tiny-llama")


@pytest.fixture(scope="module")
def url(engine):
    with running(create_app(engine, model=MODEL)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def by_choice(chunks) -> dict:
    """Streamed chunks folded per choice index: content, logprobs entries, finish_reason; and the usage."""
    out: dict = {"usage": None}
    for chunk in chunks:
        out["usage"] = chunk.usage or out["usage"]
        for choice in chunk.choices:
            c = out.setdefault(choice.index, {"content": "", "logprobs": [], "finish_reason": None, "role": None})
            c["role"] = c["role"] or choice.delta.role
            c["content"] += choice.delta.content or ""
            c["logprobs"] += choice.logprobs.content if choice.logprobs and choice.logprobs.content else []
            c["finish_reason"] = choice.finish_reason or c["finish_reason"]
    return out


# ----------------------------------------------------------------------------- seed and n

def test_the_same_seed_gives_the_same_reply_and_another_seed_another(client):
    first = client.chat.completions.create(**SAMPLED, seed=7)
    again = client.chat.completions.create(**SAMPLED, seed=7)
    other = client.chat.completions.create(**SAMPLED, seed=8)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.choices[0].message.content != other.choices[0].message.content
    streamed = by_choice(client.chat.completions.create(**SAMPLED, seed=7, stream=True))
    assert streamed[0]["content"] == first.choices[0].message.content


def test_vllm_top_k_and_min_p_are_served(client):
    kw = dict(SAMPLED, seed=3, top_p=0.9, extra_body={"top_k": 5, "min_p": 0.01})
    assert client.chat.completions.create(**kw).choices[0].message.content == \
        client.chat.completions.create(**kw).choices[0].message.content
    assert client.chat.completions.create(**dict(kw, extra_body={"top_k": -1})).choices[0].finish_reason  # vLLM: off


def test_n_gives_n_choices_each_drawn_with_seed_plus_its_index(client):
    r = client.chat.completions.create(**SAMPLED, n=3, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(**SAMPLED, seed=11 + i) for i in range(3)]
    assert [c.message.content for c in r.choices] == [s.choices[0].message.content for s in singles]
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens  # the prompt is counted once
    assert len(r.model_extra["oospec"]["choices"]) == 3


def test_n_streamed_chunks_carry_their_choice_index(client):
    whole = client.chat.completions.create(**SAMPLED, n=3, seed=5)
    streamed = by_choice(client.chat.completions.create(**SAMPLED, n=3, seed=5, stream=True,
                                                        stream_options={"include_usage": True}))
    for choice in whole.choices:
        got = streamed[choice.index]
        assert got["role"] == "assistant"
        assert (got["content"], got["finish_reason"]) == (choice.message.content, choice.finish_reason)
    assert streamed["usage"].completion_tokens == whole.usage.completion_tokens


def test_n_without_a_seed_and_greedy_n(client):
    assert len(client.chat.completions.create(**SAMPLED, n=2).choices) == 2
    greedy = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, n=2)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content


# ----------------------------------------------------------------------------- logprobs

def check_entries(entries, top: int) -> None:
    for entry in entries:
        assert entry.logprob <= 0 and entry.bytes == list(entry.token.encode("utf-8"))
        assert len(entry.top_logprobs) == top
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True)


def test_logprobs_through_the_openai_client(client):
    """Greedy: the chosen token is the likeliest, so it is top_logprobs[0]; streamed, the round's
    logprobs ride with its chunks and join up to the whole reply's."""
    kw = dict(model=MODEL, messages=ASK, max_tokens=10, logprobs=True, top_logprobs=2)
    r = client.chat.completions.create(**kw)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 10
    check_entries(entries, 2)
    for entry in entries:
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == (entry.token, entry.logprob)
    streamed = by_choice(client.chat.completions.create(**kw, stream=True))
    assert streamed[0]["content"] == r.choices[0].message.content
    again = streamed[0]["logprobs"]  # the same tokens; their values to float32's rounding (a cached prefill)
    assert [(e.token, [t.token for t in e.top_logprobs]) for e in again] == \
        [(e.token, [t.token for t in e.top_logprobs]) for e in entries]
    assert [e.logprob for e in again] == pytest.approx([e.logprob for e in entries], abs=1e-4)


def test_logprobs_of_a_sampled_call_and_of_n_choices(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required",
                                       max_tokens=16, temperature=0.8, seed=1, n=2, logprobs=True, top_logprobs=1)
    for choice in r.choices:
        check_entries(choice.logprobs.content, 1)
        assert choice.message.tool_calls[0].function.name == "get_weather"
    assert sum(len(c.logprobs.content) for c in r.choices) == r.usage.completion_tokens


def test_logprobs_true_alone_and_none_unless_asked(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, logprobs=True)
    check_entries(r.choices[0].logprobs.content, 0)
    assert client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4).choices[0].logprobs is None


# ----------------------------------------------------------------------------- what is refused

BAD = BAD_SAMPLING + [  # what the server takes besides: n, penalties, logit_bias
    ("n", {"n": 0}, "n must be an integer from 1 to 8"),
    ("presence_penalty", {"presence_penalty": -1.0}, "presence_penalty=-1.0 is not served"),
    ("frequency_penalty", {"frequency_penalty": 0.5}, "frequency_penalty=0.5 is not served"),
    ("repetition_penalty", {"repetition_penalty": 1.2}, "repetition_penalty=1.2 is not served"),
    ("logit_bias", {"logit_bias": {"42": 5}}, "logit_bias is not served"),
]


@pytest.mark.parametrize("field, body, says", BAD)
def test_a_bad_or_unserved_setting_is_a_400_naming_it(client, field, body, says):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, extra_body=body)
    assert err.value.param == field and re.search(says, err.value.message), err.value.body
    assert err.value.type == "invalid_request_error"


@pytest.mark.parametrize("body, param", [({"n": 9}, "n"), ({"seed": "x"}, "seed"), ({"logprobs": "maybe"}, "logprobs")])
def test_more_400s_name_their_field(url, body, param):
    r = httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": ASK, **body, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_neutral_values_of_what_is_not_served_are_accepted(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3, temperature=0, top_p=1, n=1,
                                       frequency_penalty=0, presence_penalty=0, logit_bias={},
                                       extra_body={"repetition_penalty": 1})
    assert r.usage.completion_tokens == 3


# ----------------------------------------------------------------------------- clients with their defaults

CALL_THEN_ANSWER = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                    "It is sunny in Paris.")


@pytest.fixture
def scripted_url():
    """A server whose engine replies with a call of get_weather, then an answer."""
    engine = Scripted(*CALL_THEN_ANSWER)
    with running(create_app(engine, model=MODEL)) as base:
        yield base + "/v1", engine


def test_chat_openai_with_its_defaults_runs_an_agent_loop(scripted_url):
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"Sunny in {city}."

    base, engine = scripted_url
    agent = create_agent(ChatOpenAI(model=MODEL, base_url=base, api_key="unused", max_retries=0), tools=[get_weather])
    messages = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]}, {"recursion_limit": 6})["messages"]
    assert [type(m) for m in messages] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert messages[2].content == "Sunny in Paris." and messages[3].content == "It is sunny in Paris."
    assert len(engine.requests) == 2


@pytest.mark.parametrize("streaming", [False, True])
async def test_openai_like_with_its_defaults_runs_a_function_agent(scripted_url, streaming):
    """OpenAILike sends LlamaIndex's default temperature=0.1 with every request: it is served."""
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.llms.openai_like import OpenAILike

    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"Sunny in {city}."

    base, engine = scripted_url
    llm = OpenAILike(model=MODEL, api_base=base, api_key="unused", is_chat_model=True, is_function_calling_model=True)
    handler = FunctionAgent(tools=[get_weather], llm=llm, streaming=streaming).run("Weather in Paris?",
                                                                                  max_iterations=4)
    events = [event async for event in handler.stream_events()]
    response = await handler
    assert [e.tool_output.content for e in events if isinstance(e, ToolCallResult)] == ["Sunny in Paris."]
    assert "sunny in Paris" in str(response)
    assert [r["temperature"] for r in engine.requests] == [0.1, 0.1]


def test_chat_openai_n_seed_and_logprobs(client, url):
    """ChatOpenAI's own fields: `n` gives a generation per choice; `logprobs` land in response_metadata."""
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI
    model = ChatOpenAI(model=MODEL, base_url=url + "/v1", api_key="unused", max_retries=0, max_tokens=8,
                       temperature=0.7, seed=4, n=3)
    generations = model.generate([[HumanMessage("Hi")]]).generations[0]
    direct = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                            temperature=0.7, seed=4, n=3)
    assert [g.text for g in generations] == [c.message.content for c in direct.choices]
    reply = ChatOpenAI(model=MODEL, base_url=url + "/v1", api_key="unused", max_retries=0, max_tokens=6,
                       logprobs=True, top_logprobs=2).invoke("Hi")
    content = reply.response_metadata["logprobs"]["content"]
    assert len(content) == 6 and all(len(entry["top_logprobs"]) == 2 for entry in content)
    assert json.dumps(content)  # plain JSON, as OpenAI's
