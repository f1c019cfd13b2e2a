"""What a new user meets first: the extras each command needs and the pip line that brings them, a bench
without matplotlib, model references checked before anything loads, tool schemas' errors and forms, and
loads that print nothing of the libraries' own unless asked. README's install lines themselves run in
tests/test_wheels.py."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

from oospec_agents import Engine, cli
from oospec_agents.errors import ModelLoadError, ToolSchemaError
from oospec_agents.references import check_reference
from oospec_agents.tools import normalize_tools
from oospec_testing import tiny_model

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


def block(monkeypatch, *modules: str) -> None:
    """Import these modules as a venv without them would: ModuleNotFoundError naming each one."""
    for name in list(sys.modules):
        if name.split(".")[0] in modules or name.startswith(("oospec_agents.serve", "oospec_agents.bench")):
            monkeypatch.delitem(sys.modules, name)
    for name in modules:
        monkeypatch.setitem(sys.modules, name, None)


# ------------------------------------------------------------------ 1. extras and their pip lines

def test_help_and_a_command_without_its_extra_name_the_pip_line_that_fixes_it(monkeypatch, capsys):
    block(monkeypatch, "fastapi")
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert 'serve unavailable, needs the [serve] extra: pip install "oospec-agents[serve]"' in shown, shown
    assert 'pip install "oospec-agents[all]"' in shown
    with pytest.raises(SystemExit) as done:
        cli.main(["serve", "--port", "8001"])  # its flags are unknown without the module that declares them
    assert 'oospec serve needs the [serve] extra' in str(done.value.code)
    assert 'pip install "oospec-agents[serve]"' in str(done.value.code) and "fastapi" in str(done.value.code)


def test_a_flags_missing_module_names_its_own_extra():
    ray = ModuleNotFoundError("No module named 'ray'", name="ray")
    assert cli.missing_extra("serve", ray) == "ray"
    assert cli.missing_extra("train-sidecar", ModuleNotFoundError(name="peft")) == "train"
    assert cli.missing_extra("serve", ModuleNotFoundError(name="peft")) == "embedded"
    assert cli.missing_extra("bench", ModuleNotFoundError(name="json5")) is None
    assert cli.needs_extra("serve", ray).endswith('pip install "oospec-agents[ray]" (in a clone, pip install ".[ray]")')


def test_every_extra_the_cli_names_is_declared_and_all_brings_them():
    named = set(cli.EXTRA_MODULES) | set(cli.COMMAND_EXTRA.values())
    assert named <= set(EXTRAS), named - set(EXTRAS)
    (everything,) = EXTRAS["all"]
    brought = set(re.fullmatch(r"oospec-agents\[(.*)\]", everything).group(1).split(","))
    assert brought == set(EXTRAS) - {"all", "suffix", "vllm", "dev"}, brought


@pytest.mark.parametrize("doc, extra", [("README.md", "serve"), ("README.md", "bench"), ("README.md", "mcp"),
                                        ("README.md", "train"), ("README.md", "all"), ("docs/server.md", "serve"),
                                        ("docs/bench.md", "bench"), ("docs/training.md", "train"),
                                        ("docs/mcp.md", "mcp"), ("docs/own-model.md", "all"),
                                        ("docs/troubleshooting.md", "serve")])
def test_the_docs_name_each_commands_extra(doc, extra):
    text = (ROOT / doc).read_text()
    assert f'"oospec-agents[{extra}]"' in text or f'".[{extra}]"' in text, (doc, extra)


# ------------------------------------------------------------------ 2. a bench without matplotlib

RECORD = {"id": "edge/0", "source": "edge", "messages": [{"role": "user", "content": "Weather in Paris?"}],
          "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
              "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
          "expected": [{"name": "get_weather", "arguments": {"city": "Paris"}}], "meta": {}}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, smollm2_tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tiny-target")
    tiny_model("llama", smollm2_tokenizer, seed=5).save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return path


def test_bench_without_matplotlib_prints_its_table_and_writes_all_but_the_plot(monkeypatch, tmp_path, tiny_dir,
                                                                              capsys):
    block(monkeypatch, "matplotlib")
    data, out = tmp_path / "records.jsonl", tmp_path / "out"
    data.write_text(json.dumps(RECORD) + "\n")
    rc = cli.main(["bench", "--data", str(data), "--target", str(tiny_dir), "--sidecar", "none", "--methods",
                   "ar,toolspec", "--limit", "1", "--max-new-tokens", "6", "--no-warmup", "--dtype", "float32",
                   "--out", str(out)])
    said = capsys.readouterr()
    assert rc == 0
    assert "| toolspec | 1 |" in said.out  # the table
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "results.json"]
    assert "speedup.png" not in said.out.splitlines()[-1]
    assert 'no speedup.png: drawing it takes matplotlib' in said.err
    assert 'pip install "oospec-agents[bench]"' in said.err


# ------------------------------------------------------------------ 3. model references, early and fast

@pytest.mark.parametrize("typo, meant", [("embeded", "embedded"), ("Embedded", "embedded"), ("smolm2", "smollm2"),
                                         ("gemma-3", "gemma3"), ("embedded-thinkng", "embedded-thinking")])
def test_a_near_miss_of_a_shipped_name_asks_did_you_mean(typo, meant):
    with pytest.raises(ModelLoadError, match=f"unknown model '{typo}': did you mean '{meant}'"):
        check_reference(typo)


def test_the_front_ends_check_their_reference_at_construction_and_load_nothing(monkeypatch):
    from langchain_oospec import ChatOoOSpec
    from llama_index.llms.oospec import OoOSpec
    loads = []
    monkeypatch.setattr(Engine, "from_pretrained", lambda *a, **kw: loads.append(a))
    with pytest.raises(ValueError, match="did you mean 'embedded'"):
        ChatOoOSpec(model="embeded")
    with pytest.raises(ValueError, match="did you mean 'embedded'"):
        OoOSpec(model="embeded")
    with pytest.raises(ValueError, match="model path '/no/such/model' does not exist"):
        ChatOoOSpec(model="embedded", sidecar="/no/such/model")
    ChatOoOSpec(model="someorg/some-model")  # a hub id is probed when it loads, not here
    assert loads == []


class Hub:
    """A stand-in for the hub's address that counts connections: it hangs up on each (no network), or
    answers 404 as the hub does for a repository that does not exist."""

    def __init__(self, answer: bytes | None):
        self.connections, self.answer, self.paths = 0, answer, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        threading.Thread(target=self.serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536).split(b" ")  # read whole before the answer or the hang-up
                self.connections += 1
                self.paths.append(request[1].decode() if len(request) > 1 else "")
                if self.answer is not None:
                    conn.sendall(self.answer)


NOT_FOUND = (b"HTTP/1.1 404 Not Found\r\nX-Error-Code: RepoNotFound\r\nContent-Type: application/json\r\n"
             b"Content-Length: 27\r\nConnection: close\r\n\r\n{\"error\": \"Repo not found\"}")


@pytest.fixture
def hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    def at(answer):
        server = Hub(answer)
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        return server
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return at


def test_an_unreachable_hub_fails_the_load_on_one_probe_naming_the_id_and_the_cause(hub):
    server = hub(None)
    with pytest.raises(ModelLoadError) as error:
        Engine.from_pretrained("someorg/some-model", sidecar=False, target_device="cpu")
    message = str(error.value)
    assert "'someorg/some-model'" in message and "not in the local Hugging Face cache" in message
    assert f"the hub ({server.url}) cannot be reached" in message
    # one metadata request for the model (huggingface_hub may add its one-time /api/agent-harnesses), and
    # nothing after it: transformers' downloads and their retries never start
    assert [p for p in server.paths if p.startswith("/api/models")] == ["/api/models/someorg/some-model"], server.paths
    assert all(p.startswith("/api/") for p in server.paths), server.paths


def test_a_hub_id_that_does_not_exist_is_named(hub):
    server = hub(NOT_FOUND)
    with pytest.raises(ModelLoadError, match="'someorg/nope'.*has no such model"):
        check_reference("someorg/nope")
    assert "/api/models/someorg/nope" in server.paths


def test_offline_mode_fails_at_construction_without_a_connection(hub, monkeypatch):
    from huggingface_hub import constants
    from langchain_oospec import ChatOoOSpec
    server = hub(None)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="'someorg/some-model'.*HF_HUB_OFFLINE is set"):
        ChatOoOSpec(model="someorg/some-model")
    assert server.connections == 0


def test_a_cached_hub_id_passes_without_a_connection(hub, monkeypatch):
    from huggingface_hub import constants
    server = hub(None)
    snapshot = Path(constants.HF_HUB_CACHE) / "models--someorg--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    check_reference("someorg/cached")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    check_reference("someorg/cached")
    assert server.connections == 0


# ------------------------------------------------------------------ 4. tools

def test_the_flat_responses_form_of_a_tool_is_the_same_tool():
    params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    nested = {"type": "function", "function": {"name": "w", "description": "d", "parameters": params, "strict": True}}
    flat = {"type": "function", "name": "w", "description": "d", "parameters": params, "strict": True}
    assert normalize_tools([flat]) == normalize_tools([nested])
    assert normalize_tools([flat])[0].to_openai() == nested


def test_a_schema_error_names_every_problem_by_its_json_path():
    params = {"type": "objekt", "properties": {"city": {"type": "strin"}, "n": {"type": "integer", "minimum": "1"}}}
    with pytest.raises(ToolSchemaError) as error:
        normalize_tools([{"type": "function", "function": {"name": "w", "parameters": params}}])
    message = str(error.value)
    assert message.startswith("tool 'w' has an invalid JSON Schema (3 problems; $ is its 'parameters'): ")
    for path, bad in (("$.type", "'objekt'"), ("$.properties.city.type", "'strin'"),
                      ("$.properties.n.minimum", "'1' is not of type 'number'")):
        assert re.search(re.escape(path) + ": " + re.escape(bad), message), (path, message)


def test_a_tool_without_a_name_shows_both_forms():
    with pytest.raises(ToolSchemaError, match=r'expected \{"type": "function", "function": \{"name": ...\}\} '
                                              r'or the flat \{"type": "function", "name": ...\}'):
        normalize_tools([{"type": "function", "parameters": {}}])


# ------------------------------------------------------------------ 5. quiet loads

LOAD = ("import sys, torch; from oospec_agents import models; "
        "models.load_model(sys.argv[1], device=torch.device('cpu'), dtype=torch.float32, adapter=sys.argv[2])")


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, tiny_dir) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    path = tmp_path_factory.mktemp("tiny-adapter")
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(path)
    return path


def load_stderr(tiny_dir, adapter_dir, **env) -> str:
    unset = ("OOSPEC_VERBOSE", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")
    env = {**{k: v for k, v in os.environ.items() if k not in unset}, **env}
    done = subprocess.run([sys.executable, "-c", LOAD, str(tiny_dir), str(adapter_dir)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_a_load_prints_nothing_of_the_libraries_unless_asked(tiny_dir, adapter_dir):
    """The load of a target with a LoRA adapter: transformers' "Loading weights" bar and its
    `is_gradient_checkpointing` FutureWarning (which peft's merge triggers) show only when asked for."""
    asked = load_stderr(tiny_dir, adapter_dir, OOSPEC_VERBOSE="1")
    assert "Loading weights" in asked and "is_gradient_checkpointing" in asked, asked[-3000:]
    quiet = load_stderr(tiny_dir, adapter_dir)
    assert "Loading weights" not in quiet and "Warning" not in quiet, quiet[-3000:]
