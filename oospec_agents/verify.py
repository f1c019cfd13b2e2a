"""Verification of a token tree in one target forward, and KV-cache rollback.

Node 0 of the tree is the last committed token (not yet in the KV cache); every draft hangs below
it. One forward scores all nodes under a tree attention mask (alone, or as one row of a batched
forward: batching.py); we then walk from the root while the target's choice picks a child -- its
argmax, or under sampling a seeded draw per node (sampling.py), or a grammar's masked argmax -- and
commit that path plus the target's own next token. Under a grammar,
tokens it forced (jump-forward) are committed already: they form a chain below the root, fed in the
same forward, and the drafts hang below the last of them (`Tree.start`), where the walk starts.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import get_layer_types_and_kwargs

from . import deterministic
from .drafters import Draft
from .errors import ModelLoadError
from .sampling import greedy

log = logging.getLogger(__name__)

#: attention layer types whose cached keys and values can be cropped back after a rejected draft
ATTENTION_TYPES = {"full_attention", "sliding_attention", "chunked_attention"}


@dataclass
class Tree:
    tokens: list[int]
    parents: list[int]
    sources: list[str | None]
    depths: list[int]
    children: list[dict[int, int]] = field(default_factory=list)
    start: int = 0  # the node the drafts hang below: after the root's chain of forced tokens

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents) if i)


def build_tree(root: int, drafts: list[Draft], max_nodes: int, chain: bool = False,
               forced: list[int] = ()) -> Tree:
    """Merge drafts into a trie under `root`, first draft first, so the best guess stays contiguous;
    a `late` draft only after all the others, so it fills what nodes they leave and displaces none.
    With `chain`, only the first draft is kept (the first that is not late): a chain, for targets that
    take no tree mask.
    `forced`: committed tokens that follow `root` (a grammar forced them); they go first, as a chain,
    the drafts below them, and they do not count in `max_nodes`."""
    t = Tree([root], [-1], [None], [0], [{}])
    for tok in forced:
        t.children[-1][tok] = len(t.tokens)
        t.tokens.append(tok)
        t.parents.append(len(t.tokens) - 2)
        t.sources.append("grammar")
        t.depths.append(len(t.tokens) - 1)
        t.children.append({})
    t.start = len(forced)
    max_nodes += len(forced)
    ordered = [d for d in drafts if not d.late] + [d for d in drafts if d.late]
    for d in ordered[:1] if chain else ordered:
        node = t.start
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


@dataclass(frozen=True)
class Layout:
    """How the target attends, as tree verification needs it.

    `windows` maps each layer type to its sliding window (None: full attention); a model that takes
    one mask for all its layers has the single key None. `tree` is False when trees cannot be masked
    for this model (the reason says why): every round is then verified as a chain."""
    windows: dict[str | None, int | None]
    tree: bool = True
    reason: str | None = None


def attention_layout(model) -> Layout:
    """Read the target's layer types. Raise ModelLoadError for a model whose cache cannot roll back."""
    config = model.config.get_text_config(decoder=True)
    types, kwargs = get_layer_types_and_kwargs(config)
    found = {t for t in types if t != "dummy"}
    if not found <= ATTENTION_TYPES:
        raise ModelLoadError(
            f"{type(model).__name__} has {sorted(found - ATTENTION_TYPES)} layers, whose state cannot be rolled back "
            "after a rejected draft; speculative decoding needs attention layers only")
    windows: dict[str, set] = {}
    for t, kw in zip(types, kwargs):
        windows.setdefault(t, set()).add(kw.get("sliding_window"))
    if "chunked_attention" in found:
        return Layout({}, False, "chunked attention layers take no tree mask")
    if any(len(w) > 1 for w in windows.values()):
        return Layout({}, False, "its layers of one type have different sliding windows")
    per_type = {t: next(iter(w)) for t, w in windows.items() if t != "dummy"}
    if getattr(config, "layer_types", None) is not None:
        return Layout(per_type)  # transformers takes a {layer type: mask} mapping for these models
    if len(per_type) > 1:
        return Layout({}, False, "it mixes layer types without naming them in config.layer_types")
    return Layout({None: next(iter(per_type.values()), None)})


