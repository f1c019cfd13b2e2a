"""One request-level wave: every row of a request decoded greedily as one batch on the sidecar model.

    prefix + what all suffixes share       prefilled once                         [1, P]
    each tool's call opener                fanned out: one element per tool       [T, P + O]
    each row's key                         fanned out: one element per row        [R, P + O + K]
    decode all rows in lockstep; a row leaves the batch once its JSON value is complete

The prefill and its fan-out are fanout.py's. Each level is right-aligned: pads sit between levels,
masked out, and position ids skip them, so every batch element is exactly its row's `prefix + suffix`
and no row attends to another. The decode loop is lockstep.py's; this module plans the batches and
phases, and reads what the rows wrote. A wave returns a `WaveResult` (each row's
text and log-probability, and where its time went) and keeps none of it.

A required parameter's row (`Row.required`) never answers null: a call without it would not
validate, so its first tokens are kept off `null` and the row writes its best value instead.

A row may be constrained to a few choices (the function row: the offered tool names): its logits
are masked to the tokens that continue one of them, and it stops once only one choice is left. Once
it has chosen, the rows of every other tool leave the batch too. Choices given with a prior (a
mapping text -> prior, `rank.tool_prior`'s) add `prior_weight x prior` to each allowed token's logit,
the best prior among the choices that token continues.

A large tool set (more rows than `max_rows`, MAX_ROWS by default) is decoded in two phases of the same
wave, so that its cost stays bounded: the function row alone first, then only the rows of the tool it
chose (the first `max_rows - 1` in schema order). With `top_tools=K` the first phase also decodes the
rows of the K tools whose names the function row's first token ranks highest, and the second phase
runs only when it chose another tool. A wave never has more than `max_rows` rows in one batch; with
`top_tools=0` (the default) it decodes at most `max_rows` rows in all. Rows without a constrained
function row (a named tool_choice: one tool's rows) are decoded in one batch, as always.
docs/sidecar.md ("Large tool sets") has the measurements behind the defaults.
"""
from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass, field

import torch

from ..prefix_cache import DEFAULT_TOKENS, PrefixCache
from ..verify import eos_ids
from .fanout import FanOut
from .lockstep import Lockstep, RequestRows, runner_ups
from .payback import Line
from .rows import Row, parse_value, value_end

JSON_STARTS = set('"{[-0123456789tfn')  # a row whose first character is none of these is garbage
#: the work of one row, in prefix tokens, for the wave's cost estimate (its opener, key and value)
ROW_WORK = 8
#: the most rows a wave decodes under a function row. Up to this many (every dev.jsonl request: at most 15)
#: it decodes all rows in one lockstep batch, as it always has; above it (callnavi's 21-101 tools, BFCL
#: multi-turn's 17-39, BFCL live_multiple's largest) the function row decides first and only its
#: tool's rows follow. docs/sidecar.md, "Large tool sets", has the measurements behind 16.
MAX_ROWS = 16
#: the most KV a batched wave (`Wave.many`) fans out: batch elements x the longest shared prefix, in tokens.
#: Each row's element holds its request's prefix (the fan-out copies it), so eight requests of 16 rows over
#: 2,000-token prompts would hold 256k tokens' KV; requests past the budget wait for the next batch.
MAX_BATCH_TOKENS = 65536
#: logits the function row adds per unit of a tool's lexical prior (`rank.tool_prior`, in [-1, 0]);
#: docs/sidecar.md ("A lexical prior over the tools") has the sweep that chose it
PRIOR_WEIGHT = 6.0


