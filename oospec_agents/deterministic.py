"""Deterministic mode: every decode forward of a reply runs the same kernels on the same shapes, so a
position's logits (and its keys and values) do not depend on the forward that computed them.

Greedy decoding picks a token per position from that position's logits. A reply is the same whatever
the method (`ar`, `toolspec`, `oospec`), the draft tree and the concurrency when the logits of a
position are the same bits in every forward that can compute them: the root alone (ar), somewhere in
a chain, or a node deep in a tree. In bf16 they were not (docs/deterministic.md): the attention
kernel's result for a query row depends on how many query rows and how many keys the forward has.
Measured on torch 2.13's CPU kernels (bf16, AVX512-BF16), what a row's result depends on:

- the linear layers (oneDNN bf16 GEMM): nothing but the row itself, for 1 to 64 rows;
- scaled-dot-product attention (the CPU flash kernel): the number of keys; the query rows when a
  forward has fewer than 4 of them; and which 512-key block of the kernel a key sits in. Where a
  key sits inside its block (a tree's ancestors are not contiguous) does not change the result.

So in this mode every decode forward has:

- `rows(n)` query rows: its n nodes then dummy rows up to a multiple of `ROW_QUANTUM` (8), at most
  `MAX_ROWS`. A dummy attends the cached past and itself (a row that attends nothing would be NaN,
  and 0 x NaN reaches every row through the values); nothing attends to it, and its keys, values and
  logits are dropped after the forward;
- `Shapes.keys` keys: the cache and the forward's rows, then zeros up to a width fixed for the reply
  at its start (prompt + max_new_tokens + MAX_ROWS, rounded up to 64), masked out;
- no node whose key lands in another 512-key block than its position's (where a committed token's
  key sits in an `ar` forward): such a tree is cut back to its first chain (`fit`). It happens only
  when a forward's rows reach past a 512-key boundary.

Forced tokens (grammar jump-forward) too long for one forward are fed first, `MAX_ROWS` a forward,
their logits dropped (`fit`). The prompt is prefilled as before, the same for every method; with
prefill chunks aligned to absolute positions (`prefill_chunk`), a cache hit is the cold prefill.
Greedy decoding is covered; a sampled reply is drawn as the method draws it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import DynamicCache

#: query rows of a decode forward are a multiple of this (fewer than 4 rows take other attention kernels)
ROW_QUANTUM = 8
#: the most query rows of one decode forward; a longer run of forced tokens takes several forwards
MAX_ROWS = 64
#: keys per block of torch's CPU flash attention (its kv split): a key must be in the block of its position
KV_BLOCK = 512
#: prompt tokens per prefill chunk when the engine was given none (a cache hit is then the cold prefill)
PREFILL_CHUNK = 256


@dataclass(frozen=True)
class Shapes:
    """The fixed shapes of one reply's decode forwards."""
    keys: int  # key width of every decode forward

    @classmethod
    def for_reply(cls, n_prompt: int, max_new_tokens: int) -> "Shapes":
        return cls(-(-(n_prompt + max_new_tokens + MAX_ROWS) // 64) * 64)

    @staticmethod
    def rows(n: int) -> int:
        if n > MAX_ROWS:
            raise ValueError(f"a deterministic forward takes at most {MAX_ROWS} rows, got {n}")
        return max(ROW_QUANTUM, -(-n // ROW_QUANTUM) * ROW_QUANTUM)


def max_draft_nodes(nodes: int) -> int:
    """The draft tree's node budget in this mode: the root and its drafts fit in one forward."""
    return min(nodes, MAX_ROWS)


def fed_ahead(tree) -> int:
    """How many of the tree's first nodes (the root and forced tokens: a committed chain) are fed in
    forwards of their own before it, so that the rest fits in one forward."""
    return max(0, len(tree.tokens) - MAX_ROWS)


def subtree(tree, cut: int):
    """The tree without its first `cut` nodes (a chain ending on a node at or before `tree.start`)."""
    if cut == 0:
        return tree
    assert cut <= tree.start, "only committed (forced) nodes are fed ahead"
    return type(tree)(tree.tokens[cut:], [-1] + [p - cut for p in tree.parents[cut + 1:]], tree.sources[cut:],
                [d - cut for d in tree.depths[cut:]], [{t: i - cut for t, i in c.items()} for c in tree.children[cut:]],
                tree.start - cut)


def within_blocks(tree, past: int) -> bool:
    """Whether every node's key lands in the attention block of its position (`KV_BLOCK`)."""
    return all((past + i) // KV_BLOCK == (past + d) // KV_BLOCK for i, d in enumerate(tree.depths))


def first_chain(tree):
    """The tree cut back to its longest chain from the root: the root, the forced tokens and the first draft."""
    n = 1
    while n < len(tree.tokens) and tree.parents[n] == n - 1:
        n += 1
    children = [{t: i for t, i in c.items() if i < n} for c in tree.children[:n]]
    return type(tree)(tree.tokens[:n], tree.parents[:n], tree.sources[:n], tree.depths[:n], children, tree.start)


def inputs(tree, reach: torch.Tensor, past: int, shapes: Shapes, device,
           dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids [1, R], position ids [1, R], additive mask [1, 1, R, keys]) of a forward over the
    tree's n nodes (a chain or a tree; `reach` [n, n]: which nodes each one sees) padded with dummy
    rows to R = `Shapes.rows(n)`."""
    n = len(tree.tokens)
    rows = shapes.rows(n)
    if past + rows > shapes.keys:
        raise ValueError(f"a forward at {past} with {rows} rows passes the reply's {shapes.keys} keys")
    ids = tree.tokens + [tree.tokens[0]] * (rows - n)
    depth = torch.tensor(tree.depths + list(range(n, rows)), device=device)
    allowed = torch.zeros(rows, shapes.keys, dtype=torch.bool, device=device)
    allowed[:, :past] = True
    mine = torch.eye(rows, dtype=torch.bool, device=device)  # a dummy row sees itself
    mine[:n, :n] = reach
    allowed[:, past:past + rows] = mine
    mask = torch.zeros(rows, shapes.keys, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return torch.tensor([ids], device=device), (past + depth)[None], mask[None, None]


class _PaddedKeys(DynamicCache):
    """A view of a request's DynamicCache for one forward: it updates the same layers, and hands the
    attention its keys and values padded with zeros to the reply's key width."""
    width: int

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        pad = self.width - keys.shape[-2]
        if pad > 0:
            keys = torch.nn.functional.pad(keys, (0, 0, 0, pad))
            values = torch.nn.functional.pad(values, (0, 0, 0, pad))
        return keys, values


def padded(cache: DynamicCache, width: int) -> DynamicCache:
    """`cache` as the forward sees it: the same layers (what the forward appends, the cache holds),
    attention over `width` keys."""
    view = copy.copy(cache)  # shares `cache.layers`, the list and the layers in it
    view.__class__ = _PaddedKeys
    view.width = width
    return view
