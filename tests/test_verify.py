"""The verifier's host-side steps, against the plain tensor operations they stand for: the greedy pick of a
logits row, the walk of a tree's rows, and the KV cache rolled back to the accepted path."""
import random

import pytest
import torch
from transformers import DynamicCache

from oospec_agents.sampling import greedy
from oospec_agents.verify import Verifier, build_tree, keep_cache
from oospec_agents.drafters import Draft


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_greedy_is_the_first_largest_logit_of_the_row_in_its_own_dtype(dtype):
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):  # small integers: many ties, which argmax breaks at the first index
        row = torch.randint(-4, 4, (1000,), generator=gen).to(dtype)
        assert greedy(row) == int(row.argmax())
    row = torch.full((10,), float("-inf"), dtype=dtype)
    row[7] = 0
    assert greedy(row) == 7  # a grammar's masked row


def _cache(past: int, nodes: int, layers: int = 3) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(layers):
        k = torch.randn(1, 2, past + nodes, 4, dtype=torch.bfloat16)
        cache.update(k, k.clone() * 2, layer)
    return cache


def _reference(cache: DynamicCache, past: int, path: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    idx = torch.tensor(list(range(past)) + [past + i for i in path])
    return [(layer.keys.index_select(-2, idx), layer.values.index_select(-2, idx)) for layer in cache.layers]


def _paths(n: int, rng: random.Random):
    """Tree paths from the root: ascending node indices starting 0 (the chain's, and branches')."""
    yield list(range(n))
    yield [0]
    for _ in range(20):
        yield [0] + sorted(rng.sample(range(1, n), rng.randint(1, n - 1)))


def test_keep_cache_keeps_exactly_the_path_s_keys_and_values_after_the_past():
    rng = random.Random(1)
    for past, n in [(0, 2), (5, 1), (7, 6), (40, 12)]:
        for path in _paths(n, rng) if n > 1 else [[0]]:
            cache = _cache(past, n)
            want = _reference(cache, past, path)
            keep_cache(cache, past, path, n)
            assert cache.get_seq_length() == past + len(path)
            for layer, (k, v) in zip(cache.layers, want):
                assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)


def test_keep_cache_rolls_back_a_cache_the_forward_wrote_in_inference_mode():
    with torch.inference_mode():
        cache = _cache(4, 5)
    want = _reference(cache, 4, [0, 2, 4])
    keep_cache(cache, 4, [0, 2, 4], 5)
    assert all(torch.equal(layer.keys, k) for layer, (k, _) in zip(cache.layers, want))


class _Walk:
    """`Verifier.accept` without a model: only its walk and its cache roll-back are used."""
    accept = Verifier.accept


def test_accept_walks_the_rows_argmax_of_every_dtype_and_keeps_the_path():
    gen, rng = torch.Generator().manual_seed(2), random.Random(2)
    drafts = [Draft([5, 6, 7, 8], "schema"), Draft([5, 9, 3], "retrieval"), Draft([4, 1], "hint")]
    tree = build_tree(0, drafts, 64)
    n = len(tree.tokens)
    for dtype in (torch.bfloat16, torch.float32):
        for _ in range(50):
            logits = torch.randn(n, 12, generator=gen).to(dtype)
            for i in range(n):  # steer the walk down a random branch, with ties now and then
                kids = list(tree.children[i])
                if kids and rng.random() < 0.7:
                    logits[i, rng.choice(kids)] = logits[i].max() + rng.choice([0, 1])
            picks = logits.argmax(-1).tolist()
            path = [0]
            while (nxt := tree.children[path[-1]].get(picks[path[-1]])) is not None:
                path.append(nxt)
            cache = _cache(3, n)
            want = _reference(cache, 3, path)
            got_path, token, rows = _Walk().accept(tree, logits, cache, 3)
            assert (got_path, token) == (path, picks[path[-1]])
            assert torch.equal(rows, logits[path])
            assert all(torch.equal(layer.keys, k) for layer, (k, _) in zip(cache.layers, want))
