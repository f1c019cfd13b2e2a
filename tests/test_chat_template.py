"""`chat_template=`: a tokenizer without a chat template fails at load time, naming the fix; a template
given as a string or as a file replaces the tokenizer's own in the engine, both integrations and
`oospec serve --chat-template`. Tiny random models on SmolLM2's tokenizer: no test here is slow."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from oospec_agents import Engine
from oospec_agents.errors import ChatFormatError, OoOSpecError
from oospec_agents.models import GEMMA3_CHAT_TEMPLATE
from oospec_testing import tiny_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def bare_dir(tmp_path_factory, smollm2_tokenizer) -> Path:
    """A tiny model whose tokenizer has no chat template (as the Gemma-3-270M GGUF's has none)."""
    out = tmp_path_factory.mktemp("no-template")
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = None
    tiny_model("llama", tok).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def smollm2_template(smollm2_tokenizer) -> str:
    return smollm2_tokenizer.chat_template


def load(path, **kw) -> Engine:
    return Engine.from_pretrained(str(path), sidecar=False, dtype=torch.float32, **kw)


# ---------------------------------------------------------------- no template: an error at load time

def test_a_tokenizer_without_a_chat_template_fails_at_load_naming_the_fix(bare_dir):
    with pytest.raises(ChatFormatError, match="has no chat template") as err:
        load(bare_dir)
    assert "chat_template=" in str(err.value) and "--chat-template" in str(err.value)


def test_an_engine_built_on_a_tokenizer_without_a_chat_template_fails_at_once(smollm2_tokenizer):
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = None
    with pytest.raises(ChatFormatError, match="has no chat template.*chat_template="):
        Engine(tiny_model("llama", tok), tok)


# ---------------------------------------------------------------- chat_template= fixes it

def test_a_template_string_renders_the_prompt(bare_dir, smollm2_tokenizer, smollm2_template):
    engine = load(bare_dir, chat_template=smollm2_template)
    reference = Engine(engine.target, smollm2_tokenizer)
    assert engine.prompt_ids(ASK, [WEATHER], tool_choice="required") == \
        reference.prompt_ids(ASK, [WEATHER], tool_choice="required")
    assert len(engine.generate(ASK, [WEATHER], max_new_tokens=3, method="toolspec").token_ids) == 3


@pytest.mark.parametrize("as_path", [str, Path])
def test_a_template_file_renders_the_prompt(bare_dir, tmp_path, smollm2_tokenizer, smollm2_template, as_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(smollm2_template)
    engine = load(bare_dir, chat_template=as_path(path))
    assert engine.tokenizer.chat_template == smollm2_template
    assert engine.prompt_ids(ASK, [WEATHER]) == Engine(engine.target, smollm2_tokenizer).prompt_ids(ASK, [WEATHER])


def test_the_shipped_gemma3_template_folds_the_system_text_and_gets_the_tool_prompt(bare_dir):
    engine = load(bare_dir, chat_template=GEMMA3_CHAT_TEMPLATE)
    assert not engine.native_tools  # it renders no tools=, so the engine writes the format's prompt
    history = [*ASK, {"role": "assistant", "content": "",
                      "tool_calls": [{"id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    prompt = engine.tokenizer.decode(engine.prompt_ids(history, [WEATHER]))
    bos = engine.tokenizer.bos_token
    assert prompt.startswith(bos + "<start_of_turn>user\nBe brief.\n\nYou are a function calling AI model.")
    assert '"name": "get_weather"' in prompt and "\nWeather in Paris?<end_of_turn>\n<start_of_turn>model\n<tool_call>" \
        in prompt
    assert prompt.endswith("sunny\n</tool_response><end_of_turn>\n<start_of_turn>model\n")


# ---------------------------------------------------------------- a bad template is named

def test_a_template_path_that_does_not_exist_is_named(bare_dir, tmp_path):
    missing = tmp_path / "nope.jinja"
    with pytest.raises(ChatFormatError, match=f"chat template file '{missing}' does not exist"):
        load(bare_dir, chat_template=missing)


@pytest.mark.parametrize("template, says", [
    ("{% for m in messages %}{{ m.content }}", "is not valid Jinja: Unexpected end of template"),
    ("{{ raise_exception('roles must alternate') }}", "cannot render a one-message chat: .*roles must alternate"),
])
def test_a_template_that_is_not_valid_jinja_is_named(bare_dir, tmp_path, template, says):
    with pytest.raises(ChatFormatError, match="chat template given as a string " + says):
        load(bare_dir, chat_template=template)
    path = tmp_path / "broken.jinja"
    path.write_text(template)
    with pytest.raises(ChatFormatError, match=f"chat template '{path}' " + says):
        load(bare_dir, chat_template=path)


def test_a_chat_template_that_is_neither_text_nor_path_is_named(bare_dir):
    with pytest.raises(ChatFormatError, match="chat_template must be a Jinja string or a file path, got int"):
        load(bare_dir, chat_template=3)


# ---------------------------------------------------------------- the front-ends pass it on

def test_chat_oospec_loads_its_engine_with_the_template(bare_dir, tmp_path, monkeypatch, smollm2_template):
    from langchain_oospec import ChatOoOSpec
    monkeypatch.setattr(Engine, "_shared", {})
    path = tmp_path / "chatml.jinja"
    path.write_text(smollm2_template)
    with pytest.raises(ChatFormatError, match="has no chat template"):
        ChatOoOSpec(model=bare_dir, max_tokens=2).invoke("hi")
    reply = ChatOoOSpec(model=bare_dir, chat_template=path, max_tokens=2).invoke("hi")
    assert reply.usage_metadata["output_tokens"] == 2


def test_oospec_llm_loads_its_engine_with_the_template(bare_dir, monkeypatch, smollm2_template):
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.oospec import OoOSpec
    monkeypatch.setattr(Engine, "_shared", {})
    with pytest.raises(ChatFormatError, match="has no chat template"):
        OoOSpec(model=bare_dir).metadata
    llm = OoOSpec(model=bare_dir, chat_template=smollm2_template, max_new_tokens=2)
    assert llm.engine.tokenizer.chat_template == smollm2_template
    assert llm.chat([ChatMessage(role="user", content="hi")]).raw["usage"]["completion_tokens"] == 2


def test_serve_passes_chat_template_to_the_engine(monkeypatch, tmp_path):
    import uvicorn

    from oospec_agents.cli import main
    from oospec_agents.serve import app as serve_app
    loaders = []
    monkeypatch.setattr(serve_app, "create_app", lambda loader, **options: loaders.append(loader))
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    monkeypatch.setattr(Engine, "from_pretrained", lambda **kw: kw)
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}")
    assert main(["serve", "--model", "some/model", "--chat-template", str(path)]) == 0
    assert loaders[0]()["chat_template"] == str(path)
    assert main(["serve", "--model", "some/model"]) == 0
    assert "chat_template" not in loaders[1]()


def test_serve_refuses_a_chat_template_path_that_does_not_exist(capsys, tmp_path):
    from oospec_agents.cli import main
    assert main(["serve", "--chat-template", str(tmp_path / "nope.jinja")]) == 2
    assert f"chat template file '{tmp_path / 'nope.jinja'}' does not exist" in capsys.readouterr().err


# ---------------------------------------------------------------- stop sequences are checked in prepare

@pytest.mark.parametrize("stop, says", [(["", None], r"stop\[0\] is ''"), (["ok", None], r"stop\[1\] is None"),
                                        ([3], r"stop\[0\] is 3"), (5, "stop must be a string or a list of strings, got int")])
def test_stop_sequences_must_be_non_empty_strings(tiny_engine, stop, says):
    with pytest.raises(OoOSpecError, match=says):
        tiny_engine.prepare(ASK, stop=stop)
    assert tiny_engine.prepare(ASK, stop="\nObservation:").stop == ["\nObservation:"]
