"""Concurrent replies share each target forward (#58): batched rounds.

Every reply keeps its own state (`engine._Reply`), its own KV cache and its own thread; only the target
forward is shared. A reply that wants the target hands `Batcher.run` a job and waits:

    verify job     one reply's draft tree on its own cache: batchable. The verify jobs of every reply
                   decoding now join one forward, their trees packed in one sequence.
    alone job      anything else (a prefill, a deterministic mode forward of fixed shapes): it has the
                   target to itself.

A round starts once no reply that is decoding is still busy on the host (drafting, committing): the
replies whose consumer has not yet taken their last event are *parked* and do not hold a round up
(`Seat.parked`), so a slow reader never stalls the others; a reply that stays busy longer than
`MAX_WAIT_S` is not waited for either. Any waiting thread may run the round (the first to find it ready).

How one forward holds replies of different lengths: each reply's keys and values stay in its own
`DynamicCache`, which rolls back on its own as before (`verify.keep_cache`). The forward's cache is a
`RoundCache`: the layer's `update` appends each row's new keys to that row's own cache and hands the
attention `RaggedKV`, the rows' whole keys and values; the attention (`ragged_attention`, reached from
the target's attention implementation, which `install` makes ours) runs each row alone over its own
keys with its own tree mask, through transformers' own sdpa function -- the very call a reply alone
makes for its tree -- while every linear layer (projections, MLP, the head) runs once over all rows.

Why not transformers' continuous batching (`PagedAttentionCache`, `generate_batch`): its paged kernels
take no tree mask and its cache has no per-request rollback of rejected drafts, which are the two
things speculative verification needs; nor a padded batch cache (every reply's past copied into one
tensor each round, padding masked): the copy costs what the attention reads, and padding changes
the attention's shapes, so a reply's bits would depend on its neighbours' lengths. Here a row's
attention has the shapes it has alone.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

#: the attention implementation `install` registers: transformers' sdpa plus the ragged rounds
BATCH_ATTENTION = "oospec_batch"
#: replies that share a forward at most, by default (`Engine(max_batch=...)`, `oospec serve --max-batch`)
DEFAULT_MAX_BATCH = 8
#: a reply busy on the host this long does not hold up a round (seconds)
MAX_WAIT_S = 0.25


# ---------------------------------------------------------------------------------------- the forward

@dataclass
class Row:
    """One reply's part of a batched forward: its tree's tokens, positions and mask on its own cache."""
    tokens: list[int]
    positions: list[int]
    cache: Any                  # the reply's own DynamicCache
    make_mask: Callable[[], torch.Tensor]  # [1, 1, n, past + n] additive, as `Verifier._tree_mask`; built
    mask: torch.Tensor | None = None       # only when the row joins a batch (`batched_forward`)
    offset: int = 0                        # where its tokens start in the batched forward's one sequence


class RaggedKV:
    """What a batched forward's attention gets for keys (and values): each row's whole keys."""
    __slots__ = ("rows",)

    def __init__(self, rows: list[torch.Tensor]):
        self.rows = rows


class RoundCache:
    """The cache a batched forward is given: each layer's new keys and values go to each row's own
    cache (its own span of the packed sequence), and the attention reads them back whole."""

    is_compileable = False

    def __init__(self, rows: list[Row]):
        self.rows = rows

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        keys, values = [], []
        for row in self.rows:
            at, n = row.offset, len(row.tokens)
            k, v = row.cache.update(key_states[:, :, at:at + n], value_states[:, :, at:at + n], layer_idx)
            keys.append(k)
            values.append(v)
        return RaggedKV(keys), RaggedKV(values)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max(row.cache.get_seq_length(layer_idx) for row in self.rows)


def ragged_attention(module, query, key: RaggedKV, value: RaggedKV, rows: list[Row], **kwargs):
    """Attention of a batched forward: each row's queries over its own keys with its own mask, through
    transformers' sdpa function (what the row's reply alone runs)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    out = []
    for b, row in enumerate(rows):
        at, n = row.offset, len(row.tokens)
        o, _ = sdpa_attention_forward(module, query[:, :, at:at + n], key.rows[b], value.rows[b], row.mask,
                                      dropout=0.0, scaling=kwargs.get("scaling"), is_causal=False)
        out.append(o)  # [1, n, heads, dim]
    return torch.cat(out, dim=1), None


