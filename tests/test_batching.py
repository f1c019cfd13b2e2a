"""Concurrent replies share each target forward (#58: batching.py schedules, batch_attention.py attends):
every reply in a batch is the reply the same request gets alone, whatever else is decoding beside it."""
import threading
import time

import pytest
import torch

from oospec_testing import greedy, tiny_model
from oospec_agents import Engine
from oospec_agents.batch_attention import TreeRow
from oospec_agents.batching import Batcher, Job

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
QUESTIONS = ["What is the weather in Paris?", "Search for pizza in Rome", "Is it raining in Oslo?",
             "Find the news", "How hot is Cairo?", "Look up python", "Weather in Lima in fahrenheit",
             "search cheap flights"]


def ask(q):
    return [{"role": "user", "content": q}]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def engine(request, smollm2_tokenizer):
    """A tiny float32 target of each family (two layers: quick), batching up to 8 replies."""
    return Engine(tiny_model(request.param, smollm2_tokenizer), smollm2_tokenizer, model_name=f"tiny-{request.param}")


def together(calls):
    """Run every `call()` in its own thread, started together; their results (or exceptions) in order."""
    out = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(i):
        start.wait()
        try:
            out[i] = calls[i]()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out[i] = e
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_the_target_batches_and_says_so(engine):
    assert engine.batching_refusal is None
    assert Engine(engine.target, engine.tokenizer, max_batch=1).batching_refusal == "max_batch=1"
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1"):
        Engine(engine.target, engine.tokenizer, max_batch=0)


@pytest.mark.parametrize("method", ["ar", "toolspec", "oospec"])
def test_every_reply_in_a_batch_is_its_reply_alone(engine, method):
    kw = dict(method=method, max_new_tokens=40)
    if method == "oospec":  # a fixed hint per reply: a draft source of its own
        kw["hint"] = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    alone = [engine.generate(ask(q), [WEATHER, SEARCH], **kw) for q in QUESTIONS]
    engine.clear_prefix_cache()
    engine.clear_call_memory()
    batched = together([lambda q=q: engine.generate(ask(q), [WEATHER, SEARCH], **kw) for q in QUESTIONS])
    for q, a, b in zip(QUESTIONS, alone, batched):
        assert b.token_ids == a.token_ids
        # and both are plain transformers greedy decoding (generate(do_sample=False)) of the prompt
        assert b.token_ids == greedy(engine, engine.prompt_ids(ask(q), [WEATHER, SEARCH]), 40)[:len(b.token_ids)]
        assert b.text == a.text and b.tool_calls == [dict(c, id=c2["id"]) for c, c2 in zip(a.tool_calls, b.tool_calls)]
    sizes = [s for g in batched for s in g.stats.batch_sizes]
    assert max(sizes) > 1, "no round was shared: the replies did not decode at the same time"
    assert all(1 <= s <= 8 for s in sizes)
    assert all(len(g.stats.batch_sizes) == len(g.stats.rounds) for g in batched)


def test_a_target_on_the_exact_prefills_attention_batches_too(smollm2_tokenizer):
    """attention_registry.py: every attention implementation of ours hands a batched round's keys to the
    round's own attention, so a target switched to the exact prefill's (deterministic.py; the engine's
    default on a bf16 CPU) batches its replies as one on batch_attention.py's does, each reply still
    transformers' greedy decoding of its prompt."""
    from oospec_agents import attention_registry
    from oospec_agents import deterministic as det
    model = tiny_model("llama", smollm2_tokenizer)
    assert det.install_exact_attention(model)
    engine = Engine(model, smollm2_tokenizer, model_name="tiny-llama-exact")
    assert engine.batching_refusal is None
    assert attention_registry.implementation(model) == det.EXACT_ATTENTION  # not switched back to ours
    questions = QUESTIONS[:6]
    out = together([lambda q=q: engine.generate(ask(q), [WEATHER], method="toolspec", max_new_tokens=24)
                    for q in questions])
    for q, g in zip(questions, out):
        assert not isinstance(g, BaseException), g
        assert g.token_ids == greedy(engine, engine.prompt_ids(ask(q), [WEATHER]), 24)[:len(g.token_ids)]
    assert max(s for g in out for s in g.stats.batch_sizes) > 1


