"""A CPU core set is a device: `target_device="cpu:0"`, `sidecar_device="cpu:1"` keep the target and the
sidecar's worker process each to its own cores; sets that overlap, cores the machine lacks and cores this
process may not use are clear errors, raised before anything loads."""
from __future__ import annotations

import os

import psutil
import pytest
import torch

from oospec_testing import InTime, greedy, load_records
from oospec_agents import Engine
from oospec_agents.sidecar.cores import Place, check_split, place, shares_cpu
from oospec_agents.sidecar.hosts.process import ProcessSidecar
from oospec_agents.sidecar.load import resolve_placement

CPU = torch.device("cpu")


@pytest.mark.parametrize("text, cores", [("cpu:1", {1}), ("cpu:0-2", {0, 1, 2}), ("cpu:0,2", {0, 2}),
                                         ("cpu:0-1,4", {0, 1, 4}), (" cpu:3 ", {3})])
def test_core_sets_read_as_devices(text, cores):
    assert place(text) == Place(CPU, frozenset(cores))


def test_cpu_alone_and_other_devices_are_not_core_sets():
    assert place("cpu") == Place(CPU) and place(CPU).cores is None
    assert place("meta") == Place(torch.device("meta"))


@pytest.mark.parametrize("text", ["cpu:", "cpu:a", "cpu:1-", "cpu:3-1", "cpu:1;2"])
def test_a_malformed_core_set_is_a_clear_error(text):
    with pytest.raises(ValueError, match="core set"):
        place(text)


def test_overlapping_sets_and_missing_cores_are_refused_before_anything_loads():
    with pytest.raises(ValueError, match=r"overlap on core\(s\) \[1\]"):
        Engine.from_pretrained("no/such-model", target_device="cpu:0-1", sidecar_device="cpu:1")
    with pytest.raises(ValueError, match="that this machine lacks"):
        Engine.from_pretrained("no/such-model", target_device="cpu:0", sidecar_device=f"cpu:{os.cpu_count()}")
    barred = next((c for c in range(os.cpu_count()) if c not in os.sched_getaffinity(0)), None)
    if barred is not None:  # a machine whose cgroup or affinity leaves this process some cores only
        with pytest.raises(ValueError, match="may not use"):
            check_split(Place(CPU), Place(CPU, frozenset({barred})))


def test_a_core_set_needs_a_process_and_auto_gives_it_one():
    assert resolve_placement("auto", "cpu:1") == "process" and resolve_placement("auto", "cpu") == "thread"
    with pytest.raises(ValueError, match="needs sidecar_placement 'process'"):
        resolve_placement("thread", "cpu:1")


def test_disjoint_sets_share_nothing_and_a_shared_cpu_shares():
    split = Place(CPU, frozenset({0}))
    assert not shares_cpu(CPU, frozenset({1}), split)
    assert shares_cpu(CPU, None, split) and shares_cpu(CPU, frozenset({1}), Place(CPU))
    assert not shares_cpu(torch.device("meta"), None, Place(CPU))


class _HeldFor(InTime):
    """`InTime` (submit returns once the hint is posted: forward counts do not depend on the CPU's load)
    that keeps the wrapped sidecar's place, so that the engine costs it as the device it is."""

    def __init__(self, sidecar):
        super().__init__(sidecar)
        self.device, self.cores, self.threads = sidecar.device, sidecar.cores, sidecar.threads


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0),
                    reason="needs cores 0 and 1")
def test_target_on_core_0_sidecar_pinned_to_core_1_hints_accepted_and_lossless():
    record = load_records("dev")[0]
    before = (os.sched_getaffinity(0), torch.get_num_threads())
    engine = Engine.from_pretrained("embedded", target_device="cpu:0", sidecar_device="cpu:1", dtype=torch.float32)
    try:
        side = engine.sidecar
        assert isinstance(side, ProcessSidecar) and side.cores == {1} and side.threads == 1
        assert psutil.Process(side.pid).cpu_affinity() == [1]        # the worker keeps to its set
        assert os.sched_getaffinity(0) == {0} and torch.get_num_threads() == 1  # and the target to its own
        assert engine.place == Place(CPU, frozenset({0}))
        ids = engine.prompt_ids(record["messages"], record["tools"], tool_choice="required")
        reference = greedy(engine, ids, 48)
        gen = engine.with_parts(sidecar=_HeldFor(side)).generate(record["messages"], record["tools"], tool_choice="required", max_new_tokens=48)
        assert gen.token_ids == reference                              # lossless
        s = gen.stats
        assert s.sidecar_error is None and s.sidecar_skipped is None and s.wave_estimate_s is None  # not costed: its own device
        assert s.hint_bytes > 0 and s.accepted_by_source["hint"] > 0  # its hint was accepted
        assert torch.get_num_threads() == 1                           # no core lent: none is shared
    finally:
        engine.close()
    assert (os.sched_getaffinity(0), torch.get_num_threads()) == before  # close() gives the cores back
    assert side.pid is None


