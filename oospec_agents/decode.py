"""The decode loop: draft, verify in one target forward, commit, roll back -- until a stop.

    hint = hints.poll(answer)                 non-blocking; the sidecar's call as target-format text
    drafts = prediction + hint + schema + retrieval   each behind the one Drafter interface (drafters/stack.py)
    path, next_token = verify(tree(drafts))   one target forward; greedy acceptance, or a seeded draw
                                              per node when the request samples (sampling.py)
    commit path + next_token; crop the KV cache past rejected nodes; tell the drafters; emit the events

The target is the only model that commits tokens, so the output equals its greedy decoding, or when
the request samples, is distributed as its sampling. Under a grammar (strict), a token the grammar
forces (the only one its mask allows) is committed at once without the target (jump-forward): it
enters the KV cache in the next forward, ahead of the drafts.

`DecodeLoop` is the part of `Engine` that runs one reply; each step takes the reply's `RequestState`
(request.py) and returns what it decided. The engine gives it `_verifier`, `_batcher`, `drafters`,
`memory`, `_listeners`, `prefix_cache`, `payback`, `sidecar`, `fmt`, `tokenizer`, `_reply_text`, `eos_ids`,
`max_draft_nodes`, `deterministic`, `hint_follow_up`, `place`, `call_log`, `model_name`, `_logged_faults`.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Iterator

import torch

from . import deterministic as det
from .batching import Job
from .drafters import Accepted, ReplyState, stack_drafts
from .drafters.base import Prediction
from .drafters.prediction import matched_tokens
from .drafters.stack import tell
from .events import CallPredicted, ReplyEvents
from .finish import read_reply
from .formats import ToolFormat
from .request import Event, Generation, Prepared, RequestState
from .sampling import Choice
from .sidecar import FixedHint, HintRequest, Sidecar
from .sidecar import cores
from .sidecar.session import HintSession, Outcome, follows_up
from .stats import SOURCES, DecodeStats
from .verify import Tree, build_tree

log = logging.getLogger(__name__)


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


class DecodeLoop:
    """The decode loop's steps, mixed into `Engine` (the module's docstring lists what it reads)."""

    def _begin(self, req: Prepared, method: str, hint_text: str | None, record_margins: bool,
               cancel: threading.Event | None, predicted: list[int], seat) -> RequestState:
        """A reply's state, built once as it starts decoding (request.py); its hint session opened."""
        stats = DecodeStats(method, prompt_tokens=len(req.prompt_ids), margins=[] if record_margins else None,
                            prediction_tokens=len(predicted))
        call_ids = "call_" + uuid.uuid4().hex[:12]
        reading = self.fmt.for_forced_reply(req.choice[0])  # a forced opener makes the reply calls
        state = ReplyState(ids=list(req.prompt_ids), n_prompt=len(req.prompt_ids), text=req.prefix, tools=req.tools,
                           fmt=self.fmt, tokenizer=self.tokenizer, pool=self.memory.recall(req.tools),
                           prediction=Prediction(predicted) if predicted else None, reasoning=req.reasoning)
        rs = RequestState(req, method, state, ReplyEvents(reading, lambda i: f"{call_ids}_{i}", req.reasoning), stats,
                          self._reply_text, self.eos_ids, call_ids, seat, hint_text=hint_text, cancel=cancel,
                          choose=Choice.for_reply(req.guide, req.sampling.sampler(), req.top_logprobs))
        rs.hints = self._open_hints(rs)
        if self.deterministic:  # every decode forward of the reply has these shapes
            rs.shapes = det.Shapes.for_reply(len(req.prompt_ids), req.max_new_tokens)
        return rs

    def _decode(self, rs: RequestState) -> Iterator[Event]:
        """One reply's events, then its `Generation` (none when it is cancelled or abandoned)."""
        stats, done = rs.stats, False
        try:
            pending, logits = self._start(rs)
            told = None  # the drafts the last verify forward accepted, per source: told once committed
            t1 = time.perf_counter()
            while True:
                kept = yield from rs.commit(pending, logits)
                if told is not None:  # the drafters' feedback: what the round committed
                    tell(self._listeners, rs.state, Accepted(tuple(pending[:kept]), told))
                forced = [] if rs.finish else self._forced(rs, rs.req.max_new_tokens - rs.n_new)
                if forced:  # jump-forward: commit what the grammar forces now; the next forward feeds it
                    yield from rs.commit(forced, None)
                if rs.req.reasoning is not None and stats.reasoning_forwards is None and rs.state.answer is not None:
                    stats.reasoning_tokens, stats.reasoning_forwards = rs.n_new, stats.target_forwards
                    stats.reasoning_s = time.perf_counter() - t1
                if rs.finish is not None:
                    break
                if rs.cancelled:
                    return  # abandoned: the finally below stops the sidecar
                tree, predicted = self._draft(rs, forced)
                if predicted is not None:  # the hint read this round: what the sidecar predicts
                    rs.predictions += predicted.calls
                    yield predicted
                verified = self._verify(rs, tree)
                _count(stats, verified)
                pending, logits = verified.tokens, verified.logits
                told = verified.by_source
            self._sync()
            stats.decode_s = time.perf_counter() - t1
            stats.host_s = max(0.0, stats.decode_s - stats.forward_s)
            done = True
        finally:
            if rs.hints is not None:
                _record(stats, rs.hints.close(abandoned=not done))
        finished = self._listeners + ([] if self.payback is None else [PayBackListener(self.payback)])
        tell(finished, rs.state, Accepted((), {}, done=True, stats=stats))  # the call memory keeps the reply
        yield from rs.close()
        if rs.state.prediction is not None:
            stats.prediction_matched = matched_tokens(rs.state.prediction.tokens, rs.new)
        gen = self._finish(rs)
        yield from rs.events.ready_for(gen.tool_calls)  # a call read only at the end (rounds sent the rest)
        self._judge_hint(rs, gen)
        self._log_call(rs, gen)
        yield gen

    def _start(self, rs: RequestState) -> tuple[list[int], torch.Tensor]:
        """Prefill the prompt (what the prefix cache holds is reused) and the tokens the grammar forces
        first: (the tokens to commit first, the logits that chose the last of them)."""
        req, stats = rs.req, rs.stats
        t0 = time.perf_counter()
        hit, rs.cache = self.prefix_cache.lookup(req.prompt_ids, self._verifier.new_cache)
        forced = self._forced(rs, req.max_new_tokens - 1)  # the reply's first tokens, if forced
        ids = req.prompt_ids + forced
        logits = rs.seat.run(Job(fn=lambda: self._verifier.prefill(ids, rs.cache, hit, self.prefix_cache.chunk)))
        self.prefix_cache.store(ids, rs.cache)  # before decoding grows it
        self._sync()
        stats.prefill_s, stats.target_forwards = time.perf_counter() - t0, 1
        stats.cached_prompt_tokens = hit
        return forced + [int(logits[-1].argmax()) if rs.choose is None else rs.choose(logits[-1])], logits

    def _forced(self, rs: RequestState, limit: int) -> list[int]:
        """The tokens the grammar forces next (none without one), counted as the grammar's."""
        if rs.req.guide is None:
            return []
        forced = rs.req.guide.forced(limit)
        rs.stats.accepted_by_source["grammar"] += len(forced)
        return forced

    def _draft(self, rs: RequestState, forced: list[int]) -> tuple[Tree, CallPredicted | None]:
        """The candidate tree for the next forward -- the forced tokens (committed, not yet in the KV
        cache) below the last token the target chose, then the drafts (drafters/stack.py) -- and the
        calls a hint read this round predicts (None: no hint was read)."""
        state, predicted = rs.state, None
        answer = state.answer  # None while the reply reasons: a hint waits until the reasoning has closed
        if rs.hints is not None and answer is not None and (hint := rs.hints.poll(answer)) is not None:
            state.add_hint(hint)
            predicted = predicted_calls(self.fmt, hint, rs.hints.confidence)
        drafts = [] if rs.method == "ar" else stack_drafts(self.drafters, state)
        # deterministic: a chain (the first draft), whose rows see their keys where `ar`'s row does; a
        # tree's row whose ancestors have gaps can come out in other bits (docs/deterministic.md)
        nodes = det.max_draft_nodes(self.max_draft_nodes) if self.deterministic else self.max_draft_nodes
        root = state.ids[len(state.ids) - 1 - len(forced)]
        return build_tree(root, drafts, nodes, chain=not self._verifier.layout.tree or self.deterministic,
                          forced=forced), predicted

    def _verify(self, rs: RequestState, tree: Tree) -> Verified:
        """One target forward over the tree (alone, or as one row of a batched forward): the accepted
        drafts plus the target's own next token (the forced tokens at the tree's start are committed
        already), and their logits."""
        past = len(rs.state.ids) - 1 - tree.start
        verifier, choose = self._verifier, rs.choose

        def alone() -> Verified:  # the target to itself: the forward and walk a reply alone has always run
            fitted, at, fed = tree, past, []
            if rs.shapes is not None:  # deterministic: a tree that fits the reply's shapes
                fitted, at, fed = verifier.fit(tree, rs.cache, past, rs.shapes)
            fixed = {} if rs.shapes is None else {"shapes": rs.shapes}
            path, nxt, logits = verifier.verify(fitted, rs.cache, at, choose=choose, **fixed)
            return _verified(fitted, at, path, nxt, logits, 1, verifier.last_forward_s, tuple(fed))

        def rowed(logits, seconds: float, batch: int) -> Verified:  # the tree's row of a batched forward, walked
            path, nxt, kept = verifier.accept(tree, logits, rs.cache, past, choose)
            return _verified(tree, past, path, nxt, kept, batch, seconds)

        # beside other replies' trees, a normal mode tree is one row of a batched forward (batching.py)
        batchable = rs.shapes is None and self._batcher.max_batch > 1
        return rs.seat.run(Job(fn=alone, row=(lambda: verifier.row(tree, rs.cache, past)) if batchable else None,
                               rowed=rowed))

    def _open_hints(self, rs: RequestState) -> HintSession | None:
        """The sidecar's wave for this reply (oospec with tools), unless the pay-back rule skips it."""
        cores.take_back_lent_cores()  # what an earlier reply of this thread lent, if another thread closed it
        req, stats, given = rs.req, rs.stats, rs.hint_text
        if rs.method != "oospec" or not req.tools:
            return None
        sidecar = FixedHint(given) if given is not None else self.sidecar
        if sidecar is None:
            return None
        stats.sidecar = sidecar.name or type(sidecar).__name__
        request = HintRequest(req.messages, req.tools, self.fmt, req.choice)
        shares = cores.shares_cpu(sidecar.device, sidecar.cores, self.place)
        if given is None and self.payback is not None and shares:
            stats.wave_estimate_s = wave_estimate(sidecar, request)
            stats.call_estimate_s = self.payback.call_s(len(req.prompt_ids) - self.prefix_cache.peek(req.prompt_ids))
            stats.decode_estimate_s = self.payback.decode_s()
            hidden = self.payback.hidden_s(req.tool_s, stats.call_estimate_s)
            stats.hidden_estimate_s = hidden if req.tool_s else None
            stats.sidecar_skipped = self.payback.verdict(stats.wave_estimate_s, stats.decode_estimate_s, hidden)
            if stats.sidecar_skipped:
                return None
        follow_up = given is None and follows_up(self.hint_follow_up, shares)
        return HintSession.open(sidecar, request, target=self.place, faults=self._logged_faults,
                                lend_cores=given is None, follow_up=follow_up)

    def _sync(self) -> None:
        if self._verifier.device.type == "cuda":
            torch.cuda.synchronize(self._verifier.device)

    def _finish(self, rs: RequestState) -> Generation:
        """The finished reply: its calls read and checked as the stream read them."""
        req, stats, new = rs.req, rs.stats, rs.new
        ended = rs.finish == "stop" and bool(new) and new[-1] in self.eos_ids  # not cut off: the model ended
        read = read_reply(rs.events, rs.text, req.tools, rs.call_id_prefix, rs.finish, ended)  # as the stream read
        stats.new_tokens = len(new)
        if stats.margins is not None:
            del stats.margins[len(new):]
        return Generation(text=rs.text, token_ids=new, stats=stats, prompt_tokens=len(req.prompt_ids),
                          logprobs=None if req.top_logprobs is None else rs.logprobs[:len(new)], **read)

    def _judge_hint(self, rs: RequestState, gen: Generation) -> None:
        """The wave ran: was its prediction exactly a call the target wrote? (the pay-back rule learns it)"""
        if rs.hints is None:
            return
        rs.stats.prediction_exact = any({"name": c["name"], "arguments": c["arguments"]} in rs.predictions
                                        for c in gen.tool_calls)
        if self.payback is not None and rs.hint_text is None:
            self.payback.observe_prediction(rs.stats.prediction_exact)

    def _log_call(self, rs: RequestState, gen: Generation) -> None:
        """A reply whose calls the target wrote, all fitting their schemas: a training record (calllog.py)."""
        if self.call_log is None or not gen.tool_calls or gen.invalid_tool_calls or gen.tool_call_problems:
            return
        req = rs.req
        self.call_log.record(req.messages, [t.to_openai() for t in req.tools], gen.tool_calls,
                             model=self.model_name, method=rs.method, hint=rs.state.hint,
                             hint_tokens=rs.stats.accepted_by_source.get("hint", 0))


