"""OoOSpecProposer driven as vLLM drives it (`propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu)`), on the engine's real prompts and AR replies, without vLLM: what it reads from a
prompt, what it drafts, and how many steps a greedy verifier would take with its drafts."""
from __future__ import annotations

import numpy as np
import pytest

from oospec_agents.vllm import OoOSpecProposer
from oospec_agents.vllm.prompt import PromptReader, tools_in

K = 8


@pytest.fixture(scope="module")
def replies(engine, records):
    """(prompt ids, the AR reply's ids) for the first 8 records, tool_choice auto."""
    out = []
    for r in records[:8]:
        gen = engine.generate(r["messages"], r["tools"], method="ar", max_new_tokens=96)
        out.append((engine.prompt_ids(r["messages"], r["tools"]), list(gen.token_ids)))
    return out


def _batch(rows: list[list[int]], width: int = 4096):
    """token_ids_cpu and num_tokens_no_spec as vLLM's input batch holds them."""
    ids = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    return ids, np.array([len(r) for r in rows], dtype=np.int32)


def _replay(proposer, prompt: list[int], reply: list[int], after_first=None) -> tuple[int, int]:
    """Steps a greedy verifier takes to write `reply` with the proposer's drafts (prefill included),
    and the draft tokens it accepted. `after_first()` runs after the first decode step."""
    n, steps, accepted = 1, 1, 0  # the prefill writes the first token
    while n < len(reply):
        if steps == 2 and after_first is not None:
            after_first()
        ids, lens = _batch([prompt + reply[:n]])
        draft = proposer.propose([[reply[n - 1]]], lens, ids)[0]
        assert len(draft) <= K
        ok = 0
        while ok < len(draft) and n + ok < len(reply) and draft[ok] == reply[n + ok]:
            ok += 1
        n += ok + 1
        steps += 1
        accepted += ok
    proposer.propose([], np.zeros(0, dtype=np.int32), np.zeros((0, 1), dtype=np.int32))  # the request is gone
    return steps, accepted


def test_reads_reply_start_and_tools(engine, records):
    reader = PromptReader(engine.tokenizer)
    for r in records[:4]:
        ids = engine.prompt_ids(r["messages"], r["tools"])
        view = reader.read(ids + [1, 2, 3])
        assert view.n_prompt == len(ids)
        assert [t.name for t in view.tools] == [t["function"]["name"] for t in r["tools"]]


def test_earlier_calls_are_not_tools():
    text = 'tools: {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}} ' \
           'then <tool_call>\n{"name": "g", "arguments": {"x": 1}}\n</tool_call> {"name": bad json'
    assert [t.name for t in tools_in(text)] == ["f"]


def test_drafts_cut_steps_on_the_engines_replies(engine, replies):
    proposer = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=None)
    steps = accepted = tokens = 0
    for prompt, reply in replies:
        s, a = _replay(proposer, prompt, reply)
        steps, accepted, tokens = steps + s, accepted + a, tokens + len(reply)
    assert accepted > 0 and steps + accepted == tokens
    assert steps <= 0.6 * tokens, (steps, tokens)
    assert proposer.stats["by_source"].get("schema", 0) > 0


def test_call_memory_after_a_request_finishes(engine, replies):
    """A finished request's reply is drafted from when the same tools come again."""
    proposer = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=None)
    prompt, reply = replies[0]
    first, _ = _replay(proposer, prompt, reply)
    again, _ = _replay(proposer, prompt, reply)
    assert len(proposer.memory) >= 1
    assert again <= first


def test_identical_prompts_in_flight_keep_their_own_state(engine, replies):
    """Two requests with the same prompt in one batch, one 5 tokens ahead: each row gets the drafts a proposer
    serving it alone gives it (vLLM names no request; the rows are told apart by their replies so far)."""
    prompt, reply = replies[1]
    both = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=None)
    alone = [OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=None) for _ in range(2)]
    drafted = 0
    for n in range(6, len(reply)):
        rows = [prompt + reply[:n], prompt + reply[:n - 5]]
        ids, lens = _batch(rows)
        got = both.propose([[r[-1]] for r in rows], lens, ids)
        for i, row in enumerate(rows):
            one_ids, one_lens = _batch([row])
            assert got[i] == alone[i].propose([[row[-1]]], one_lens, one_ids)[0], (n, i)
        drafted += sum(map(len, got))
    assert drafted > 0
    assert sum(map(len, both.replies.values())) == 2


