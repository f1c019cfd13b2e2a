"""The sidecar's hints for vLLM requests (filled in below)."""
from __future__ import annotations


def hints_from_env(reader):
    return None