@dataclass(frozen=True)
class WaveResult:
    """What one request's wave wrote: one entry per row, in the order of the rows it was given."""
    #: the text each row generated after its suffix, up to the end of its JSON value; "" for a row that a
    #: two-phase wave did not decode
    texts: list[str]
    #: each row's log-probability: the sum over its tokens of the chosen token's log-softmax under the
    #: constraints the row decoded with (choices, prior, no null for a required row); None for a row the
    #: wave did not decode. `confidence.call_logprob` reads it. None: a wave function that keeps none.
    row_logprobs: list[float | None] | None = None
    #: where the wave's time went: prefix_tokens, cached_prefix_tokens, rows (decoded), rows_offered,
    #: max_rows, prefill_s, steps (tokens per row at most, both phases together), decode_s; a two-phase
    #: wave adds phases (1 or 2), function_steps and first_rows (the first phase's steps and rows), and
    #: top_tools where it ranked them; a batched wave (`Wave.many`) adds batched (the requests in it)
    profile: dict = field(default_factory=dict)
    #: where a constrained row (the function row) was unsure: row -> (its runner-up choice's text, the
    #: log-probability margin by which the choice it made beat it at the token where they part); for a
    #: slot row, its runner-up first token's text and margin
    runner_ups: dict[int, tuple[str, float]] = field(default_factory=dict)


