"""Raw replies for the scripted engine (a uniquely named module: the test folders' conftest modules all
share the name `conftest`, so `from conftest import ...` finds whichever was imported first)."""
from __future__ import annotations

from oospec_agents.formats import HermesFormat


def reply_text(content: str, calls: list[tuple[str, dict]]) -> str:
    """The raw reply a Hermes-format model writes: its text, then its calls' markup."""
    rendered = HermesFormat().render_calls([{"name": name, "arguments": args} for name, args in calls])
    return content + ("\n" if content and calls else "") + rendered
