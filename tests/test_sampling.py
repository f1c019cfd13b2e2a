"""Sampling stays lossless in distribution: every method's replies are distributed as the target's own
sampling. Checked three ways: the rule's per-node probabilities against enumeration on hand-built
cases; the seeded draw against the warped distribution; and, end to end on a tiny model whose next
tokens are spread out, the first three tokens of several thousand replies of `ar`, `toolspec` and
`oospec` (trees of several children, drafts sometimes right, sometimes wrong) against the exact
distribution, by a chi-square test at ALPHA -- which fails when the rule is broken (drafts accepted
outright). Seeds are fixed, so every outcome here is reproducible."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from oospec_testing import tiny_model
from oospec_agents import Engine, SamplingError
from oospec_agents.drafters import Draft, Drafter
from oospec_agents.sampling import Sampler, Sampling
from oospec_agents.verify import Verifier, keep_cache

#: the significance of every chi-square test here
ALPHA = 1e-3
ASK = [{"role": "user", "content": "Name a colour."}]
SETTINGS = dict(temperature=1.5, top_k=3)  # three tokens at each position: 27 cells for three tokens
N = 1500


def p_value(observed: dict, expected: dict, n: int) -> float:
    """Pearson's chi-square goodness of fit of counts `observed` to probabilities `expected`."""
    cells = [c for c in expected if expected[c] > 0]
    stat = sum((observed.get(c, 0) - n * expected[c]) ** 2 / (n * expected[c]) for c in cells)
    stray = sum(v for c, v in observed.items() if expected.get(c, 0) == 0)
    if stray:
        return 0.0  # an outcome the distribution cannot give
    df = len(cells) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# ---------------------------------------------------------------- the rule, by enumeration

def sequential_rule(p: dict[int, float], children: list[int]) -> dict[int, float]:
    """The multi-draft rejection rule for deterministic drafts, as SpecInfer states it: try the children
    in order, accept child x with probability p(x) of what the earlier rejected children leave
    (renormalised); if none is accepted, draw from what is left. The probability of each outcome."""
    out, left, mass = Counter(), dict(p), 1.0
    reach = 1.0  # the probability that the rule gets to the current child
    for x in children:
        q = left.get(x, 0.0) / mass if mass > 0 else 0.0
        out[x] += reach * q
        reach *= 1 - q
        mass -= left.pop(x, 0.0)
    for t, v in left.items():
        out[t] += reach * (v / mass if mass > 0 else 0.0)
    return dict(out)


@pytest.mark.parametrize("children", [[], [0], [2, 0], [3, 1, 2], [4, 0]])
def test_the_sequential_rule_emits_each_token_with_its_own_probability(children):
    p = {0: 0.5, 1: 0.25, 2: 0.15, 3: 0.1}  # token 4: probability 0 (a draft the target never takes)
    got = sequential_rule(p, children)
    assert all(abs(got.get(t, 0.0) - v) < 1e-12 for t, v in p.items()), got
    assert got.get(4, 0.0) == 0.0


def test_the_warped_distribution_is_transformers_generate_s():
    row = torch.randn(50, generator=torch.Generator().manual_seed(0))
    s = Sampler(Sampling(temperature=0.7, top_k=10, top_p=0.9))
    reference = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), TopPLogitsWarper(0.9)])
    assert torch.allclose(s.probs(row), torch.softmax(reference(None, row[None]), -1)[0])


def test_the_seeded_draw_follows_the_warped_distribution():
    row = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0, -9.0])
    s = Sampler(Sampling(temperature=1.0, seed=11))
    probs = s.probs(row)
    n = 20000
    counts = Counter(s.draw(row) for _ in range(n))
    assert p_value(counts, dict(enumerate(probs.tolist())), n) > ALPHA


def test_the_same_seed_draws_the_same_tokens_and_another_seed_others():
    row = torch.randn(100, generator=torch.Generator().manual_seed(1))
    draws = [[Sampler(Sampling(temperature=1.0, seed=seed)).draw(row) for _ in range(1)] for seed in (5, 5)]
    assert draws[0] == draws[1]
    a, b = Sampler(Sampling(temperature=1.0, seed=5)), Sampler(Sampling(temperature=1.0, seed=6))
    assert [a.draw(row) for _ in range(20)] != [b.draw(row) for _ in range(20)]


@pytest.mark.parametrize("settings, param", [(dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
                                             (dict(temperature=1, top_p=0), "top_p"), (dict(temperature=1, top_p=1.5), "top_p"),
                                             (dict(temperature=1, top_k=-1), "top_k"), (dict(temperature=1, top_k=2.5), "top_k"),
                                             (dict(temperature=1, min_p=2), "min_p"), (dict(temperature=1, seed="7"), "seed"),
                                             (dict(temperature=1, seed=True), "seed"),
                                             (dict(temperature=1, seed=2 ** 64), "seed"), (dict(logprobs=21), "top_logprobs"),
                                             (dict(temperature="hot"), "temperature")])
def test_bad_settings_are_clear_errors_before_any_token(settings, param, smollm2_tokenizer):
    engine = Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer)
    with pytest.raises(SamplingError, match=param) as e:
        engine.stream(ASK, **settings)  # raises here, before the first token: nothing is half-sent
    assert e.value.param == param


# ---------------------------------------------------------------- end to end, against the exact distribution

