"""n-gram retrieval (prompt lookup): match the last n committed tokens, longest n first, in a pool of
token sequences -- the prompt and output so far, earlier calls of this engine, the sidecar's hint --
and propose what followed there."""
from __future__ import annotations

import json
import threading
from collections import OrderedDict

from .base import Accepted, Draft, ReplyState, Drafter


class RetrievalDrafter(Drafter):
    source = "retrieval"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, max_tokens: int = 12, max_candidates: int = 2):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.max_tokens, self.max_candidates = max_tokens, max_candidates

    def propose(self, ctx: ReplyState) -> list[Draft]:
        pool: list[list[int]] = [ctx.ids] + ctx.pool
        ids = ctx.ids
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ids) <= n:
                continue
            key = ids[-n:]
            found: list[list[int]] = []
            for seq in pool:
                cont = _last_match(seq, key, exclude_end=seq is ids)
                if cont is not None:
                    cont = seq[cont:cont + self.max_tokens]
                    if cont and cont not in found:
                        found.append(cont)
                if len(found) >= self.max_candidates:
                    break
            if found:
                return [Draft(c, self.source) for c in found]
        return []


def _last_match(seq: list[int], key: list[int], exclude_end: bool) -> int | None:
    """Index just after the latest occurrence of `key` in `seq` (not the trailing one itself)."""
    n = len(key)
    last = len(seq) - n - (1 if exclude_end else 0)
    first = key[0]
    for start in range(last, -1, -1):
        if seq[start] == first and seq[start:start + n] == key:
            end = start + n
            return end if end < len(seq) else None
    return None


class CallMemory:
    """Earlier replies that retrieval may draft from, kept per tool set and bounded.

    A reply is only recalled for a request offering the same tools (names and schemas), so one
    tenant's calls are never drafted into another tool set's replies; `size=0` turns memory off.
    """

    def __init__(self, size: int = 32, max_tool_sets: int = 64):
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"memory_size must be an integer >= 0, got {size!r}")
        self.size, self.max_tool_sets = size, max_tool_sets
        self._by_tools: OrderedDict[str, list[list[int]]] = OrderedDict()
        self._lock = threading.Lock()  # replies decoding at once recall and remember from their threads

    def recall(self, tools) -> list[list[int]]:
        """A copy of the replies remembered for this tool set (most recent last)."""
        key = _key(tools)
        with self._lock:
            return [list(ids) for ids in self._by_tools.get(key, [])]

    def remember(self, tools, ids: list[int]) -> None:
        if not self.size:
            return
        key = _key(tools)
        with self._lock:
            replies = self._by_tools.pop(key, [])
            replies.append(list(ids))
            self._by_tools[key] = replies[-self.size:]
            while len(self._by_tools) > self.max_tool_sets:  # the least recently used tool set goes
                self._by_tools.popitem(last=False)

    def accepted(self, ctx: ReplyState, accepted: Accepted) -> None:
        """The drafters' feedback hook: a finished reply is kept for its tool set."""
        if accepted.done:
            self.remember(ctx.tools, ctx.new)

    def clear(self) -> None:
        with self._lock:
            self._by_tools.clear()

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_tools.values())


def _key(tools) -> str:
    return json.dumps([t.to_openai() for t in tools], sort_keys=True, ensure_ascii=False)
