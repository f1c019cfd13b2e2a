"""A real engine on a tiny random model, for what needs a real engine but not a real answer."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The repository's test helpers (tests/oospec_testing.py), when this folder is run on its own.
sys.path.append(str(Path(__file__).resolve().parents[4] / "tests"))


@pytest.fixture(scope="session")
def tiny_engine():
    """SmolLM2's tokenizer over 2 random layers: replies are nonsense that runs to max_tokens, a few
    milliseconds a round."""
    from oospec_testing import make_tiny_engine
    return make_tiny_engine()
