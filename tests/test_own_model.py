"""Your model, your devices (#64, docs/own-model.md): a target that is not the embedded one, loaded by
path as a user loads theirs, through every front-end. The target is Gemma-3-270M as a local
Hugging Face-format directory (the safetensors that `models.gguf_to_safetensors` writes from the
shipped GGUF: config.json, weights, tokenizer, and no chat template, so the user's own template file
comes in as `chat_template=`). The sidecar is the default one, the embedded SmolLM2 with its shipped
adapter, across tokenizers. Every reply is checked token for token against transformers' greedy
decoding on the same engine, or for the tool it calls where a front-end hides the tokens."""
from __future__ import annotations

import warnings

import pytest
import torch

from oospec_agents import Engine, models
from oospec_agents.errors import DeviceError
from oospec_testing import greedy

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = "What is the weather like in Paris today?"
MAX_NEW_TOKENS = 24
#: a base model, not tuned to call tools: its calls are asked for under the grammar of valid calls
#: (`strict`, lossless against the masked reference: docs/strict.md), which is enough tokens for one
CALL_TOKENS = 40


@pytest.fixture(scope="module")
def model_dir() -> str:
    path = models.gguf_to_safetensors(models.embedded_gguf("gemma3"))
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    return str(path)


@pytest.fixture(scope="module")
def template() -> str:
    return str(models.GEMMA3_CHAT_TEMPLATE)  # the user's template file; Gemma-3 base ships none


@pytest.fixture(scope="module")
def engine(model_dir, template):
    """What ChatOoOSpec and OoOSpec load for the same arguments (`Engine.shared`), so one engine serves all."""
    with warnings.catch_warnings():
        # the default sidecar has its adapter: no bare-sidecar warning
        warnings.filterwarnings("error", message=".*no slot-prediction adapter")
        return Engine.shared(model_dir, None, chat_template=template)


def test_engine_from_a_local_directory_is_lossless_with_the_default_sidecar(engine, model_dir):
    assert type(engine.target).__name__ == "Gemma3ForCausalLM"
    assert engine.sidecar is not None and "smollm2-sidecar" in engine.sidecar.name
    messages = [{"role": "user", "content": ASK}]
    ids = engine.prompt_ids(messages, [WEATHER], tool_choice="required")
    reference = greedy(engine, ids, MAX_NEW_TOKENS)
    for method in ("ar", "toolspec", "oospec"):
        gen = engine.generate(messages, [WEATHER], tool_choice="required", max_new_tokens=MAX_NEW_TOKENS,
                              method=method)
        assert gen.token_ids == reference[:len(gen.token_ids)], method
    gen = engine.generate(messages, [WEATHER], tool_choice="required", max_new_tokens=CALL_TOKENS, strict=True)
    assert [c["name"] for c in gen.tool_calls] == ["get_current_weather"], gen.text


def test_chatoospec_by_path(engine, model_dir, template):
    from langchain_oospec import ChatOoOSpec
    model = ChatOoOSpec(model=model_dir, chat_template=template, max_tokens=CALL_TOKENS)
    reply = model.bind_tools([WEATHER], tool_choice="any", strict=True).invoke(ASK)
    assert [c["name"] for c in reply.tool_calls] == ["get_current_weather"], reply
    assert Engine.shared(model_dir, None, chat_template=template) is engine


def test_oospec_llm_by_path(model_dir, template):
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.oospec import OoOSpec

    def get_current_weather(city: str) -> str:
        """Get the current weather in a given city."""
        return f"22 degrees in {city}"

    llm = OoOSpec(model=model_dir, chat_template=template, max_new_tokens=CALL_TOKENS, strict=True)
    response = llm.chat_with_tools([FunctionTool.from_defaults(get_current_weather)], user_msg=ASK,
                                   tool_required=True)
    calls = llm.get_tool_calls_from_response(response, error_on_no_tool_call=True)
    assert [c.tool_name for c in calls] == ["get_current_weather"]


def test_the_server_serves_it_under_its_path(engine, model_dir):
    from openai import OpenAI

    from oospec_agents.serve import create_app
    from serve_testing import running
    with running(create_app(engine, model=model_dir)) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == [model_dir]
        reply = client.chat.completions.create(model=model_dir, messages=[{"role": "user", "content": ASK}],
                                               tools=[{**WEATHER, "function": {**WEATHER["function"], "strict": True}}],
                                               tool_choice="required", max_tokens=CALL_TOKENS)
    assert reply.choices[0].message.tool_calls[0].function.name == "get_current_weather"


def test_a_cuda_device_that_is_not_there_is_refused_by_name(model_dir, template):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has cuda:1")
    with pytest.raises(DeviceError, match=r"device 'cuda:1' requested but"):
        Engine.from_pretrained(model_dir, target_device="cpu", sidecar_device="cuda:1", chat_template=template)
