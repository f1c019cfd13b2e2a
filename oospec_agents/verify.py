"""Greedy verification of a token tree in one target forward, and KV-cache rollback.

Node 0 of the tree is the last committed token (not yet in the KV cache); every draft hangs below
it. One forward scores all nodes under a tree attention mask; we then walk from the root while the
target's argmax picks a child, and commit that path plus the target's own next token.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from .drafters import Draft


@dataclass
class Tree:
    tokens: list[int]
    parents: list[int]
    sources: list[str | None]
    depths: list[int]
    children: list[dict[int, int]] = field(default_factory=list)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents) if i)


def build_tree(root: int, drafts: list[Draft], max_nodes: int) -> Tree:
    """Merge drafts into a trie under `root`, first draft first, so the best guess stays contiguous."""
    t = Tree([root], [-1], [None], [0], [{}])
    for d in drafts:
        node = 0
        for tok in d.tokens:
            nxt = t.children[node].get(tok)
            if nxt is None:
                if len(t.tokens) >= max_nodes:
                    break
                nxt = len(t.tokens)
                t.tokens.append(tok)
                t.parents.append(node)
                t.sources.append(d.source)
                t.depths.append(t.depths[node] + 1)
                t.children.append({})
                t.children[node][tok] = nxt
            node = nxt
    return t


def cache_kwarg(model) -> str:
    # transformers renamed `past_key_values` to `cache`; accept both across 5.x.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def eos_ids(model) -> set[int]:
    """The token ids that end a reply, from the model's generation config."""
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])


class Verifier:
    def __init__(self, model):
        self.model = model
        self.cache_kw = cache_kwarg(model)
        self.device = next(model.parameters()).device
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    def forward(self, ids: list[int], cache, past_len: int, tree: Tree | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Logits [len(ids), vocab] for `ids` appended after `past_len` cached tokens ([1, vocab] with
        `last_only`: a prompt's prefill needs only its last position's logits)."""
        inp = torch.tensor([ids], device=self.device)
        kw = {self.cache_kw: cache, "use_cache": True}
        if last_only and self.keeps_logits:
            kw["logits_to_keep"] = 1
        if tree is not None and not tree.is_chain:
            depth = torch.tensor(tree.depths, device=self.device)
            kw["position_ids"] = (past_len + depth)[None]
            kw["attention_mask"] = self._tree_mask(tree, past_len)
        else:
            kw["position_ids"] = torch.arange(past_len, past_len + len(ids), device=self.device)[None]
        with torch.inference_mode():
            logits = self.model(input_ids=inp, **kw).logits[0]
        return logits[-1:] if last_only else logits

    def _tree_mask(self, tree: Tree, past_len: int) -> torch.Tensor:
        n = len(tree.tokens)
        allowed = torch.zeros(n, past_len + n, dtype=torch.bool)
        allowed[:, :past_len] = True
        for i in range(n):
            j = i
            while j >= 0:
                allowed[i, past_len + j] = True
                j = tree.parents[j]
        dtype = self.model.dtype
        mask = torch.zeros(n, past_len + n, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None].to(self.device)

    def verify(self, tree: Tree, cache, past_len: int) -> tuple[list[int], int, torch.Tensor]:
        """(accepted node path starting at the root, the target's next token, logits of the path)."""
        logits = self.forward(tree.tokens, cache, past_len, tree)
        argmax = logits.argmax(-1).tolist()
        path = [0]
        while True:
            nxt = tree.children[path[-1]].get(argmax[path[-1]])
            if nxt is None:
                break
            path.append(nxt)
        keep_cache(cache, past_len, path, len(tree.tokens))
        return path, argmax[path[-1]], logits[path]


def keep_cache(cache, past_len: int, path: list[int], n_nodes: int) -> None:
    """Keep the cached K/V of `path` (tree node indices) after the first `past_len` positions."""
    if path == list(range(len(path))):
        drop = n_nodes - len(path)
        if drop:
            cache.crop(-drop)  # transformers 5.x: a negative count drops that many tokens
        return
    idx = torch.tensor(list(range(past_len)) + [past_len + i for i in path])
    for layer in cache.layers:
        idx_d = idx.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, idx_d)
        layer.values = layer.values.index_select(-2, idx_d)
