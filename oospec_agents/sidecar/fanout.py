"""The wave's prefill: the rows' shared prompt prefix fed once, its KV cache fanned out per row.

    prefix + what all suffixes share       prefilled once (from the prefix cache)  [1, P]
    each tool's call opener                fanned out: one element per tool       [T, P + O]
    each row's key                         fanned out: one element per row        [R, P + O + K]

Each level is right-aligned: pads sit between levels, masked out, and position ids skip them, so
every batch element is exactly its row's `prefix + suffix` and no row attends to another. Several
requests' prefilled prefixes (a batched wave, `Wave.many`) are stacked left-padded into one batch
before the fan-out. `Wave` (wave.py) decodes what this prefills.
"""
from __future__ import annotations

import functools

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..prefix_cache import PrefixCache
from ..verify import cache_kwarg


class FanOut:
    """Feeds the sidecar model the prefixes and row suffixes of a wave, sharing the KV of every common
    part; returns the cache, the last logits, the attention mask and each row's next position."""

    def __init__(self, model, pad: int):
        self.model = model
        self.pad = pad
        self.device = next(model.parameters()).device
        self.cache_kw = cache_kwarg(model)

    @functools.cached_property
    def stackable(self) -> bool:
        """Whether prefilled prefixes of different lengths can be stacked into one batch: every layer's
        cache is a plain `DynamicLayer` (a sliding window's layer crops, which left pads would upset)."""
        return all(type(layer) is DynamicLayer for layer in DynamicCache(config=self.model.config).layers)

    def prefill_rows(self, prefix: list[int], suffixes: list[list[int]], groups: list, kept: PrefixCache, cancel=None):
        """Feed prefix + suffix of every row, sharing the KV cache of every common part.

        Three levels, each fanned out from the one before: the prefix plus what all suffixes share
        (one sequence), what each group's suffixes share (one per group: a tool's call opener), then
        each row's own rest (its key). Every row keeps at least one token for the last level. The
        first level starts from `kept`'s longest hit, and is cached in turn.
        Returns (cache, logits, attention mask so far, each row's next position, tokens reused)."""
        cache, logits, mask, pos, hit, rests = self.shared_level(prefix, suffixes, kept)
        if cancel is not None and cancel.is_set():  # the request is over: skip the fan-out
            return cache, logits, mask, pos, hit
        openers, row_group = self.openers(rests, groups)
        logits, mask, pos = self.fan_out(cache, mask, pos, [0] * len(openers), openers, row_group, rests)
        return cache, logits, mask, pos, hit

    def prefill_requests(self, requests: list[tuple[list[int], list[list[int]], list]], kept: PrefixCache):
        """`prefill_rows` for several requests `(prefix, suffixes, groups)` at once: each one's first level on its
        own (from `kept`), those stacked into one batch (`stack`), then every request's openers and rows
        fanned out together. Returns (cache, logits, mask, next positions, tokens reused per request)."""
        parts, hits = [], []
        opener_parent, openers, row_opener, rests = [], [], [], []
        for n, (prefix, suffixes, groups) in enumerate(requests):
            cache, _, mask, pos, hit, own = self.shared_level(prefix, suffixes, kept)
            mine, row_group = self.openers(own, groups)
            row_opener += [len(openers) + g for g in row_group]
            openers += mine
            opener_parent += [n] * len(mine)
            rests += own
            parts.append((cache, mask, pos))
            hits.append(hit)
        cache, mask, pos = self.stack(parts)
        logits, mask, pos = self.fan_out(cache, mask, pos, opener_parent, openers, row_opener, rests)
        return cache, logits, mask, pos, hits

    def shared_level(self, prefix: list[int], suffixes: list[list[int]], kept: PrefixCache):
        """The first level of `prefill_rows`: the prefix plus what every suffix shares, from `kept`'s longest
        hit, then cached in turn. Returns (cache, logits, mask, next position, tokens reused, each
        suffix's rest)."""
        common = _keep_one(_common_prefix(suffixes), suffixes)
        shared = prefix + common
        hit, cache = kept.lookup(shared, lambda: DynamicCache(config=self.model.config))
        mask = torch.ones(1, hit, dtype=torch.long, device=self.device)
        pos = torch.full((1,), hit, dtype=torch.long, device=self.device)
        logits, mask, pos = self.feed(cache, mask, pos, [0], [shared[hit:]])
        kept.store(shared, cache)
        return cache, logits, mask, pos, hit, [s[len(common):] for s in suffixes]

    @staticmethod
    def openers(rests: list[list[int]], groups: list) -> tuple[list[list[int]], list[int]]:
        """The second level: what each group's rests share (a tool's call opener, every rest keeping a
        token of its own), and each rest's group as an index into those openers."""
        group_ids = list(dict.fromkeys(groups))
        members = [[r for r, g in zip(rests, groups) if g == gid] for gid in group_ids]
        return [_keep_one(_common_prefix(m), m) for m in members], [group_ids.index(g) for g in groups]

    def fan_out(self, cache, mask, pos, opener_parent: list[int], openers: list[list[int]], row_opener: list[int],
                rests: list[list[int]]):
        """The second and third levels: each opener continues its element `opener_parent[o]` of the cache,
        then each row (its rest, less its opener) continues its opener `row_opener[r]` (or, where no
        opener has a token, the opener's parent element directly). Returns (logits, mask, positions)."""
        if any(openers):
            _, mask, pos = self.feed(cache, mask, pos, opener_parent, openers)
            parents = row_opener
        else:
            parents = [opener_parent[o] for o in row_opener]
        tails = [r[len(openers[o]):] for r, o in zip(rests, row_opener)]
        return self.feed(cache, mask, pos, parents, tails)

    def stack(self, parts: list[tuple]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """One batch of the prefilled prefixes (cache, mask [1, L], next position [1]) of several requests,
        each left-padded to the longest: the pads' keys and values are zeros that the mask hides."""
        width = max(m.shape[1] for _, m, _ in parts)
        stacked = DynamicCache(config=self.model.config)
        for li in range(len(parts[0][0].layers)):
            keys, values = [], []
            for cache, mask, _ in parts:
                k, v = cache.layers[li].keys, cache.layers[li].values
                pad = width - mask.shape[1]
                keys.append(torch.nn.functional.pad(k, (0, 0, pad, 0)))
                values.append(torch.nn.functional.pad(v, (0, 0, pad, 0)))
            stacked.update(torch.cat(keys), torch.cat(values), li)
        mask = torch.cat([torch.nn.functional.pad(m, (width - m.shape[1], 0)) for _, m, _ in parts])
        return stacked, mask, torch.cat([p for _, _, p in parts])

    def feed(self, cache, mask, pos, parents: list[int], segments: list[list[int]]):
        """Batch element i continues element parents[i] of the cache with segments[i], right-aligned
        (pads between the two are masked out, and positions skip them)."""
        idx = torch.tensor(parents, device=self.device)
        cache.batch_select_indices(idx)
        mask, pos = mask[idx], pos[idx]
        n, width = len(segments), max(map(len, segments))
        ids = torch.full((n, width), self.pad, dtype=torch.long, device=self.device)
        seg_mask = torch.zeros(n, width, dtype=torch.long, device=self.device)
        seg_pos = torch.zeros(n, width, dtype=torch.long, device=self.device)
        for i, seg in enumerate(segments):
            if seg:
                ids[i, width - len(seg):] = torch.tensor(seg, device=self.device)
                seg_mask[i, width - len(seg):] = 1
                seg_pos[i, width - len(seg):] = pos[i] + torch.arange(len(seg), device=self.device)
        mask = torch.cat([mask, seg_mask], dim=1)
        logits = self.forward(ids, cache, mask, seg_pos)
        return logits, mask, pos + torch.tensor([len(s) for s in segments], device=self.device)

    def forward(self, ids, cache, mask, pos):
        """The model's next-token logits at the last position of each batch element."""
        return self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                          **{self.cache_kw: cache}).logits


def _common_prefix(seqs: list[list[int]]) -> list[int]:
    first = seqs[0]
    n = min(map(len, seqs))
    for i in range(n):
        if any(s[i] != first[i] for s in seqs):
            return first[:i]
    return first[:n]


def _keep_one(common: list[int], seqs: list[list[int]]) -> list[int]:
    """`common`, shortened so that every sequence keeps at least one token of its own."""
    return common[:min(map(len, seqs)) - 1] if len(common) >= min(map(len, seqs)) else common
