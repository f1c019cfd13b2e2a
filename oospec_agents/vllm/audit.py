"""Counting what vLLM's structured outputs do with the proposer's drafts (a measurement, off by default).

vLLM cuts each draft to its longest prefix the request's grammar accepts before it verifies it
(`StructuredOutputManager.validate_tokens`), and ends a request whose committed tokens the grammar
refuses ("failed to advance FSM": `accept_tokens` returns False, the request finishes with an error).
`install()` wraps both where they run (vLLM's engine core, the proposer's process on the CPU build) and
counts: `rejected` (draft tokens cut), `drafts_cut` (drafts cut at all), `fsm_failures`. Nothing they
return changes. The proposer installs it when OOSPEC_VLLM_AUDIT=1 (the bench sets it).
"""
from __future__ import annotations

import functools


class Audit:
    def __init__(self):
        self.rejected = 0
        self.drafts_cut = 0
        self.fsm_failures = 0

    def to_dict(self) -> dict:
        return {"grammar_rejected": self.rejected, "drafts_cut": self.drafts_cut, "fsm_failures": self.fsm_failures}


_AUDIT: Audit | None = None


def install() -> Audit:
    """Wrap vLLM's grammar checks (once per process) and return their counts."""
    global _AUDIT
    if _AUDIT is not None:
        return _AUDIT
    from vllm.v1.structured_output import StructuredOutputManager
    audit = _AUDIT = Audit()
    validate, accept = StructuredOutputManager.validate_tokens, StructuredOutputManager.accept_tokens

    @functools.wraps(validate)
    def validate_tokens(self, request, spec_tokens):
        out = validate(self, request, spec_tokens)
        asked = sum(1 for t in spec_tokens if t >= 0)
        if len(out) < asked:
            audit.rejected += asked - len(out)
            audit.drafts_cut += 1
        return out

    @functools.wraps(accept)
    def accept_tokens(self, request, new_token_ids):
        ok = accept(self, request, new_token_ids)
        if not ok:
            audit.fsm_failures += 1
        return ok

    StructuredOutputManager.validate_tokens = validate_tokens
    StructuredOutputManager.accept_tokens = accept_tokens
    return audit
