"""The rough edges a new user hits first (#57): sampling settings out of OpenAI's ranges are clear
errors in the Python API, both front-ends and the server alike; a script that builds a process
sidecar at its top level is told what happened and how to fix it; and what a `seed` promises
(docs/engine.md, "What a seed promises") holds."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx
import pytest
import torch

from oospec_testing import tiny_model
from oospec_agents import Engine
from oospec_agents.errors import SamplingError
from oospec_agents.frontend import check_penalties
from oospec_agents.sampling import Sampling
from oospec_agents.sidecar.hosts.process import BOOTSTRAP_EXIT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

# ---------------------------------------------------------------- sampling ranges, one check for all

#: (settings, the field named, the range its message states): OpenAI's ranges, vLLM's for top_k and min_p
OUT_OF_RANGE = [
    ({"temperature": 5}, "temperature", "from 0 to 2"),
    ({"temperature": 2.0001}, "temperature", "from 0 to 2"),
    ({"temperature": float("inf")}, "temperature", "from 0 to 2"),
    ({"temperature": float("nan")}, "temperature", "from 0 to 2"),
    ({"top_p": 1.5}, "top_p", "in (0, 1]"),
    ({"top_p": -0.1}, "top_p", "in (0, 1]"),
    ({"top_k": -2}, "top_k", ">= 0 (0: no top-k)"),
    ({"min_p": -0.1}, "min_p", "in [0, 1] (vLLM's range"),
]


@pytest.mark.parametrize("settings, field, says", OUT_OF_RANGE)
def test_the_engines_check_names_the_field_and_states_its_range(settings, field, says):
    with pytest.raises(SamplingError) as err:
        Sampling(**settings)
    assert err.value.param == field and says in str(err.value), str(err.value)


@pytest.mark.parametrize("temperature", [0, 0.0, 1, 2, 2.0])
def test_temperature_0_to_2_is_taken(temperature):
    assert Sampling(temperature=temperature).temperature == temperature


@pytest.mark.parametrize("settings, field, says", [
    ({"presence_penalty": 5}, "presence_penalty", "presence_penalty must be a number from -2 to 2, got 5"),
    ({"frequency_penalty": -2.5}, "frequency_penalty", "frequency_penalty must be a number from -2 to 2"),
    ({"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty must be a number above 0"),
    ({"presence_penalty": 1.0}, "presence_penalty", "presence_penalty=1.0 is not served"),
])
def test_penalties_out_of_range_say_so_before_they_are_refused_as_not_served(settings, field, says):
    with pytest.raises(SamplingError) as err:
        check_penalties(settings)
    assert err.value.param == field and says in str(err.value), str(err.value)
    assert getattr(err.value, "code", None) == (None if "must be" in says else "unsupported_parameter")


def test_the_python_api_refuses_temperature_5_before_decoding(tiny_engine):
    with pytest.raises(SamplingError, match=r"temperature must be a number from 0 to 2 .*got 5"):
        tiny_engine.generate(ASK, max_new_tokens=2, temperature=5)
    with pytest.raises(SamplingError, match=r"top_p must be a number in \(0, 1\], got 1.5"):
        next(iter(tiny_engine.stream(ASK, max_new_tokens=2, temperature=1, top_p=1.5)))


def test_both_front_ends_refuse_temperature_5():
    from langchain_oospec import ChatOoOSpec
    from llama_index.llms.oospec import OoOSpec
    with pytest.raises(ValueError, match="temperature must be a number from 0 to 2"):
        ChatOoOSpec(temperature=5)
    with pytest.raises(ValueError, match="presence_penalty must be a number from -2 to 2"):
        ChatOoOSpec(presence_penalty=3)
    with pytest.raises(ValueError, match="temperature must be a number from 0 to 2"):
        OoOSpec(temperature=5)


@pytest.fixture(scope="module")
def server():
    from oospec_agents.serve import create_app
    from oospec_agents.testing import Scripted
    from serve_testing import running
    with running(create_app(Scripted("hi"), model="m")) as base:
        yield base


@pytest.mark.parametrize("body, param, says", [
    ({"temperature": 5}, "temperature", "temperature must be a number from 0 to 2"),
    ({"top_p": 1.5}, "top_p", "top_p must be a number in (0, 1]"),
    ({"n": 0}, "n", "n must be an integer from 1 to 8"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs must be an integer from 0 to 20"),
    ({"presence_penalty": 5}, "presence_penalty", "presence_penalty must be a number from -2 to 2"),
    ({"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty must be a number from -2 to 2"),
    ({"min_p": 2}, "min_p", "min_p must be a number in [0, 1]"),
])
def test_the_server_answers_400_naming_the_field(server, body, param, says):
    r = httpx.post(server + "/v1/chat/completions", json={"model": "m", "messages": ASK, **body}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error


# ---------------------------------------------------------------- a process sidecar built at a script's top level

TOP_LEVEL_SCRIPT = """
import sys
from oospec_agents import Engine

