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
  key sits inside its block (a tree's ancestors are not contiguous) was measured not to change the
  result; later probes found that it does, rarely (a few row-heads in thousands), so a tree whose
  accepted path is not contiguous can give a row other bits than `ar` (docs/deterministic.md,
  "Decode forwards": not fixed yet).

So in this mode every decode forward has:

- `rows(n)` query rows: its n nodes then dummy rows up to a multiple of `ROW_QUANTUM` (8), at most
  `MAX_ROWS`. A dummy attends the cached past and itself (a row that attends nothing would be NaN,
  and 0 x NaN reaches every row through the values); nothing attends to it, and its keys, values and
  logits are dropped after the forward;
- `Shapes.keys` keys: the cache and the forward's rows, then zeros up to a width fixed for the reply
  at its start (prompt + max_new_tokens + MAX_ROWS, rounded up to 64), masked out; appended and padded
  in one copy (`padded`), their attention computed by torch's kernel with `enable_gqa` where the target
  takes `EXACT_ATTENTION` (`decode_attention()`; transformers' `sdpa` would repeat the key and value
  heads under a mask): the same bits as transformers' `sdpa`, measured;
- no node whose key lands in another 512-key block than its position's (where a committed token's
  key sits in an `ar` forward): such a tree is cut back to its first chain (`fit`). It happens only
  when a forward's rows reach past a 512-key boundary.

Forced tokens (grammar jump-forward) too long for one forward are fed first, `MAX_ROWS` a forward,
their logits dropped (`fit`). The prompt is prefilled the same for every method, and exactly: a cache
hit is the cold prefill bit for bit (the exact one-forward prefill below, or chunks of `PREFILL_CHUNK`
aligned to absolute positions where the target does not take it).
Greedy decoding is covered; a sampled reply is drawn as the method draws it.

