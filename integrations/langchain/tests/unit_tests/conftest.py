"""The unit tests' test double for `oospec_agents.Engine` (`oospec_agents.testing.ScriptedEngine`)."""
from __future__ import annotations

import pytest

from oospec_agents.testing import ScriptedEngine


@pytest.fixture
def scripted():
    """`scripted(*replies)` -> a ScriptedEngine test double."""
    return ScriptedEngine
