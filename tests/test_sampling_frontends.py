"""ChatOoOSpec and OoOSpec sample with a real engine (a tiny random model, whose distribution is near
uniform): a seed gives the same reply every time, `n` choices are the replies of seed + i, and the
logprobs are the engine's, in each framework's shape. The frameworks' plumbing, on a scripted engine,
is in integrations/*/tests."""
from __future__ import annotations

from typing import Literal

import pytest
from langchain_core.messages import HumanMessage
from langchain_oospec import ChatOoOSpec
from llama_index.core.base.llms.types import ChatMessage
from llama_index.llms.oospec import OoOSpec

from oospec_agents import Engine
from oospec_testing import tiny_model

ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def engine(smollm2_tokenizer):
    return Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, model_name="tiny-llama")


def test_chat_oospec_at_temperature_0_7_is_reproducible_with_a_seed(engine):
    model = ChatOoOSpec(engine=engine, temperature=0.7, max_tokens=10, seed=3)
    first = model.invoke(ASK).content
    assert model.invoke(ASK).content == first
    assert "".join(chunk.content for chunk in model.stream(ASK)) == first
    assert model.invoke(ASK, seed=4).content != first


def test_chat_oospec_n_choices_are_the_replies_of_seed_plus_i(engine):
    model = ChatOoOSpec(engine=engine, temperature=1.0, max_tokens=8, seed=20)
    generations = model.generate([[HumanMessage(ASK)]], n=3).generations[0]
    assert [g.text for g in generations] == [model.invoke(ASK, seed=20 + i).content for i in range(3)]


def test_chat_oospec_logprobs_are_the_engines(engine):
    reply = ChatOoOSpec(engine=engine, max_tokens=6, logprobs=True, top_logprobs=3).invoke(ASK)
    content = reply.response_metadata["logprobs"]["content"]
    assert len(content) == reply.usage_metadata["output_tokens"] == 6
    for entry in content:  # greedy: the chosen token is the likeliest
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["token"] == entry["token"]


def test_oospec_at_temperature_0_1_is_reproducible_and_gives_logprobs(engine):
    llm = OoOSpec(engine=engine, temperature=0.1, seed=5, max_new_tokens=8, logprobs=True, top_logprobs=2)
    messages = [ChatMessage(role="user", content=ASK)]
    response = llm.chat(messages)
    assert llm.chat(messages).message.content == response.message.content
    streamed = list(llm.stream_chat(messages))
    assert streamed[-1].message.content == response.message.content
    assert [[p.token for p in token] for token in streamed[-1].logprobs] == \
        [[p.token for p in token] for token in response.logprobs]
    assert len(response.logprobs) == response.raw["usage"]["completion_tokens"] == 8
    assert all(len(token) == 2 and token[0].logprob >= token[1].logprob for token in response.logprobs)


def test_chat_oospec_at_temperature_0_7_runs_a_tool_loop(engine):
    """#46's goal: the agent code that sets temperature=0.7 runs its loop: a call, the tool's result, a reply."""
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:  # an enum: the tiny model's call ends in a few tokens
        """The weather in a city."""
        return f"Sunny in {city}"

    model = ChatOoOSpec(engine=engine, temperature=0.7, max_tokens=24, seed=11)
    messages = [HumanMessage(ASK)]
    ai = model.bind_tools([get_weather], tool_choice="required", strict=True, parallel_tool_calls=False).invoke(messages)
    assert ai.tool_calls and not ai.invalid_tool_calls  # strict: the sampled call fits its schema
    messages += [ai] + [ToolMessage(get_weather.invoke(c["args"]), tool_call_id=c["id"]) for c in ai.tool_calls]
    final = model.bind_tools([get_weather]).invoke(messages)
    assert final.response_metadata["finish_reason"] in ("stop", "length", "tool_calls")