def test_a_mixed_batch_keeps_each_requests_own_settings(engine):
    """Strict, sampling (each its own seed), a stop string, logprobs, a prediction and a forced call, in
    one batch: each greedy one is what it is alone. A sampled reply keeps its distribution
    (test_sampling.py samples it batched), not its draws: a batched forward's logits may differ from a
    lone forward's in their last bits (other GEMM shapes), and a draw near a boundary of the inverse CDF
    then takes the neighbouring token. Call memory off: the replies alone would each have drafted from
    the earlier ones."""
    engine = Engine(engine.target, engine.tokenizer, memory_size=0)
    requests = [
        dict(messages=ask(QUESTIONS[0]), tools=[WEATHER], strict=True, method="toolspec"),
        dict(messages=ask(QUESTIONS[1]), temperature=0.9, seed=7, method="toolspec"),
        dict(messages=ask(QUESTIONS[2]), temperature=0.7, top_p=0.9, seed=8, method="ar"),
        dict(messages=ask(QUESTIONS[3]), stop=["e"], method="toolspec"),
        dict(messages=ask(QUESTIONS[4]), logprobs=2, method="ar"),
        dict(messages=ask(QUESTIONS[5]), prediction="Paris is a city in France", method="toolspec"),
        dict(messages=ask(QUESTIONS[6]), tools=[WEATHER, SEARCH], tool_choice="required", method="toolspec"),
    ]

    def run(r):
        r = dict(r)
        return engine.generate(r.pop("messages"), r.pop("tools", None), max_new_tokens=32, **r)
    alone = [run(r) for r in requests]
    engine.clear_prefix_cache()
    batched = together([lambda r=r: run(r) for r in requests])
    for r, a, b in zip(requests, alone, batched):
        if r.get("temperature"):
            assert b.stats.new_tokens == len(b.token_ids) > 0 and b.finish_reason in ("stop", "length", "tool_calls")
            continue
        assert b.token_ids == a.token_ids, r
        assert b.finish_reason == a.finish_reason
        if r.get("logprobs"):  # the same tokens and alternatives; values up to float32's last bits
            assert [[t["token"] for t in e["top_logprobs"]] for e in b.logprobs] == \
                [[t["token"] for t in e["top_logprobs"]] for e in a.logprobs]
            assert [e["logprob"] for e in b.logprobs] == pytest.approx([e["logprob"] for e in a.logprobs], abs=1e-4)
    assert max(s for g in batched for s in g.stats.batch_sizes) > 1


def test_replies_join_and_leave_mid_batch_and_a_warm_prompt_sits_beside_cold_ones(engine):
    """Requests of other lengths start at other times; one prompt is in the prefix cache, the others not."""
    engine.clear_prefix_cache()
    engine.generate(ask(QUESTIONS[0]), [WEATHER], method="toolspec", max_new_tokens=4)  # warms its prompt
    lengths = [40, 8, 24, 3, 30]
    alone = [engine.generate(ask(QUESTIONS[i]), [WEATHER], method="ar", max_new_tokens=n)
             for i, n in enumerate(lengths)]
    engine.clear_prefix_cache()
    engine.generate(ask(QUESTIONS[0]), [WEATHER], method="toolspec", max_new_tokens=4)

    def late(i, n):
        def call():
            time.sleep(0.02 * i)
            return engine.generate(ask(QUESTIONS[i]), [WEATHER], method="ar", max_new_tokens=n)
        return call
    batched = together([late(i, n) for i, n in enumerate(lengths)])
    # the warm prompt is cached to its last tokens; the others share only the tools' prefix with it
    assert batched[0].stats.cached_prompt_tokens > max(g.stats.cached_prompt_tokens for g in batched[1:])
    for a, b in zip(alone, batched):
        assert b.token_ids == a.token_ids


