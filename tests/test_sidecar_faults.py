"""A sidecar changes nothing in the target's output: its faults, a late or declining wave, a sidecar with
another tokenizer, and requests from several threads (tiny models)."""
from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from oospec_testing import InTime, greedy, tiny_model
from sidecar_testing import ASK, N, TIME, WEATHER
from oospec_agents import Engine
from oospec_agents.sidecar import HintRequest, SidecarBase
from oospec_agents.sidecar.hosts.thread import WaveSidecar
from oospec_agents.sidecar.join import encode_payload
from oospec_agents.sidecar.runtime import wave_rows
from oospec_agents.sidecar.wave import Wave


@pytest.fixture(scope="module")
def tiny_target(smollm2_tokenizer):
    return tiny_model("llama", smollm2_tokenizer, seed=7), smollm2_tokenizer


@pytest.fixture(scope="module")
def released():
    event = threading.Event()
    yield event
    event.set()  # lets the hung test doubles' threads end


def _fault_sidecars(released):
    def raises(*a):
        raise RuntimeError("boom")

    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def hangs(*a):
        released.wait()
        return ["x"] * 5

    def late(prefix, rows, cancel, choices):
        cancel.wait(30)
        return [' "get_weather"', ' "Paris"', " null", " null", " null"]

    class SubmitRaises(SidecarBase):
        def submit(self, request):
            raise ConnectionError("mailbox down")

    class PollRaises(SidecarBase):
        def submit(self, request):
            return type("T", (), {"error": None, "poll": lambda s: 1 / 0, "cancel": lambda s: None})()
    return {
        "raises": WaveSidecar(raises),
        "out of memory": WaveSidecar(oom),
        "hangs": WaveSidecar(hangs, timeout_s=0.0),
        "is late": WaveSidecar(late),
        "returns garbage": WaveSidecar(lambda *a: ["}}garbage{{"] * 5),
        "names an unknown function": WaveSidecar(lambda *a: [' "launch_rockets"', ' "Paris"'] + [" 1"] * 3),
        "fails to submit": SubmitRaises(),
        "fails to poll": PollRaises(),
    }


FAULTS = {"raises": "sidecar failed", "out of memory": "sidecar out of memory", "hangs": "sidecar timeout",
          "is late": "sidecar hint late", "returns garbage": "sidecar gave no usable call",
          "names an unknown function": "sidecar gave no usable call", "fails to submit": "sidecar submit failed",
          "fails to poll": "sidecar poll failed"}


@pytest.fixture(scope="module")
def tiny_reference(tiny_target):
    engine = Engine(*tiny_target)
    return greedy(engine, engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice="required"), 12)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulty_sidecar_leaves_the_target_tokens_unchanged(fault, tiny_target, tiny_reference, released, caplog):
    model, tok = tiny_target
    engine = Engine(model, tok, _fault_sidecars(released)[fault])
    kind = FAULTS[fault]
    with caplog.at_level(logging.WARNING, logger="oospec_agents.engine"):
        gens = [engine.generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=12) for _ in range(2)]
    for gen in gens:
        assert gen.token_ids == tiny_reference
        assert gen.stats["new_tokens"] == 12 and gen.finish_reason == "length"
        assert gen.stats["sidecar_error"].startswith(kind), gen.stats["sidecar_error"]
        assert gen.stats["accepted_by_source"]["hint"] == 0
    assert sum(kind in r.getMessage() for r in caplog.records) == 1  # logged once, in stats every time


def test_a_sidecar_that_predicts_no_call_is_no_fault_under_auto(tiny_target, caplog):
    model, tok = tiny_target
    engine = Engine(model, tok, InTime(WaveSidecar(lambda prefix, rows, *a: [" null"] * len(rows))))
    ref = greedy(engine, engine.prompt_ids(ASK, [WEATHER, TIME]), 12)
    with caplog.at_level(logging.WARNING, logger="oospec_agents.engine"):
        gen = engine.generate(ASK, [WEATHER, TIME], max_new_tokens=12)  # tool_choice="auto"
    assert gen.token_ids == ref
    assert gen.stats["sidecar_error"] is None and gen.stats["sidecar_declined"] and gen.stats["hint_ready_s"] is None
    assert not caplog.records
    # when a call is required, "no call" is a wrong answer, and reported as such
    gen = engine.generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=12)
    assert gen.stats["sidecar_error"].startswith("sidecar gave no usable call") and not gen.stats["sidecar_declined"]


