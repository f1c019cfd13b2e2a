"""Suffix-tree retrieval, as vLLM's `suffix` method (SuffixDecoding, Arctic Inference) drafts: the same
pool as n-gram retrieval -- the prompt and output so far, earlier replies from the call memory, the
hint -- kept in Arctic Inference's `SuffixDecodingCache`, which matches the longest suffix of the reply
and proposes the continuation its earlier occurrences took most often.

An optional dependency (`pip install oospec-agents[suffix]`, built from source): imported only when a
`SuffixDrafter` is made. docs/reports/suffix-tree.md compares it with `RetrievalDrafter`.
"""
from __future__ import annotations

from collections import Counter
from itertools import count

from .base import Draft, ReplyState, Drafter

#: vLLM's defaults for its `suffix` method (tree depth 24, as many draft tokens, factor 1, min prob 0.1)
MAX_DEPTH = 24


def suffix_cache(max_depth: int):
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError as e:
        raise ImportError("the suffix drafter needs Arctic Inference's suffix tree: pip install "
                          f"'oospec-agents[suffix]' (it builds a C++ extension; docs/reports/suffix-tree.md) ({e})") from e
    return SuffixDecodingCache(max_tree_depth=max_depth, max_cached_requests=-1)


class SuffixDrafter(Drafter):
    """Drafts as `RetrievalDrafter` does, from the same sequences, with a suffix tree in place of n-gram
    matching. Its drafts count as retrieval's. It follows one reply at a time: a new `ReplyState` starts
    a request whose local tree holds the prompt, and the global tree is kept equal to the reply's pool,
    so what it may recall is what the call memory holds. Replies decoding at the same time (an engine
    with `max_batch` > 1 and concurrent requests) make it start over at each switch: still lossless (the
    target verifies every draft), but it drafts less. Give it an engine that decodes one reply at a time
    (the bench's `suffix` method runs its records one after the other).
    """
    source = "retrieval"

    def __init__(self, max_depth: int = MAX_DEPTH, max_tokens: int = MAX_DEPTH, max_spec_factor: float = 1.0,
                 min_token_prob: float = 0.1, tree: bool = False):
        self.max_depth, self.max_tokens = max_depth, max_tokens
        self.spec = {"max_spec_factor": max_spec_factor, "min_token_prob": min_token_prob, "use_tree_spec": tree}
        self._cache = suffix_cache(max_depth)
        self._ids = count()
        self._held: dict[tuple[int, ...], list[int]] = {}  # a pool sequence -> its copies' ids in the tree
        self._reply: ReplyState | None = None
        self._rid = self._fed = self._pooled = 0

    def propose(self, ctx: ReplyState) -> list[Draft]:
        if ctx is not self._reply or len(ctx.ids) < self._fed:
            self._start(ctx)
        elif len(ctx.pool) != self._pooled:  # the hint arrived
            self._sync(ctx.pool)
        self._cache.add_active_response(self._rid, ctx.ids[self._fed:])
        self._fed = len(ctx.ids)
        d = self._cache.speculate(self._rid, ctx.ids[-self.max_depth:], max_spec_tokens=self.max_tokens, **self.spec)
        return [Draft(p, self.source) for p in _paths(d.token_ids, d.parents)]

    def _start(self, ctx: ReplyState) -> None:
        if self._reply is not None:
            # the last reply's own copy goes: the call memory hands it back in the pool if it kept it
            self._cache.stop_request(self._rid)
            self._cache.evict_cached_response(self._rid)
        self._sync(ctx.pool)
        self._reply, self._rid, self._fed = ctx, next(self._ids), ctx.n_prompt
        self._cache.start_request(self._rid, ctx.ids[:ctx.n_prompt])

    def _sync(self, pool: list[list[int]]) -> None:
        """Make the global tree hold exactly `pool` (a multiset: a reply written twice counts twice)."""
        want = Counter(tuple(s) for s in pool if s)
        for seq, rids in list(self._held.items()):
            while len(rids) > want[seq]:
                self._cache.evict_cached_response(rids.pop())
            if not rids:
                del self._held[seq]
        for seq, n in want.items():
            rids = self._held.setdefault(seq, [])
            while len(rids) < n:
                rid = next(self._ids)
                self._cache.start_request(rid, [])
                self._cache.add_active_response(rid, list(seq))
                self._cache.stop_request(rid)
                rids.append(rid)
        self._pooled = len(pool)


def _paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """The root-to-leaf paths of a draft tree given as parent indices (a chain gives itself)."""
    inner = set(parents)
    out = []
    for leaf in (i for i in range(len(tokens)) if i not in inner):
        path, i = [], leaf
        while i >= 0:
            path.append(tokens[i])
            i = parents[i]
        out.append(path[::-1])
    return out
