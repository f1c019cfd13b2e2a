"""The decode loop: draft, verify in one target forward, commit, roll back -- until a stop.

    hint = hints.poll(answer)                 non-blocking; the sidecar's call as target-format text
    drafts = reply.stack.round_drafts()       prediction + hint + schema + retrieval (drafters/stack.py)
    path, next_token = verify(tree(drafts))   one target forward; greedy acceptance, or a seeded draw
                                              per node when the request samples (sampling.py)
    reply.commit(path + next_token)           the KV cache cropped past rejected nodes; events out

The target is the only model that commits tokens, so the output equals its greedy decoding, or when
the request samples, is distributed as its sampling. Under a grammar (strict), a token the grammar
forces (the only one its mask allows) is committed at once without the target (jump-forward): it
enters the KV cache in the next forward, ahead of the drafts.

`Decoder` is handed what it uses when it is built (`Engine` builds it: verifier, batcher, how replies are
read, the `Parts`); `Decoder.reply` builds a request's `Reply` (reply.py), `Decoder.run` decodes it, and
each step takes the `Reply` and returns what it decided.
"""
from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch

from . import deterministic as det
from .batching import Batcher, Job
from .drafters import CallMemory, Drafter, DrafterStack, ReplyState
from .drafters.base import Prediction
from .drafters.prediction import matched_tokens
from .events import CallPredicted, ReplyEvents
from .finish import read_reply
from .formats import ToolFormat
from .prefix_cache import PrefixCache
from .reply import Reading, Reply
from .request import Event, Generation, Prepared
from .sampling import Choice, greedy
from .sidecar import FixedHint, HintRequest, Sidecar
from .sidecar import cores
from .sidecar.payback import PayBack
from .sidecar.session import HintSession, Outcome, follows_up
from .stats import DecodeStats
from .verify import Tree, Verifier, build_tree

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Parts:
    """What an engine decodes with that a caller may choose (`Engine(...)`, `Engine.with_parts`): the
    drafters by slot (a `Drafter` is shared by every reply; a class or other factory makes each reply its
    own), and what is shared across requests: the call memory, the prefix cache, the sidecar, the
    pay-back rule (None: every wave runs) and the call log (None: none)."""
    drafters: Mapping[str, Drafter | Callable[[], Drafter]]
    memory: CallMemory
    prefix_cache: PrefixCache
    sidecar: Sidecar | None = None
    payback: PayBack | None = None
    call_log: object | None = None


@dataclass(frozen=True)
class Verified:
    """What one verify forward decided: the tokens to commit, the logits that chose them, the drafts
    accepted per source; and the forward's account (the tree verified, its past, batch, seconds)."""
    tokens: list[int]
    logits: torch.Tensor
    by_source: dict[str, int]
    tree: Tree
    past: int
    batch: int
    seconds: float
    fed_s: tuple[float, ...] = ()   # deterministic mode: forwards that fed the tree's forced chain ahead


