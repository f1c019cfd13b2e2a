"""The sidecar's mailbox and threads: polling never waits, a wave's thread count and the cores a reply
lends it come back to the threads they belong to."""
from __future__ import annotations

import threading
import time

import torch

from oospec_testing import InTime, tiny_model
from sidecar_testing import ASK, WEATHER, hint_request
from oospec_agents import Engine
from oospec_agents.sidecar import SidecarBase
from oospec_agents.sidecar.hosts.thread import WaveSidecar


def test_poll_returns_at_once_while_the_wave_computes():
    release = threading.Event()

    def slow_wave(prefix, rows, cancel, choices):
        release.wait(10)
        return [' "get_weather"', ' "Paris"', " null", " null", " null"]
    ticket = WaveSidecar(slow_wave).submit(hint_request())
    t0 = time.perf_counter()
    polls = [ticket.poll() for _ in range(100)]
    assert time.perf_counter() - t0 < 0.5 and polls == [None] * 100
    release.set()
    while (hint := ticket.poll()) is None and ticket.error is None:
        time.sleep(0.001)
    assert hint.text == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert hint.payload_bytes == len(b'{"f":"get_weather","a":{"city":"Paris"}}') and hint.ready_s > 0


def _new_thread_count() -> int:
    """The intra-op thread count a thread started now begins with."""
    out = []
    thread = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return out[0]


def test_a_wave_runs_on_its_own_threads_and_leaves_every_other_threads_count_alone():
    """A wave thread sets its own count (`threads=1`); `torch.set_num_threads` also sets the count new
    threads start with, which must come back after the wave: a server's request threads started after
    the first wave would otherwise decode the target on one core."""
    before = (torch.get_num_threads(), _new_thread_count())
    seen = []

    def wave(prefix, rows, cancel, choices):
        seen.append(torch.get_num_threads())
        return [' "get_weather"', ' "Paris"', " null", " null", " null"]
    ticket = InTime(WaveSidecar(wave, threads=1)).submit(hint_request())
    assert ticket.poll() is not None and seen == [1]
    deadline = time.perf_counter() + 10
    while _new_thread_count() != before[1] and time.perf_counter() < deadline:  # the wave thread's finally
        time.sleep(0.01)
    assert (torch.get_num_threads(), _new_thread_count()) == before


def test_a_wave_begun_while_the_target_lent_it_cores_leaves_the_target_threads_count():
    """The engine lends a CPU wave the target thread's cores right after submitting it, and gives them
    back when the reply ends, maybe before the wave does. A wave thread that began inside the loan
    must not leave the loan's count to the threads started after it."""
    before = torch.get_num_threads()
    release = threading.Event()
    seen = []

    def wave(prefix, rows, cancel, choices):
        seen.append(torch.get_num_threads())
        release.wait(10)
        return [' "get_weather"', ' "Paris"', " null", " null", " null"]
    sidecar = WaveSidecar(wave, threads=1)
    host = sidecar.host
    with host._turn:                           # hold the wave thread until the loan has begun
        host._busy = True
    ticket = sidecar.submit(hint_request())
    torch.set_num_threads(max(before - 1, 1))  # the loan (session._lend_cores)
    with host._turn:
        host._busy = False
        host._turn.notify_all()
    while not seen:
        time.sleep(0.001)
    torch.set_num_threads(before)          # given back before the wave ends
    release.set()
    while ticket.poll() is None and ticket.error is None:
        time.sleep(0.001)
    assert (torch.get_num_threads(), _new_thread_count()) == (before, before)


class _SlowCPUSidecar(SidecarBase):
    """TEST DOUBLE: a sidecar on the target's CPU, with one thread of its own, whose waves never answer
    (the worker's own mailbox, never posted): the reply decodes on with the cores it lent."""
    device, threads, name = "cpu", 1, "slow-cpu"

    def submit(self, request):
        from oospec_agents.sidecar.protocol import Ticket
        return Ticket(request, timeout_s=600.0)


def test_a_stream_closed_on_another_thread_gives_the_lent_cores_back_to_the_thread_that_lent_them(smollm2_tokenizer):
    """`torch.set_num_threads` sets the calling thread's count. A reply lends its CPU wave the decoding
    thread's cores; closed from another thread (or collected there), it used to add them to that thread
    and leave the decoding thread short of them for good. The decoding thread takes them back at its
    next request, and the closing thread's count is untouched."""
    engine = Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, _SlowCPUSidecar(), wave_payback=None)
    counts: dict[str, int] = {}
    streams = []

    def decode(closed: threading.Event):
        torch.set_num_threads(2)
        counts["before"] = torch.get_num_threads()
        events = engine.stream(ASK, [WEATHER], tool_choice="required", max_new_tokens=24)
        next(events)                                   # the wave is asked for; its cores are lent
        counts["lent"] = torch.get_num_threads()
        streams.append(events)
        closed.wait(10)
        counts["after close"] = torch.get_num_threads()
        engine.generate(ASK, max_new_tokens=2, method="ar")  # the next request on this thread
        counts["next request"] = torch.get_num_threads()

    def close(closed: threading.Event):
        torch.set_num_threads(2)
        counts["closer before"] = torch.get_num_threads()  # (a thread's first get initialises its count)
        ready.set()
        while not streams:
            time.sleep(0.001)
        streams[0].close()                             # on this thread: the reply's finally runs here
        counts["closer"] = torch.get_num_threads()
        closed.set()

    closed, ready = threading.Event(), threading.Event()
    threads = [threading.Thread(target=close, args=(closed,)), threading.Thread(target=decode, args=(closed,))]
    mine = torch.get_num_threads()
    try:
        threads[0].start()
        ready.wait(10)  # the closer has its own count before the decoder lends any
        threads[1].start()
        for t in threads:
            t.join(30)
    finally:  # the threads' set_num_threads also set the count later threads start with: put it back
        torch.set_num_threads(mine)
    assert counts == {"before": 2, "lent": 1, "closer before": 2, "closer": 2, "after close": 1,
                      "next request": 2}, counts
