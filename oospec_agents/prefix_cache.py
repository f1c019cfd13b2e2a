"""Reuse the KV cache of earlier prompts: an agent resends the same system prompt and tools each turn.

    hit, cache = prefix_cache.lookup(prompt_ids)   a private copy holding the longest cached prefix
    ... prefill prompt_ids[hit:] into it ...
    prefix_cache.store(prompt_ids, cache)          a copy of the prompt's KV, before decoding grows it

Entries are keyed by token ids and matched by their longest common prefix with the new prompt, so a
conversation's next turn reuses the previous turn's whole prompt, and another user message on the
same tools reuses the system prompt and tool schemas. The budget counts cached tokens; the least
recently used entries go first. A request never sees an entry itself, only a copy cropped to the hit,
so verification's rollback can never change what the next request reuses.
"""
from __future__ import annotations

import copy
import threading
from collections import OrderedDict

#: tokens of KV kept by default: about 190 MB for SmolLM2-135M in bf16, about 1 GB for an 8B
#: Llama with grouped-query attention (128 KB a token) -- small beside the weights on a 24 GB machine
DEFAULT_TOKENS = 8192


class PrefixCache:
    def __init__(self, max_tokens: int = DEFAULT_TOKENS):
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"prefix_cache_tokens must be an integer >= 0, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._lock = threading.Lock()  # lookups and stores may come from several engines' threads

    @property
    def tokens(self) -> int:
        """Tokens cached now (never above `max_tokens`)."""
        return sum(len(k) for k in self._entries)

    def lookup(self, ids: list[int], make_empty) -> tuple[int, object]:
        """(tokens reused, a cache of its own holding them). At least the last prompt token is left
        to prefill, since its logits start the reply. `make_empty()` builds the cache of a miss."""
        with self._lock:
            best, hit = None, 0
            for key in self._entries:
                n = _common_prefix(key, ids)
                if n > hit:
                    best, hit = key, n
            hit = min(hit, len(ids) - 1)
            if best is None or hit <= 0:
                return 0, make_empty()
            self._entries.move_to_end(best)
            cache = copy.deepcopy(self._entries[best])
        if hit < len(best):
            try:
                cache.crop(-(len(best) - hit))
            except (ValueError, RuntimeError):  # a layer that cannot roll back (a full sliding window)
                return 0, make_empty()
        return hit, cache

    def peek(self, ids: list[int]) -> int:
        """How many tokens `lookup(ids)` would reuse, without copying anything."""
        with self._lock:
            hit = max((_common_prefix(key, ids) for key in self._entries), default=0)
        return max(0, min(hit, len(ids) - 1))

    def store(self, ids: list[int], cache) -> None:
        """Keep a copy of `cache`, which holds exactly the KV of `ids`."""
        if len(ids) > self.max_tokens:
            return
        key = tuple(ids)
        with self._lock:
            if key in self._entries:  # a full hit: the entry already holds this prompt, no copy needed
                self._entries.move_to_end(key)
                return
        snapshot = copy.deepcopy(cache)
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


def _common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