# no `if __name__ == "__main__":` -- the process sidecar's worker re-imports this file
engine = Engine.from_pretrained(sys.argv[1], sys.argv[1], sidecar_device="cpu:1", dtype="float32")
print("built")
engine.close()
"""


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    path = tmp_path_factory.mktemp("tiny-pair")
    tiny_model("llama", smollm2_tokenizer, seed=3).save_pretrained(path)
    smollm2_tokenizer.save_pretrained(path)
    return str(path)


needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="sidecar_device='cpu:1' needs 2 cores")


@needs_two_cores
def test_a_process_sidecar_built_at_a_scripts_top_level_says_what_happened_and_the_fix(tmp_path, tiny_dir):
    script = tmp_path / "agent.py"
    script.write_text(TOP_LEVEL_SCRIPT)
    out = subprocess.run([sys.executable, str(script), tiny_dir], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode != 0 and "built" not in out.stdout, out.stdout + out.stderr[-3000:]
    error = [line for line in out.stderr.splitlines() if line.startswith("oospec_agents.errors.ModelLoadError")]
    assert error, out.stderr[-3000:]
    message = error[-1]
    assert f"exit code {BOOTSTRAP_EXIT}" in message
    assert "re-imports this program's main module" in message and str(script) in message
    assert 'if __name__ == "__main__":' in message and 'sidecar_placement="thread"' in message


@needs_two_cores
def test_a_main_module_the_worker_cannot_import_is_named_as_the_cause(tmp_path, tiny_dir):
    script = tmp_path / "agent.py"
    script.write_text('if __name__ != "__main__":\n    raise ImportError("only python agent.py runs me")\n'
                      + TOP_LEVEL_SCRIPT)
    out = subprocess.run([sys.executable, str(script), tiny_dir], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode != 0 and "only python agent.py runs me" in out.stderr, out.stderr[-3000:]
    message = [line for line in out.stderr.splitlines() if line.startswith("oospec_agents.errors.ModelLoadError")][-1]
    assert "exit code 1 before the worker ran any of its own code" in message and str(script) in message


@needs_two_cores
def test_the_same_script_with_the_guard_builds_its_engine(tmp_path, tiny_dir):
    script = tmp_path / "agent.py"
    body = textwrap.indent(TOP_LEVEL_SCRIPT.split("\n", 4)[4], "    ")
    script.write_text("import sys\nfrom oospec_agents import Engine\n\nif __name__ == \"__main__\":\n" + body)
    out = subprocess.run([sys.executable, str(script), tiny_dir], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0 and "built" in out.stdout, out.stderr[-3000:]



# ---------------------------------------------------------------- what a seed promises (docs/engine.md)

WEATHER = {"type": "function", "function": {"name": "get_current_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
RIGHT = '<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WRONG = '<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Quito"}}\n</tool_call>'


def _sampled(engine: Engine, method: str = "toolspec", hint: str | None = None, seed: int = 7):
    return engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=24, method=method, hint=hint,
                           temperature=0.9, top_p=0.95, seed=seed)


def test_a_seed_gives_the_same_reply_for_the_same_request_and_engine_state(smollm2_tokenizer):
    engine = Engine(tiny_model("llama", smollm2_tokenizer, seed=5), smollm2_tokenizer)
    first = _sampled(engine).token_ids
    engine.clear_call_memory()
    engine.clear_prefix_cache()
    assert _sampled(engine).token_ids == first and len(first) == 24
    assert _sampled(engine, seed=8).token_ids != first  # the seed picks the draws


def test_the_call_memory_drafts_a_repeated_request(smollm2_tokenizer):
    """The engine's state reaches the forwards: a repeated request is drafted from the call memory,
    so its forwards verify other trees (what can change a bf16 reply without deterministic mode)."""
    engine = Engine(tiny_model("llama", smollm2_tokenizer, seed=5), smollm2_tokenizer)
    cold = engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=24, method="toolspec")
    warm = engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=24, method="toolspec")
    assert warm.token_ids == cold.token_ids  # float32 here: the same tokens ...
    assert warm.stats.accepted_by_source["retrieval"] > cold.stats.accepted_by_source["retrieval"]  # ... other trees
    assert warm.stats.target_forwards < cold.stats.target_forwards


def test_deterministic_mode_keeps_a_seeded_bf16_reply_whatever_the_call_memory_and_method(smollm2_tokenizer):
    engine = Engine(tiny_model("llama", smollm2_tokenizer, seed=3).to(torch.bfloat16), smollm2_tokenizer,
                    deterministic=True)
    engine.clear_call_memory()
    reference = _sampled(engine, "ar").token_ids  # one token a forward, nothing drafted; now in the call memory
    assert len(reference) == 24
    for method, hint in (("toolspec", None), ("oospec", RIGHT), ("oospec", WRONG), ("ar", None)):
        full = _sampled(engine, method, hint)
        assert full.token_ids == reference, (method, hint)
        if method == "toolspec":
            assert full.stats.accepted_by_source["retrieval"] > 0  # drafted from the call memory
        engine.clear_call_memory()
        assert _sampled(engine, method, hint).token_ids == reference, (method, hint)  # an empty one
