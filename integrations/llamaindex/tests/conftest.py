"""Fixtures: a scripted engine for the adapter layer, a tiny real engine for releasing it, and the
embedded engine for end-to-end checks."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from oospec_agents.testing import Scripted

from llama_index.llms.oospec import OoOSpec
from scripted_replies import reply_text

# The repository's test helpers (tests/oospec_testing.py), when this folder is run on its own.
sys.path.append(str(Path(__file__).resolve().parents[3] / "tests"))


@pytest.fixture
def scripted():
    """Build an OoOSpec over a `Scripted` engine (the real engine on a scripted model) that writes `replies`,
    each (content, [(tool, args), ...])."""
    def make(*replies, **kwargs) -> tuple[OoOSpec, Scripted]:
        engine = Scripted(*(reply_text(*r) for r in replies), model_name="scripted-model")
        return OoOSpec(engine=engine, **kwargs), engine
    return make


@pytest.fixture(scope="module")
def embedded_llm():
    """The embedded default pair, loaded once; small replies keep the CPU budget."""
    return OoOSpec(max_new_tokens=48)


@pytest.fixture(scope="session")
def tiny_engine():
    """A real engine on a tiny random model (SmolLM2's tokenizer, 2 layers): its replies are long
    nonsense, decoded in a few milliseconds a round, so a stream can be abandoned halfway."""
    from oospec_testing import make_tiny_engine
    return make_tiny_engine()
