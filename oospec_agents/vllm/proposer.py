"""★ `OoOSpecProposer`: OoO-Spec's drafts inside vLLM, as its `custom_class` proposer.

    LLM(model, speculative_config={"method": "custom_class",
                                   "model": "oospec_agents.vllm.OoOSpecProposer",
                                   "num_speculative_tokens": k})

vLLM builds the class with its `VllmConfig` and calls `propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, ...)` after every step: one row of ids per running request, no request id, no tools.
Each row is read through its rendered prompt (prompt.py): the assistant header ends the prompt, the
tools are the JSON it holds; a row whose prompt is not recognised gets no drafts. The drafts come from
our drafters (drafts.py). vLLM names no request to the proposer: a row is matched to the drafting
state of its prompt's ids whose reply so far its own ids continue (the longest such), so identical
prompts in flight at once each keep a state of their own. A state no row of a step claims has finished
(or was preempted), and its reply joins the call memory of its tool set.

`stats` counts steps, rows, drafts by drafter and format, and `propose_s` (the proposer's own time).
With OOSPEC_VLLM_STATS=<path> they are written there (JSON) after every step, for a caller outside
vLLM's worker (the bench); a file `<path>.reset` makes it forget earlier replies.

Why `custom_class` rather than a plugin that patches vLLM's model runner (as Arctic Inference does for
its suffix proposer): it is vLLM's own, documented entry point, it runs unchanged in process and behind
`vllm serve`, and the prompt already carries everything the drafters need. What it costs: a request is
known by its prompt and its reply so far, not by vLLM's request id.
"""
from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from itertools import count

from ..drafters.retrieval import CallMemory
from .drafts import ReplyDrafts
from .prompt import PromptReader

#: requests whose drafting state is kept at once (a step's batch is far smaller)
MAX_REQUESTS = 1024