def test_a_cancelled_or_failing_reply_leaves_the_others_going(engine, monkeypatch):
    alone = [engine.generate(ask(q), [WEATHER], method="ar", max_new_tokens=30) for q in QUESTIONS[:4]]
    cancel = threading.Event()
    from oospec_agents.drafters import SchemaDrafter

    class FailsForOslo(SchemaDrafter):  # TEST DOUBLE: the schema drafter, failing for one reply
        def propose(self, state):
            if "Oslo" in engine.tokenizer.decode(state.ids[:state.n_prompt]) and len(state.ids) > state.n_prompt + 5:
                raise RuntimeError("a drafter failed for this reply only")
            return super().propose(state)
    engine = engine.with_parts(drafters={"schema": FailsForOslo})

    def cancelled():
        events = []
        for ev in engine.stream(ask(QUESTIONS[3]), [WEATHER], method="ar", max_new_tokens=30, cancel=cancel):
            events.append(ev)
            if len(events) == 3:
                cancel.set()
        return events
    out = together([
        lambda: engine.generate(ask(QUESTIONS[0]), [WEATHER], method="toolspec", max_new_tokens=30),
        lambda: engine.generate(ask(QUESTIONS[1]), [WEATHER], method="toolspec", max_new_tokens=30),
        lambda: engine.generate(ask(QUESTIONS[2]), [WEATHER], method="toolspec", max_new_tokens=30),  # Oslo: fails
        cancelled,
    ])
    assert out[0].token_ids == alone[0].token_ids and out[1].token_ids == alone[1].token_ids
    assert isinstance(out[2], RuntimeError) and "this reply only" in str(out[2])
    assert not any(type(e).__name__ == "Generation" for e in out[3])
    assert engine.decoding == 0


def test_an_abandoned_stream_does_not_hold_up_the_others(engine):
    """A consumer that holds its stream's last event (or drops it) does not stall the other replies' rounds."""
    held = engine.stream(ask(QUESTIONS[0]), [WEATHER], method="ar", max_new_tokens=60)
    next(held)  # parked: its reader is away
    t0 = time.perf_counter()
    other = engine.generate(ask(QUESTIONS[1]), [WEATHER], method="ar", max_new_tokens=20)
    assert other.stats.new_tokens == 20
    assert time.perf_counter() - t0 < 30
    assert engine.decoding == 1
    held.close()
    assert engine.decoding == 0


# ---------------------------------------------------------------- the rendezvous alone, on a fake forward

def fake_row(n):
    return lambda: TreeRow(list(range(n)), list(range(n)), None, lambda: torch.zeros(1))


def test_verify_jobs_of_waiting_replies_share_one_forward_up_to_max_batch():
    forwards = []
    batcher = Batcher(lambda rows: forwards.append(len(rows)) or [torch.zeros(len(r.tokens)) for r in rows],
                      max_batch=3)
    seats = [batcher.seat() for _ in range(5)]
    jobs = [Job(fn=lambda: ("alone", 0.0), row=fake_row(i + 1)) for i in range(5)]
    out = together([lambda s=s, j=j: s.run(j) for s, j in zip(seats, jobs)])
    alone = sum(1 for o in out if o[0] == "alone")
    assert sum(forwards) + alone == 5 and forwards and max(forwards) <= 3
    assert all(j.batch <= 3 for j in jobs)
    assert all(o[0] == "alone" or o[0].shape == (len(j.row().tokens),) for o, j in zip(out, jobs))


def test_a_round_waits_for_busy_replies_but_not_parked_ones():
    forwards = []
    batcher = Batcher(lambda rows: forwards.append(len(rows)) or [torch.zeros(1) for _ in rows], max_batch=8)
    a, b, parked = batcher.seat(), batcher.seat(), batcher.seat()
    parked.parked(True)
    done = []
    t = threading.Thread(target=lambda: done.append(a.run(Job(fn=lambda: ("alone", 0.0), row=fake_row(1)))))
    t.start()
    time.sleep(0.05)
    assert not done, "the round ran while a busy reply (b) was about to join it"
    b.run(Job(fn=lambda: ("alone", 0.0), row=fake_row(1)))
    t.join(5)
    assert done and forwards == [2]


