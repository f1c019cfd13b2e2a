"""Every popular open architecture as the target: tiny random models of each family, float32, with
prompts longer than their sliding windows, are token-identical to `generate(do_sample=False)` under
`ar`, `toolspec` and `oospec` -- with drafts that force long accepted paths and rejected branches.

The results also make README's coverage table (`test_readme_coverage_table_is_current`); set
OOSPEC_WRITE_COVERAGE=1 to rewrite it from this run.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
import torch

from oospec_testing import ReferenceDrafter, greedy
from oospec_agents import Engine
from oospec_agents.errors import ModelLoadError
from oospec_agents.verify import Tree, Verifier, attention_layout

WINDOW = 16        # every sliding window here; the prompts are ~290 tokens
NEW = 40
TOOLS = [{"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris in celsius?"}]

#: family -> (transformers model_type, config overrides). "sliding" families get WINDOW.
FAMILIES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen2 (sliding layers)": ("qwen2", {"use_sliding_window": True, "sliding_window": WINDOW,
                                         "max_window_layers": 2}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "qwen3_moe": ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                "head_dim": 16}),
    "phi3 (sliding window)": ("phi3", {"sliding_window": WINDOW}),
    "smollm3": ("smollm3", {}),
    "olmo2": ("olmo2", {}),
    "granite": ("granite", {}),
    "gemma2": ("gemma2", {"sliding_window": WINDOW, "head_dim": 16}),
    "gemma3_text": ("gemma3_text", {"sliding_window": WINDOW, "head_dim": 16, "num_hidden_layers": 6}),
    "gpt_oss": ("gpt_oss", {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2,
                            "head_dim": 16}),
    "mistral (sliding window)": ("mistral", {"sliding_window": WINDOW}),
    "cohere2": ("cohere2", {"sliding_window": WINDOW, "head_dim": 16}),
}
METHODS = ("ar", "toolspec", "oospec")
README = Path(__file__).resolve().parents[1] / "README.md"


def tiny_target(model_type: str, overrides: dict, tokenizer):
    from transformers import AutoConfig, AutoModelForCausalLM
    kw = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
              eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
              pad_token_id=tokenizer.pad_token_id)
    cfg = AutoConfig.for_model(model_type, **{**kw, **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model


def _run(engine: Engine, method: str, reference: list[int], prompt_ids: list[int]) -> dict:
    hint = None
    if method == "oospec":
        # A fixed hint: the reference's first half right, then a wrong stretch, then the rest --
        # long accepted paths and rejected branches.
        half = len(reference) // 2
        hint = engine.tokenizer.decode(reference[:half]) + " zebra quartz" + engine.tokenizer.decode(reference[half:])
    gen = engine.generate(ASK, TOOLS, tool_choice="required", max_new_tokens=NEW, method=method, hint=hint)
    return {"lossless": gen.token_ids == reference, "forwards": gen.stats.target_forwards,
            "accepted": sum(gen.stats.accepted_by_source.values())}


@pytest.fixture(scope="module")
def coverage(smollm2_tokenizer) -> dict:
    """family -> {"window", "prompt", "layout", method -> result, "tree" -> result}: one run of each."""
    out = {}
    for family, (model_type, overrides) in FAMILIES.items():
        engine = Engine(tiny_target(model_type, overrides, smollm2_tokenizer), smollm2_tokenizer,
                        model_name=f"tiny-{family}")
        ids = engine.prompt_ids(ASK, TOOLS, tool_choice="required")
        ref = greedy(engine, ids, NEW)
        row = {"window": overrides.get("sliding_window"), "prompt": len(ids), "layout": engine._verifier.layout}
        for method in METHODS:
            row[method] = _run(engine, method, ref, ids)
        engine = engine.with_parts(drafters={"retrieval": ReferenceDrafter(ref, len(ids), wrong_at=3, branch=True)})
        row["tree"] = _run(engine, "toolspec", ref, ids)
        out[family] = row
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_method_is_lossless_on_every_family(coverage, family):
    row = coverage[family]
    if row["window"] is not None:
        assert row["prompt"] > 4 * row["window"], "the prompt must reach far past the sliding window"
        assert any(w == WINDOW for w in row["layout"].windows.values())
    assert row["layout"].tree, row["layout"].reason
    for method in METHODS:
        assert row[method]["lossless"], f"{family}: {method} differs from generate(do_sample=False)"
    assert row["oospec"]["forwards"] < row["ar"]["forwards"]
    # The branching drafts: every round is a real tree whose second branch is accepted.
    assert row["tree"]["lossless"]
    assert row["tree"]["accepted"] >= NEW - 8 and row["tree"]["forwards"] <= 1 + -(-(NEW - 1) // 9) + 1


@pytest.mark.parametrize("family", ["gemma3_text", "mistral (sliding window)"])
def test_a_sliding_target_reuses_a_cached_prompt_prefix_far_past_its_window(smollm2_tokenizer, family):
    """A partial prefix-cache hit crops the cached prompt back to the shared prefix, which a
    window-sized cache could not: the full-past cache can, and the reply is still greedy's."""
    model_type, overrides = FAMILIES[family]
    # chunks of 16 prompt tokens (prefix_cache.py): a short prompt still shares whole chunks
    engine = Engine(tiny_target(model_type, overrides, smollm2_tokenizer), smollm2_tokenizer, prefill_chunk=16)
    engine.generate(ASK, TOOLS, tool_choice="required", max_new_tokens=4, method="ar")
    other = [{"role": "user", "content": "And in Rome, in fahrenheit?"}]
    ids = engine.prompt_ids(other, TOOLS, tool_choice="required")
    gen = engine.generate(other, TOOLS, tool_choice="required", max_new_tokens=NEW, method="toolspec")
    assert 4 * WINDOW < gen.stats.cached_prompt_tokens < len(ids)
    assert gen.token_ids == greedy(engine, ids, NEW)


