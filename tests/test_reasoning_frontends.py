"""Reasoning in every front-end (#47): LangChain's ChatOoOSpec, LlamaIndex's OoOSpec and the server,
streamed, lossless.

A tiny random `qwen3` under the Qwen3-style `<think>` template (oospec_testing.chat_template) is made to
write a reply that reasons, says a sentence and calls twice (`ScriptedTarget`), through the real engine;
each front-end must give the reasoning, the content and the calls apart, the same streamed as not, and
the tokens must be greedy `generate`'s. A second tiny qwen3, unscripted, under the R1-style template
(the prompt opens the block) reasons in random text until `max_new_tokens`: what a front-end shows of
it must be the Generation's reasoning, token for token greedy's. The server is driven by clients we
did not write: the `openai` SDK, LangChain's `ChatOpenAI` and LlamaIndex's `OpenAILike`.
"""
from __future__ import annotations

import asyncio

import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from llama_index.core.base.llms.types import ChatMessage, TextBlock, ThinkingBlock, ToolCallBlock
import oospec_testing
from serve_testing import API_KEY, running

from langchain_oospec import ChatOoOSpec
from llama_index.llms.oospec import OoOSpec
from oospec_agents import Engine, ReasoningDelta, TextDelta, ToolCallReady
from oospec_agents.errors import TemplateArgumentError
from oospec_agents.formats import HermesFormat, Reasoning
from oospec_agents.frontend import ChatRequest
from oospec_agents.serve import create_app
from oospec_agents.testing import Scripted
from oospec_testing import TEMPLATES, ScriptedTarget, greedy, tiny_qwen3

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = "What is the weather in Paris and in Rome?"
MESSAGES = [{"role": "user", "content": ASK}]
THOUGHT = "Two cities: Paris first, then Rome."
CONTENT = "Let me check both."
CITIES = ["Paris", "Rome"]
FMT = HermesFormat()
REPLY = ("<think>\n" + THOUGHT + "\n</think>\n\n" + CONTENT
         + "\n".join(FMT.render_call("get_weather", {"city": c}) for c in CITIES))
N = 120      # enough for the scripted reply, which ends with its end-of-sequence token
N_RANDOM = 24


@pytest.fixture(scope="module")
def thinker(with_template):
    """A tiny qwen3 under the Qwen3-style template, made to write `REPLY` to `MESSAGES` with `WEATHER`
    offered, whatever the method."""
    tok = with_template(TEMPLATES["qwen3"])
    engine = Engine(tiny_qwen3(tok), tok, model_name="tiny-qwen3-thinking")
    ScriptedTarget(engine.target, tok).script(engine.prompt_ids(MESSAGES, [WEATHER]), REPLY)
    return engine


@pytest.fixture(scope="module")
def reference(thinker) -> list[int]:
    """Greedy `generate`'s tokens for the scripted request: every front-end's reply must be these."""
    return greedy(thinker, thinker.prompt_ids(MESSAGES, [WEATHER]), N)


@pytest.fixture(scope="module")
def random_r1(with_template):
    """An unscripted tiny qwen3 under the R1-style template: the prompt opens the block, and the model
    reasons in random text until `max_new_tokens`."""
    tok = with_template(TEMPLATES["r1"])
    return Engine(tiny_qwen3(tok, seed=1), tok, model_name="tiny-qwen3-r1")


def test_the_scripted_reply_reasons_says_and_calls(thinker, reference):
    gen = thinker.generate(MESSAGES, [WEATHER], max_new_tokens=N)
    assert gen.token_ids == reference and gen.finish_reason == "tool_calls"
    assert (gen.reasoning, gen.content) == (THOUGHT, CONTENT)
    assert [c["arguments"] for c in gen.tool_calls] == [{"city": c} for c in CITIES]


# ------------------------------------------------------------------ LangChain