The exact prefill (the engine's default on a bf16 CPU target, in this mode or not): the uncached tail
of a prompt in one forward, as the plain prefill, but with attention computed so that a row's bits do
not depend on the forward (`_exact_sdpa`); the linear layers already do not, for 3 rows or more
(`EXACT_MIN_TAIL`). A warm request then recomputes its tail's rows as its cold prefill did.
"""
from __future__ import annotations

import copy
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from . import attention_registry

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
    attention its keys and values padded with zeros to the reply's key width. A plain `DynamicLayer`
    is appended to and padded in one copy: the layer then holds a view of the padded keys' first rows
    (a new tensor, as `DynamicLayer.update`'s own concatenation makes: nothing is written in place)."""
    width: int

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4 and not self.offloading:
            n = layer.keys.shape[-2] + key_states.shape[-2]
            if n <= self.width:
                keys, values = _append_padded(layer.keys, key_states, self.width), \
                    _append_padded(layer.values, value_states, self.width)
                layer.keys, layer.values = keys[..., :n, :], values[..., :n, :]
                return keys, values
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        pad = self.width - keys.shape[-2]
        if pad > 0:
            keys = torch.nn.functional.pad(keys, (0, 0, 0, pad))
            values = torch.nn.functional.pad(values, (0, 0, 0, pad))
        return keys, values


def _append_padded(cached: torch.Tensor, new: torch.Tensor, width: int) -> torch.Tensor:
    b, h, n, d = cached.shape
    pad = width - n - new.shape[-2]
    return torch.cat([cached, new] + ([new.new_zeros(b, h, pad, d)] if pad else []), dim=-2)


def padded(cache: DynamicCache, width: int) -> DynamicCache:
    """`cache` as the forward sees it: the same layers (what the forward appends, the cache holds),
    attention over `width` keys."""
    view = copy.copy(cache)  # shares `cache.layers`, the list and the layers in it
    view.__class__ = _PaddedKeys
    view.width = width
    return view


# ---------------------------------------------------------------- exact prefill: one forward, canonical attention

#: the fewest prompt tokens a prefill forward feeds (the rest of a cache hit is fed again): a bf16 GEMM
#: computes a row in other bits in a forward of 1 or 2 rows than in one of 3 or more (docs/deterministic.md)
EXACT_MIN_TAIL = 8
#: the attention function an exact prefill installs on the target (transformers' AttentionInterface)
EXACT_ATTENTION = "oospec_exact_sdpa"

_exact = threading.local()  # `.on`: this thread's forward is an exact prefill (`exact_attention()`);
# `.decode`: a deterministic decode forward (`decode_attention()`)


def exact_prefill_refusal(model, windows) -> str | None:
    """Why an exact one-forward prefill is not offered for this target (None: it is): it rests on what
    was measured of torch's CPU kernels in bf16 (oneDNN's native kernels: AVX512-BF16 or AMX) through
    transformers' `sdpa`, for full attention."""
    from .models import cpu_supports_bf16
    device, dtype = next(model.parameters()).device, model.dtype
    attn = attention_registry.implementation(model)
    if device.type != "cpu" or dtype != torch.bfloat16:
        return f"measured for bf16 on the CPU only (this target: {dtype} on {device.type})"
    if not cpu_supports_bf16():
        return "measured where the CPU computes bf16 natively (AVX512-BF16 or AMX); this one emulates it"
    if not attention_registry.computes_sdpa(attn):
        return f"measured for the sdpa attention only (this target: {attn})"
    if any(w is not None for w in windows.values()):
        return "a sliding-window layer"
    return None


def install_exact_attention(model) -> bool:
    """Make the target's attention `EXACT_ATTENTION`: transformers' `sdpa`, unchanged, except inside
    `exact_attention()` (this thread's prefill forwards) and `decode_attention()` (its deterministic
    decode forwards), where `_exact_sdpa` computes it. False where
    the model did not take it (a model that cannot switch its attention). Registered through
    attention_registry.py, it passes a batched round's keys on to the round (batch_attention.py)."""
    attention_registry.register(EXACT_ATTENTION, _exact_sdpa)
    return attention_registry.switch(model, EXACT_ATTENTION)


@contextmanager
def exact_attention():
    """Forwards of this thread inside it compute attention in `_exact_sdpa`'s canonical shapes."""
    _exact.on, _exact.masks = True, {}
    try:
        yield
    finally:
        _exact.on, _exact.masks = False, {}


@contextmanager
def decode_attention():
    """Forwards of this thread inside it are deterministic decode forwards (`Verifier._fixed_forward`):
    `_exact_sdpa` hands their keys (padded to the reply's width) and mask (`inputs`) to torch's kernel as
    they are, with `enable_gqa`, where transformers' `sdpa` repeats the key and value heads first (it
    takes grouped-query attention on the CPU only without a mask). The same bits: the kernel reads a
    query head's key head in place of its copy (measured, docs/deterministic.md)."""
    _exact.decode = True
    try:
        yield
    finally:
        _exact.decode = False


def _exact_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    """Attention for a prefill forward whose query rows' results do not depend on the forward (how many
    rows it has, where it starts, how many keys follow): so a cache hit's uncached tail, fed in one
    forward, gets the bits that the cold prefill of the whole prompt computed for those rows.

    torch's CPU flash attention splits the keys in blocks of `KV_BLOCK` and a row's bits depend on the
    length of the block its last key is in, and on the query rows being split in blocks of 4 or more
    (docs/deterministic.md). So the keys are padded with zeros to a multiple of `KV_BLOCK` (every block
    full; a block past a row's keys adds exactly nothing to it), the query rows with copies of the last
    one to a multiple of `ROW_QUANTUM`; a forward from position 0 takes the causal kernel (which skips
    the blocks above the diagonal: the cold prefill costs what it did), a forward after cached keys an
    explicit mask; the two give the same bits per row (measured; `tests/test_prefix_cache.py`).

    Inside `decode_attention()` (a deterministic decode forward) it is torch's kernel on the forward's
    keys and mask as they come, with `enable_gqa`. (A batched round's keys never reach it: the registry
    hands them to the round, attention_registry.py.)"""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    unsupported = {k for k in ("softcap", "s_aux", "sinks", "position_bias", "sliding_window")
                   if kwargs.get(k) is not None}
    if getattr(_exact, "decode", False) and not getattr(_exact, "on", False) and not unsupported \
            and not kwargs.get("dropout", 0.0) and not args and attention_mask is not None \
            and attention_mask.shape[-1] == key.shape[2]:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=kwargs.get("scaling"),
            enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous(), None
    if not getattr(_exact, "on", False) or unsupported or kwargs.get("dropout", 0.0) or args \
            or query.shape[-1] != value.shape[-1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    q_len, kv_len = query.shape[2], key.shape[2]
    past = kv_len - q_len
    rows = -(-q_len // ROW_QUANTUM) * ROW_QUANTUM
    width = -(-kv_len // KV_BLOCK) * KV_BLOCK
    if rows > q_len:
        query = torch.cat([query, query[:, :, -1:].expand(-1, -1, rows - q_len, -1)], dim=2)
    if width > kv_len:
        key = torch.nn.functional.pad(key, (0, 0, 0, width - kv_len))
        value = torch.nn.functional.pad(value, (0, 0, 0, width - kv_len))
    kw = {"scale": kwargs.get("scaling"), "enable_gqa": query.shape[1] != key.shape[1]}
    if past == 0:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, **kw)
    else:
        mask = _exact.masks.get((past, rows, width))
        if mask is None:  # the same for every layer of the forward
            seen = torch.arange(past, past + rows, device=query.device).clamp_(max=kv_len - 1)
            hidden = torch.arange(width, device=query.device)[None, :] > seen[:, None]
            mask = torch.zeros(rows, width, dtype=query.dtype, device=query.device)
            mask = _exact.masks[(past, rows, width)] = mask.masked_fill_(hidden, torch.finfo(query.dtype).min)[None, None]
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, **kw)
    return out[:, :, :q_len].transpose(1, 2).contiguous(), None
