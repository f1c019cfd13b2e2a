"""Helpers the tests share: the data path, reading records, tiny random models, greedy reference.

(A module of its own, not conftest.py: every test folder has a conftest, and `from conftest import`
would pick whichever was imported first.)
"""
from __future__ import annotations

from pathlib import Path

import torch

from oospec_agents import data
from oospec_agents.bench.records import spread  # noqa: F401  (n records round-robin over the sources)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "toolcalls"


def load_records(split: str = "dev") -> list[dict]:
    """The shared data's records, read by the package's own reader."""
    return data.load_records(DATA / f"{split}.jsonl")


def tiny_model(kind: str, tokenizer, seed: int = 0):
    """A randomly initialised 2-layer model of the given family with SmolLM2's vocabulary."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[kind]
    cfg = cls(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
              eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
              pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model


def greedy(engine, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Plain transformers greedy decoding: the reference every method must reproduce."""
    inp = torch.tensor([prompt_ids], device=engine.target.device)
    with torch.inference_mode():
        out = engine.target.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                     max_new_tokens=max_new_tokens)
    return out[0, len(prompt_ids):].tolist()