def _sum(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    return full


@pytest.mark.parametrize("method", ["oospec", "ar"])
def test_langchain_gives_reasoning_content_and_calls_apart(thinker, reference, monkeypatch, method):
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    llm = ChatOoOSpec(engine=thinker, max_tokens=N, method=method).bind_tools([WEATHER])
    message = llm.invoke(ASK)
    assert seen[-1][3].token_ids == reference
    assert message.additional_kwargs["reasoning_content"] == THOUGHT  # as ChatOllama and ChatDeepSeek give it
    assert message.content == CONTENT
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"city": c}) for c in CITIES]
    # LangChain's standard content blocks: the reasoning first, then the text and the calls
    blocks = message.content_blocks
    assert blocks[0] == {"type": "reasoning", "reasoning": THOUGHT}
    assert [b["type"] for b in blocks] == ["reasoning", "text", "tool_call", "tool_call"]

    chunks = list(llm.stream(ASK))
    assert seen[-1][3].token_ids == reference
    thinking = [c for c in chunks if "reasoning_content" in c.additional_kwargs]
    assert all(c.content == "" and not c.tool_call_chunks for c in thinking)
    # in pieces, as committed (oospec drafts this reply whole from the engine's memory of earlier replies)
    assert len(thinking) > 1 or method == "oospec"
    # the reasoning streams before any text or call
    first_answer = next(i for i, c in enumerate(chunks) if c.content or c.tool_call_chunks)
    assert chunks.index(thinking[-1]) < first_answer
    full = _sum(chunks)
    assert full.additional_kwargs == message.additional_kwargs and full.content == message.content
    assert [(c["name"], c["args"]) for c in full.tool_calls] == [(c["name"], c["args"]) for c in message.tool_calls]
    assert full.content_blocks[0] == blocks[0]


def test_langchain_async_stream_equals_invoke(thinker, reference, monkeypatch):
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    llm = ChatOoOSpec(engine=thinker, max_tokens=N).bind_tools([WEATHER])

    async def both():
        message = await llm.ainvoke(ASK)
        chunks = [chunk async for chunk in llm.astream(ASK)]
        return message, _sum(chunks)
    message, full = asyncio.run(both())
    assert [entry[3].token_ids for entry in seen] == [reference, reference]
    assert message.additional_kwargs == full.additional_kwargs == {"reasoning_content": THOUGHT}
    assert message.content == full.content == CONTENT


def test_langchain_random_reasoning_is_lossless(random_r1):
    """A reply cut off inside the block: all of it reasoning, greedy's tokens, stream == invoke."""
    ids = random_r1.prompt_ids(MESSAGES)
    reference = greedy(random_r1, ids, N_RANDOM)
    gen = random_r1.generate(MESSAGES, max_new_tokens=N_RANDOM)
    assert gen.token_ids == reference and gen.reasoning and gen.finish_reason == "length"
    llm = ChatOoOSpec(engine=random_r1, max_tokens=N_RANDOM)
    message = llm.invoke(ASK)
    assert message.additional_kwargs["reasoning_content"] == gen.reasoning and message.content == gen.content == ""
    assert _sum(list(llm.stream(ASK))).additional_kwargs == message.additional_kwargs


def test_langchain_sends_earlier_reasoning_back(thinker, monkeypatch):
    """An earlier AIMessage's reasoning, in `additional_kwargs` or as a standard reasoning block, goes
    back as `reasoning_content`; the Qwen3-style template writes it into the prompt."""
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    call = {"name": "get_weather", "args": {"city": "Rome"}, "id": "c1"}
    histories = {
        "additional_kwargs": AIMessage("", additional_kwargs={"reasoning_content": "Rome first."}, tool_calls=[call]),
        "content block": AIMessage([{"type": "reasoning", "reasoning": "Rome first."}, {"type": "text", "text": ""}],
                                   tool_calls=[call]),
    }
    for how, earlier in histories.items():
        ChatOoOSpec(engine=thinker, max_tokens=2).bind_tools([WEATHER]).invoke(
            [HumanMessage(ASK), earlier, ToolMessage("sunny", tool_call_id="c1")])
        assistant = seen[-1][0][1]
        assert assistant["reasoning_content"] == "Rome first." and assistant["content"] == "", how
        prompt = thinker.tokenizer.decode(thinker.prompt_ids(seen[-1][0], [WEATHER]))
        assert "<think>\nRome first.\n</think>" in prompt, how