def test_the_bench_runs_toolspec_and_oospec_in_a_split_layout_beside_the_shared_one():
    from oospec_agents.bench.cli import _with_layout
    from oospec_agents.sidecar.cores import split_cores
    methods = ["ar", "toolspec", "oospec"]
    assert _with_layout(methods, "shared") == methods
    assert _with_layout(methods, "split") == ["ar", "toolspec@split", "oospec@split"]
    assert _with_layout(methods, "both") == ["ar", "toolspec", "toolspec@split", "oospec", "oospec@split"]
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) >= 2:
        target, side = split_cores()
        assert target.cores == frozenset(usable[:-1]) and side.cores == {usable[-1]}
    with pytest.raises(ValueError, match="overlap"):
        split_cores("cpu:0", "cpu:0")
    with pytest.raises(ValueError, match="takes core sets"):
        split_cores("cpu", "cpu:1")


# ------------------------------------------------------------------ sidecar_placement="auto": the layout


def test_auto_keeps_two_cores_shared_and_splits_many(monkeypatch):
    from oospec_agents.sidecar import layout
    monkeypatch.delenv(layout.ENV, raising=False)
    # two cores: the target would lose half of its prefill's cores, more than the hint wins back
    assert layout.split_over_shared(2) > 1.0 and layout.choose(2) == "shared"
    assert layout.choose(1) == "shared" and layout.split_over_shared(1) == float("inf")
    # many cores: one core less costs the target little, and the hint's forwards are saved
    assert layout.split_over_shared(16) < layout.MARGIN and layout.choose(16) == "split"
    # the projection falls as cores are added, and a hint that saves nothing never splits
    shares = [layout.split_over_shared(n) for n in range(2, 33)]
    assert shares == sorted(shares, reverse=True)
    assert layout.choose(64, layout.Costs(hint_forwards=1.0)) == "shared"
    # a prefill-heavy call (long prompts) splits later than a decode-heavy one, and one almost all
    # prefill never does: the hint saves decode forwards only
    assert all(layout.choose(n, layout.Costs(prefill_share=0.8)) == "shared" for n in range(2, 65))
    heavy, light = layout.Costs(prefill_share=0.6), layout.Costs(prefill_share=0.2)
    assert min(n for n in range(2, 65) if layout.choose(n, heavy) == "split") > \
        min(n for n in range(2, 65) if layout.choose(n, light) == "split")


def test_the_environment_overrides_the_projection(monkeypatch):
    from oospec_agents.sidecar import layout
    monkeypatch.setenv(layout.ENV, "split")
    assert layout.choose(2) == "split" and layout.choose(1) == "shared"  # one core cannot be split
    monkeypatch.setenv(layout.ENV, "shared")
    assert layout.choose(64) == "shared"
    monkeypatch.setenv(layout.ENV, "halves")
    with pytest.raises(ValueError, match="OOSPEC_CPU_LAYOUT must be 'shared', 'split' or 'auto'"):
        layout.choose(4)


def test_auto_splits_only_where_a_worker_process_can_start(monkeypatch, tmp_path, caplog):
    import types
    from oospec_agents.sidecar import cores, layout
    monkeypatch.setenv(layout.ENV, "split")
    monkeypatch.setattr(cores, "usable_cores", lambda: frozenset({0, 1, 2, 3}))
    monkeypatch.setattr(cores.os, "cpu_count", lambda: 4)
    script = tmp_path / "agent.py"
    main = types.ModuleType("__main__")
    main.__file__, main.__spec__ = str(script), None
    monkeypatch.setitem(__import__("sys").modules, "__main__", main)
    script.write_text("from oospec_agents import Engine\nengine = Engine.from_pretrained()\n")
    with caplog.at_level("WARNING", logger="oospec_agents.sidecar.layout"):
        assert not layout.spawn_safe() and layout.auto_places() is None  # spawn would run the script again
    assert "no `if __name__ == \"__main__\":` guard" in caplog.text
    script.write_text("from oospec_agents import Engine\n\nif __name__ == '__main__':\n    Engine.from_pretrained()\n")
    target, side = layout.auto_places()
    assert layout.spawn_safe() and target.cores == {0, 1, 2} and side.cores == {3}
    main.__file__ = None  # an interactive session, a notebook
    assert layout.spawn_safe()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_auto_placement_runs_the_split_it_chooses_and_explicit_devices_win(monkeypatch):
    from oospec_agents.sidecar import layout
    usable = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv(layout.ENV, "split")  # as the projection answers on a many-core machine
    before = os.sched_getaffinity(0)
    engine = Engine.from_pretrained("embedded", dtype=torch.float32)
    try:
        side = engine.sidecar
        assert isinstance(side, ProcessSidecar) and side.cores == {usable[-1]}
        assert engine.place == Place(CPU, frozenset(usable[:-1])) and os.sched_getaffinity(0) == set(usable[:-1])
    finally:
        engine.close()
    assert os.sched_getaffinity(0) == before
    # an explicit placement, a sidecar object or none, a GPU target keep every core shared (explicit
    # devices never reach the projection: from_pretrained asks it only when neither device is named)
    from oospec_agents.loading import auto_layout
    cpu, gpu = Place(CPU), Place(torch.device("cuda", 0))
    assert auto_layout(None, cpu, {}) is not None and auto_layout("embedded", cpu, {"sidecar_placement": "auto"})
    for sidecar, where, kw in ((None, cpu, {"sidecar_placement": "thread"}), (None, cpu, {"sidecar_placement": "process"}),
                               (False, cpu, {}), (object(), cpu, {}), (None, gpu, {})):
        assert auto_layout(sidecar, where, kw) is None
    engine = Engine.from_pretrained("embedded", sidecar=False, target_device="cpu", dtype=torch.float32)
    try:
        assert engine.place.cores is None
    finally:
        engine.close()