def round_attention(module, query, key: RaggedKV, value: RaggedKV, **kwargs):
    """The attention of the batched forward this thread runs (`batched_forward` set its rows)."""
    return ragged_attention(module, query, key, value, _ROUND.rows, **kwargs)


def _batch_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    """`BATCH_ATTENTION`: transformers' sdpa, except in a batched forward (keys as `RaggedKV`)."""
    if isinstance(key, RaggedKV):
        return round_attention(module, query, key, value, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)


class _Round(threading.local):
    rows: list[Row] = []


_ROUND = _Round()  # the rows of the batched forward this thread runs (the attention reads them)


def install(model, windows: dict, passes_on: tuple[str, ...] = ()) -> str | None:
    """Make the target able to run batched rounds; None where it can, else why not (its replies are
    then verified one at a time, as before). Full attention through sdpa (ours: `BATCH_ATTENTION`), or
    an implementation in `passes_on` that hands `RaggedKV` keys to `round_attention` (the exact
    prefill's: deterministic.py)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    if any(w is not None for w in windows.values()):
        return "a sliding-window layer (one mask per layer type)"
    text = model.config.get_text_config(decoder=True)
    attn = getattr(text, "_attn_implementation", None)
    if attn == BATCH_ATTENTION or attn in passes_on:
        return None
    if attn != "sdpa":
        return f"batched rounds run through sdpa attention (this target: {attn})"
    if BATCH_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(BATCH_ATTENTION, _batch_sdpa)
        AttentionMaskInterface.register(BATCH_ATTENTION, AttentionMaskInterface._global_mapping["sdpa"])
    try:
        model.set_attn_implementation(BATCH_ATTENTION)
    except Exception as e:  # a model that cannot switch
        return f"its attention implementation cannot be switched ({e})"
    return None if text._attn_implementation == BATCH_ATTENTION else "its attention implementation did not switch"


def batched_forward(model, cache_kw: str, rows: list[Row], device=None) -> list[torch.Tensor]:
    """One target forward over several replies' trees; each row's logits [n, vocab], and each row's
    own cache grown by its tree's keys and values (rolled back by its reply, as after a lone forward).
    The trees are packed one after another in a single sequence (no padding): the linear layers run
    over exactly their tokens, the attention over each row's own span (`ragged_attention`)."""
    ids, pos, at = [], [], 0
    for r in rows:
        r.mask, r.offset = r.make_mask(), at
        ids += r.tokens
        pos += r.positions
        at += len(r.tokens)
    dummy = torch.zeros(1, 1, 1, 1, dtype=model.dtype, device=device)  # 4D: transformers passes it on as is
    _ROUND.rows = rows
    try:
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids], device=device), position_ids=torch.tensor([pos], device=device),
                           attention_mask=dummy, use_cache=True, **{cache_kw: RoundCache(rows)}).logits[0]
    finally:
        _ROUND.rows = []
    return [logits[r.offset:r.offset + len(r.tokens)] for r in rows]


# ---------------------------------------------------------------------------------------- the rendezvous

@dataclass(eq=False)
class Job:
    """Work on the target: `fn()` runs it alone. A verify job also has `row()`, which makes its `Row` only
    when it joins a batched forward (a reply alone never builds one), and its `fn` then returns (logits,
    forward seconds), as a batched forward gives the row."""
    row: Callable[[], Row] | None = None
    fn: Callable[[], Any] | None = None
    result: Any = None
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
        with self.batcher._cond:
            self.state = "parked" if on else "busy"
            if on:
                self.batcher._cond.notify_all()

    def run(self, job: Job):
        return self.batcher._run(self, job)


class Batcher:
    """Who runs the target next: verify jobs of replies decoding at the same time share a forward."""

    def __init__(self, forward: Callable[[list[Row]], list[torch.Tensor]], max_batch: int = 8,
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

    def _run(self, seat: Seat, job: Job):
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
        return job.result

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
            j.result, j.batch, j.done = r, len(jobs), True