class PayBackListener:
    """The pay-back rule (sidecar/payback.py) on the drafters' feedback hook: a finished reply of a
    speculative method teaches it what the call took (its prefill and decode seconds)."""

    def __init__(self, payback):
        self.payback = payback

    def accepted(self, state, accepted: Accepted) -> None:
        s = accepted.stats
        if accepted.done and s is not None and s.method != "ar":
            self.payback.observe(s.prompt_tokens, s.cached_prompt_tokens, s.prefill_s, s.decode_s)


def _verified(tree: Tree, past: int, path: list[int], nxt: int, logits, batch: int, seconds: float,
              fed_s: tuple[float, ...] = ()) -> Verified:
    drafted = path[tree.start + 1:]
    by_source = dict.fromkeys(SOURCES, 0)
    for node in drafted:  # a drafter's own source (not one of SOURCES) is counted too
        by_source[tree.sources[node]] = by_source.get(tree.sources[node], 0) + 1
    return Verified([tree.tokens[i] for i in drafted] + [nxt], logits[tree.start:], by_source, tree, past, batch,
                    seconds, fed_s)


def _count(stats: DecodeStats, v: Verified) -> None:
    """A verify forward, into the reply's stats."""
    stats.target_forwards += len(v.fed_s) + 1
    stats.forward_s += sum(v.fed_s) + v.seconds
    stats.batch_sizes.append(v.batch)
    stats.rounds.append((len(v.tree.tokens), len(v.tokens) - 1, v.past))
    stats.draft_tokens += len(v.tree.tokens) - 1 - v.tree.start
    for source, n in v.by_source.items():
        stats.accepted_by_source[source] = stats.accepted_by_source.get(source, 0) + n


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