def test_langchain_takes_chat_template_kwargs_and_reasoning_effort(thinker, monkeypatch):
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    off = {"enable_thinking": False}
    message = ChatOoOSpec(engine=thinker, max_tokens=4, chat_template_kwargs=off).invoke(ASK)
    assert seen[-1][2]["chat_template_kwargs"] == off and seen[-1][3].reasoning is None
    assert "reasoning_content" not in message.additional_kwargs
    ChatOoOSpec(engine=thinker, max_tokens=4).invoke(ASK, chat_template_kwargs=off)  # per call too
    assert seen[-1][2]["chat_template_kwargs"] == off
    bad = ChatOoOSpec(engine=thinker, chat_template_kwargs={"enable_thinkng": False})
    with pytest.raises(TemplateArgumentError, match="'enable_thinkng' is not an argument of this chat template"):
        bad.invoke(ASK)
    with pytest.raises(TemplateArgumentError, match="takes no reasoning_effort") as raised:
        next(iter(ChatOoOSpec(engine=thinker).stream(ASK, reasoning_effort="high")))  # nothing streamed
    assert raised.value.param == "reasoning_effort"


def test_the_scripted_engine_reasons_for_unit_tests():
    """The test double reasons, given a `Reasoning` (a `<think>` template), and records the template's arguments."""
    engine = Scripted(REPLY, REPLY, reasoning=Reasoning())
    llm = ChatOoOSpec(engine=engine, reasoning_effort="low").bind_tools([WEATHER])
    message = llm.invoke(ASK)
    assert (message.additional_kwargs["reasoning_content"], message.content) == (THOUGHT, CONTENT)
    assert len(message.tool_calls) == 2 and engine.requests[-1]["reasoning_effort"] == "low"
    assert _sum(list(llm.stream(ASK))).additional_kwargs == message.additional_kwargs


def test_the_test_double_reads_a_reply_as_the_engine_does(thinker):
    """Given the text the scripted target writes, the double (the engine on `Scripted`'s model, tokenizer and
    template) streams and finishes it as the engine on the scripted qwen3 does."""
    def run(engine):
        events = list(ChatRequest(MESSAGES, [WEATHER], max_new_tokens=N).stream(engine))
        joined = {kind: "".join(e.text for e in events if isinstance(e, kind)) for kind in (ReasoningDelta, TextDelta)}
        ready = [(e.name, e.arguments) for e in events if isinstance(e, ToolCallReady)]
        return events[-1], joined, ready
    (real, real_joined, real_ready) = run(thinker)
    (fake, fake_joined, fake_ready) = run(Scripted(REPLY, reasoning=Reasoning()))
    assert fake.text == real.text == REPLY
    assert (fake.content, fake.reasoning, fake.finish_reason) == (real.content, real.reasoning, real.finish_reason)
    assert fake_joined == real_joined and fake_ready == real_ready == [("get_weather", {"city": c}) for c in CITIES]
    named = [[(c["name"], c["arguments"]) for c in gen.tool_calls] for gen in (fake, real)]
    assert named[0] == named[1] and fake.invalid_tool_calls == real.invalid_tool_calls == []
    assert fake.tool_call_problems == real.tool_call_problems == []


# ------------------------------------------------------------------ LlamaIndex

@pytest.mark.parametrize("method", ["oospec", "ar"])
def test_llamaindex_gives_a_thinking_block_content_and_calls(thinker, reference, monkeypatch, method):
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    llm = OoOSpec(engine=thinker, max_new_tokens=N, method=method)
    messages = [ChatMessage(role="user", content=ASK)]
    response = llm.chat(messages, tools=[WEATHER])
    assert seen[-1][3].token_ids == reference
    blocks = response.message.blocks
    assert [type(b) for b in blocks] == [ThinkingBlock, TextBlock, ToolCallBlock, ToolCallBlock]
    assert (blocks[0].content, blocks[1].text) == (THOUGHT, CONTENT)
    assert [s.tool_kwargs for s in llm.get_tool_calls_from_response(response)] == [{"city": c} for c in CITIES]

    responses = list(llm.stream_chat(messages, tools=[WEATHER]))
    assert seen[-1][3].token_ids == reference
    deltas = [r.additional_kwargs["thinking_delta"] for r in responses if "thinking_delta" in r.additional_kwargs]
    assert "".join(deltas) == THOUGHT and (len(deltas) > 1 or method == "oospec")  # where LlamaIndex's agents read it
    assert all(r.delta == "" for r in responses if "thinking_delta" in r.additional_kwargs)
    growing = [r.message.blocks[0].content for r in responses if isinstance(r.message.blocks[0], ThinkingBlock)]
    assert growing == sorted(growing, key=len) and growing[-1] == THOUGHT
    assert _without_ids(responses[-1].message) == _without_ids(response.message)  # stream == chat (each reply's ids)