class Decoder:
    """Decodes replies on one target: see the module's docstring."""

    def __init__(self, verifier: Verifier, batcher: Batcher, reading: Reading, parts: Parts, *,
                 max_draft_nodes: int, deterministic: bool, hint_follow_up: bool | None, place: cores.Place,
                 model_name: str):
        self.verifier, self.batcher, self.reading, self.parts = verifier, batcher, reading, parts
        self.max_draft_nodes, self.deterministic, self.hint_follow_up = max_draft_nodes, deterministic, hint_follow_up
        self.place, self.model_name = place, model_name
        self.faults: set[str] = set()  # sidecar faults logged once

    def stream(self, req: Prepared, **options) -> Iterator[Event]:
        """A request's events, decoded as one `Reply` (`reply`'s `options`) with its seat at the target
        (batching.py): while its consumer holds an event the reply is parked, so the other replies' rounds do
        not wait for it."""
        seat, steps = self.batcher.seat(), None
        try:
            steps = self.run(self.reply(req, seat, **options))  # a request that fails to begin leaves its seat
            for event in steps:
                seat.parked(True)
                try:
                    yield event
                finally:
                    seat.parked(False)
        finally:
            try:
                if steps is not None:
                    steps.close()
            finally:
                self.batcher.leave(seat)

    # ------------------------------------------------------------------ a reply, built once

    def reply(self, req: Prepared, seat, *, hint_text: str | None = None, record_margins: bool = False,
              cancel: threading.Event | None = None) -> Reply:
        """A request's `Reply`, built once as it starts decoding; its hint session opened, its KV cache taken
        from the prefix cache."""
        stats = DecodeStats(req.method, prompt_tokens=len(req.prompt_ids), margins=[] if record_margins else None,
                            prediction_tokens=len(req.predicted))
        call_ids = "call_" + uuid.uuid4().hex[:12]
        reading = self.reading.fmt.for_forced_reply(req.choice[0])  # a forced opener makes the reply calls
        hints = self._open_hints(req, stats, hint_text)
        hit, cache = self.parts.prefix_cache.lookup(req.prompt_ids, self.verifier.new_cache)
        return Reply(req, self.reading, self._stack(req), ReplyEvents(reading, lambda i: f"{call_ids}_{i}", req.reasoning),
                     stats, call_ids, seat, cache, hit, hints=hints, hint_text=hint_text, cancel=cancel,
                     choose=Choice.for_reply(req.guide, req.sampling.sampler(), req.top_logprobs),
                     shapes=det.Shapes.for_reply(len(req.prompt_ids), req.max_new_tokens) if self.deterministic
                     else None)  # deterministic: every decode forward of the reply has these shapes

    def _stack(self, req: Prepared) -> DrafterStack:
        """The reply's own drafters, over its state (the call memory's replies for its tools in the pool)."""
        memory, r = self.parts.memory, self.reading
        state = ReplyState(ids=list(req.prompt_ids), n_prompt=len(req.prompt_ids), text=req.prefix, tools=req.tools,
                           fmt=r.fmt, tokenizer=r.tokenizer, pool=memory.recall(req.tools),
                           prediction=Prediction(list(req.predicted)) if req.predicted else None,
                           reasoning=req.reasoning)
        drafters = {slot: d if isinstance(d, Drafter) else d() for slot, d in self.parts.drafters.items()}
        return DrafterStack.for_reply(state, r.text, memory=memory, drafters=drafters)

    def _open_hints(self, req: Prepared, stats: DecodeStats, given: str | None) -> HintSession | None:
        """The sidecar's wave for this reply (oospec with tools), unless the pay-back rule skips it."""
        cores.take_back_lent_cores()  # what an earlier reply of this thread lent, if another thread closed it
        if req.method != "oospec" or not req.tools:
            return None
        sidecar, payback = FixedHint(given) if given is not None else self.parts.sidecar, self.parts.payback
        if sidecar is None:
            return None
        stats.sidecar = sidecar.name or type(sidecar).__name__
        request = HintRequest(req.messages, req.tools, self.reading.fmt, req.choice)
        shares = cores.shares_cpu(sidecar.device, sidecar.cores, self.place)
        if given is None and payback is not None and shares:
            stats.wave_estimate_s = wave_estimate(sidecar, request)
            uncached = len(req.prompt_ids) - self.parts.prefix_cache.peek(req.prompt_ids)
            stats.call_estimate_s = payback.call_s(uncached)
            stats.decode_estimate_s = payback.decode_s()
            hidden = payback.hidden_s(req.tool_s, stats.call_estimate_s)
            stats.hidden_estimate_s = hidden if req.tool_s else None
            stats.sidecar_skipped = payback.verdict(stats.wave_estimate_s, stats.decode_estimate_s, hidden)
            if stats.sidecar_skipped:
                return None
        follow_up = given is None and follows_up(self.hint_follow_up, shares)
        return HintSession.open(sidecar, request, target=self.place, faults=self.faults,
                                lend_cores=given is None, follow_up=follow_up)

    # ------------------------------------------------------------------ the loop

    def run(self, rs: Reply) -> Iterator[Event]:
        """One reply's events, then its `Generation` (none when it is cancelled or abandoned)."""
        done = False
        try:
            done = yield from self._rounds(rs)
        finally:
            if rs.hints is not None:
                _record(rs.stats, rs.hints.close(abandoned=not done))
        if not done:
            return
        yield from self._end(rs)

    def _rounds(self, rs: Reply):
        """The reply's rounds until it finishes (True) or is cancelled (False)."""
        stats = rs.stats
        pending, logits = self._start(rs)
        told = None  # the drafts the last verify forward accepted, per source: told once committed
        t1 = time.perf_counter()
        while True:
            kept = yield from rs.commit(pending, logits)
            if told is not None:  # the drafters' feedback: what the round committed
                rs.stack.committed(pending[:kept], told)
            forced = [] if rs.finish else self._forced(rs, rs.req.max_new_tokens - rs.n_new)
            if forced:  # jump-forward: commit what the grammar forces now; the next forward feeds it
                yield from rs.commit(forced, None)
            if rs.req.reasoning is not None and stats.reasoning_forwards is None and rs.state.answer is not None:
                stats.reasoning_tokens, stats.reasoning_forwards = rs.n_new, stats.target_forwards
                stats.reasoning_s = time.perf_counter() - t1
            if rs.finish is not None:
                break
            if rs.cancelled:
                return False  # abandoned: the caller's finally stops the sidecar
            tree, predicted = self._draft(rs, forced)
            if predicted is not None:  # the hint read this round: what the sidecar predicts
                rs.predicted(predicted.calls)
                yield predicted
            verified = self._verify(rs, tree)
            _count(stats, verified)
            pending, logits, told = verified.tokens, verified.logits, verified.by_source
        self._sync()
        stats.decode_s = time.perf_counter() - t1
        stats.host_s = max(0.0, stats.decode_s - stats.forward_s)
        return True

    def _end(self, rs: Reply) -> Iterator[Event]:
        """The finished reply: its drafters and the call memory told, its last events, its `Generation`."""
        stats = rs.stats
        for source, n in rs.stack.accepted_by_source.items():
            stats.accepted_by_source[source] = stats.accepted_by_source.get(source, 0) + n
        rs.stack.finished(stats)  # the call memory keeps the reply
        payback = self.parts.payback
        if payback is not None and stats.method != "ar":  # the pay-back rule learns what the call took
            payback.observe(stats.prompt_tokens, stats.cached_prompt_tokens, stats.prefill_s, stats.decode_s)
        yield from rs.close()
        if rs.state.prediction is not None:
            stats.prediction_matched = matched_tokens(rs.state.prediction.tokens, rs.new)
        gen = self._finish(rs)
        yield from rs.events.ready_for(gen.tool_calls)  # a call read only at the end (rounds sent the rest)
        self._judge_hint(rs, gen)
        self._log_call(rs, gen)
        yield gen

    def _start(self, rs: Reply) -> tuple[list[int], torch.Tensor]:
        """Prefill the prompt (what the prefix cache held is reused) and the tokens the grammar forces
        first: (the tokens to commit first, the logits that chose the last of them)."""
        req, stats, cache = rs.req, rs.stats, self.parts.prefix_cache
        t0 = time.perf_counter()
        forced = self._forced(rs, req.max_new_tokens - 1)  # the reply's first tokens, if forced
        ids = req.prompt_ids + forced
        logits = rs.seat.run_now(functools.partial(self.verifier.prefill, ids, rs.cache, rs.hit, cache.chunk))
        cache.store(ids, rs.cache)  # before decoding grows it
        self._sync()
        stats.prefill_s, stats.target_forwards = time.perf_counter() - t0, 1
        stats.cached_prompt_tokens = rs.hit
        return forced + [greedy(logits[-1]) if rs.choose is None else rs.choose(logits[-1])], logits

    def _forced(self, rs: Reply, limit: int) -> list[int]:
        """The tokens the grammar forces next (none without one), counted as the grammar's."""
        if rs.guide is None:
            return []
        forced = rs.guide.forced(limit)
        rs.stats.accepted_by_source["grammar"] += len(forced)
        return forced

    def _draft(self, rs: Reply, forced: list[int]) -> tuple[Tree, CallPredicted | None]:
        """The candidate tree for the next forward -- the forced tokens (committed, not yet in the KV
        cache) below the last token the target chose, then the drafts (drafters/stack.py) -- and the
        calls a hint read this round predicts (None: no hint was read)."""
        state, predicted = rs.state, None
        answer = state.answer  # None while the reply reasons: a hint waits until the reasoning has closed
        if rs.hints is not None and answer is not None and (hint := rs.hints.poll(answer)) is not None:
            state.add_hint(hint)
            predicted = predicted_calls(self.reading.fmt, hint, rs.hints.confidence)
        drafts = [] if rs.method == "ar" else rs.stack.round_drafts()
        # deterministic: a chain (the first draft), whose rows see their keys where `ar`'s row does; a
        # tree's row whose ancestors have gaps can come out in other bits (docs/deterministic.md)
        nodes = det.max_draft_nodes(self.max_draft_nodes) if self.deterministic else self.max_draft_nodes
        root = state.ids[len(state.ids) - 1 - len(forced)]
        return build_tree(root, drafts, nodes, chain=not self.verifier.layout.tree or self.deterministic,
                          forced=forced), predicted

    def _verify(self, rs: Reply, tree: Tree) -> Verified:
        """One target forward over the tree: the accepted drafts plus the target's own next token (the
        forced tokens at the tree's start are committed already), and their logits. A reply decoding alone
        runs it on its own thread; beside other replies a normal mode tree is one row of a batched forward."""
        past = len(rs.state.ids) - 1 - tree.start
        alone = functools.partial(self._verify_alone, rs, tree, past)
        if rs.shapes is not None or self.batcher.max_batch == 1:
            return rs.seat.run_now(alone)
        return rs.seat.run_now(alone, Job(fn=alone, row=functools.partial(self.verifier.row, tree, rs.cache, past),
                                          rowed=functools.partial(self._rowed, rs, tree, past)))

    def _verify_alone(self, rs: Reply, tree: Tree, past: int) -> Verified:
        """The target to itself: the plain forward over the tree (in deterministic mode, fitted to the
        reply's shapes), and the walk of its logits."""
        fitted, at, fed = tree, past, []
        if rs.shapes is not None:
            fitted, at, fed = self.verifier.fit(tree, rs.cache, past, rs.shapes)
        fixed = {} if rs.shapes is None else {"shapes": rs.shapes}
        path, nxt, logits = self.verifier.verify(fitted, rs.cache, at, choose=rs.choose, **fixed)
        return _verified(fitted, at, path, nxt, logits, 1, self.verifier.last_forward_s, tuple(fed))

    def _rowed(self, rs: Reply, tree: Tree, past: int, logits, seconds: float, batch: int) -> Verified:
        """The tree's row of a batched forward, walked."""
        path, nxt, kept = self.verifier.accept(tree, logits, rs.cache, past, rs.choose)
        return _verified(tree, past, path, nxt, kept, batch, seconds)

    def _sync(self) -> None:
        if self.verifier.device.type == "cuda":
            torch.cuda.synchronize(self.verifier.device)

    # ------------------------------------------------------------------ the finished reply

    def _finish(self, rs: Reply) -> Generation:
        """The finished reply: its calls read and checked as the stream read them."""
        req, stats, new = rs.req, rs.stats, rs.new
        ended = rs.finish == "stop" and bool(new) and new[-1] in self.reading.eos  # not cut off: the model ended
        read = read_reply(rs.events, rs.text, req.tools, rs.call_id_prefix, rs.finish, ended)  # as the stream read
        stats.new_tokens = len(new)
        if stats.margins is not None:
            del stats.margins[len(new):]
        return Generation(text=rs.text, token_ids=new, stats=stats, prompt_tokens=len(req.prompt_ids),
                          logprobs=None if req.top_logprobs is None else rs.logprobs[:len(new)], **read)

    def _judge_hint(self, rs: Reply, gen: Generation) -> None:
        """The wave ran: was its prediction exactly a call the target wrote? (the pay-back rule learns it)"""
        if rs.hints is None:
            return
        rs.stats.prediction_exact = any({"name": c["name"], "arguments": c["arguments"]} in rs.predictions
                                        for c in gen.tool_calls)
        if self.parts.payback is not None and rs.hint_text is None:
            self.parts.payback.observe_prediction(rs.stats.prediction_exact)

    def _log_call(self, rs: Reply, gen: Generation) -> None:
        """A reply whose calls the target wrote, all fitting their schemas: a training record (calllog.py)."""
        log_ = self.parts.call_log
        if log_ is None or not gen.tool_calls or gen.invalid_tool_calls or gen.tool_call_problems:
            return
        req = rs.req
        log_.record(req.messages, [t.to_openai() for t in req.tools], gen.tool_calls, model=self.model_name,
                    method=rs.method, hint=rs.state.hint, hint_tokens=rs.stack.accepted_by_source.get("hint", 0))


