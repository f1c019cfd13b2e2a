"""Shared fixtures: tiny random models on SmolLM2's real tokenizer, the embedded model in fp32,
and dev records spread over the data's sources."""
from __future__ import annotations

import copy

import pytest
import torch

from oospec_testing import greedy, load_records, once_per_run, spread, tiny_model  # noqa: F401


@pytest.fixture(scope="session")
def dev_records20() -> list[dict]:
    return spread(load_records("dev"), 20)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    from oospec_agents.models import resolve_reference
    return resolve_reference("embedded")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_engine(request, smollm2_tokenizer):
    from oospec_agents import Engine
    return Engine(tiny_model(request.param, smollm2_tokenizer), smollm2_tokenizer, model_name=f"tiny-{request.param}")


@pytest.fixture(scope="session")
def embedded_fp32():
    """The embedded target in float32 (exact losslessness is a float32 property), no sidecar. Its
    prefix cache holds the 20 slow-test records' prompts (about 430 tokens each) with room to spare,
    and the slow tests' other engines on this target share it (`oospec_testing.on_target_of`)."""
    from oospec_agents import Engine
    return Engine.from_pretrained("embedded", sidecar=False, dtype=torch.float32, prefix_cache_tokens=16384)


@pytest.fixture(scope="session")
def embedded_sidecar():
    """The embedded sidecar in a thread of this process, loaded once. Its dtype is the engine's default on
    this CPU (bf16 only where the CPU has it natively: emulated bf16 makes every wave slower)."""
    from oospec_agents.models import resolve_dtype
    from oospec_agents.sidecar.load import load_sidecar
    cpu = torch.device("cpu")
    return load_sidecar("embedded", device=cpu, dtype=resolve_dtype(None, cpu), sidecar_placement="thread")




@pytest.fixture(scope="session")
def embedded_greedy48(embedded_fp32, dev_records20, tmp_path_factory) -> list[list[int]]:
    """Per record of `dev_records20`: transformers' greedy 48 tokens under tool_choice="required" --
    the reference every embedded method must reproduce (its first n tokens are greedy's n tokens).
    Computed once per run: xdist workers (same machine, same thread count) share it."""
    return once_per_run(tmp_path_factory, "embedded_greedy48.json", lambda: [
        greedy(embedded_fp32, embedded_fp32.prompt_ids(r["messages"], r["tools"], tool_choice="required"), 48)
        for r in dev_records20])


@pytest.fixture(scope="session")
def embedded_server():
    """`oospec serve` on the embedded default (the shared engine), on 127.0.0.1: its base URL."""
    from oospec_agents import Engine
    from oospec_agents.serve import create_app
    from serve_testing import running
    with running(create_app(Engine.shared("embedded"), model="embedded")) as url:
        yield url


@pytest.fixture(scope="module")
def with_template(smollm2_tokenizer):
    """template text -> a copy of SmolLM2's tokenizer that renders chats with it."""
    def make(template: str):
        tok = copy.deepcopy(smollm2_tokenizer)
        tok.chat_template = template
        return tok
    return make