def _without_ids(message: ChatMessage) -> list:
    return [b.model_copy(update={"tool_call_id": None}) if isinstance(b, ToolCallBlock) else b for b in message.blocks]


def test_llamaindex_random_reasoning_is_lossless(random_r1):
    reference = greedy(random_r1, random_r1.prompt_ids(MESSAGES), N_RANDOM)
    gen = random_r1.generate(MESSAGES, max_new_tokens=N_RANDOM)
    assert gen.token_ids == reference
    llm = OoOSpec(engine=random_r1, max_new_tokens=N_RANDOM)
    messages = [ChatMessage(role="user", content=ASK)]
    response = llm.chat(messages)
    assert response.message.blocks[0] == ThinkingBlock(content=gen.reasoning)
    assert list(llm.stream_chat(messages))[-1].message == response.message


def test_llamaindex_sends_earlier_thinking_back_and_takes_template_arguments(thinker, monkeypatch):
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    earlier = ChatMessage(role="assistant", blocks=[
        ThinkingBlock(content="Rome first."), TextBlock(text=""),
        ToolCallBlock(tool_call_id="c1", tool_name="get_weather", tool_kwargs={"city": "Rome"})])
    answer = ChatMessage(role="tool", content="sunny", additional_kwargs={"tool_call_id": "c1"})
    llm = OoOSpec(engine=thinker, max_new_tokens=2, chat_template_kwargs={"enable_thinking": False})
    llm.chat([ChatMessage(role="user", content=ASK), earlier, answer], tools=[WEATHER])
    messages, _, kw, gen = seen[-1]
    assert messages[1]["reasoning_content"] == "Rome first."
    assert kw["chat_template_kwargs"] == {"enable_thinking": False} and gen.reasoning is None
    prompt = thinker.tokenizer.decode(thinker.prompt_ids(messages, [WEATHER]))
    assert "<think>\nRome first.\n</think>" in prompt
    with pytest.raises(TemplateArgumentError, match="takes no reasoning_effort"):
        OoOSpec(engine=thinker).stream_chat([ChatMessage(role="user", content=ASK)], reasoning_effort="low")


# ------------------------------------------------------------------ the server

@pytest.fixture(scope="module")
def url(thinker):
    with running(create_app(thinker, model="thinker", api_key=API_KEY)) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)


def _ask(client, **kw):
    return client.chat.completions.create(**{"model": "thinker", "messages": MESSAGES, "tools": [WEATHER],
                                             "max_tokens": N, **kw})