def _verified(tree: Tree, past: int, path: list[int], nxt: int, logits, batch: int, seconds: float,
              fed_s: tuple[float, ...] = ()) -> Verified:
    drafted = path[tree.start + 1:]
    by_source: dict[str, int] = {}
    for node in drafted:  # a drafter's own source (not one of SOURCES) is counted too
        by_source[tree.sources[node]] = by_source.get(tree.sources[node], 0) + 1
    return Verified([tree.tokens[i] for i in drafted] + [nxt], logits[tree.start:], by_source, tree, past, batch,
                    seconds, fed_s)


def _count(stats: DecodeStats, v: Verified) -> None:
    """A verify forward, into the reply's stats (its accepted drafts are the reply's stack's to count)."""
    stats.target_forwards += len(v.fed_s) + 1
    stats.forward_s += sum(v.fed_s) + v.seconds
    stats.batch_sizes.append(v.batch)
    stats.rounds.append((len(v.tree.tokens), len(v.tokens) - 1, v.past))
    stats.draft_tokens += len(v.tree.tokens) - 1 - v.tree.start


def wave_estimate(sidecar: Sidecar, request: HintRequest) -> float | None:
    """The sidecar's own estimate of its wave's seconds."""
    try:
        return sidecar.estimate(request)
    except Exception as e:  # an estimate that fails is no estimate: the wave runs
        log.debug("sidecar estimate failed: %s", e)
        return None


def predicted_calls(fmt: ToolFormat, hint: str, confidence: float | None = None) -> CallPredicted | None:
    """The calls a hint's text names, as `CallPredicted` with the wave's `confidence` (None where it
    names none that reads as a call)."""
    try:
        _, parsed = fmt.parse(hint)
    except Exception as e:  # a hint that does not parse is no prediction; the target decodes on
        log.debug("hint not read as calls: %s", e)
        return None
    calls = [{"name": c["name"], "arguments": c["arguments"]} for c in parsed
             if "error" not in c and isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict)]
    return CallPredicted(calls, confidence) if calls else None


def _record(stats: DecodeStats, out: Outcome) -> None:
    """What the sidecar did for the reply, into its stats."""
    stats.sidecar_error, stats.sidecar_declined, stats.hint_follow_ups = out.error, out.declined, out.follow_ups
    stats.hint_ready_s, stats.hint_bytes, stats.sidecar_profile = out.hint_ready_s, out.hint_bytes, out.profile
    stats.sidecar_cached_prompt_tokens = out.cached_prompt_tokens
