"""The unit tests' test double for `oospec_agents.Engine`: `oospec_agents.testing.Scripted`, the real
engine on a model scripted to write given replies."""
from __future__ import annotations

import pytest

from oospec_agents.testing import Scripted


@pytest.fixture
def scripted():
    """`scripted(*replies)` -> a `Scripted` engine."""
    return Scripted
