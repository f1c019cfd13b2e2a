"""deterministic=True: the same request gives the same tokens whatever the method, the draft tree's
shape, the concurrency and the prefix cache, in bf16 (oospec_agents/deterministic.py)."""
from __future__ import annotations

import threading

import pytest
import torch

from oospec_testing import AMX_BF16_FLAW, DATA, ReferenceDrafter, tiny_model
from oospec_agents import Engine
from oospec_agents import deterministic as det
from oospec_agents.drafters import Draft
from oospec_agents.errors import OoOSpecError
from oospec_agents.verify import build_tree

WEATHER = {"type": "function", "function": {"name": "get_current_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RIGHT = '<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WRONG = '<tool_call>\n{"name": "get_current_weather", "arguments": {"city": "Quito", "unit": "f"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tiny_bf16(smollm2_tokenizer):
    return tiny_model("llama", smollm2_tokenizer, seed=3).to(torch.bfloat16)


def engine_on(model, tokenizer, **kw) -> Engine:
    return Engine(model, tokenizer, deterministic=True, **kw)


def in_threads(n: int, call) -> list:
    """`call(i)` from `n` threads at once; the results in order."""
    out: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, call(i))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [out[i] for i in range(n)]


# ---------------------------------------------------------------- the shapes

def test_rows_are_padded_to_a_multiple_of_8_and_keys_are_fixed_per_reply():
    assert [det.Shapes.rows(n) for n in (1, 7, 8, 9, 49, 64)] == [8, 8, 8, 16, 56, 64]
    with pytest.raises(ValueError):
        det.Shapes.rows(65)
    shapes = det.Shapes.for_reply(300, 100)
    assert shapes.keys % 64 == 0 and shapes.keys >= 300 + 100 + det.MAX_ROWS


def test_a_tree_whose_keys_would_cross_an_attention_block_is_cut_to_its_first_chain():
    drafts = [Draft([1, 2, 3], "schema"), Draft([1, 5, 6, 7], "retrieval")]
    tree = build_tree(9, drafts, 48)
    assert not tree.is_chain and tree.depths == [0, 1, 2, 3, 2, 3, 4]
    assert det.within_blocks(tree, 0) and det.within_blocks(tree, det.KV_BLOCK - 7)
    # node 4 (depth 2) sits at slot past + 4: across the boundary from its position when past = 510
    assert not det.within_blocks(tree, det.KV_BLOCK - 3)
    chain = det.first_chain(tree)
    assert chain.tokens == [9, 1, 2, 3] and chain.is_chain and chain.children[-1] == {}
    assert det.within_blocks(chain, det.KV_BLOCK - 3)


def test_a_forced_run_longer_than_a_forward_is_fed_ahead(smollm2_tokenizer, tiny_bf16):
    """100 forced tokens and a draft: the first ones go in forwards of their own, the rest with the draft."""
    engine = engine_on(tiny_bf16, smollm2_tokenizer)
    verifier = engine._verifier
    prompt = list(range(10, 40))
    forced = list(range(200, 300))
    tree = build_tree(7, [Draft([1, 2, 3], "schema")], 48, forced=forced)
    shapes = det.Shapes.for_reply(len(prompt), 200)
    cache = verifier.new_cache()
    verifier.forward(prompt, cache, 0)
    fitted, past, fed = verifier.fit(tree, cache, len(prompt), shapes)
    assert len(fitted.tokens) == det.MAX_ROWS and past == len(prompt) + len(tree.tokens) - det.MAX_ROWS
    assert len(fed) == 1 and cache.get_seq_length() == past
    path, nxt, logits = verifier.verify(fitted, cache, past, shapes=shapes)
    # the same tokens one at a time, each in a forward of its own
    ref = verifier.new_cache()
    verifier.forward(prompt, ref, 0)
    rows = [verifier.forward([t], ref, len(prompt) + i, shapes=shapes)[0]
            for i, t in enumerate([7] + forced + [1, 2, 3][:len(path) - fitted.start - 1])]
    assert torch.equal(logits, torch.stack(rows[-len(path):]))
    assert cache.get_seq_length() == ref.get_seq_length()


def test_a_sliding_window_target_is_refused(smollm2_tokenizer):
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(vocab_size=len(smollm2_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=32,
                      max_window_layers=1, layer_types=["sliding_attention", "full_attention"])
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(OoOSpecError, match="sliding-window"):
        Engine(model, smollm2_tokenizer, deterministic=True)


def test_off_by_default_and_an_exact_prefill_when_on(smollm2_tokenizer, tiny_bf16):
    """On: the exact one-forward prefill where the target takes it (bf16 where the CPU has it), else
    chunks of 256; never the plain prefill, even when asked for (1). More than 1: those chunks."""
    from oospec_agents.models import cpu_supports_bf16
    assert not Engine(tiny_bf16, smollm2_tokenizer).deterministic
    for kw in ({}, {"prefill_chunk": 1}):
        on = engine_on(tiny_bf16, smollm2_tokenizer, **kw)
        assert on._verifier.exact_prefill == cpu_supports_bf16()
        assert on.prefix_cache.chunk == (1 if cpu_supports_bf16() else det.PREFILL_CHUNK)
    fp32 = engine_on(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer)
    assert not fp32._verifier.exact_prefill and fp32.prefix_cache.chunk == det.PREFILL_CHUNK
    chunked = engine_on(tiny_bf16, smollm2_tokenizer, prefill_chunk=16)
    assert not chunked._verifier.exact_prefill and chunked.prefix_cache.chunk == 16


# ---------------------------------------------------------------- the same tokens, tiny bf16 target

def test_methods_trees_and_threads_give_the_same_tokens_on_a_tiny_bf16_target(smollm2_tokenizer, tiny_bf16,
                                                                              monkeypatch):
    engine = engine_on(tiny_bf16, smollm2_tokenizer, prefix_cache_tokens=0, memory_size=0)
    small = engine_on(tiny_bf16, smollm2_tokenizer, prefix_cache_tokens=0, memory_size=0, max_draft_nodes=3)

    def run(e, method, hint=None, n=40):
        return e.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=n, method=method, hint=hint).token_ids
    ref = run(engine, "ar")
    assert len(ref) == 40
    for e in (engine, small):
        for method, hint in (("toolspec", None), ("oospec", RIGHT), ("oospec", WRONG)):
            assert run(e, method, hint) == ref, (e.max_draft_nodes, method, hint)
    # trees whose accepted path is not contiguous (a flawed draft first), rejected at several depths
    n_prompt = len(engine.prompt_ids(ASK, [WEATHER], tool_choice="required"))
    for wrong_at in (0, 2, 5):
        assert run(engine.with_parts(drafters={"retrieval": ReferenceDrafter(ref, n_prompt, wrong_at, True)}),
                   "toolspec") == ref
    calls = [("ar", None), ("toolspec", None), ("oospec", RIGHT), ("oospec", WRONG)]
    for n in (4, 8):
        got = in_threads(n, lambda i: run(engine if i % 2 else small, *calls[i % 4]))
        assert got == [ref] * n


def test_the_mode_verifies_a_chain_the_first_draft(smollm2_tokenizer, tiny_bf16, monkeypatch):
    """A tree's row whose ancestors are not contiguous can come out in other bits (the slow test's xfail),
    so in this mode a forward verifies the first draft only: a chain. Without the mode, trees."""
    trees = {}
    for on in (True, False):
        engine = engine_on(tiny_bf16, smollm2_tokenizer, prefix_cache_tokens=0, memory_size=0) if on else \
            Engine(tiny_bf16, smollm2_tokenizer, prefix_cache_tokens=0, memory_size=0)
        n_prompt = len(engine.prompt_ids(ASK, [WEATHER], tool_choice="required"))
        ref = engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=30, method="ar").token_ids
        # two drafts: a flawed one first, the reference second
        engine = engine.with_parts(drafters={"retrieval": ReferenceDrafter(ref, n_prompt, 2, True)})
        seen = trees[on] = []
        verify = engine._verifier.verify
        monkeypatch.setattr(engine._verifier, "verify", lambda tree, *a, **k: seen.append(tree.is_chain) or
                            verify(tree, *a, **k))
        assert engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=30,
                               method="toolspec").token_ids == ref
        monkeypatch.undo()
    assert trees[True] and all(trees[True])
    assert not all(trees[False])