def test_vllms_json_formats_are_drafted_and_cut_to_fit(engine, records):
    """A reply vLLM holds to its JSON list of calls (tool_choice "required"): the proposer reads the format
    from the reply's first characters and drafts the list's forced text; a draft that would leave the list's
    grammar (a tool name not offered) is cut."""
    r = records[0]
    prompt, names = engine.prompt_ids(r["messages"], r["tools"]), [t["function"]["name"] for t in r["tools"]]
    tool = names[0]
    typed = next(tool[:n] for n in range(1, len(tool) + 1) if [m for m in names if m.startswith(tool[:n])] == [tool])
    tok = engine.tokenizer
    proposer = OoOSpecProposer(tokenizer=tok, k=K, hints=None)
    reply = tok.encode('[\n  {"name": "' + typed, add_special_tokens=False)
    ids, lens = _batch([prompt + reply])
    draft = proposer.propose([[reply[-1]]], lens, ids)[0]
    assert proposer.stats["formats"] == {"vllm_list": 1}
    text, forced = tok.decode(reply + draft), '[\n  {"name": "' + tool + '", "parameters": {'
    assert forced.startswith(text) or text.startswith(forced), text
    assert draft and proposer.stats["by_source"] == {"schema": 1}


def test_a_request_without_tools_gets_retrieval_only(engine, records):
    proposer = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=None)
    r = records[0]
    prompt = engine.prompt_ids(r["messages"], None)
    gen = engine.generate(r["messages"], None, method="ar", max_new_tokens=48)
    _replay(proposer, prompt, list(gen.token_ids))
    assert set(proposer.stats["by_source"]) <= {"retrieval"}
    assert proposer.stats["unrecognised"] == 0


def test_an_unrecognised_prompt_gets_no_drafts_and_no_error(engine):
    proposer = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=None)
    plain = engine.tokenizer.encode('Q: {"name": "f", "arguments": {"a": 1}} again: {"name": "f", "arguments"',
                                    add_special_tokens=False)
    ids, lens = _batch([plain])
    assert proposer.propose([[plain[-1]]], lens, ids) == [[]]
    assert proposer.stats["unrecognised"] == 1


def test_partial_prefills_and_full_contexts_get_no_drafts(engine, replies):
    proposer = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=None)
    proposer.max_model_len = len(replies[1][0]) + 1
    ids, lens = _batch([replies[0][0] + replies[0][1][:1], replies[1][0] + replies[1][1][:1]])
    assert proposer.propose([[], [replies[1][1][0]]], lens, ids) == [[], []]


def test_needs_k():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        OoOSpecProposer(tokenizer=object(), k=0)


@pytest.fixture(scope="module")
def sidecar():
    """The embedded sidecar in a process of its own, as the proposer loads it in vLLM's worker."""
    import torch

    from oospec_agents.sidecar.load import load_sidecar
    side = load_sidecar("embedded", device="cpu", dtype=torch.float32, sidecar_placement="process")
    yield side
    side.close()


def test_the_sidecars_hint_joins_the_drafts(engine, replies, sidecar):
    """The wave starts at a request's first step; once it has posted, its call is drafted."""
    from oospec_agents.vllm.hints import SidecarHints
    proposer = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=SidecarHints(sidecar, PromptReader(engine.tokenizer)))
    for prompt, reply in replies[:4]:
        _replay(proposer, prompt, reply, after_first=lambda: sidecar.wait_idle(60))
    assert proposer.stats["by_source"].get("hint", 0) > 0, proposer.stats
    assert proposer.hints.sessions == {}  # every finished request's session is closed


def test_a_killed_sidecar_leaves_schema_and_retrieval(engine, replies, sidecar):
    from oospec_agents.vllm.hints import SidecarHints
    proposer = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=SidecarHints(sidecar, PromptReader(engine.tokenizer)))
    (prompt, reply), plain = replies[4], OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=None)
    killed = []

    def kill():
        import os
        import signal
        killed.append(sidecar.pid)
        os.kill(sidecar.pid, signal.SIGKILL)
    steps, _ = _replay(proposer, prompt, reply, after_first=kill)
    assert killed and steps == _replay(plain, prompt, reply)[0]
    assert "hint" not in proposer.stats["by_source"]


def test_hint_first_waits_for_each_requests_wave_before_its_first_draft(engine, replies, monkeypatch):
    """OOSPEC_VLLM_HINT_FIRST (`oospec bench --backend vllm --hint-first`): the sidecar the environment names is
    waited for at a request's first step, so its hint is polled ready at once; every request is hinted."""
    from oospec_agents.sidecar.protocol import HintFirst
    from oospec_agents.vllm.hints import hints_from_env
    monkeypatch.setenv("OOSPEC_VLLM_SIDECAR", "embedded")
    monkeypatch.setenv("OOSPEC_VLLM_SIDECAR_PLACEMENT", "thread")
    monkeypatch.setenv("OOSPEC_VLLM_HINT_FIRST", "1")
    hints = hints_from_env(PromptReader(engine.tokenizer))
    try:
        assert isinstance(hints.sidecar, HintFirst)
        proposer = OoOSpecProposer(tokenizer=engine.tokenizer, k=K, hints=hints)
        for prompt, reply in replies[:2]:
            _replay(proposer, prompt, reply)
        assert proposer.stats["requests"] == proposer.stats["hinted"] == 2, proposer.stats
    finally:
        hints.sidecar.close()
