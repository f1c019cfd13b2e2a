"""The real Gemma-3-270M as a target: another tokenizer (262k vocabulary), no chat template of its own
(the shipped gemma3.jinja is passed as `chat_template=`), and sliding-window attention layers (window
512, which these ~500-token tool prompts cross). Every method stays token-identical to transformers'
greedy generate, with the embedded SmolLM2 sidecar posting hints across tokenizers."""
from __future__ import annotations

import pytest
import torch

from oospec_agents import Engine
from oospec_agents import models
from oospec_testing import greedy

MAX_NEW_TOKENS = 24
METHODS = ("ar", "toolspec", "oospec")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma3(embedded_sidecar):
    """Gemma 3 with the session's embedded sidecar (the object, not loaded again)."""
    return Engine.from_pretrained(models.embedded_gguf("gemma3"), sidecar=embedded_sidecar, dtype=torch.float32,
                                  chat_template=models.GEMMA3_CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def runs(gemma3, dev_records20):
    """Per record (10, spread over the sources): the greedy reference and each method's Generation,
    or the exception it raised. Methods run back to back on a record, so after `ar` the prompt's KV
    comes from the prefix cache (a ~500-token prefill is most of a record's cost on this CPU)."""
    out = []
    for rec in dev_records20[::2]:
        ids = gemma3.prompt_ids(rec["messages"], rec["tools"], tool_choice="required")
        gens = {}
        for method in METHODS:
            try:
                gens[method] = gemma3.generate(rec["messages"], rec["tools"], tool_choice="required",
                                               max_new_tokens=MAX_NEW_TOKENS, method=method)
            except Exception as e:  # reported by that method's test alone
                gens[method] = e
        out.append((rec, ids, greedy(gemma3, ids, MAX_NEW_TOKENS), gens))
    return out


def test_gemma3_loads_with_the_shipped_template(gemma3):
    assert type(gemma3.target).__name__ == "Gemma3ForCausalLM"
    assert gemma3.tokenizer.chat_template == models.GEMMA3_CHAT_TEMPLATE.read_text()
    assert not gemma3.native_tools  # the template renders no tools=: the format's system prompt is injected


@pytest.mark.parametrize("method", METHODS)
def test_gemma3_matches_greedy_generate_on_10_dev_records(runs, gemma3, method):
    assert len({rec["source"] for rec, *_ in runs}) >= 4
    window = gemma3.target.config.sliding_window
    assert any(len(ids) + MAX_NEW_TOKENS > window for _, ids, _, _ in runs)  # some replies cross the window
    for rec, _, reference, gens in runs:
        gen = gens[method]
        if isinstance(gen, Exception):
            raise gen
        assert gen.token_ids == reference, f"{method} diverged from greedy on {rec['id']}"