# ---------------------------------------------------------------- the embedded target in bf16

#: a train-extra record whose warm reply differed from its cold one in bf16 before prefills were chunked
#: (tests/test_prefix_cache.py), beside the first dev record
EXTRA = ("tooltalk/easy/CreateEvent-easy#0",)


GAPPED_TREES_DIFFER = pytest.mark.xfail(
    reason="why the mode drafts chains only (docs/deterministic.md, 'Decode forwards'): where a key sits in its "
           "512-key block can change a row's bits; with these keys (reply width 1024) the gapped trees' rows from "
           "depth 3 differ from ar's", strict=False)


def gapped_tree(ids: list[int], past: int, spacing: int, depth: int = 8):
    """(tree, its path's nodes): `ids[past:past + depth]` at every `spacing`-th node, wrong siblings first
    between them, so that (spacing > 1) the path is not contiguous in the tree."""
    from oospec_agents.verify import Tree
    tokens, parents, depths, path = [ids[past]], [-1], [0], [0]
    for d in range(1, depth):
        for k in range(spacing - 1):
            tokens.append(50 + 10 * d + k)
            parents.append(path[-1])
            depths.append(d)
        path.append(len(tokens))
        tokens.append(ids[past + d])
        parents.append(path[-2])
        depths.append(d)
    return Tree(tokens, parents, [None] * len(tokens), depths, [{} for _ in tokens]), path


