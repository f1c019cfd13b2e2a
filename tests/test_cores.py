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
        engine.sidecar = _HeldFor(side)
        gen = engine.generate(record["messages"], record["tools"], tool_choice="required", max_new_tokens=48)
        assert gen.token_ids == reference                              # lossless
        s = gen.stats
        assert s.sidecar_error is None and s.sidecar_skipped is None and s.wave_estimate_s is None  # not costed: its own device
        assert s.hint_bytes > 0 and s.accepted_by_source["hint"] > 0  # its hint was accepted
        assert torch.get_num_threads() == 1                           # no core lent: none is shared
    finally:
        engine.sidecar = side
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
