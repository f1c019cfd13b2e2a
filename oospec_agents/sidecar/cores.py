"""CPU cores as devices, and every change of a torch thread count (words: docs/glossary.md).

On a CPU the sidecar's "own device" is a set of cores. `place("cpu:0-5")` reads one: the device
strings take `cpu:N`, `cpu:A-B` and `cpu:A,B,...` (and mixes, `cpu:0-3,6`); `cpu` alone is every
core, shared. `check_split` refuses overlapping sets and cores this process may not use; a process
keeps to its set with `pin_process` (the worker process of a sidecar, or the engine's own process for
the target), with as many torch threads as cores.

Where the target and the sidecar share the CPU, the target lends a running wave its cores and takes
them back when the wave ends (`lend`, `Loan`): oversubscribed cores slow both models several-fold.

`torch.set_num_threads` sets the calling thread's intra-op count, and also the count every thread
started later begins with; this module is the one place in the package that calls it.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import weakref
from dataclasses import dataclass

import torch

from ..errors import DeviceError

_CORE_SET = re.compile(r"^cpu:(\d+(-\d+)?(,\d+(-\d+)?)*)$")


@dataclass(frozen=True)
class Place:
    """Where a model runs: a torch device, and on the CPU the cores it keeps to itself (None: all, shared)."""
    device: torch.device
    cores: frozenset[int] | None = None

    def __str__(self) -> str:
        if self.cores is None:
            return str(self.device)
        return "cpu:" + ",".join(str(c) for c in sorted(self.cores))


def place(device) -> Place:
    """A device argument as a `Place`: a core set for `cpu:...` strings, else the torch device."""
    if isinstance(device, Place):
        return device
    if isinstance(device, str) and device.strip().startswith("cpu:"):
        text = device.strip().replace(" ", "")
        if not _CORE_SET.match(text):
            raise DeviceError(f"bad core set {device!r}: expected cpu:N, cpu:A-B or cpu:A,B,... (e.g. 'cpu:0-5')")
        cores: set[int] = set()
        for part in text[4:].split(","):
            lo, _, hi = part.partition("-")
            if hi and int(hi) < int(lo):
                raise DeviceError(f"bad core set {device!r}: the range {part} runs backwards")
            cores.update(range(int(lo), int(hi or lo) + 1))
        return Place(torch.device("cpu"), frozenset(cores))
    try:
        return Place(torch.device(device))
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"unknown device {device!r}: {e}") from None


def usable_cores() -> frozenset[int]:
    """The cores this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: every core the machine has
        return frozenset(range(os.cpu_count() or 1))


def check_split(target: Place, sidecar: Place) -> None:
    """Refuse a core set the machine lacks or this process may not use, and overlapping sets."""
    usable, count = usable_cores(), os.cpu_count() or 1
    for who, p in (("target_device", target), ("sidecar_device", sidecar)):
        if p.cores is None:
            continue
        if missing := sorted(c for c in p.cores if c >= count):
            raise DeviceError(f"{who}={str(p)!r} names core(s) {missing} that this machine lacks "
                             f"(it has {count}: 0-{count - 1})")
        if barred := sorted(p.cores - usable):
            raise DeviceError(f"{who}={str(p)!r} names core(s) {barred} that this process may not use "
                             f"(os.sched_getaffinity: {sorted(usable)})")
    if target.cores is not None and sidecar.cores is not None and (both := target.cores & sidecar.cores):
        raise DeviceError(f"target_device={str(target)!r} and sidecar_device={str(sidecar)!r} overlap on core(s) "
                         f"{sorted(both)}: a core set is a device of its own")


def shares_cpu(sidecar_device, sidecar_cores, target: Place) -> bool:
    """Whether a sidecar's wave runs on CPU cores the target decodes on."""
    if target.device.type != "cpu" or torch.device(sidecar_device).type != "cpu":
        return False
    return sidecar_cores is None or target.cores is None or bool(sidecar_cores & target.cores)


# ---------------------------------------------------------------------- thread counts and affinity

def set_threads(n: int) -> None:
    """The calling thread's torch thread count, and the count threads started later begin with."""
    torch.set_num_threads(max(1, int(n)))


