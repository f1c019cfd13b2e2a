"""★ `OoOSpecProposer`: OoO-Spec's drafts inside vLLM, as its `custom_class` proposer.

    LLM(model, speculative_config={"method": "custom_class",
                                   "model": "oospec_agents.vllm.OoOSpecProposer",
                                   "num_speculative_tokens": k})

vLLM builds the class with its `VllmConfig` and calls `propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu, ...)` after every step: one row of ids per running request, no request id, no tools.
Each row is read through its rendered prompt (prompt.py): the assistant header ends the prompt, the
tools are the JSON it holds; a row whose prompt is not recognised gets no drafts. The drafts come from
our drafters (drafts.py). Requests are told apart by their prompt's ids; one that is not in a step's
batch any more has finished (or was preempted), and its reply joins the call memory of its tool set.

Why `custom_class` rather than a plugin that patches vLLM's model runner (as Arctic Inference does for
its suffix proposer): it is vLLM's own, documented entry point, it runs unchanged in process and behind
`vllm serve`, and the prompt already carries everything the drafters need. What it costs: a request is
known by its prompt, so two identical prompts running at once share one drafting state (harmless: the
drafts are only proposals, vLLM verifies every token).
"""
from __future__ import annotations

import time
from collections import OrderedDict

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
        self.replies: OrderedDict[int, ReplyDrafts] = OrderedDict()
        self.stats = {"steps": 0, "rows": 0, "drafted_rows": 0, "draft_tokens": 0, "unrecognised": 0,
                      "by_source": {}, "propose_s": 0.0}

    def load_model(self, *args, **kwargs) -> None:
        """vLLM hands its drafter the target model; drafting needs none."""

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None,
                **kwargs) -> list[list[int]]:
        """One list of draft ids (at most k) per row of the batch; an empty list drafts nothing."""
        t0 = time.perf_counter()
        seen: set[int] = set()
        out = [self._row(sampled, int(num_tokens_no_spec[i]), token_ids_cpu[i], seen)
               for i, sampled in enumerate(sampled_token_ids)]
        self._retire(seen)
        self.stats["steps"] += 1
        self.stats["propose_s"] += time.perf_counter() - t0
        return out

    def _row(self, sampled, n: int, row, seen: set[int]) -> list[int]:
        if not len(sampled) or (self.max_model_len is not None and n >= self.max_model_len):
            return []  # a partial prefill, or a request at the end of its context: vLLM skips these
        self.stats["rows"] += 1
        ids = row[:n].tolist()
        reply = self._reply(ids)
        if reply is None:
            self.stats["unrecognised"] += 1
            return []
        seen.add(reply.view.key)
        reply.update(ids)
        if self.hints is not None and not reply.state.hint:
            hint = self.hints.poll(reply.view.key)
            if hint:
                reply.set_hint(hint)
        draft, source = reply.propose(self.k)
        if draft:
            self.stats["drafted_rows"] += 1
            self.stats["draft_tokens"] += len(draft)
            self.stats["by_source"][source] = self.stats["by_source"].get(source, 0) + 1
        return draft

    def _reply(self, ids: list[int]) -> ReplyDrafts | None:
        """The drafting state of the request whose ids these are; a new one at its first step."""
        view = self.reader.read(ids)
        if view is None:
            return None
        reply = self.replies.get(view.key)
        if reply is not None:
            self.replies.move_to_end(view.key)
            return reply
        reply = ReplyDrafts(view, ids, self.reader.fmt, self.reader.tokenizer, self.memory)
        self.replies[view.key] = reply
        if self.hints is not None and view.tools:
            self.hints.open(view.key, ids[:view.n_prompt], list(view.tools))
        while len(self.replies) > MAX_REQUESTS:
            self._forget(next(iter(self.replies)))
        return reply

    def _retire(self, seen: set[int]) -> None:
        """Requests not in this step's batch have finished: their replies join the call memory."""
        for key in [k for k in self.replies if k not in seen]:
            self._forget(key)

    def _forget(self, key: int) -> None:
        reply = self.replies.pop(key)
        reply.finish()
        if self.hints is not None:
            self.hints.close(key)


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
