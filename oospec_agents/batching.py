"""Concurrent replies share each target forward: who runs the target next.

Every reply keeps its own state (request.py), its own KV cache and its own thread; only the target
forward is shared. A reply that wants the target hands its `Seat` a job and waits:

    verify job     one reply's draft tree on its own cache: batchable. The verify jobs of every reply
                   decoding now join one forward, their trees packed in one sequence (batch_attention.py).
    alone job      anything else (a prefill, a deterministic mode forward of fixed shapes): it has the
                   target to itself.

A round starts once no reply that is decoding is still busy on the host (drafting, committing): the
replies whose consumer has not yet taken their last event are *parked* and do not hold a round up
(`Seat.parked`), so a slow reader never stalls the others; a reply that stays busy longer than
`MAX_WAIT_S` is not waited for either. Any waiting thread may run the round (the first to find it ready).

How one forward holds replies of different lengths (the attention of a batched round) is
batch_attention.py's; this module only decides which jobs run together.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .batch_attention import TreeRow

#: replies that share a forward at most, by default (`Engine(max_batch=...)`, `oospec serve --max-batch`)
DEFAULT_MAX_BATCH = 8
#: a reply busy on the host this long does not hold up a round (seconds)
MAX_WAIT_S = 0.25


@dataclass(eq=False)
class Job:
    """Work on the target: `fn()` runs it alone. A verify job also has `row()`, which makes its `TreeRow` only
    when it joins a batched forward (a reply alone never builds one), and `rowed(logits, seconds, batch)`,
    which turns the row's logits from that forward into the job's result, on the job's own thread. So a
    job's result is one type however it ran: what `fn` returns, or what `rowed` returns from a row (by
    default the row's (logits, forward seconds))."""
    row: Callable[[], TreeRow] | None = None
    fn: Callable[[], Any] | None = None
    rowed: Callable[[Any, float, int], Any] = lambda logits, seconds, batch: (logits, seconds)
    result: Any = None
    from_row: bool = False      # the result is still a row's (logits, seconds), for `rowed`
    error: BaseException | None = None
    done: bool = False
    batch: int = 1              # replies in the forward that ran it
    since: float = field(default_factory=time.perf_counter)


class Seat:
    """One reply's place at the target: busy on the host, parked (its consumer holds its last event),
    or waiting for a job."""
    __slots__ = ("batcher", "state")

    def __init__(self, batcher: "Batcher"):
        self.batcher, self.state = batcher, "busy"

    def parked(self, on: bool) -> None:
        """The reply's consumer holds its last event (on), or has taken it (off)."""
        self.batcher.park(self, on)

    def run(self, job: Job):
        """Run `job` on the target (alone, or in a round with other seats' verify jobs); its result."""
        return self.batcher.run(self, job)

    def run_now(self, fn: Callable[[], Any], job: Job | None = None):
        """`fn()` on this thread when this reply decodes alone and the target is free (no round, no job);
        else `job` (by default `fn` as a job that has the target to itself) run as `run` runs it."""
        return self.batcher.run_now(self, fn, job)


class Batcher:
    """Who runs the target next: verify jobs of replies decoding at the same time share a forward."""

    def __init__(self, forward: Callable[[list[TreeRow]], list[torch.Tensor]], max_batch: int = DEFAULT_MAX_BATCH,
                 batched: bool = True):
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self._forward = forward
        self.max_batch = max_batch if batched else 1
        # Once replies have decoded at the same time, every job runs on this one thread, whichever reply's
        # thread leads the round: torch's CPU kernels run on an OpenMP team per calling thread, and each
        # new team costs every team after it (measured on this project's 2-core Xeon: five small forwards
        # and a 400-token one took 0.39 s on the thread that loaded the model, 0.60 s on another thread
        # and from then on on the first one too). A process that never decodes two replies at once keeps
        # running them on its own thread, as before.
        self._target = ThreadPoolExecutor(1, thread_name_prefix="oospec-target")
        self._together = False
        self._cond = threading.Condition()
        self._queue: list[Job] = []
        self._seats: set[Seat] = set()
        self._busy = False

    @property
    def seated(self) -> int:
        return len(self._seats)

    def seat(self) -> Seat:
        seat = Seat(self)
        with self._cond:
            self._together = self._together or bool(self._seats)
            self._seats.add(seat)
        return seat

    def leave(self, seat: Seat) -> None:
        with self._cond:
            self._seats.discard(seat)
            self._cond.notify_all()

    def park(self, seat: Seat, on: bool) -> None:
        """`seat` is parked (its consumer holds its last event: it does not hold a round up) or busy again."""
        with self._cond:
            seat.state = "parked" if on else "busy"
            if on:
                self._cond.notify_all()

    def run(self, seat: Seat, job: Job):
        """`seat`'s job run, alone or in a round; its result (or its error raised). The calling thread waits,
        and runs the round itself when it is the first to find one ready."""
        with self._cond:
            self._queue.append(job)
            seat.state = "waiting"
            try:
                while not job.done:
                    if not self._busy and self._queue and self._ready():
                        self._busy = True
                        jobs = self._take()
                        self._cond.release()
                        try:
                            if self._together:
                                self._target.submit(self._execute, jobs).result()
                            else:
                                self._execute(jobs)
                        finally:
                            self._cond.acquire()
                            self._busy = False
                            self._cond.notify_all()
                    else:
                        self._cond.wait(0.01)
            finally:
                seat.state = "busy"
        if job.error is not None:
            raise job.error
        return job.rowed(*job.result, job.batch) if job.from_row else job.result

    def run_now(self, seat: Seat, fn: Callable[[], Any], job: Job | None = None):
        """`Seat.run_now`: a reply alone (the only one seated, on a target that never ran two at once)
        runs `fn` itself, holding the target; otherwise its job waits its turn (`run`)."""
        with self._cond:
            alone = not self._together and not self._busy and not self._queue and len(self._seats) == 1 \
                and seat in self._seats
            if alone:
                self._busy = True
        if not alone:
            return self.run(seat, job or Job(fn=fn))
        try:
            return fn()
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _ready(self) -> bool:
        """A round starts when no seated reply is busy on the host (or the oldest job waited long enough)."""
        if self.max_batch == 1 or self._queue[0].row is None:
            return True
        if all(s.state != "busy" for s in self._seats):
            return True
        return time.perf_counter() - self._queue[0].since > MAX_WAIT_S

    def _take(self) -> list[Job]:
        """The oldest job alone if it is not a verify forward; else the verify jobs, oldest first."""
        if self._queue[0].row is None or self.max_batch == 1:
            return [self._queue.pop(0)]
        jobs = [j for j in self._queue if j.row is not None][:self.max_batch]
        self._queue = [j for j in self._queue if j not in jobs]
        return jobs

    def _execute(self, jobs: list[Job]) -> None:
        """Run the jobs taken: one alone (its `fn`: a verify job alone runs the plain forward, not a batch
        of one), or the rows of several verify jobs in one forward, each given (its logits, seconds)."""
        t0 = time.perf_counter()
        try:
            if len(jobs) == 1:
                results = [jobs[0].fn()]
            else:
                logits = self._forward([j.row() for j in jobs])
                results = [(rows, time.perf_counter() - t0) for rows in logits]
        except BaseException as e:  # every job of the forward gets its error
            for j in jobs:
                j.error, j.done = e, True
            return
        for j, r in zip(jobs, results):
            j.result, j.batch, j.from_row, j.done = r, len(jobs), len(jobs) > 1, True