def test_sliding_tree_mask_hides_keys_outside_the_window():
    """A node at depth d sees past keys only within the window of its own position past_len + d."""
    tree = Tree([1, 2, 3, 4], [-1, 0, 0, 2], [None] * 4, [0, 1, 1, 2], [{}] * 4)
    verifier = Verifier.__new__(Verifier)
    verifier.model = type("M", (), {"dtype": torch.float32})()
    verifier.device = torch.device("cpu")
    seen = verifier._tree_mask(tree, past_len=10, window=4)[0, 0] == 0
    assert seen[0].tolist() == [False] * 7 + [True] * 3 + [True, False, False, False]   # position 10
    assert seen[3].tolist() == [False] * 9 + [True] + [True, False, True, True]          # position 12
    full = verifier._tree_mask(tree, past_len=10)[0, 0] == 0
    assert full[3].tolist() == [True] * 10 + [True, False, True, True]


def test_a_model_that_takes_no_tree_mask_verifies_chains_and_says_so_once(smollm2_tokenizer, caplog):
    """Llama 4's chunked attention takes no tree mask here: drafts are verified as a chain."""
    model = tiny_target("llama4_text", {"attention_chunk_size": WINDOW, "num_local_experts": 2,
                                        "intermediate_size_mlp": 128, "head_dim": 16,
                                        "no_rope_layers": [1, 1, 1, 1]}, smollm2_tokenizer)
    with caplog.at_level(logging.WARNING, logger="oospec_agents.verify"):
        engine = Engine(model, smollm2_tokenizer, model_name="tiny-llama4")
    assert not engine._verifier.layout.tree
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "chunked" in caplog.records[0].message
    ids = engine.prompt_ids(ASK, TOOLS, tool_choice="required")
    ref = greedy(engine, ids, NEW)
    engine = engine.with_parts(drafters={"retrieval": ReferenceDrafter(ref, len(ids), wrong_at=3, branch=True)})
    for method in METHODS:
        assert _run(engine, method, ref, ids)["lossless"], method


def test_a_model_whose_cache_cannot_roll_back_is_refused_at_load(smollm2_tokenizer):
    """Linear-attention layers keep a running state: a rejected draft could not be undone."""
    model = tiny_target("qwen3_next", {"head_dim": 16, "linear_num_value_heads": 2, "linear_num_key_heads": 2,
                                       "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                                       "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
                                       "shared_expert_intermediate_size": 32}, smollm2_tokenizer)
    with pytest.raises(ModelLoadError, match="linear_attention.*cannot be rolled back"):
        attention_layout(model)
    with pytest.raises(ModelLoadError, match="rolled back"):
        Engine(model, smollm2_tokenizer)


# ---------------------------------------------------------------- README's coverage table

def coverage_table(coverage: dict) -> str:
    def cell(r):
        return "lossless" if r["lossless"] else "**differs**"
    lines = ["| target family (tiny, random, float32) | sliding window | `ar` | `toolspec` | `oospec` | tree drafts |",
             "|---|---|---|---|---|---|"]
    for family, row in coverage.items():
        window = f"{row['window']} (prompt {row['prompt']})" if row["window"] else "–"
        lines.append(f"| {family} | {window} | {cell(row['ar'])} | {cell(row['toolspec'])} | "
                     f"{cell(row['oospec'])} | {cell(row['tree'])} |")
    return "\n".join(lines)


def test_readme_coverage_table_is_current(coverage):
    text = README.read_text()
    start, end = "<!-- architectures:start -->", "<!-- architectures:end -->"
    table = coverage_table(coverage)
    if os.environ.get("OOSPEC_WRITE_COVERAGE"):
        text = re.sub(f"{start}.*?{end}", lambda _: f"{start}\n{table}\n{end}", text, flags=re.S)
        README.write_text(text)
    assert f"{start}\n{table}\n{end}" in text, "README's architecture table is stale: rerun with OOSPEC_WRITE_COVERAGE=1"


# ---------------------------------------------------------------- the tree mask, built with tensor ops

def _mask_by_walking(tree: Tree, past_len: int, window: int | None) -> torch.Tensor:
    """The engine's former mask: a Python walk from every node up to the root (the reference)."""
    n = len(tree.tokens)
    allowed = torch.zeros(n, past_len + n, dtype=torch.bool)
    allowed[:, :past_len] = True
    for i in range(n):
        j = i
        while j >= 0:
            allowed[i, past_len + j] = True
            j = tree.parents[j]
    if window is not None:
        q_pos = past_len + torch.tensor(tree.depths)
        k_pos = torch.cat([torch.arange(past_len), q_pos])
        allowed &= (q_pos[:, None] - k_pos[None, :]) < window
    return allowed


@pytest.mark.parametrize("seed", range(40))
def test_the_tensor_tree_mask_equals_the_walked_one_on_random_trees(seed):
    import random
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 8, 24, 48])
    chainy = rng.random() < 0.3  # deep trees too, where the squaring needs its most rounds
    parents = [-1] + [i - 1 if chainy and rng.random() < 0.9 else rng.randrange(i) for i in range(1, n)]
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    tree = Tree(list(range(n)), parents, [None] * n, depths, [{}] * n)
    verifier = Verifier.__new__(Verifier)
    verifier.model = type("M", (), {"dtype": torch.float32})()
    verifier.device = torch.device("cpu")
    past_len, window = rng.choice([0, 5, 37]), rng.choice([None, 1, 4, 64])
    got = verifier._tree_mask(tree, past_len, window)[0, 0] == 0
    assert torch.equal(got, _mask_by_walking(tree, past_len, window))