@AMX_BF16_FLAW
@pytest.mark.slow
@pytest.mark.parametrize("max_new, spacings", [(48, (1,)), (260, (1,)), (48, (2, 4)),
                                               pytest.param(260, (2, 4), marks=GAPPED_TREES_DIFFER)])
def test_in_bf16_a_position_has_the_same_logits_in_every_forward_shape(embedded_bf16, max_new, spacings):
    """The embedded target in bf16, 700 tokens of past (past a 512-key block): a position's logits from
    one-token forwards and from a chain (spacing 1: what the mode drafts) are the same bits in deterministic
    forwards; so are those of trees whose accepted path is not contiguous (spacing 2, 4) with these
    48-token replies' keys, but not always (the xfail: why the mode does not draft trees). In normal
    forwards they need not be: the printed count says how often not. With 48 new tokens the reply's keys
    end in a partial block (832 keys); with 260 in a full one (1024)."""
    from oospec_agents.verify import chain
    v = embedded_bf16._verifier
    torch.manual_seed(0)
    ids = torch.randint(100, 40000, (720,)).tolist()
    past = 700
    shapes = det.Shapes.for_reply(past, max_new)

    def fresh():
        cache = v.new_cache()
        v.forward(ids[:512], cache, 0)
        v.forward(ids[512:past], cache, 512)
        return cache

    def one_by_one(fixed):
        cache = fresh()
        return torch.stack([v.forward([t], cache, past + i, shapes=shapes if fixed else None)[0]
                            for i, t in enumerate(ids[past:past + 8])])

    reference, normal = one_by_one(True), one_by_one(False)
    differ = 0
    for spacing in spacings:
        tree, path = gapped_tree(ids, past, spacing)
        for fixed in (True, False):
            cache = fresh()
            logits = v.forward(tree.tokens, cache, past, tree if spacing > 1 else chain(tree.tokens),
                               shapes=shapes if fixed else None)[path]
            if fixed:
                assert torch.equal(logits, reference), spacing
            else:
                differ += int(not torch.equal(logits, normal))
    print(f"normal (not deterministic) forwards whose path logits differ from one-token forwards: {differ} of "
          f"{len(spacings)}")


