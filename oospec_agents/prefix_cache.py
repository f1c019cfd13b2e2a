"""Reuse the KV cache of earlier prompts: an agent resends the same system prompt and tools each turn.

    hit, cache = prefix_cache.lookup(prompt_ids)   a private copy holding the longest cached prefix
    ... prefill prompt_ids[hit:] into it ...
    prefix_cache.store(prompt_ids, cache)          a copy of the prompt's KV, before decoding grows it

Entries are keyed by token ids and matched by their longest common prefix with the new prompt, so a
conversation's next turn reuses the previous turn's whole prompt, and another user message on the
same tools reuses the system prompt and tool schemas. The budget counts cached tokens; the least
recently used entries go first. A request never sees an entry itself, only a cache of its own cut to
the hit, so verification's rollback can never change what the next request reuses.

With `chunk` > 1 a hit is cut back to a multiple of `chunk` tokens: the engine prefills in chunks that
end at those absolute positions, so a warm request runs the very forwards (the same kernels on the
same shapes over the same past) that its cold prefill ran, and its reply is the cold one bit for bit.
A plain prefill of the whole tail at once would differ from the cold one in its last bits (bf16), and
greedy decoding can turn on them. The engine's default on a bf16 CPU target is cheaper and as exact:
the tail in one forward whose attention runs in shapes that make each row's bits independent of the
forward (deterministic.py, "exact prefill"); a hit is then any prefix (`chunk` 1), but it leaves at
least `min_tail` tokens (8) to feed, since a bf16 GEMM of 1 or 2 rows gives other bits than one of more.

That cache shares the entry's tensors where it can (`fork`): transformers' `DynamicLayer` never
writes a tensor it holds (it grows by `torch.cat`, crops by slicing, and our tree rollback keeps
paths with `index_select`), so a fork over the same tensors is as safe as a copy and costs nothing;
any other cache type is deep-copied (what the copies cost: docs/reports/warm-prompts.md).
"""
from __future__ import annotations

import copy
import threading
from collections import OrderedDict

#: tokens of KV kept by default: about 190 MB for SmolLM2-135M in bf16, about 1 GB for an 8B
#: Llama with grouped-query attention (128 KB a token) -- small beside the weights on a 24 GB machine
DEFAULT_TOKENS = 8192


class PrefixCache:
    """Earlier prompts' KV caches, keyed by their token ids, within a budget of `max_tokens` cached tokens
    (least recently used first out): `lookup` hands a request its own copy cut to the longest cached
    prefix (whole `chunk`s, leaving at least `min_tail` tokens to feed), `store` keeps a copy of a
    prompt's KV. Thread-safe: replies decoding at once look up and store from their threads."""

    def __init__(self, max_tokens: int = DEFAULT_TOKENS, chunk: int = 1, min_tail: int = 1):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be an integer >= 0, got {max_tokens!r}")
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise ValueError(f"prefill_chunk must be an integer >= 1, got {chunk!r}")
        if not isinstance(min_tail, int) or min_tail < 1:
            raise ValueError(f"min_tail must be an integer >= 1, got {min_tail!r}")
        self.max_tokens, self.chunk, self.min_tail = max_tokens, chunk, min_tail
        self._entries: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._lock = threading.Lock()  # lookups and stores may come from several engines' threads

    @property
    def tokens(self) -> int:
        """Tokens cached now (never above `max_tokens`)."""
        return sum(len(k) for k in self._entries)

    def lookup(self, ids: list[int], make_empty) -> tuple[int, object]:
        """(tokens reused, a cache of its own holding them). At least the last prompt token is left
        to prefill, since its logits start the reply (`min_tail` tokens: see the module's docstring).
        `make_empty()` builds the cache of a miss."""
        with self._lock:
            best, hit = None, 0
            for key in self._entries:
                n = _common_prefix(key, ids)
                if n > hit:
                    best, hit = key, n
            hit = self._aligned(min(hit, len(ids) - self.min_tail))
            if best is None or hit <= 0:
                return 0, make_empty()
            self._entries.move_to_end(best)
            entry = self._entries[best]
        cache = fork(entry, hit, len(best))
        return (0, make_empty()) if cache is None else (hit, cache)

    def peek(self, ids: list[int]) -> int:
        """How many tokens `lookup(ids)` would reuse, without copying anything."""
        with self._lock:
            hit = max((_common_prefix(key, ids) for key in self._entries), default=0)
        return max(0, self._aligned(min(hit, len(ids) - self.min_tail)))

    def _aligned(self, hit: int) -> int:
        return hit - hit % self.chunk

    def store(self, ids: list[int], cache) -> None:
        """Keep a copy of `cache`, which holds exactly the KV of `ids`."""
        if len(ids) > self.max_tokens:
            return
        key = tuple(ids)
        with self._lock:
            if key in self._entries:  # a full hit: the entry already holds this prompt, no copy needed
                self._entries.move_to_end(key)
                return
        snapshot = fork(cache, len(ids), len(ids))
        with self._lock:
            self._entries.pop(key, None)
            # an entry that is a prefix of the new one holds nothing the new one lacks
            for old in [k for k in self._entries if len(k) < len(key) and key[:len(k)] == k]:
                del self._entries[old]
            self._entries[key] = snapshot
            while self.tokens > self.max_tokens:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def fork(cache, keep: int, length: int):
    """A cache of its own holding the first `keep` of `cache`'s `length` tokens, or None where the
    cache cannot be cut back (a full sliding window). For a plain `DynamicCache` of `DynamicLayer`s
    (what `Verifier.new_cache` and the wave build for full-attention models) the fork's layers are new
    objects over views of the same tensors, which no layer method writes in place; anything else
    (another layer type, offloading) is deep-copied, then cropped."""
    if _append_only(cache):
        out = copy.copy(cache)
        out.layers = []
        for layer in cache.layers:
            mine = copy.copy(layer)
            if keep < length and layer.is_initialized:
                mine.keys, mine.values = layer.keys[..., :keep, :], layer.values[..., :keep, :]
            out.layers.append(mine)
        return out
    out = copy.deepcopy(cache)
    if keep < length:
        try:
            out.crop(-(length - keep))
        except (ValueError, RuntimeError):  # a layer that cannot roll back (a full sliding window)
            return None
    return out


def _append_only(cache) -> bool:
    from transformers.cache_utils import DynamicCache, DynamicLayer
    return type(cache) is DynamicCache and not getattr(cache, "offloading", False) \
        and all(type(layer) is DynamicLayer for layer in cache.layers)


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
