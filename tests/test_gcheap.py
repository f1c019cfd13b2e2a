"""The garbage collector's heap is frozen once an engine is loaded (gcheap.py): collections then skip
the loaded objects, garbage is collected before it is frozen, and a frozen engine is still freed."""
from __future__ import annotations

import gc
import weakref

from oospec_agents import Engine, models
from oospec_agents import loading
from oospec_agents.gcheap import freeze_gc_heap

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class Node:
    def __init__(self):
        self.other = self


def test_freeze_collects_garbage_first_and_freezes_what_is_alive():
    cycle = Node()
    dead = weakref.ref(cycle)
    del cycle  # unreachable now, but only the cycle collector can free it
    alive = Node()
    count = freeze_gc_heap()
    assert dead() is None, "garbage must be collected before the heap is frozen, or it stays forever"
    # The count is the freeze's: a frozen object can still die by reference counting afterwards (another
    # test's server or sidecar thread dropping one), so the count read later may only be smaller.
    assert 0 < gc.get_freeze_count() <= count
    assert not any(o is alive for o in gc.get_objects()), "a live object is frozen: collections skip it"
    new = Node()
    assert any(o is new for o in gc.get_objects()), "objects made after the freeze are collected as usual"


def test_a_frozen_engine_is_still_freed_when_dropped():
    from oospec_testing import make_tiny_engine
    engine = make_tiny_engine()
    engine.generate(ASK, [WEATHER], max_new_tokens=6, method="toolspec")
    freeze_gc_heap()
    gone, model_gone = weakref.ref(engine), weakref.ref(engine.target)
    was = gc.isenabled()
    gc.disable()  # reference counting alone: a frozen object in a cycle would stay
    try:
        del engine
        assert gone() is None and model_gone() is None
    finally:
        if was:
            gc.enable()


def test_from_pretrained_freezes_the_heap_unless_told_not_to(monkeypatch, tiny_engine):
    calls = []
    monkeypatch.setattr(models, "load_model", lambda *a, **kw: (tiny_engine.target, tiny_engine.tokenizer))
    monkeypatch.setattr(loading, "freeze_gc_heap", lambda: calls.append(1))  # where from_pretrained loads
    Engine.from_pretrained("some/model", sidecar=False)
    assert calls == [1]
    engine = Engine.from_pretrained("some/model", sidecar=False, freeze_gc=False, memory_size=3)
    assert calls == [1] and engine.memory.size == 3  # the keyword is not passed on to Engine(...)