class Wave:
    """The sidecar's prediction of one tool call, every argument at once: a *wave*.

    A request becomes rows (rows.py): one function-index row (which tool, or null) and one
    value-or-null row per parameter of every offered tool, each a short suffix after one shared
    prefix (the compact tools and the conversation). No row sees another's answer, so all of them
    decode greedily as one batch: the shared prefix is prefilled once (from the prefix cache) and its
    KV fanned out per row (fanout.py), then the rows decode in lockstep, each leaving the batch as
    soon as its JSON value is complete (early stop per row). `runtime.run_waves` joins the texts into
    the call that is hinted to the target.

    A call (`wave(prefix, rows, cancel, choices)`) and a batch of several requests' waves
    (`wave.many`) return a `WaveResult` each, and keep nothing of it on the wave: only the settings
    given here, the prefix cache and the cost line (`estimate`) outlive a wave.

    `calibration` maps a call's log-probability to the probability that it is exact
    (`confidence.Calibration`; None: the runtime reports no confidence); `row_options` says how the
    adapter's rows are written (`rows.RowOptions`; None: today's rows; `runtime.wave_rows` reads it).
    """

    def __init__(self, model, tokenizer, *, max_row_tokens: int = 32, prefix_cache_tokens: int = DEFAULT_TOKENS,
                 max_rows: int = MAX_ROWS, top_tools: int = 0, prior_weight: float = PRIOR_WEIGHT,
                 calibration=None, row_options=None):
        _check_settings(max_rows, top_tools, prior_weight)
        self.model = model
        self.tokenizer = tokenizer
        self.max_row_tokens = max_row_tokens
        #: a request with more rows than this is decoded in two phases (see the module's docstring)
        self.max_rows = max_rows
        #: in a two-phase wave, how many tools (ranked by the function row's first token) decode their
        #: rows beside the function row; 0: the function row chooses alone first
        self.top_tools = top_tools
        #: logits added per unit of a choice's prior (0: the model alone chooses)
        self.prior_weight = float(prior_weight)
        self.calibration = calibration
        self.row_options = row_options
        self.device = next(model.parameters()).device
        self.eos = eos_ids(model)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos), 0)
        self.fanout = FanOut(model, self.pad)
        #: the shared prefix (compact tools + conversation) of recent waves: the next turn reuses it
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._nulls: torch.Tensor | None = None  # see null_starts
        #: seconds of finished waves against their work (uncached prefix tokens + ROW_WORK per row)
        self.cost = Line()

    def estimate(self, prefix: str, rows: list[Row]) -> float | None:
        """Seconds a wave over `prefix` and `rows` is expected to take; None before any has finished."""
        ids = self._enc(prefix)
        return self.cost(len(ids) - self.prefix_cache.peek(ids) + ROW_WORK * self._work_rows(rows))

    def _work_rows(self, rows: list[Row]) -> int:
        """The rows a wave's work counts: all of them, but at most `max_rows` where a function row heads
        them (which rows a two-phase wave decodes is not known before its function row has chosen)."""
        return min(len(rows), self.max_rows) if rows and rows[0].kind == "function" else len(rows)

    def two_phases(self, rows: list[Row], choices: dict[int, list[str]] | None = None) -> bool:
        """Whether a wave decodes these rows in two phases: more than `max_rows` of them, headed by a
        function row that is constrained to the offered names."""
        return len(rows) > self.max_rows and rows[0].kind == "function" and 0 in (choices or {})

    def __call__(self, prefix: str, rows: list[Row], cancel: threading.Event | None = None,
                 choices: dict[int, list[str]] | None = None) -> WaveResult:
        """One request's wave: each row's text, log-probability and the wave's profile (`WaveResult`).

        `choices` maps a row's index to the only texts it may produce: a list, or a mapping from each
        text to its prior (added to its tokens' logits, times `prior_weight`).
        """
        if not rows:
            return WaveResult([], [], {})
        tries, bias = self._constraints(choices)
        out: list[list[int]] = [[] for _ in rows]
        scores: list[float | None] = [None] * len(rows)
        runner: dict = {}
        prefix_ids = self._enc(prefix)
        t0 = time.perf_counter()
        with torch.inference_mode():
            if self.two_phases(rows, choices):
                steps, cached, prefill_s, decoded, extra = self._two_phases(prefix_ids, rows, tries, bias, out,
                                                                            scores, cancel, runner)
            else:  # every row in one batch, as always (a named tool_choice's rows too: one tool's)
                steps, cached, prefill_s = self._lockstep(prefix_ids, rows, list(range(len(rows))), tries, bias,
                                                          out, scores, cancel, runner=runner)
                decoded, extra = len(rows), {}
        profile = {"prefix_tokens": len(prefix_ids), "cached_prefix_tokens": cached, "rows": decoded,
                   "rows_offered": len(rows), "max_rows": self.max_rows, "prefill_s": prefill_s,
                   "steps": steps, "decode_s": time.perf_counter() - t0 - prefill_s, **extra}
        if cancel is None or not cancel.is_set():  # a cancelled wave's time says nothing of its cost
            self.cost.add(len(prefix_ids) - cached + ROW_WORK * self._work_rows(rows), time.perf_counter() - t0)
        return WaveResult(self._texts(out), scores, profile, runner_ups(self.tokenizer, tries, bias, runner))

    def many(self, waves: list[tuple]) -> list[WaveResult]:
        """Several requests' waves at once, each `(prefix, rows, cancel, choices)` as a call takes them;
        returns one `WaveResult` per wave.

        Requests decoding at once share the sidecar's forwards: each prefix is prefilled on its own
        (from the prefix cache), the prefilled prefixes are stacked left-padded into one batch (pads
        masked out, positions kept; `FanOut.prefill_requests`), and every row of every request then
        decodes in one lockstep batch, each row over its own request's prefix (`lockstep.Lockstep`). A request
        leaves the batch when it is cancelled; a function row rules out only its own request's other
        tools. A two-phase wave (a large tool set), a model whose cache is not a plain one per layer
        (sliding windows), and requests past MAX_BATCH_TOKENS run on their own, as a call."""
        results: list[WaveResult | None] = [None] * len(waves)
        for group in self._batches(waves):
            together = self._together([(ids, *waves[n][1:]) for n, ids in group])
            for (n, _), res in zip(group, together):
                results[n] = res
        for n, (prefix, rows, cancel, choices) in enumerate(waves):
            if results[n] is None:
                results[n] = self(prefix, rows, cancel, choices)
        return results

    def _batches(self, waves: list[tuple]) -> list[list[tuple[int, list[int]]]]:
        """The batches `many` decodes together, each a list of (wave index, prefix ids), of two requests
        or more; the waves in none (a two-phase wave, an unstackable cache) run on their own."""
        if not self.fanout.stackable:
            return []
        return _group([(n, self._enc(prefix), len(rows)) for n, (prefix, rows, _, choices) in enumerate(waves)
                       if rows and not self.two_phases(rows, choices)])

    def _together(self, waves: list[tuple]) -> list[WaveResult]:
        """`many`'s shared batch, each wave `(prefix ids, rows, cancel, choices)`: the waves' rows in one
        fan-out (`FanOut.prefill_requests`) and one decode loop."""
        t0 = time.perf_counter()
        jobs = [RequestRows(rows, *self._constraints(choices), [[] for _ in rows], [None] * len(rows), cancel)
                for _, rows, cancel, choices in waves]
        with torch.inference_mode():
            cache, logits, mask, pos, hits = self.fanout.prefill_requests(
                [(ids, [self._enc(r.suffix) for r in job.rows], [r.tool for r in job.rows])
                 for (ids, *_), job in zip(waves, jobs)], self.prefix_cache)
            prefill_s = time.perf_counter() - t0
            items = [(job, i) for job in jobs for i in range(len(job.rows))]
            steps = self._lockstep_decoder().decode(items, cache, logits, mask, pos)
        decode_s = time.perf_counter() - t0 - prefill_s
        profiles = [{"prefix_tokens": len(ids), "cached_prefix_tokens": hit, "rows": len(job.rows),
                     "rows_offered": len(job.rows), "max_rows": self.max_rows}
                    for (ids, *_), job, hit in zip(waves, jobs, hits)]
        work = sum(p["prefix_tokens"] - p["cached_prefix_tokens"] + ROW_WORK * p["rows"] for p, job in
                   zip(profiles, jobs) if not job.cancelled())
        if work:
            self.cost.add(work, time.perf_counter() - t0)
        return [WaveResult(self._texts(job.out), job.scores,
                           p | {"prefill_s": prefill_s, "steps": steps.get(n, 0), "decode_s": decode_s,
                                "batched": len(jobs)}, runner_ups(self.tokenizer, job.tries, job.bias, job.runner))
                for n, (job, p) in enumerate(zip(jobs, profiles))]

    def _two_phases(self, prefix_ids: list[int], rows: list[Row], tries: dict, bias: dict, out: list[list[int]],
                    scores: list, cancel, runner: dict | None = None):
        """A large tool set: the function row first (beside the rows of the `top_tools` tools that its
        first token ranks highest), then the rows of the tool it chose, where they have not run yet.
        Each phase's prefill starts from the shared prefix of the one before: the prefix cache, or a
        private one for this wave where the prefix cache is off or too small to hold it.
        Returns (steps, cached prefix tokens, prefill seconds, rows decoded, profile extras)."""
        by_tool = _rows_by_tool(rows)
        need = len(prefix_ids) + 64  # the prefix and the longest call opener
        kept = self.prefix_cache if self.prefix_cache.max_tokens >= need else PrefixCache(need)
        budget = self.max_rows - 1   # the slot rows one phase may decode beside the function row
        first, prefill_s, extra = [0], 0.0, {}
        if self.top_tools:
            t = time.perf_counter()
            fn_suffix = self._enc(rows[0].suffix)
            _, logits, _, _, ranked_hit = self.fanout.prefill_rows(prefix_ids, [fn_suffix], [None], kept, cancel)
            prefill_s += time.perf_counter() - t
            ranked = _rank(self.tokenizer, logits[0, -1], tries[0], bias.get(0), by_tool)[:self.top_tools]
            for name in ranked:
                if len(first) - 1 + len(by_tool[name]) <= budget:
                    first += by_tool[name]
            extra["top_tools"] = ranked
        steps, cached, p = self._lockstep(prefix_ids, rows, first, tries, bias, out, scores, cancel, kept, runner)
        if self.top_tools:  # the ranking prefill saw the prefix cache first
            cached = ranked_hit
        prefill_s += p
        extra.update(phases=1, function_steps=steps, first_rows=len(first))
        decoded = len(first)
        name = parse_value(self.tokenizer.decode(out[0], skip_special_tokens=True))
        if (cancel is None or not cancel.is_set()) and isinstance(name, str) and name in by_tool \
                and by_tool[name][0] not in first:
            second = by_tool[name][:budget]  # a guard: no tool in the data has over 28 parameters
            more, _, p = self._lockstep(prefix_ids, rows, second, tries, bias, out, scores, cancel, kept)
            steps, prefill_s, decoded = steps + more, prefill_s + p, decoded + len(second)
            extra["phases"] = 2
        return steps, cached, prefill_s, decoded, extra

    def _lockstep(self, prefix_ids: list[int], rows: list[Row], idx: list[int], tries: dict, bias: dict,
                  out: list[list[int]], scores: list, cancel,
                  kept: PrefixCache | None = None, runner: dict | None = None) -> tuple[int, int, float]:
        """Decode rows[i], for i in idx, as one batch into out[i] (a row in `tries` constrained to its
        choices, plus its `bias` per choice), and each row's log-probability into scores[i] (the chosen
        tokens' log-softmax under those constraints; a choice completed once it is the only one left
        adds nothing: it had probability 1). Returns (steps, cached prefix tokens, prefill seconds)."""
        t0 = time.perf_counter()
        cache, logits, mask, pos, cached = self.fanout.prefill_rows(
            prefix_ids, [self._enc(rows[i].suffix) for i in idx], [rows[i].tool for i in idx],
            self.prefix_cache if kept is None else kept, cancel)
        prefill_s = time.perf_counter() - t0
        job = RequestRows(rows, tries, bias, out, scores, cancel, {} if runner is None else runner)
        steps = self._lockstep_decoder().decode([(job, i) for i in idx], cache, logits, mask, pos)
        return steps.get(0, 0), cached, prefill_s

    def _lockstep_decoder(self) -> Lockstep:
        """The decode loop of one wave, with the rules this wave holds its rows to."""
        return Lockstep(self.fanout.forward, self.tokenizer, self.eos, self.max_row_tokens, self.device,
                        constrain_row=self._constrain_row, done=self._done)

    def _constrain_row(self, job: RequestRows, row: int, logits: torch.Tensor) -> None:
        """Row `row` of `job`: its next-token logits (a view into the batch's) under its constraints, in
        place: masked to its choices (plus their prior) where it has some, kept off null while a
        required row has written nothing."""
        if row in job.tries:
            logits[:] = _constrain(logits, job.tries[row], job.out[row], job.bias.get(row))
        elif job.rows[row].required and not self.tokenizer.decode(job.out[row]).strip():
            logits[self.null_starts()] = float("-inf")  # a required parameter has a value

    def _constraints(self, choices: dict | None) -> tuple[dict, dict]:
        """(tries, bias) of `choices`: each constrained row's choices as token ids, and where they carry a
        prior, its logits (`prior_weight` x prior) per choice."""
        tries = {i: [self._enc(c) for c in cs] for i, cs in (choices or {}).items()}
        bias = {i: [self.prior_weight * float(p) for p in cs.values()]
                for i, cs in (choices or {}).items() if isinstance(cs, dict) and self.prior_weight}
        return tries, bias

    def _enc(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _texts(self, out: list[list[int]]) -> list[str]:
        return [self.tokenizer.decode(o, skip_special_tokens=True) for o in out]

    def null_starts(self) -> torch.Tensor:
        """Ids of the tokens that begin `null` (after any whitespace), which a required parameter's row
        may not write first: no other JSON value starts with "n"."""
        if self._nulls is None:
            self._nulls = torch.tensor(_null_start_ids(self.tokenizer), dtype=torch.long, device=self.device)
        return self._nulls

    def _done(self, ids: list[int]) -> bool:
        """Whether a row's text is finished: its JSON value is complete, or it begins with what no JSON
        value begins with."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        head = text.lstrip()
        return bool(head) and (head[0] not in JSON_STARTS or value_end(text) is not None)


def _group(waves: list[tuple[int, list[int], int]]) -> list[list[tuple[int, list[int]]]]:
    """Waves `(index, prefix ids, rows)` in batches of consecutive ones within MAX_BATCH_TOKENS (elements
    x the longest prefix and call opener), each batch as (index, prefix ids); only those of two or more."""
    groups: list[list[tuple]] = []
    size = longest = 0
    for n, ids, rows in waves:
        width = len(ids) + 64  # its prefix and a call opener
        if groups and (size + rows) * max(longest, width) <= MAX_BATCH_TOKENS:
            groups[-1].append((n, ids))
            size, longest = size + rows, max(longest, width)
        else:
            groups.append([(n, ids)])
            size, longest = rows, width
    return [g for g in groups if len(g) > 1]


def _rows_by_tool(rows: list[Row]) -> dict[str, list[int]]:
    """Each tool's slot rows, as indices into `rows`."""
    by_tool: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if r.kind == "slot" and r.tool is not None:
            by_tool.setdefault(r.tool, []).append(i)
    return by_tool


def _rank(tokenizer, logits: torch.Tensor, names: list[list[int]], bias: list[float] | None,
          by_tool: dict[str, list[int]]) -> list[str]:
    """The offered tools with rows, best first, by the function row's logit for the first token
    of each name plus the name's prior (ties keep their offered order)."""
    scored = []
    for order, ids in enumerate(names):
        name = parse_value(tokenizer.decode(ids, skip_special_tokens=True))
        if ids and isinstance(name, str) and name in by_tool:
            scored.append((-float(logits[ids[0]]) - (bias[order] if bias else 0.0), order, name))
    return [name for _, _, name in sorted(scored)]


def _check_settings(max_rows, top_tools, prior_weight) -> None:
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 2:
        raise ValueError(f"max_rows must be an integer >= 2 (the function row and a slot), got {max_rows!r}")
    if isinstance(top_tools, bool) or not isinstance(top_tools, int) or top_tools < 0:
        raise ValueError(f"top_tools must be an integer >= 0, got {top_tools!r}")
    if isinstance(prior_weight, bool) or not isinstance(prior_weight, (int, float)) \
            or not math.isfinite(prior_weight) or prior_weight < 0:
        raise ValueError(f"prior_weight must be a finite number >= 0 (0 turns the prior off), got {prior_weight!r}")


@functools.lru_cache(maxsize=8)
def _null_start_ids(tokenizer) -> list[int]:
    """The vocabulary's tokens whose text, after any leading whitespace, starts with "n" (one pass over
    the vocabulary, ~0.3 s for SmolLM2's 49k; kept per tokenizer)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return [i for i, t in enumerate(texts) if t.lstrip()[:1] == "n"]


def _constrain(logits: torch.Tensor, choices: list[list[int]], so_far: list[int],
               bias: list[float] | None = None) -> torch.Tensor:
    """Logits masked to the tokens that continue a choice; with `bias` (one per choice), each allowed
    token gains the largest bias among the choices it continues."""
    k = len(so_far)
    allowed: dict[int, float] = {}
    for j, c in enumerate(choices):
        if len(c) > k and c[:k] == so_far:
            b = bias[j] if bias else 0.0
            allowed[c[k]] = max(allowed.get(c[k], b), b)
    if not allowed:
        return logits
    masked = torch.full_like(logits, float("-inf"))
    idx = torch.tensor(sorted(allowed), device=logits.device)
    masked[idx] = logits[idx] + torch.tensor([allowed[t] for t in sorted(allowed)], dtype=logits.dtype,
                                             device=logits.device)
    return masked