def test_a_forward_that_raises_fails_each_of_its_jobs_and_the_batcher_goes_on():
    calls = []

    def forward(rows):
        calls.append(len(rows))
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return [torch.zeros(1) for _ in rows]
    batcher = Batcher(forward, max_batch=4)
    seats = [batcher.seat() for _ in range(2)]
    out = together([lambda s=s: s.run(Job(fn=lambda: ("alone", 0.0), row=fake_row(1))) for s in seats])
    assert all(isinstance(o, RuntimeError) for o in out)
    again = together([lambda s=s: s.run(Job(fn=lambda: ("alone", 0.0), row=fake_row(1))) for s in seats])
    assert all(isinstance(o, tuple) for o in again)


def test_max_batch_is_checked():
    with pytest.raises(ValueError, match="max_batch must be an integer >= 1, got 0"):
        Batcher(lambda rows: [], max_batch=0)
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(lambda rows: [], max_batch=True)


def test_a_reasoning_targets_batch_mixes_methods_thinking_on_and_off_and_a_strict_call(with_template):
    """A reasoning target (a Qwen3-style template: the reply may open `<think>`), one batch of replies with
    thinking on and off (`enable_thinking`), each method, a strict forced call and a seeded sample: each
    greedy reply is its reply alone, reasoning state and all, and transformers' greedy decoding of its
    prompt."""
    from oospec_agents.formats import Reasoning
    from oospec_testing import TEMPLATES, tiny_qwen3
    tok = with_template(TEMPLATES["qwen3"])
    engine = Engine(tiny_qwen3(tok), tok, model_name="tiny-qwen3", memory_size=0)
    off = {"enable_thinking": False}
    hint = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    requests = [
        dict(messages=ask(QUESTIONS[0]), method="ar"),
        dict(messages=ask(QUESTIONS[1]), method="toolspec", chat_template_kwargs=off),
        dict(messages=ask(QUESTIONS[2]), method="oospec", hint=hint),
        dict(messages=ask(QUESTIONS[3]), method="oospec", hint=hint, chat_template_kwargs=off),
        dict(messages=ask(QUESTIONS[4]), method="toolspec", tools=[WEATHER], tool_choice="required", strict=True,
             chat_template_kwargs=off),
        dict(messages=ask(QUESTIONS[5]), method="toolspec", temperature=0.8, seed=3),
    ]

    def run(r):
        r = dict(r)
        return engine.generate(r.pop("messages"), r.pop("tools", [WEATHER, SEARCH]), max_new_tokens=24, **r)
    alone = [run(r) for r in requests]
    engine.clear_prefix_cache()
    batched = together([lambda r=r: run(r) for r in requests])
    states = [engine.prepare(r["messages"], r.get("tools", [WEATHER, SEARCH]), r.get("tool_choice", "auto"),
                             chat_template_kwargs=r.get("chat_template_kwargs")).reasoning for r in requests[:4]]
    assert states == [Reasoning(), None, Reasoning(), None]  # thinking on and off in one batch
    for r, a, b in zip(requests, alone, batched):
        assert not isinstance(b, BaseException), b
        if r.get("temperature"):
            assert b.stats.new_tokens == len(b.token_ids) > 0
            continue
        assert (b.token_ids, b.reasoning, b.text, b.finish_reason, b.tool_calls) == \
            (a.token_ids, a.reasoning, a.text, a.finish_reason, [dict(c, id=c2["id"]) for c, c2 in
                                                                 zip(a.tool_calls, b.tool_calls)]), r
        if not r.get("strict"):
            ids = engine.prompt_ids(r["messages"], r.get("tools", [WEATHER, SEARCH]),
                                    chat_template_kwargs=r.get("chat_template_kwargs"))
            assert b.token_ids == greedy(engine, ids, 24)[:len(b.token_ids)]
    assert max(s for g in batched for s in g.stats.batch_sizes) > 1
