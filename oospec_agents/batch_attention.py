"""The attention kernel of a batched round: one target forward over several replies' draft trees,
each row attending over its own keys with its own tree mask.

How one forward holds replies of different lengths: each reply's keys and values stay in its own
`DynamicCache`, which rolls back on its own as before (`verify.keep_cache`). The forward's cache is a
`RoundCache`: the layer's `update` appends each row's new keys to that row's own cache and hands the
attention `RaggedKV`, the rows' whole keys and values and the rows themselves; the attention (reached
through the target's attention implementation: any of ours, attention_registry.py) runs each row alone
over its own keys with its own tree mask (`ragged_attention`), through transformers' own sdpa function --
the very call a reply alone makes for its tree -- while every linear layer (projections, MLP, the head)
runs once over all rows.

Why not transformers' continuous batching (`PagedAttentionCache`, `generate_batch`): its paged kernels
take no tree mask and its cache has no per-request rollback of rejected drafts, which are the two
things speculative verification needs; nor a padded batch cache (every reply's past copied into one
tensor each round, padding masked): the copy costs what the attention reads, and padding changes
the attention's shapes, so a reply's bits would depend on its neighbours' lengths. Here a row's
attention has the shapes it has alone.

Who runs which forward when is the scheduler's (batching.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from . import attention_registry
from .attention_registry import RoundKeys

#: the attention implementation `install` registers: transformers' sdpa, which passes batched rounds on
BATCH_ATTENTION = "oospec_batch"


@dataclass
class TreeRow:
    """One reply's part of a batched forward: its tree's tokens, positions and mask on its own cache."""
    tokens: list[int]
    positions: list[int]
    cache: Any                  # the reply's own DynamicCache
    make_mask: Callable[[], torch.Tensor]  # [1, 1, n, past + n] additive, as `Verifier._tree_mask`; built
    mask: torch.Tensor | None = None       # only when the row joins a batch (`batched_forward`)
    offset: int = 0                        # where its tokens start in the batched forward's one sequence


class RaggedKV(RoundKeys):
    """What a batched forward's attention gets for keys (and values): each row's whole keys, and the
    round's rows (their masks and spans), so the attention needs nothing else."""
    __slots__ = ("tensors", "rows")

    def __init__(self, tensors: list[torch.Tensor], rows: list[TreeRow]):
        self.tensors, self.rows = tensors, rows

    def attend(self, module, query, value: "RaggedKV", **kwargs):
        return ragged_attention(module, query, self, value, self.rows, **kwargs)


class RoundCache:
    """The cache a batched forward is given: each layer's new keys and values go to each row's own
    cache (its own span of the packed sequence), and the attention reads them back whole."""

    is_compileable = False

    def __init__(self, rows: list[TreeRow]):
        self.rows = rows

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        keys, values = [], []
        for row in self.rows:
            at, n = row.offset, len(row.tokens)
            k, v = row.cache.update(key_states[:, :, at:at + n], value_states[:, :, at:at + n], layer_idx)
            keys.append(k)
            values.append(v)
        return RaggedKV(keys, self.rows), RaggedKV(values, self.rows)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(row.cache.get_seq_length(layer_idx) for row in self.rows)


def ragged_attention(module, query, key: RaggedKV, value: RaggedKV, rows: list[TreeRow], **kwargs):
    """Attention of a batched forward: each row's queries over its own keys with its own mask, through
    transformers' sdpa function (what the row's reply alone runs)."""
    out = []
    for b, row in enumerate(rows):
        at, n = row.offset, len(row.tokens)
        o, _ = sdpa_attention_forward(module, query[:, :, at:at + n], key.tensors[b], value.tensors[b], row.mask,
                                      dropout=0.0, scaling=kwargs.get("scaling"), is_causal=False)
        out.append(o)  # [1, n, heads, dim]
    return torch.cat(out, dim=1), None


def install(model, windows: dict) -> str | None:
    """Make the target able to run batched rounds; None where it can, else why not (its replies are
    then verified one at a time, as before). Full attention through sdpa (switched to `BATCH_ATTENTION`),
    or through any implementation of ours (attention_registry.py: each passes batched rounds on)."""
    if any(w is not None for w in windows.values()):
        return "a sliding-window layer (one mask per layer type)"
    attn = attention_registry.implementation(model)
    if attention_registry.passes_rounds_on(attn):
        return None
    if attn != attention_registry.SDPA:
        return f"batched rounds run through sdpa attention (this target: {attn})"
    attention_registry.register(BATCH_ATTENTION, sdpa_attention_forward)
    try:
        took = attention_registry.switch(model, BATCH_ATTENTION)
    except Exception as e:  # a model that cannot switch
        return f"its attention implementation cannot be switched ({e})"
    return None if took else "its attention implementation did not switch"


def batched_forward(model, cache_kw: str, rows: list[TreeRow], device=None) -> list[torch.Tensor]:
    """One target forward over several replies' trees; each row's logits [n, vocab], and each row's
    own cache grown by its tree's keys and values (rolled back by its reply, as after a lone forward).
    The trees are packed one after another in a single sequence (no padding): the linear layers run
    over exactly their tokens, the attention over each row's own span (`ragged_attention`)."""
    ids, pos, at = [], [], 0
    for r in rows:
        r.mask, r.offset = r.make_mask(), at
        ids += r.tokens
        pos += r.positions
        at += len(r.tokens)
    dummy = torch.zeros(1, 1, 1, 1, dtype=model.dtype, device=device)  # 4D: transformers passes it on as is
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([pos], device=device),
                       attention_mask=dummy, use_cache=True, **{cache_kw: RoundCache(rows)}).logits[0]
    return [logits[r.offset:r.offset + len(r.tokens)] for r in rows]