class OoOSpecProposer:
    """vLLM's `custom_class` proposer: schema, retrieval (prompt, reply, call memory) and hint drafts.

    vLLM passes only `vllm_config` (k is its `num_speculative_tokens`, the tokenizer its model's). The
    keywords are for use outside vLLM: `tokenizer`, `k`, and `hints` (an object with `open`, `poll` and
    `close`, as hints.SidecarHints; None: the sidecar OOSPEC_VLLM_SIDECAR names, if any)."""

    def __init__(self, vllm_config=None, *, tokenizer=None, k: int | None = None, hints=None,
                 memory_size: int = 32):
        spec = getattr(vllm_config, "speculative_config", None)
        self.k = int(k if k is not None else getattr(spec, "num_speculative_tokens", 0) or 0)
        if self.k < 1:
            raise ValueError(f"OoOSpecProposer needs num_speculative_tokens >= 1, got {self.k}")
        model_config = getattr(vllm_config, "model_config", None)
        self.max_model_len = getattr(model_config, "max_model_len", None)
        if tokenizer is None:
            tokenizer = _load_tokenizer(model_config)
        self.reader = PromptReader(tokenizer)
        self.memory = CallMemory(size=memory_size)
        self.hints = hints if hints is not None else _hints_from_env(self.reader)
        #: prompt key -> the drafting states of the requests with that prompt (usually one)
        self.replies: OrderedDict[int, list[ReplyDrafts]] = OrderedDict()
        self._uid = count()
        self.layouts: dict = {}  # the whitespace of vLLM's JSON formats, learnt from finished replies
        self.stats = {"steps": 0, "rows": 0, "drafted_rows": 0, "draft_tokens": 0, "unrecognised": 0,
                      "by_source": {}, "formats": {}, "propose_s": 0.0, "requests": 0, "hinted": 0}
        self.stats_path = os.environ.get("OOSPEC_VLLM_STATS") or None

    def load_model(self, *args, **kwargs) -> None:
        """vLLM hands its drafter the target model; drafting needs none."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **kwargs) -> list[list[int]]:
        """One list of draft ids (at most k) per row of the batch; an empty list drafts nothing."""
        t0 = time.perf_counter()
        if self.stats_path and os.path.exists(self.stats_path + ".reset"):
            self._reset()
        seen: set[int] = set()
        out = [self._row(sampled, int(num_tokens_no_spec[i]), token_ids_cpu[i], seen)
               for i, sampled in enumerate(sampled_token_ids)]
        self._retire(seen)
        self.stats["steps"] += 1
        self.stats["propose_s"] += time.perf_counter() - t0
        if self.stats_path:
            self._write_stats()
        return out

    def _reset(self) -> None:
        """Forget earlier replies (call memory, learnt whitespace): the bench asks it (`<OOSPEC_VLLM_STATS>.reset`)
        before each run, so a run over the same records again starts as the first did."""
        os.remove(self.stats_path + ".reset")
        for states in self.replies.values():  # the last run's requests have ended: not remembered
            for reply in states:
                if self.hints is not None:
                    self.hints.close(reply.uid)
        self.replies.clear()
        self.memory.clear()
        self.layouts.clear()

    def _write_stats(self) -> None:
        stats = self.stats
        tmp = f"{self.stats_path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, self.stats_path)

    def _row(self, sampled, n: int, row, seen: set[int]) -> list[int]:
        if not len(sampled) or (self.max_model_len is not None and n >= self.max_model_len):
            return []  # a partial prefill, or a request at the end of its context: vLLM skips these
        self.stats["rows"] += 1
        ids = row[:n].tolist()
        reply = self._reply(ids, seen)
        if reply is None:
            self.stats["unrecognised"] += 1
            return []
        seen.add(reply.uid)
        had_format = reply.fmt is not None
        reply.update(ids)
        if reply.fmt is not None and not had_format:
            self.stats["formats"][reply.fmt.name] = self.stats["formats"].get(reply.fmt.name, 0) + 1
        if self.hints is not None and not reply.hint:
            hint = self.hints.poll(reply.uid)
            if hint:
                reply.set_hint(hint)
                self.stats["hinted"] += 1
        draft, source = reply.propose(self.k)
        if draft:
            self.stats["drafted_rows"] += 1
            self.stats["draft_tokens"] += len(draft)
            self.stats["by_source"][source] = self.stats["by_source"].get(source, 0) + 1
        return draft

    def _reply(self, ids: list[int], seen: set[int]) -> ReplyDrafts | None:
        """The drafting state of the request whose ids these are: of the states of its prompt not yet
        claimed this step, the one with the longest reply that `ids` continue; a new one at its first step."""
        view = self.reader.read(ids)
        if view is None:
            return None
        states = self.replies.get(view.key)
        if states is not None:
            self.replies.move_to_end(view.key)
            out = ids[view.n_prompt:]
            fits = [r for r in states if r.uid not in seen and out[:len(r.output)] == r.output]
            if fits:
                return max(fits, key=lambda r: len(r.output))
        reply = ReplyDrafts(view, ids, self.reader.fmt, self.reader.tokenizer, self.memory, next(self._uid),
                            self.layouts)
        self.replies.setdefault(view.key, []).append(reply)
        self.stats["requests"] += 1
        if self.hints is not None and view.tools:
            self.hints.open(reply.uid, ids[:view.n_prompt], list(view.tools))
        while sum(map(len, self.replies.values())) > MAX_REQUESTS:
            self._forget(next(iter(self.replies)), None)
        return reply

    def _retire(self, seen: set[int]) -> None:
        """Requests not in this step's batch have finished: their replies join the call memory."""
        for key in list(self.replies):
            self._forget(key, seen)

    def _forget(self, key: int, keep: set[int] | None) -> None:
        """The states of prompt `key` that are not in `keep` end (all of them where `keep` is None)."""
        states = self.replies.pop(key)
        kept = [r for r in states if keep is not None and r.uid in keep]
        for reply in states:
            if reply not in kept:
                reply.finish()
                if self.hints is not None:
                    self.hints.close(reply.uid)
        if kept:
            self.replies[key] = kept


def _load_tokenizer(model_config):
    """The target's tokenizer, as vLLM was told to load it."""
    if model_config is None:
        raise ValueError("OoOSpecProposer needs a vllm_config with a model_config, or tokenizer=")
    from transformers import AutoTokenizer
    name = getattr(model_config, "tokenizer", None) or model_config.model
    return AutoTokenizer.from_pretrained(name, trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)))


def _hints_from_env(reader):
    """The sidecar's hints where OOSPEC_VLLM_SIDECAR names one (hints.py), else none."""
    from .hints import hints_from_env
    return hints_from_env(reader)