class _PostsAfter(SidecarBase):
    """TEST DOUBLE: a sidecar whose wave posts `call` as its hint `delay_s` after each submit, from a
    thread of its own (a wave slower than the reply)."""
    name = "posts-after"

    def __init__(self, call: dict, delay_s: float):
        self.call, self.delay_s = call, delay_s

    def submit(self, request):
        from oospec_agents.sidecar import Ticket
        ticket = Ticket(request, timeout_s=60.0)
        threading.Timer(self.delay_s, lambda: ticket.post(payload=encode_payload(self.call))).start()
        return ticket


def test_hint_first_has_the_target_wait_for_the_wave_so_every_hint_is_in_time(tiny_target, tiny_reference):
    """`oospec bench --hint-first`'s wrapper: the target's first poll finds the slow wave's hint, where
    without it the reply ends before the hint comes; the tokens are the target's either way."""
    from oospec_agents.sidecar.protocol import HintFirst
    model, tok = tiny_target
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    late = Engine(model, tok, _PostsAfter(call, 5.0)).generate(ASK, [WEATHER, TIME], tool_choice="required",
                                                                max_new_tokens=12)
    assert late.stats["sidecar_error"].startswith("sidecar hint late")
    waited = HintFirst(_PostsAfter(call, 0.3))
    assert waited.name == "posts-after" and waited.describe() == {"hint_first": True}
    first = Engine(model, tok, waited).generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=12)
    assert first.stats["sidecar_error"] is None and first.stats["hint_ready_s"] >= 0.3
    assert first.stats["hint_bytes"] == len(encode_payload(call))
    assert late.token_ids == first.token_ids == tiny_reference


def test_without_a_sidecar_oospec_is_toolspec(tiny_target):
    a, b = (Engine(*tiny_target).generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=16, method=m)
            for m in ("toolspec", "oospec"))
    assert a.token_ids == b.token_ids and a.stats["target_forwards"] == b.stats["target_forwards"]
    assert b.stats["sidecar_error"] is None and b.stats["hint_ready_s"] is None


# ---------------------------------------------------------------- cross-tokenizer, concurrency (tiny models)

def test_a_sidecar_with_another_tokenizer_crosses_as_text(tiny_target, bpe_tokenizer, bpe_sidecar_model):
    model, tok = tiny_target
    assert bpe_tokenizer.get_vocab() != tok.get_vocab()
    side = WaveSidecar(Wave(bpe_sidecar_model, bpe_tokenizer, max_row_tokens=8))
    engine = Engine(model, tok, InTime(side))
    for tools in ([WEATHER], [WEATHER, TIME]):
        ids = engine.prompt_ids(ASK, tools, tool_choice="required")
        gen = engine.generate(ASK, tools, tool_choice="required", max_new_tokens=N)
        assert gen.token_ids == greedy(engine, ids, N)
        assert gen.stats["sidecar_error"] is None and gen.stats["hint_bytes"] > 10
        # where the wave's time went travels with the hint, for the benchmark's profile
        prof = gen.stats["sidecar_profile"]
        req = engine.prepare(ASK, tools, "required")
        rows, _, _ = wave_rows(HintRequest(req.messages, req.tools, engine.fmt, req.choice))
        assert prof["rows"] == len(rows) and prof["prefix_tokens"] > 0 and 1 <= prof["steps"] <= 8
        assert 0 <= prof["queued_s"] and 0 < prof["prefill_s"] + prof["decode_s"] <= prof["wave_s"]


def test_requests_from_several_threads_take_one_forward_at_a_time_and_are_unchanged(tiny_target, bpe_tokenizer, bpe_sidecar_model):
    model, tok = tiny_target
    engine = Engine(model, tok, WaveSidecar(Wave(bpe_sidecar_model, bpe_tokenizer, max_row_tokens=8)))
    asks = [[{"role": "user", "content": f"Weather in city number {i}?"}] for i in range(4)]
    expected = [greedy(engine, engine.prompt_ids(a, [WEATHER, TIME], tool_choice="required"), 12) for a in asks]
    inside, most, lock = 0, 0, threading.Lock()
    forward = model.forward

    def counting_forward(*a, **kw):
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        try:
            time.sleep(0.002)  # widen the window in which an unserialised request would overlap
            return forward(*a, **kw)
        finally:
            with lock:
                inside -= 1
    results = [None] * len(asks)

    def run(i):
        results[i] = engine.generate(asks[i], [WEATHER, TIME], tool_choice="required", max_new_tokens=12).token_ids
    model.forward = counting_forward
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(asks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        del model.forward
    assert results == expected
    assert most == 1  # one forward at a time owns the target (the replies' rounds may share it: batching.py)