@pytest.mark.slow
def test_in_bf16_decode_attention_gives_the_bits_of_transformers_sdpa(embedded_bf16, monkeypatch):
    """Deterministic decode forwards compute attention with torch's kernel and `enable_gqa` (no repeated
    key and value heads) and append and pad the keys in one copy: the embedded target in bf16 gives the
    same logits and cached keys and values, bit for bit, as through transformers' `sdpa` over keys
    concatenated then padded (the forward before), for one token, a chain, trees with gaps and a 48-node
    tree, at 700 and 1000 tokens of past and reply widths whose last 512-key block is partial and full."""
    from transformers import DynamicCache

    from oospec_agents.verify import chain
    v = embedded_bf16._verifier
    if not v.gqa_decode():
        pytest.skip("decode attention goes through decode_attention() only where the target takes the exact attention")

    class CatThenPad(DynamicCache):  # deterministic._PaddedKeys before
        width: int

        def update(self, key_states, value_states, layer_idx, *a, **kw):
            keys, values = super().update(key_states, value_states, layer_idx, *a, **kw)
            pad = (0, 0, 0, self.width - keys.shape[-2])
            return torch.nn.functional.pad(keys, pad), torch.nn.functional.pad(values, pad)

    torch.manual_seed(2)
    ids = torch.randint(100, 40000, (1100,)).tolist()

    checked = 0
    for past in (700, 1000):
        prefix = v.new_cache()
        v.forward(ids[:512], prefix, 0)
        v.forward(ids[512:past], prefix, 512)
        trees = [chain(ids[past:past + 1]), chain(ids[past:past + 8]), gapped_tree(ids, past, 2)[0], gapped_tree(ids, past, 4)[0],
                 build_tree(ids[past], [Draft(ids[past + 1:past + 31], "schema"),
                                        Draft(ids[past + 1:past + 11] + list(range(50, 70)), "retrieval")], 48)]
        for shapes in (det.Shapes.for_reply(past, 48), det.Shapes(1536)):
            for tree in trees:
                got = {}
                for gqa in (True, False):
                    v._gqa_decode = gqa
                    if not gqa:
                        monkeypatch.setattr(det, "_PaddedKeys", CatThenPad)
                    cache = DynamicCache()
                    for layer in prefix.layers:  # the prefix's keys, shared: nothing writes them in place
                        cache.layers[len(cache.layers):] = [type(layer)()]
                        cache.layers[-1].lazy_initialization(layer.keys, layer.values)
                        cache.layers[-1].keys, cache.layers[-1].values = layer.keys, layer.values
                    logits = v.forward(tree.tokens, cache, past, tree, shapes=shapes)
                    got[gqa] = logits, [(x.keys, x.values) for x in cache.layers]
                    monkeypatch.undo()
                v._gqa_decode = None
                assert torch.equal(got[True][0], got[False][0]), (past, shapes, len(tree.tokens))
                assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                           for a, b in zip(got[True][1], got[False][1]))
                checked += 1
    assert checked == 20


@AMX_BF16_FLAW
@pytest.mark.slow
def test_in_bf16_every_method_tree_thread_count_and_cache_state_gives_the_same_tokens(smollm2_dir):
    from oospec_agents.bench.records import load_records, spread
    records = [spread(load_records(DATA / "dev.jsonl"), 1)[0]]
    extra = {r["id"]: r for r in load_records(DATA / "train-extra.jsonl")}
    records += [extra[i] for i in EXTRA]
    engine = Engine.from_pretrained("embedded", sidecar=False, dtype=torch.bfloat16, deterministic=True)
    small = Engine(engine.target, engine.tokenizer, deterministic=True, max_draft_nodes=8)
    small = small.with_parts(prefix_cache=engine.prefix_cache)
    n = 20
    for rec in records:
        hint = engine.fmt.render_calls(rec["expected"])
        wrong = engine.fmt.render_calls([dict(c, arguments={}) for c in rec["expected"]])

        def run(e, method, h=None):
            g = e.generate(rec["messages"], rec["tools"], tool_choice="required", max_new_tokens=n, method=method,
                           hint=h)
            return g.token_ids, g.stats.cached_prompt_tokens
        engine.clear_prefix_cache()
        ref, cached = run(engine, "ar")
        assert cached == 0
        calls = [(engine, "toolspec", None), (engine, "oospec", hint), (small, "oospec", wrong), (small, "toolspec", None),
                 (engine, "ar", None)]
        for e, method, h in calls:
            tokens, cached = run(e, method, h)
            assert cached > 0 and tokens == ref, (rec["id"], method, e.max_draft_nodes)
        for k in (4, 8):
            got = in_threads(k, lambda i: run(*calls[i % len(calls)])[0])
            assert got == [ref] * k, rec["id"]


# ---------------------------------------------------------------- the command lines

@pytest.mark.parametrize("command", ["bench", "serve"])
def test_the_deterministic_flag_reaches_the_engine(monkeypatch, command):
    """`oospec bench --deterministic` and `oospec serve --deterministic` load `Engine(deterministic=True)`;
    without the flag the engine's default (off)."""
    import sys
    import types

    from oospec_agents.cli import main
    from oospec_agents.serve import app
    seen = []

    def load(target="embedded", sidecar=None, **kw):
        seen.append(kw.get("deterministic", False))
        raise SystemExit(7)
    monkeypatch.setattr(Engine, "from_pretrained", load)
    # the server loads its engine from create_app's loader: call it where uvicorn would start serving
    monkeypatch.setattr(app, "create_app", lambda loader, **kw: loader())
    monkeypatch.setitem(sys.modules, "uvicorn", types.SimpleNamespace(run=lambda *a, **k: None))
    args = {"bench": ["bench", "--data", str(DATA / "dev.jsonl"), "--limit", "1"], "serve": ["serve"]}[command]
    for flag in ([], ["--deterministic"]):
        with pytest.raises(SystemExit):
            main([*args, *flag])
    assert seen == [False, True]