def test_the_server_sends_reasoning_content_as_vllm_and_deepseek_do(thinker, reference, client, monkeypatch):
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    message = _ask(client).choices[0].message
    assert seen[-1][3].token_ids == reference
    assert message.model_extra["reasoning_content"] == THOUGHT
    assert message.content == CONTENT
    assert [c.function.arguments for c in message.tool_calls] == ['{"city": "%s"}' % c for c in CITIES]

    chunks = list(_ask(client, stream=True, extra_body={"method": "ar"}))  # ar: the reasoning in many deltas
    assert seen[-1][3].token_ids == reference
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thinking = [d.model_extra["reasoning_content"] for d in deltas if (d.model_extra or {}).get("reasoning_content")]
    assert len(thinking) > 1 and "".join(thinking) == THOUGHT
    assert all(not d.content for d in deltas if (d.model_extra or {}).get("reasoning_content"))
    assert "".join(d.content or "" for d in deltas) == CONTENT
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_server_passes_template_arguments_and_earlier_reasoning(thinker, client, monkeypatch):
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    off = _ask(client, max_tokens=2, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert seen[-1][2]["chat_template_kwargs"] == {"enable_thinking": False} and seen[-1][3].reasoning is None
    assert "reasoning_content" not in off.choices[0].message.model_extra
    history = MESSAGES + [{"role": "assistant", "content": "", "reasoning_content": "Rome first.",
                           "tool_calls": [{"id": "c1", "type": "function",
                                           "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
                          {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    client.chat.completions.create(model="thinker", messages=history, tools=[WEATHER], max_tokens=2)
    assert seen[-1][0][1]["reasoning_content"] == "Rome first."


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("change, param, says", [
    ({"reasoning_effort": "high"}, "reasoning_effort", "this chat template takes no reasoning_effort"),
    ({"extra_body": {"chat_template_kwargs": {"enable_thinkng": False}}}, "chat_template_kwargs",
     "'enable_thinkng' is not an argument of this chat template"),
    ({"extra_body": {"chat_template_kwargs": {"add_generation_prompt": False}}}, "chat_template_kwargs",
     "'add_generation_prompt' is set by the engine"),
])
def test_a_bad_template_argument_is_openais_400_and_nothing_is_streamed(client, change, param, says, stream):
    with pytest.raises(openai.BadRequestError) as raised:
        _ask(client, stream=stream, **change)
    assert raised.value.status_code == 400
    body = raised.value.body
    assert says in body["message"] and body["param"] == param and body["type"] == "invalid_request_error", body


def test_the_server_random_reasoning_is_lossless(random_r1, monkeypatch):
    seen = oospec_testing.record_requests(monkeypatch, random_r1)
    reference = greedy(random_r1, random_r1.prompt_ids(MESSAGES), N_RANDOM)
    with running(create_app(random_r1, model="r1")) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        message = client.chat.completions.create(model="r1", messages=MESSAGES, max_tokens=N_RANDOM).choices[0].message
        chunks = list(client.chat.completions.create(model="r1", messages=MESSAGES, max_tokens=N_RANDOM, stream=True))
    assert [entry[3].token_ids for entry in seen] == [reference, reference]
    assert message.model_extra["reasoning_content"] == seen[0][3].reasoning and message.content == ""
    streamed = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content", "") for c in chunks if c.choices)
    assert streamed == seen[0][3].reasoning


def test_chat_openai_drops_reasoning_content(url, thinker, reference, monkeypatch):
    """langchain-openai's ChatOpenAI reads OpenAI's own fields only (its module says so): the server's
    `reasoning_content` does not reach its message, streamed or not; the content and the calls do.
    ChatDeepSeek (langchain-deepseek) reads it; with ChatOpenAI, use ChatOoOSpec in-process instead."""
    from langchain_openai import ChatOpenAI
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    llm = ChatOpenAI(model="thinker", base_url=url + "/v1", api_key=API_KEY, max_tokens=N,
                     max_retries=0).bind_tools([WEATHER])
    message = llm.invoke(ASK)
    full = _sum(list(llm.stream(ASK)))
    assert [entry[3].token_ids for entry in seen] == [reference, reference]
    for got in (message, full):
        assert "reasoning_content" not in got.additional_kwargs
        assert not [b for b in got.content_blocks if b["type"] == "reasoning"]
        assert got.content == CONTENT
        assert [c["args"] for c in got.tool_calls] == [{"city": c} for c in CITIES]


def test_openai_like_gives_a_thinking_block(url, thinker, reference, monkeypatch):
    """LlamaIndex's OpenAILike reads `reasoning_content` into a ThinkingBlock, and streams `thinking_delta`s."""
    from llama_index.llms.openai_like import OpenAILike
    seen = oospec_testing.record_requests(monkeypatch, thinker)
    llm = OpenAILike(model="thinker", api_base=url + "/v1", api_key=API_KEY, max_tokens=N, is_chat_model=True,
                     is_function_calling_model=True, max_retries=0)
    messages = [ChatMessage(role="user", content=ASK)]
    response = llm.chat(messages, tools=[WEATHER])
    assert seen[-1][3].token_ids == reference
    assert response.message.blocks[0] == ThinkingBlock(content=THOUGHT)
    assert response.message.content == CONTENT
    responses = list(llm.stream_chat(messages, tools=[WEATHER]))
    assert "".join(r.additional_kwargs.get("thinking_delta", "") for r in responses) == THOUGHT
    assert responses[-1].message.blocks[0] == ThinkingBlock(content=THOUGHT)


def test_the_responses_api_gives_a_reasoning_item(client):
    """/v1/responses: OpenAI's `reasoning` item (`reasoning_text`) before the message and the calls; the
    rest, streamed and `reasoning.effort` and input reasoning items, is tests/test_serve_responses.py's."""
    tool = {"type": "function", **WEATHER["function"]}
    response = client.responses.create(model="thinker", input=ASK, tools=[tool], max_output_tokens=N)
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call", "function_call"]
    assert response.output[0].content[0].text == THOUGHT and response.output[0].summary == []
    assert response.output_text == CONTENT
    assert [item.arguments for item in response.output[2:]] == ['{"city": "%s"}' % c for c in CITIES]
