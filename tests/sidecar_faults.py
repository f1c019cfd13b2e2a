"""TEST HELPER: faults injected into a sidecar's wave wherever it runs. A worker process loads the wave
through `WorkerSpec.loader`, which wraps the real one; the test says which fault comes next through a
file that the worker reads (its path in OOSPEC_TEST_FAULTS, which the worker inherits).

    faults = Faults(tmp_path / "fault")     spec = faults.spec(spec)     faults.inject("hang")
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import torch

from oospec_agents.sidecar import runtime

WAVE_FAULTS = ("hang", "oom", "memory_error")   # the next wave
START_FAULTS = ("slow_start",)                   # the next worker's start
SLOW_START_S = 2.0
ENV = "OOSPEC_TEST_FAULTS"


class Faults:
    def __init__(self, path: Path):
        self.path = Path(path)
        os.environ[ENV] = str(self.path)

    def spec(self, spec: runtime.WorkerSpec) -> runtime.WorkerSpec:
        return dataclasses.replace(spec, loader=f"{__name__}:load_wave")

    def inject(self, fault: str) -> None:
        if fault not in WAVE_FAULTS + START_FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {WAVE_FAULTS + START_FAULTS}")
        self.path.write_text(fault)


def load_wave(spec: runtime.WorkerSpec):
    if _take(START_FAULTS):
        time.sleep(SLOW_START_S)
    return FaultyWave(runtime.load_wave(dataclasses.replace(spec, loader=None)))


class FaultyWave:
    """The real wave, unless a fault is due."""

    def __init__(self, wave):
        self.wave = wave

    def __getattr__(self, name):  # estimate, prefix_cache, calibration: the real wave's
        return getattr(self.wave, name)

    def __call__(self, *args):
        fault = _take(WAVE_FAULTS)
        if fault == "hang":
            while True:  # ignores its cancel, as a wave stuck in a kernel would
                time.sleep(1)
        if fault == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test fault)")
        if fault == "memory_error":
            raise MemoryError("test fault")
        return self.wave(*args)


def _take(kinds: tuple[str, ...]) -> str | None:
    """The fault due, if it is one of `kinds`: read once, then gone."""
    path = Path(os.environ.get(ENV, "/nonexistent"))
    try:
        fault = path.read_text().strip()
    except OSError:
        return None
    if fault not in kinds:
        return None
    path.unlink(missing_ok=True)
    return fault