class Verifier:
    """The target as a verifier: prefills a prompt into a KV cache (`prefill`, planned by `plan_prefill`),
    scores a draft tree in one forward and keeps the accepted path's keys and values (`verify` = the
    forward, then `accept`); `row` is the tree as one row of a batched forward, `fit` the tree cut to a
    deterministic reply's shapes. `layout` says how the target attends (whether it takes tree masks)."""

    def __init__(self, model):
        self.model = model
        self.cache_kw = cache_kwarg(model)
        self.device = next(model.parameters()).device
        self.keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.layout = attention_layout(model)
        self.last_forward_s = 0.0  # seconds of the latest forward: the model's call alone
        self.exact_prefill = False  # `prefill` feeds the tail in one forward of canonical attention (`plan_prefill`)
        self._gqa_decode: bool | None = None  # deterministic decode attention through `decode_attention` (`gqa_decode`)
        if not self.layout.tree:
            log.warning("%s: drafts are verified as a chain, not a tree: %s", type(model).__name__, self.layout.reason)

    @staticmethod
    def new_cache() -> DynamicCache:
        """An empty KV cache that keeps every layer's full past for the reply's lifetime.

        transformers' sliding-window layers keep only the last window of keys, so a rejected draft
        could not be cropped off them once the window is full, and a cached prompt could not be cut
        back to a shorter prefix. Here every layer keeps it all; the window lives in the mask."""
        return DynamicCache()

    def forward(self, ids: list[int], cache, past_len: int, tree: Tree | None = None,
                last_only: bool = False, shapes: deterministic.Shapes | None = None) -> torch.Tensor:
        """Logits [len(ids), vocab] for `ids` appended after `past_len` cached tokens ([1, vocab] with
        `last_only`: a prompt's prefill needs only its last position's logits). With `shapes`
        (deterministic mode), the forward has the reply's fixed shapes (deterministic.py)."""
        if shapes is not None:
            return self._fixed_forward(tree or chain(ids), cache, past_len, shapes)
        inp = torch.tensor([ids], device=self.device)
        kw = {self.cache_kw: cache, "use_cache": True}
        if last_only and self.keeps_logits:
            kw["logits_to_keep"] = 1
        if tree is not None and not tree.is_chain:
            depth = torch.tensor(tree.depths, device=self.device)
            kw["position_ids"] = (past_len + depth)[None]
            masks = {t: self._tree_mask(tree, past_len, w) for t, w in self.layout.windows.items()}
            kw["attention_mask"] = masks[None] if None in masks else masks
        else:
            kw["position_ids"] = torch.arange(past_len, past_len + len(ids), device=self.device)[None]
        t0 = time.perf_counter()
        with torch.inference_mode():
            logits = self.model(input_ids=inp, **kw).logits[0]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the caller reads the logits next: this wait is no extra
        self.last_forward_s = time.perf_counter() - t0
        return logits[-1:] if last_only else logits

    def plan_prefill(self, chunk: int | None, fixed_shapes: bool = False) -> tuple[int, int]:
        """How this target's prompts are prefilled, from the engine's `prefill_chunk`: (the chunk a cache
        hit is cut back to a multiple of, the fewest tokens a prefill feeds). None (the default), and
        in deterministic mode (`fixed_shapes`) also 1: one exact forward where this target takes it (bf16 on the CPU,
        sdpa, full attention: `deterministic.exact_prefill_refusal`), so a cache hit is the cold
        prefill bit for bit at a single forward's cost; elsewhere None is 1 (the uncached tail in one
        plain forward), and 1 in deterministic mode is `deterministic.PREFILL_CHUNK`. An integer more
        than 1: forwards ending at its multiples, hits cut back to them (exact on any target)."""
        if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
            raise ValueError(f"prefill_chunk must be None or an integer >= 1, got {chunk!r}")
        self.exact_prefill = False
        if chunk is None or (chunk == 1 and fixed_shapes):
            why = deterministic.exact_prefill_refusal(self.model, self.layout.windows)
            if why is None and deterministic.install_exact_attention(self.model):
                self.exact_prefill = True
                return 1, deterministic.EXACT_MIN_TAIL
            log.debug("%s: no exact one-forward prefill: %s", type(self.model).__name__,
                      why or "its attention implementation cannot be switched")
            chunk = deterministic.PREFILL_CHUNK if fixed_shapes else 1
        return chunk, 1

    def prefill(self, ids: list[int], cache, hit: int, chunk: int = 1) -> torch.Tensor:
        """The last position's logits ([1, vocab]) after `ids[hit:]` is fed on `hit` cached tokens: in
        one forward (`exact_prefill`: with attention in canonical shapes, deterministic.py), or in
        forwards ending at multiples of `chunk`, so a warm prefill runs the cold one's own last forwards."""
        if self.exact_prefill:
            with deterministic.exact_attention():
                return self.forward(ids[hit:], cache, hit, last_only=True)
        start = hit
        while True:
            end = min(len(ids), start + chunk) if chunk > 1 else len(ids)
            logits = self.forward(ids[start:end], cache, start, last_only=True)
            if end == len(ids):
                return logits
            start = end

    def gqa_decode(self) -> bool:
        """Whether deterministic decode forwards compute attention in `deterministic.decode_attention()`
        (torch's kernel with `enable_gqa`, no repeated key and value heads): where the target takes the
        exact attention (bf16 on a CPU that has it, sdpa, full attention: `deterministic.exact_prefill_refusal`;
        installed here if the prefill did not). Elsewhere through transformers' sdpa."""
        if self._gqa_decode is None:
            self._gqa_decode = deterministic.exact_prefill_refusal(self.model, self.layout.windows) is None \
                and deterministic.install_exact_attention(self.model)
        return self._gqa_decode

    def _fixed_forward(self, tree: Tree, cache, past_len: int, shapes: deterministic.Shapes) -> torch.Tensor:
        """The tree's logits from a forward of fixed shapes: dummy rows after its nodes, keys padded to
        the reply's width; the dummies' keys and values are cropped off the cache after it."""
        n = len(tree.tokens)
        reach = ancestry(tree.parents, max(tree.depths), self.device)
        inp, positions, mask = deterministic.inputs(tree, reach, past_len, shapes, self.device, self.model.dtype)
        kw = {self.cache_kw: deterministic.padded(cache, shapes.keys), "use_cache": True,
              "position_ids": positions, "attention_mask": mask}
        gqa = deterministic.decode_attention() if self.gqa_decode() else contextlib.nullcontext()
        t0 = time.perf_counter()
        with torch.inference_mode(), gqa:
            logits = self.model(input_ids=inp, **kw).logits[0, :n]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.last_forward_s = time.perf_counter() - t0
        if inp.shape[1] > n:
            cache.crop(-(inp.shape[1] - n))
        return logits

    def fit(self, tree: Tree, cache, past_len: int, shapes: deterministic.Shapes) -> tuple[Tree, int, list[float]]:
        """Deterministic mode: (the tree to verify, its past, the seconds of the forwards fed ahead). The
        committed chain at the tree's start is fed ahead where the tree is too big for one forward, and
        a tree whose keys would cross an attention block is cut back to its first chain (deterministic.py)."""
        cut, seconds = deterministic.fed_ahead(tree), []
        for start in range(0, cut, deterministic.MAX_ROWS):
            ids = tree.tokens[start:min(cut, start + deterministic.MAX_ROWS)]
            self.forward(ids, cache, past_len + start, shapes=shapes)
            seconds.append(self.last_forward_s)
        tree, past_len = deterministic.subtree(tree, cut), past_len + cut
        if not deterministic.within_blocks(tree, past_len):
            tree = deterministic.first_chain(tree)
        return tree, past_len, seconds

    def row(self, tree: Tree, cache, past_len: int):
        """The tree as one row of a batched forward (batching.py): its tokens, positions and mask."""
        from .batch_attention import TreeRow
        positions = [past_len + d for d in tree.depths]
        return TreeRow(list(tree.tokens), positions, cache, lambda: self._tree_mask(tree, past_len))

    def _tree_mask(self, tree: Tree, past_len: int, window: int | None = None) -> torch.Tensor:
        """Node i sees the cached past and its own ancestors; under a sliding `window`, only the
        keys fewer than `window` positions behind its own (transformers' sliding rule). Built with
        tensor ops on the target's device."""
        n, dev = len(tree.tokens), self.device
        allowed = torch.cat([torch.ones(n, past_len, dtype=torch.bool, device=dev),
                             ancestry(tree.parents, max(tree.depths), dev)], dim=1)
        if window is not None:
            q_pos = past_len + torch.tensor(tree.depths, device=dev)
            k_pos = torch.cat([torch.arange(past_len, device=dev), q_pos])
            allowed &= (q_pos[:, None] - k_pos[None, :]) < window
        dtype = self.model.dtype
        mask = torch.zeros(n, past_len + n, dtype=dtype, device=dev)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]

    def verify(self, tree: Tree, cache, past_len: int, choose=None,
               shapes: deterministic.Shapes | None = None) -> tuple[list[int], int, torch.Tensor]:
        """(accepted node path starting at the root, the target's next token, logits of the path).

        `choose(logits row) -> token` replaces the plain argmax, e.g. a grammar's masked argmax that
        also advances the grammar: it is called on the accepted path's rows only, from `tree.start`
        (the root, unless forced tokens come first: those are committed, not chosen). `shapes`: a
        deterministic forward (a tree that `fit` returned)."""
        logits = self.forward(tree.tokens, cache, past_len, tree, shapes=shapes)
        return self.accept(tree, logits, cache, past_len, choose)

    def accept(self, tree: Tree, logits: torch.Tensor, cache, past_len: int,
               choose=None) -> tuple[list[int], int, torch.Tensor]:
        """`verify` after its forward: walk the tree's `logits` from the root, keep the accepted path's
        keys and values in `cache` (the forward appended the whole tree's), return what `verify` returns."""
        if choose is not None:
            pick = lambda i: choose(logits[i])  # noqa: E731
        elif logits.device.type == "cpu":  # the rows the walk reaches only: most of a tree is rejected
            pick = lambda i: greedy(logits[i])  # noqa: E731
        else:  # one argmax over the rows and one copy to the host
            pick = logits.argmax(-1).tolist().__getitem__
        path = list(range(tree.start + 1))
        while (nxt := tree.children[path[-1]].get(token := pick(path[-1]))) is not None:
            path.append(nxt)
        keep_cache(cache, past_len, path, len(tree.tokens))
        return path, token, logits[path]


