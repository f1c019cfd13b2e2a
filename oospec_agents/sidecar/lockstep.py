"""The wave's inner loop: rows decoded greedily in lockstep, one batch element each, under their
constraints, each leaving the batch once its JSON value is complete.

A row constrained to a few choices (the function row: the offered tool names) stops once only one choice
is left, which it completes; once a function row has chosen, its request's rows of every other tool leave
the batch. What a row's logits pass (its choices, their prior, no null for a required row) is the wave's
rule (`Wave._constrain_row`), handed to the loop. The rows may be one request's or several requests'
(`Wave.many`): each request's rows are a `RequestRows`.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from .rows import Row, parse_value


@dataclass(eq=False)
class RequestRows:
    """One request's rows in a decode loop: its constraints, and where its tokens and scores go."""
    rows: list[Row]
    tries: dict        # row -> its choices, as token ids
    bias: dict         # row -> the prior of each choice, in logits
    out: list          # row -> the tokens it generated
    scores: list       # row -> its log-probability (None: not decoded)
    cancel: threading.Event | None = None
    #: row -> (margin, token prefix) of its closest runner-up choice (`_note_runner_ups`)
    runner: dict = field(default_factory=dict)

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


class Lockstep:
    """One decode of (job, row) items in lockstep, built for it with what it reads: the model's `forward`
    over a fanned-out cache, the tokenizer, the end-of-sequence ids, the most tokens a row writes, the
    rule a row's next-token logits pass (`constrain_row(job, row, logits)`, in place) and when a row's
    text is `done`."""

    def __init__(self, forward, tokenizer, eos: set[int], max_row_tokens: int, device: torch.device, *,
                 constrain_row: Callable[[RequestRows, int, torch.Tensor], None],
                 done: Callable[[list[int]], bool]):
        self.forward, self.tokenizer, self.eos = forward, tokenizer, eos
        self.max_row_tokens, self.device = max_row_tokens, device
        self.constrain_row, self.done = constrain_row, done

    def decode(self, items: list[tuple[RequestRows, int]], cache, logits, mask, pos) -> dict[int, int]:
        """Decode every (job, row) item in lockstep, one batch element each, until its JSON value is
        complete: the rows of one request or of several (`Wave.many`). Each row's logits pass its
        constraints (`constrain_row`); once a function row has chosen, its job's rows of the other tools
        leave the batch; a job whose `cancel` is set leaves it at the next step. Returns the steps each
        job decoded (by its position among the items' jobs, in order of first appearance)."""
        order = {job: n for n, job in enumerate(dict.fromkeys(job for job, _ in items))}  # jobs hash by identity
        live = list(range(len(items)))      # the item of each batch element still decoding
        steps: dict[int, int] = {}
        for job, i in items:
            job.scores[i] = 0.0
        for _ in range(self.max_row_tokens):
            if all(items[k][0].cancelled() for k in live):
                break
            last = logits[:, -1]
            for b, k in enumerate(live):
                self.constrain_row(*items[k], last[b])
            scores = last.float()  # exact; the argmax of float32 rows is a third of bf16's on the CPU
            tokens = scores.argmax(-1)
            logprobs = scores.log_softmax(-1)
            chosen = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
            _note_runner_ups(items, live, logprobs)
            for k, lp in zip(live, chosen):
                job, row = items[k]
                job.scores[row] += lp
            for n in {order[items[k][0]] for k in live}:
                steps[n] = steps.get(n, 0) + 1  # one more token for every live row of job n
            done = self._finished(items, live, tokens.tolist())
            keep = [b for b, k in enumerate(live) if k not in done and not items[k][0].cancelled()]
            if not keep:
                break
            if len(keep) < len(live):
                sel = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(sel)
                tokens, mask, pos = tokens[sel], mask[sel], pos[sel]
                live = [live[b] for b in keep]
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            logits = self.forward(tokens[:, None], cache, mask, pos[:, None])
            pos = pos + 1
        return steps

    def _finished(self, items: list[tuple[RequestRows, int]], live: list[int], tokens: list[int]) -> set[int]:
        """Append each live item's token; the items that are done: their value complete, or ruled out by
        their job's function row, which has just chosen another tool (they cannot reach the call)."""
        done, ruled_out = set(), set()
        for k, t in zip(live, tokens):
            job, row = items[k]
            if self._append(job.out[row], t, job.tries.get(row)):
                done.add(k)
                if job.rows[row].kind == "function":
                    name = parse_value(self.tokenizer.decode(job.out[row], skip_special_tokens=True))
                    ruled_out |= {k2 for k2, (j2, i2) in enumerate(items)
                                  if j2 is job and j2.rows[i2].tool not in (None, name)}
        return done | ruled_out

    def _append(self, out: list[int], token: int, choices: list[list[int]] | None) -> bool:
        """Add a row's token; True when the row is finished."""
        if token in self.eos:
            return True
        out.append(token)
        if choices is not None:
            left = [c for c in choices if c[:len(out)] == out]
            if len(left) == 1:
                out[:] = left[0]  # the only choice left: complete it
                return True
        return self.done(out)


def _note_runner_ups(items: list[tuple[RequestRows, int]], live: list[int], logprobs: torch.Tensor) -> None:
    """For each live constrained row, before its token is appended: where its second-best allowed token
    comes closer to its best than at any earlier step, that token's place (the row's tokens so far
    and it) and the margin, in `job.runner`. A slot row's first token alone: its runner-up there."""
    for b, k in enumerate(live):
        job, row = items[k]
        if row not in job.tries and (job.out[row] or job.rows[row].kind != "slot"):
            continue
        top = logprobs[b].topk(2)
        second = float(top.values[1])
        if not math.isfinite(second):
            continue
        margin = float(top.values[0]) - second
        if row not in job.runner or margin < job.runner[row][0]:
            job.runner[row] = (margin, list(job.out[row]) + [int(top.indices[1])])


def runner_ups(tokenizer, tries: dict, bias: dict, runner: dict) -> dict[int, tuple[str, float]]:
    """Each constrained row's runner-up choice (the best-prior choice through its closest second token)
    as text, with its margin (`WaveResult.runner_ups`); `tries`, `bias` and `runner` as a `RequestRows` holds them."""
    out = {}
    for row, (margin, head) in runner.items():
        if row not in tries:  # a slot row's first token: its runner-up's beginning
            out[row] = (tokenizer.decode(head, skip_special_tokens=True), margin)
            continue
        fits = [j for j, c in enumerate(tries[row]) if c[:len(head)] == head]
        if fits:
            best = max(fits, key=lambda j: bias[row][j] if row in bias else 0.0)
            out[row] = (tokenizer.decode(tries[row][best], skip_special_tokens=True), margin)
    return out