@contextlib.contextmanager
def own_threads(n: int, after: int):
    """`n` intra-op threads for the calling (wave) thread, then `after` (the submitting thread's count).
    It is set to `after` when the wave ends, not to the count this thread began with: otherwise, after
    the first wave, every new thread (a server's request threads, an async front-end's executor) would
    decode the target on one core; and the thread may have begun while the engine lent the wave the
    target's cores."""
    set_threads(n)
    try:
        yield
    finally:
        set_threads(after)


@dataclass
class Pinned:
    """What `pin_process` changed, to put back (`restore`)."""
    affinity: frozenset[int]
    threads: int

    def restore(self) -> None:
        _set_affinity(self.affinity)
        set_threads(self.threads)


def pin_process(cores: frozenset[int]) -> Pinned:
    """Keep every thread of this process (and the threads they start) to `cores`, with one torch
    thread per core. Linux sets affinity per thread, so each running thread is pinned."""
    before = Pinned(usable_cores(), torch.get_num_threads())
    _set_affinity(cores)
    set_threads(len(cores))
    return before


@contextlib.contextmanager
def pinned(cores: frozenset[int]):
    """`pin_process` for the time of a block, then what was before (the benchmark's split-layout runs)."""
    before = pin_process(cores)
    try:
        yield
    finally:
        before.restore()


def split_cores(target=None, sidecar=None) -> tuple[Place, Place]:
    """A split layout: the core sets given, or by default the last usable core for the sidecar and the
    rest for the target."""
    usable = sorted(usable_cores())
    if len(usable) < 2 and (target is None or sidecar is None):
        raise DeviceError(f"a split layout needs two cores or more; this process may use {usable}")
    t = place(target) if target is not None else Place(torch.device("cpu"), frozenset(usable[:-1]))
    s = place(sidecar) if sidecar is not None else Place(torch.device("cpu"), frozenset(usable[-1:]))
    if t.cores is None or s.cores is None:
        raise DeviceError(f"a split layout takes core sets (cpu:0-5, cpu:6-7), got {str(t)!r} and {str(s)!r}")
    check_split(t, s)
    return t, s


def _set_affinity(cores: frozenset[int]) -> None:
    if not hasattr(os, "sched_setaffinity"):
        raise DeviceError("core sets need os.sched_setaffinity (Linux)")
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tasks = [0]
    for tid in tasks:
        try:
            os.sched_setaffinity(tid, cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass


# ---------------------------------------------------------------------- the loan of cores to a wave

#: threads a reply lent its wave and that another thread gave back (a stream closed, or collected,
#: off the thread that decoded it): per lending thread, what it takes back at its next request
_OWED: "weakref.WeakKeyDictionary[threading.Thread, int]" = weakref.WeakKeyDictionary()
_OWED_LOCK = threading.Lock()


class Loan:
    """Threads the calling (decoding) thread gave up while a wave on its CPU runs."""

    def __init__(self, threads: int = 0):
        self.threads = threads
        self.lender = threading.current_thread()

    def give_back(self) -> None:
        """On the lender's thread the count goes back up at once; on another thread (which has a count
        of its own) the loan is recorded for the lender to take back at its next request."""
        if self.threads:
            if threading.current_thread() is self.lender:
                set_threads(torch.get_num_threads() + self.threads)
            else:
                with _OWED_LOCK:
                    _OWED[self.lender] = _OWED.get(self.lender, 0) + self.threads
            self.threads = 0


def lend(sidecar_threads: int | None) -> Loan:
    """Leave a wave that shares the CPU `sidecar_threads` of the calling thread's cores (one stays)."""
    mine = torch.get_num_threads()
    lent = max(0, min(sidecar_threads or 0, mine - 1))
    if lent:
        set_threads(mine - lent)
    return Loan(lent)


def take_back_lent_cores() -> None:
    """The calling thread takes back the threads it lent a wave and another thread gave back for it
    (the engine calls this as each request begins)."""
    if not _OWED:
        return
    with _OWED_LOCK:
        owed = _OWED.pop(threading.current_thread(), 0)
    if owed:
        set_threads(torch.get_num_threads() + owed)