def chain(ids: list[int]) -> Tree:
    """`ids` as a chain: each token below the one before."""
    n = len(ids)
    return Tree(list(ids), list(range(-1, n - 1)), [None] * n, list(range(n)),
                [{ids[i + 1]: i + 1} for i in range(n - 1)] + [{}])


def ancestry(parents: list[int], max_depth: int, device=None) -> torch.Tensor:
    """[n, n] bool: (i, j) is True when node j is node i or one of its ancestors (parents[i] < i).

    Start from "itself or its parent" and square the relation until it spans the deepest path:
    log2(depth) small matmuls instead of a Python walk up from every node."""
    n = len(parents)
    reach = torch.eye(n, dtype=torch.bool, device=device)
    if n > 1:
        reach[torch.arange(1, n, device=device), torch.tensor(parents[1:], device=device)] = True
    hops = 1
    while hops < max_depth:
        r = reach.to(torch.float32)  # 0/1 sums below 2**24: exact in float32
        reach = (r @ r) > 0
        hops *= 2
    return reach


def keep_cache(cache, past_len: int, path: list[int], n_nodes: int) -> None:
    """Keep the cached K/V of `path` (tree node indices) after the first `past_len` positions: the path's
    nodes past the tree's leading chain are moved up behind it, the rest of the tree is cropped off."""
    first = next((j for j, node in enumerate(path) if node != j), len(path))  # where the path leaves the chain
    if first < len(path):
        moved = torch.tensor([past_len + node for node in path[first:]])
        end = past_len + len(path)
        with torch.inference_mode():  # the forward wrote these tensors in inference mode
            for layer in cache.layers:
                for kv in (layer.keys, layer.values):
                    kv[..., past_len + first:end, :] = kv.index_select(-2, moved.to(kv.device))
    if n_nodes > len(path):
        cache.crop(-(n_nodes - len(path)))  # transformers 5.x: a negative count drops that many tokens
