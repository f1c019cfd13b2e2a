"""The vLLM tests (`make test-vllm`, from .venv-vllm). Outside `make test`'s testpaths: vLLM's CPU build
needs its own venv (its pins conflict with ours: docs/vllm.md). The tests that start vLLM are not
collected where vLLM is not installed; the proposer's own tests run anywhere.

Float32 throughout: vLLM's verify step and its AR step agree bit for bit there (bf16 does not)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
collect_ignore_glob = [] if HAVE_VLLM else ["test_in_vllm.py", "test_serve_vllm.py"]

DEV = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "toolcalls" / "dev.jsonl"
N_RECORDS = 24


@pytest.fixture(scope="session")
def records() -> list[dict]:
    if not DEV.exists():
        pytest.fail(f"the dev records are not at {DEV}")
    rows = [json.loads(line) for line in DEV.read_text().splitlines() if line.strip()]
    return rows[:N_RECORDS]


@pytest.fixture(scope="session")
def engine():
    """The engine's embedded target in float32, no sidecar: it renders the prompts (`prompt_ids`) and
    gives the AR references the proposer's tests replay."""
    from oospec_agents import Engine
    eng = Engine.from_pretrained("embedded", sidecar=False, dtype="float32")
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def model_dir() -> str:
    """The embedded target, merged, as the HF directory vLLM loads."""
    from oospec_agents.vllm.model import embedded_target_dir
    return str(embedded_target_dir())


# The runs every vLLM test module compares: each module declares how it runs one method over its own
# prompts (`run_method(method, model_dir, prompts)`), and these module-scoped fixtures run it once.
@pytest.fixture(scope="module")
def ar(request, model_dir, prompts):
    return request.module.run_method("vllm-ar", model_dir, prompts)


@pytest.fixture(scope="module")
def oospec(request, model_dir, prompts):
    return request.module.run_method("vllm-oospec", model_dir, prompts)


@pytest.fixture(scope="module")
def ngram(request, model_dir, prompts):
    return request.module.run_method("vllm-ngram", model_dir, prompts)