@pytest.fixture(scope="module")
def spread(smollm2_tokenizer):
    """A tiny random model whose next tokens are spread out, and the exact distribution of its first
    three sampled tokens under SETTINGS, by enumeration."""
    torch.manual_seed(0)
    model = tiny_model("llama", smollm2_tokenizer, seed=5)
    engine = Engine(model, smollm2_tokenizer, prefix_cache_tokens=0)
    prompt = engine.prompt_ids(ASK)
    sampler = Sampler(Sampling(**SETTINGS))

    def probs(ids):
        with torch.inference_mode():
            return sampler.probs(model(torch.tensor([prompt + ids])).logits[0, -1])

    exact, top2 = {}, {}
    for t1, p1 in _support(probs([])):
        second = _support(probs([t1]))
        top2[t1] = [t for t, _ in sorted(second, key=lambda x: -x[1])[:2]]
        for t2, p2 in second:
            for t3, p3 in _support(probs([t1, t2])):
                exact[(t1, t2, t3)] = p1 * p2 * p3
    assert abs(sum(exact.values()) - 1) < 1e-4 and len(exact) == 27
    return engine, exact, top2, len(prompt)


def _support(p: torch.Tensor) -> list[tuple[int, float]]:
    nz = p.nonzero().flatten().tolist()
    return [(t, float(p[t])) for t in nz]


class TreeDrafter(Drafter):
    """TEST DOUBLE: after the first token, a tree of three children -- the two likeliest second tokens
    (each right some of the time) with a third token below each, and a token the target never samples."""
    source = "retrieval"

    def __init__(self, top2: dict, n_prompt: int):
        self.top2, self.n_prompt = top2, n_prompt

    def propose(self, ctx):
        new = ctx.ids[self.n_prompt:]
        if len(new) != 1 or new[0] not in self.top2:
            return []
        a, b = self.top2[new[0]]
        return [Draft([a, b], self.source), Draft([b, a], self.source), Draft([7], self.source)]


def _sample(engine, method: str, seeds) -> Counter:
    return Counter(tuple(engine.generate(ASK, max_new_tokens=3, method=method, seed=s, **SETTINGS).token_ids)
                   for s in seeds)


@pytest.mark.parametrize("method, first_seed", [("ar", 0), ("toolspec", 10**6), ("oospec", 2 * 10**6)])
def test_every_method_samples_the_target_s_distribution(spread, method, first_seed):
    engine, exact, top2, n_prompt = spread
    engine = engine.with_parts(drafters={"retrieval": TreeDrafter(top2, n_prompt)})
    forwards = engine.generate(ASK, max_new_tokens=3, method=method, seed=first_seed, **SETTINGS).stats.target_forwards
    counts = _sample(engine, method, range(first_seed, first_seed + N))  # seeds apart: independent samples
    assert p_value(counts, exact, N) > ALPHA, counts
    if method != "ar":
        assert forwards <= 3  # drafts were verified in trees (2 forwards when the tree's first child is right)


def test_replies_sampled_in_batches_keep_the_target_s_distribution(spread):
    """#58: eight threads sample at once, so their rounds share forwards (batching.py); each reply is
    still drawn from the target's distribution."""
    import threading
    engine, exact, top2, n_prompt = spread
    engine = engine.with_parts(drafters={"retrieval": TreeDrafter(top2, n_prompt)})
    seeds = list(range(3 * 10**6, 3 * 10**6 + N))
    replies, sizes = [], []

    def run(chunk):
        for s in chunk:
            gen = engine.generate(ASK, max_new_tokens=3, method="toolspec", seed=s, **SETTINGS)
            replies.append(tuple(gen.token_ids))
            sizes.extend(gen.stats.batch_sizes)
    threads = [threading.Thread(target=run, args=(seeds[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(replies) == N and max(sizes) > 1
    assert p_value(Counter(replies), exact, N) > ALPHA


def accept_outright(self, tree, cache, past_len, choose=None):
    """A BROKEN rule: take the first child wherever there is one, unsampled."""
    logits = self.forward(tree.tokens, cache, past_len, tree)
    path = list(range(tree.start + 1))
    while tree.children[path[-1]]:
        path.append(next(iter(tree.children[path[-1]].values())))
    token = choose(logits[path[-1]])
    keep_cache(cache, past_len, path, len(tree.tokens))
    return path, token, logits[path]


def test_the_test_fails_when_drafts_are_accepted_outright(spread, monkeypatch):
    engine, exact, top2, n_prompt = spread
    engine = engine.with_parts(drafters={"retrieval": TreeDrafter(top2, n_prompt)})
    monkeypatch.setattr(Verifier, "verify", accept_outright)
    counts = _sample(engine, "toolspec", range(3 * 10**6, 3 * 10**6 + N))
    assert p_value(counts, exact, N) < ALPHA


def test_a_seed_gives_the_same_reply_for_each_method_and_n_seeds_give_different_ones(spread):
    engine, exact, top2, n_prompt = spread
    engine = engine.with_parts(drafters={"retrieval": TreeDrafter(top2, n_prompt)})
    replies = {m: engine.generate(ASK, max_new_tokens=8, method=m, seed=42, temperature=0.9).token_ids
               for m in ("ar", "toolspec", "oospec")}
    again = engine.generate(ASK, max_new_tokens=8, method="toolspec", seed=42, temperature=0.9).token_ids
    assert again == replies["toolspec"]  # reproducible for a method
    assert len(set(map(tuple, replies.values()))) == 1  # one uniform per committed token, in order: across methods too (float32)
    others = {tuple(engine.generate(ASK, max_new_tokens=8, seed=s, temperature=0.9).token_ids) for s in range(5)}
    assert len(others) > 1


def test_greedy_is_unchanged_by_a_zero_temperature_and_ignores_the_rest(spread):
    engine = spread[0]
    plain = engine.generate(ASK, max_new_tokens=6).token_ids
    assert engine.generate(ASK, max_new_tokens=6, temperature=0, top_p=0.5, seed=3).token_ids == plain
