"""The decode loop: draft, verify in one target forward, commit, roll back -- until a stop.

    hint = hints.poll(reply)                  non-blocking; the sidecar's call as target-format text
    drafts = prediction + hint + schema + retrieval   each behind the one Drafter interface
    path, next_token = verify(tree(drafts))   one target forward; greedy acceptance, or a seeded draw
                                              per node when the request samples (sampling.py)
    commit path + next_token; crop the KV cache past rejected nodes; emit the new events

The target is the only model that commits tokens, so the output equals its greedy decoding, or when
the request samples, is distributed as its sampling. Under a grammar (strict), a token the grammar
forces (the only one its mask allows) is committed at once without the target (jump-forward): it
enters the KV cache in the next forward, ahead of the drafts.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator, Union

import torch

from .calllog import DEFAULT_MAX_MB as DEFAULT_LOG_MB
from .calllog import open_call_log
from .chat import normalize_messages, render_prompt, require_chat_template, template_kwargs, template_renders_tools
from . import batching
from . import deterministic as det
from .batching import Batcher, Job
from .drafters import HintDrafter, PredictionDrafter, ReplyState, RetrievalDrafter, SchemaDrafter
from .drafters.prediction import Prediction, matched_tokens, prediction_text
from .drafters.retrieval import CallMemory
from .errors import AdapterError, ContextLengthError, OoOSpecError, PredictionError
from .events import CallPredicted, LogprobsDelta, ReasoningDelta, ReplyEvents, TextDelta, ToolCallDelta, ToolCallReady
from .finish import read_reply
from .formats import Reasoning, ToolFormat, detect_format, detect_reasoning
from .gcheap import freeze_gc_heap
from .grammar import Grammars, Guide, StrictLogitsProcessor, response_schema
from .prefix_cache import DEFAULT_TOKENS as DEFAULT_PREFIX_TOKENS
from .prefix_cache import PrefixCache
from .sampling import Choice, Sampling, TokenLogprob, check_logprobs
from .sidecar import FixedHint, HintRequest, Sidecar, check_sidecar
from .sidecar import cores, layout
from .sidecar.payback import DEFAULT_RATIO, PayBack
from .sidecar.session import HintSession, Outcome, follows_up
from .stats import SOURCES, DecodeStats
from .tools import Tool, normalize_tools, resolve_tool_choice
from .verify import Verifier, build_tree, eos_ids

log = logging.getLogger(__name__)

METHODS = ("ar", "toolspec", "oospec")
#: how prompts are prefilled (`Verifier.plan_prefill`): None, the default, feeds a prompt's uncached tail in
#: one forward, exact (a cache hit is the cold prefill bit for bit) where the target takes it (bf16 on a
#: CPU that has it), for what one plain forward costs (docs/deterministic.md, "Cold against warm"); 1: one
#: plain forward; 256: forwards of 256, exact on any target but slower
PREFILL_CHUNK = None
__all__ = ["Engine", "Generation", "Prepared", "METHODS", "SOURCES"]


@dataclass
class Generation:
    """One reply. Its calls are classed as OpenAI classes them (`tools.CheckedCalls`): a call whose
    arguments parse as a JSON object is in `tool_calls`, even when it misfits its tool's schema or names
    a tool that was not offered, and that problem is reported beside it in `tool_call_problems`
    ({"id" of the call, "name", "error": the validator's message}); only a call that cannot be read
    (arguments that do not parse or are no object, a call cut off) is in `invalid_tool_calls`. Under
    `strict` the calls fit their schemas. `finish_reason` is "length" when `max_new_tokens` cut the
    reply off; else "tool_calls" when it holds any call (valid, misfit or invalid), else "stop".
    Where the template reasons, `reasoning` is the reply's reasoning block without its markers, and
    content and calls are read from the text after it (a reply cut off while reasoning has none)."""
    text: str                       # the whole assistant reply as generated, forced opener included
    token_ids: list[int]            # the new tokens only (after `Engine.prompt_ids`)
    tool_calls: list[dict]          # {"id", "name", "arguments": dict}, each checked against its schema
    invalid_tool_calls: list[dict]  # {"id", "name", "arguments": str, "error"}
    stats: DecodeStats
    content: str = ""               # the reply's text outside tool calls
    finish_reason: str = "stop"     # "stop" | "length" | "tool_calls"
    prompt_tokens: int = 0
    logprobs: list[dict] | None = None  # with `logprobs`: per new token, OpenAI's {"token", "logprob", ...}
    tool_call_problems: list[dict] = field(default_factory=list)  # {"id", "name", "error"} per misfit call
    reasoning: str | None = None    # the reasoning block's text; None when the reply has none


Event = Union[ReasoningDelta, TextDelta, ToolCallDelta, ToolCallReady, CallPredicted, LogprobsDelta, Generation]


@dataclass
class Prepared:
    """A request checked and rendered: what the decode loop needs, and nothing it has to look up."""
    messages: list[dict]
    tools: list[Tool]
    choice: tuple[str, str | None]
    prefix: str                     # assistant text forced by tool_choice in the prompt (none after reasoning)
    prompt_ids: list[int]
    max_new_tokens: int
    stop: list[str] = field(default_factory=list)
    guide: Guide | None = None      # the reply's grammar state under strict (grammar.py), else None
    sampling: Sampling = field(default_factory=Sampling)  # greedy unless it has a temperature
    top_logprobs: int | None = None  # logprobs asked for: alternatives per token (None: none asked)
    reasoning: Reasoning | None = None  # how the reply reasons (formats/reasoning.py); None: it does not
    tool_s: float | None = None     # the mean expected seconds of the speculative tools on offer (None: none known)


class Engine:
    """A target model (the sole verifier) plus an optional sidecar that posts call hints."""

    _shared: dict[tuple, "Engine"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, target, tokenizer, sidecar=None, *, fmt: ToolFormat | None = None,
                 model_name: str | None = None, max_draft_nodes: int = 48, memory_size: int = 32,
                 prefix_cache_tokens: int = DEFAULT_PREFIX_TOKENS, wave_payback: float | None = DEFAULT_RATIO,
                 hint_follow_up: bool | None = None, target_cores: frozenset[int] | None = None,
                 prefill_chunk: int | None = PREFILL_CHUNK, deterministic: bool = False, call_log=None,
                 call_log_max_mb: float = DEFAULT_LOG_MB, call_log_tool_results: bool = False,
                 max_batch: int = batching.DEFAULT_MAX_BATCH):
        """`memory_size`: earlier replies kept per tool set for retrieval drafting (0 turns it off).
        `prefix_cache_tokens`: KV of recent prompts kept for reuse, in tokens (0 turns it off).
        `wave_payback`: a sidecar on the target's own CPU runs its wave only when the wave's expected
        seconds are at most this share of the expected decode (sidecar/payback.py); None always runs it.
        `hint_follow_up`: when the target writes a function the hint does not call, ask the sidecar for
        that function's slots alone (sidecar/session.py); None, the default, does so where the sidecar
        has cores of its own (a follow-up on the target's own CPU cores costs more than it saves).
        `prefill_chunk`: None, the default, prefills the uncached tail in one forward, and on a bf16 CPU
        target (sdpa, full attention) exactly: a warm request's reply is the cold one bit for bit
        (`Verifier.plan_prefill`); 1 is one plain forward (a warm reply may then differ from the cold
        one in bf16); more than 1: chunks that end at multiples of it (absolute positions), a cache hit
        whole chunks (exact on any target, slower: docs/deterministic.md).
        `deterministic`: the same request gives the same tokens whatever the method, the draft tree and
        the concurrency, in bf16 too: every decode forward of a reply has the same shapes (deterministic.py,
        docs/deterministic.md); prompts are then prefilled exactly (one exact forward, else chunks of 256)
        unless `prefill_chunk` is more than 1.
        `call_log`: a file path (or a `CallLog`) where every reply whose calls the target wrote and that
        all fit their schemas appends one training record for the sidecar (calllog.py; off by default).
        It stores prompts; a tool's result only with `call_log_tool_results`; it keeps to `call_log_max_mb`.
        `max_batch`: replies decoding at the same time (from several threads, or an async front-end's
        executor) share each verify forward, up to this many (batching.py); 1 verifies one reply's tree a
        forward. Each reply still gets the tokens it gets alone (its attention runs over its own keys).
        `target_cores`: the CPU cores the target keeps to itself (`from_pretrained(target_device="cpu:0-5")`
        pins the process to them); None, the default, is every core, shared with a CPU sidecar."""
        require_chat_template(tokenizer)
        self.target = target
        self.tokenizer = tokenizer
        self.sidecar: Sidecar | None = None if sidecar is None else check_sidecar(sidecar)
        self.fmt = fmt or detect_format(getattr(tokenizer, "chat_template", None))
        self.reasoning = detect_reasoning(getattr(tokenizer, "chat_template", None))  # None: it does not reason
        # Templates that render `tools=` get them natively; others (SmolLM2) get the format's prompt.
        self.native_tools = template_renders_tools(tokenizer)
        self.model_name = model_name or getattr(target.config, "_name_or_path", None) or type(target).__name__
        self.context_window = int(getattr(target.config, "max_position_embeddings", 0) or 2048)
        self.max_draft_nodes = max_draft_nodes
        self.memory = CallMemory(memory_size)
        self.deterministic = bool(deterministic)
        self._verifier = Verifier(target)
        self.prefix_cache = PrefixCache(prefix_cache_tokens,
                                        *self._verifier.plan_prefill(prefill_chunk, self.deterministic))
        self.payback = None if wave_payback is None else PayBack(wave_payback)
        self.call_log = open_call_log(call_log, max_mb=call_log_max_mb, tool_results=call_log_tool_results)
        self.hint_follow_up = hint_follow_up
        self.eos_ids = eos_ids(target)
        if self.deterministic and any(w is not None for w in self._verifier.layout.windows.values()):
            raise OoOSpecError(f"deterministic=True takes a target whose layers all attend to the whole past; "
                               f"{type(target).__name__} has sliding-window layers")
        self.place = cores.Place(self._verifier.device, target_cores)  # where the target decodes
        self._pinned: cores.Pinned | None = None  # what pinning the process to `target_cores` changed
        self._reply_text = ReplyText(tokenizer, self.fmt)
        self._drafters = {"schema": SchemaDrafter(), "retrieval": RetrievalDrafter(), "hint": HintDrafter(),
                          "prediction": PredictionDrafter()}
        self._grammars = Grammars(tokenizer, self.fmt, self.eos_ids, target.config.get_text_config().vocab_size)
        # Replies from several threads share the target: their verify forwards are batched, the rest take
        # turns (batching.py). `batching_refusal`: why this target's rounds are not batched (None: they are).
        self.batching_refusal = batching.install(target, self._verifier.layout.windows, (det.EXACT_ATTENTION,)) \
            if max_batch > 1 else "max_batch=1"
        # the forward holds the target, not the engine: an engine dropped is freed (no cycle through it)
        self._batcher = Batcher(functools.partial(batching.batched_forward, target, self._verifier.cache_kw,
                                                  device=self._verifier.device),
                                max_batch, batched=self.batching_refusal is None)
        self._logged_faults: set[str] = set()
        self._jump_forward = True  # private switch: tests compare forwards without it

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, target="embedded", sidecar=None, *, target_device=None, sidecar_device=None,
                        dtype=None, **kw) -> "Engine":
        """Load a target (HF id, local path, GGUF file, "embedded", or "embedded-thinking": the embedded
        target with the adapter and template that make it reason in a `<think>` block first) and an
        optional sidecar.

        `sidecar` is a model reference like `target` or an object implementing the Sidecar protocol.
        None (the default) is the embedded sidecar, for every target: it only posts text, rendered in
        the target's own format, so any target can verify its hints. `sidecar=False` loads none.
        `sidecar_*` keywords (`sidecar_timeout_s`, `sidecar_threads`, `sidecar_placement` = "auto" | "thread" |
        "process", ...) configure a loaded sidecar; `chat_template`
        (a Jinja string, or the path of a file holding one) replaces the target tokenizer's own;
        `freeze_gc` (default True) freezes the process's heap for the garbage collector once
        everything is loaded, so that its full passes (200+ ms over a loaded engine's objects) stop
        landing inside target forwards (gcheap.py); the rest go to `Engine(...)`.
        """
        from . import models
        t_where, s_where = (None if d is None else cores.place(d) for d in (target_device, sidecar_device))
        t_dev, s_dev = models.default_devices(*(None if w is None else w.device for w in (t_where, s_where)))
        t_where, s_where = (cores.Place(dev, None if w is None else w.cores)
                            for dev, w in ((t_dev, t_where), (s_dev, s_where)))
        if target_device is None and sidecar_device is None:  # where auto finds a split faster, a split
            t_where, s_where = _auto_layout(sidecar, t_where, kw) or (t_where, s_where)
        cores.check_split(t_where, s_where)  # before anything loads
        t_dtype = models.resolve_dtype(dtype, t_dev)
        adapter = kw.pop("adapter", None)
        chat_template = kw.pop("chat_template", None)
        freeze_gc = kw.pop("freeze_gc", True)
        sidecar_kw = {k: kw.pop(k) for k in list(kw) if k.startswith("sidecar_")}
        name = None
        if str(target) == models.EMBEDDED_THINKING_REF:  # the embedded target taught to think before it answers
            target, name = "embedded", "embedded-thinking:SmolLM2-135M-Instruct"
            adapter = models.EMBEDDED_THINKING_ADAPTER if adapter is None else adapter
            chat_template = models.THINKING_CHAT_TEMPLATE if chat_template is None else chat_template
        if str(target) == "embedded" and adapter is None and models.EMBEDDED_TARGET_ADAPTER.exists():
            adapter = models.EMBEDDED_TARGET_ADAPTER
        model, tok = models.load_model(target, device=t_dev, dtype=t_dtype, adapter=adapter,
                                       chat_template=chat_template)
        require_chat_template(tok)  # before a sidecar loads for nothing
        sidecar = "embedded" if sidecar is None else None if sidecar is False else sidecar
        side = cls._load_sidecar(sidecar, s_where, models.resolve_dtype(dtype, s_dev), sidecar_kw)
        name = name or ("embedded:SmolLM2-135M-Instruct" if str(target) == "embedded" else str(target))
        engine = cls(model, tok, side, model_name=name, target_cores=t_where.cores, **kw)
        if t_where.cores is not None:  # loaded on every core; decodes on its own
            engine._pinned = cores.pin_process(t_where.cores)
        if freeze_gc:
            freeze_gc_heap()
        return engine

    @staticmethod
    def _load_sidecar(ref, where: cores.Place, dtype, sidecar_kw: dict):
        """A model reference is loaded; an object is taken as the sidecar itself (checked in `__init__`)."""
        if ref is None or not isinstance(ref, (str, os.PathLike)):
            return ref
        from .sidecar.load import load_sidecar
        return load_sidecar(ref, device=str(where), dtype=dtype, **sidecar_kw)

    @classmethod
    def shared(cls, target="embedded", sidecar=None, **kw) -> "Engine":
        """A process-wide engine per distinct set of arguments, so chat-model objects share one."""
        key = (str(target), sidecar if isinstance(sidecar, (str, bool, type(None))) else id(sidecar),
               tuple(sorted((k, str(v)) for k, v in kw.items() if v is not None)))
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls.from_pretrained(target, sidecar, **kw)
            return cls._shared[key]

    # ------------------------------------------------------------------ requests

    def prepare(self, messages, tools=None, tool_choice="auto", max_new_tokens: int = 256, stop=None,
                strict: bool = False, response_format=None, chat_template_kwargs=None,
                reasoning_effort=None) -> Prepared:
        """Check a request and render its prompt; bad input raises here, naming the problem. `strict`
        constrains the reply to valid calls of the offered tools (grammar.py); without it, the tools
        flagged `"strict": true` are constrained. `response_format` (OpenAI's: `json_object`, or
        `json_schema` with its schema) makes a reply that calls no tool one JSON value of that schema,
        as OpenAI does: the whole reply without tools, the alternative to calls under `auto`, nothing
        where `tool_choice` forces a call. `chat_template_kwargs` (e.g. `{"enable_thinking": False}`)
        and `reasoning_effort` go to the chat template, which must read them (chat.template_kwargs).

        Where the reply reasons (formats/reasoning.py), a call that `tool_choice` forces comes after the
        reasoning, not in the prompt: the grammar forces its opener there (grammar.py)."""
        msgs = normalize_messages(messages)
        tool_list = normalize_tools(tools)
        mode, name = resolve_tool_choice(tool_choice, tool_list)
        schema = response_schema(response_format)
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise OoOSpecError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        kwargs = template_kwargs(self.tokenizer.chat_template, chat_template_kwargs, reasoning_effort)
        offered = [] if mode == "none" else tool_list
        prompt = render_prompt(self.tokenizer, self.fmt, msgs, offered, self.native_tools, kwargs)
        reasoning = None if self.reasoning is None else self.reasoning.for_prompt(prompt)
        forced = {"required": self.fmt.forced_prefix(), "named": self.fmt.forced_prefix(name)}.get(mode, "")
        prefix = "" if reasoning is not None else forced
        ids = self.tokenizer.encode(prompt + prefix, add_special_tokens=False)
        if len(ids) + 1 > self.context_window:
            raise ContextLengthError(f"the prompt is {len(ids)} tokens, over the target's context window of "
                                     f"{self.context_window} tokens")
        stop = [stop] if isinstance(stop, str) else stop
        if stop is None:
            stop = []
        elif not isinstance(stop, (list, tuple)):
            raise OoOSpecError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
        for i, s in enumerate(stop):
            if not isinstance(s, str) or not s:
                raise OoOSpecError(f"stop[{i}] is {s!r}; every stop sequence must be a non-empty string")
        guide = self._grammars.json_guide(schema, reasoning) if schema is not None and not offered \
            else self._grammars.guide(offered, mode, name, strict, reply=schema, reasoning=reasoning)
        return Prepared(msgs, offered, (mode, name), prefix, ids, min(max_new_tokens, self.context_window - len(ids)),
                        list(stop), guide, reasoning=reasoning)

    def prompt_ids(self, messages, tools=None, *, tool_choice="auto", chat_template_kwargs=None,
                   reasoning_effort=None) -> list[int]:
        """The exact ids the target is conditioned on before its first free token (a forced call's
        opener included, except where the reply reasons first: then the opener follows the reasoning,
        and `logits_processor(..., strict=False)` is the reference that forces it)."""
        return list(self.prepare(messages, tools, tool_choice, chat_template_kwargs=chat_template_kwargs,
                                 reasoning_effort=reasoning_effort).prompt_ids)

    def logits_processor(self, messages, tools=None, *, tool_choice="auto", strict: bool = True, response_format=None,
                         chat_template_kwargs=None, reasoning_effort=None) -> StrictLogitsProcessor:
        """The masked reference of a strict request: `target.generate(prompt_ids, logits_processor=[it],
        do_sample=False)` is what `generate(..., strict=True)` must reproduce (or, with a JSON
        `response_format`, `generate(..., response_format=...)`; or, for a reply that reasons before
        the call `tool_choice` forces, `generate(...)` with `strict=False`). Single use."""
        req = self.prepare(messages, tools, tool_choice, strict=strict, response_format=response_format,
                           chat_template_kwargs=chat_template_kwargs, reasoning_effort=reasoning_effort)
        return StrictLogitsProcessor(req.guide, len(req.prompt_ids))

    def generate(self, messages, tools=None, *, tool_choice="auto", max_new_tokens: int = 256,
                 method: str = "oospec", stop=None, hint: str | None = None, **kw) -> Generation:
        """Decode a reply: greedily, or with a `temperature` (and `top_p`, `top_k`, `min_p`, `seed`)
        by sampling that keeps the target's distribution (sampling.py); `logprobs=True` (or the number
        of alternatives per token, up to 20) returns each new token's log-probability. `hint` injects a fixed call text instead of the sidecar's; `strict=True`
        decodes under the grammar of valid calls, and a JSON `response_format` under its schema's (the
        reference of both is `logits_processor`); `prediction` (OpenAI's Predicted Outputs: the text, or
        `{"type": "content", "content": ...}`) is drafted wherever the reply agrees with it;
        `chat_template_kwargs` and `reasoning_effort` go to the chat template (`prepare`)."""
        gen = None
        for item in self.stream(messages, tools, tool_choice=tool_choice, max_new_tokens=max_new_tokens,
                                method=method, stop=stop, hint=hint, **kw):
            gen = item
        return gen

    def stream(self, messages, tools=None, *, tool_choice="auto", max_new_tokens: int = 256,
               method: str = "oospec", stop=None, hint: str | None = None,
               record_margins: bool = False, cancel: threading.Event | None = None,
               strict: bool = False, response_format=None, prediction=None, temperature: float | None = None,
               top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
               seed: int | None = None, logprobs: bool | int | None = None, chat_template_kwargs=None,
               reasoning_effort=None, speculative_tools: dict | None = None) -> Iterator[Event]:
        """Yield `ReasoningDelta`s, `TextDelta`s and `ToolCallDelta`s in the round that commits their
        tokens, a `ToolCallReady` in the round a call's arguments close (one per `Generation.tool_calls`
        entry), a `CallPredicted` in the round the sidecar's hint is first read (a prediction, never a
        verified call: `oospec` only), then the final `Generation`. A consumer ignores the events it does not use.
        `speculative_tools` (`{name: expected seconds or None}`): the tools an agent starts early from the
        prediction (speculative.py); a sidecar on the target's cores then runs its wave where the tool time
        it can hide pays for it (sidecar/payback.py). Close the iterator (`contextlib.closing`) to abandon a reply
        early; or set `cancel` from any thread: the reply ends, with no Generation, after the round in
        progress (whether or not that round had an event to yield)."""
        if method not in METHODS:
            raise OoOSpecError(f"unknown method {method!r}; expected one of {METHODS}")
        req = self.prepare(messages, tools, tool_choice, max_new_tokens, stop, strict,  # bad input raises here, eagerly
                           response_format, chat_template_kwargs, reasoning_effort)
        req.sampling = Sampling(temperature, top_p, top_k, min_p, seed)
        req.top_logprobs = check_logprobs(logprobs)
        req.tool_s = _tool_seconds(speculative_tools, req.tools)
        predicted = self._prediction_ids(prediction)
        return self._seated(lambda seat: self._decode(req, method, hint, record_margins, cancel, predicted, seat))

    def clear_prefix_cache(self) -> None:
        """Drop every cached prompt KV, the target's and the sidecar's wave's: the next request
        prefills its whole prompt."""
        self.prefix_cache.clear()
        if self.sidecar is not None:
            self.sidecar.clear_prefix_cache()

    def load_sidecar_adapter(self, adapter) -> str:
        """Swap the sidecar's LoRA adapter for the one in directory `adapter`, without reloading the
        target or stopping a reply: waves that begin from now use it, a running one ends on the old
        (docs/sidecar.md, "Hot swap"). The target verifies every hint, so no reply's tokens change.
        Returns the sidecar's new name; a bad adapter raises AdapterError and the old one stays."""
        if self.sidecar is None:
            raise AdapterError("this engine has no sidecar (sidecar=False): there is no adapter to swap")
        return self.sidecar.load_adapter(adapter)

    def close(self) -> None:
        """Stop the sidecar: a worker process ends (none is left behind); a later request starts another.
        A process pinned to the target's core set gets back the cores it had before."""
        if self.sidecar is not None:
            self.sidecar.close()
        if self.call_log is not None:
            self.call_log.flush()
        pinned, self._pinned = self._pinned, None
        if pinned is not None:
            pinned.restore()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def clear_call_memory(self) -> None:
        """Forget the earlier replies that retrieval drafts from (for every tool set)."""
        self.memory.clear()

    @property
    def decoding(self) -> int:
        """Replies decoding now (started and neither finished nor closed)."""
        return self._batcher.seated

    @property
    def max_batch(self) -> int:
        """The most replies whose verify forwards run as one (`Engine(max_batch=...)`)."""
        return self._batcher.max_batch

    def _seated(self, make):
        """A reply's events, with its seat at the target (batching.py): while its consumer holds an
        event the reply is parked, so the other replies' rounds do not wait for it."""
        seat = self._batcher.seat()
        steps = make(seat)
        try:
            for event in steps:
                seat.parked(True)
                try:
                    yield event
                finally:
                    seat.parked(False)
        finally:
            try:
                steps.close()
            finally:
                self._batcher.leave(seat)

    # ------------------------------------------------------------------ the loop

    def _prediction_ids(self, prediction) -> list[int]:
        """A `prediction`'s target tokens, checked: none longer than the context window, which no reply fills."""
        text = prediction_text(prediction)
        ids = self.tokenizer.encode(text, add_special_tokens=False) if text else []
        if len(ids) > self.context_window:
            raise PredictionError(f"the prediction is {len(ids)} tokens, over the target's context window of "
                                  f"{self.context_window} tokens")
        return ids

    def _decode(self, req: Prepared, method: str, hint_text: str | None, record_margins: bool,
                cancel: threading.Event | None, predicted: list[int] | None, seat: batching.Seat):
        stats = DecodeStats(method, prompt_tokens=len(req.prompt_ids), margins=[] if record_margins else None)
        ids = "call_" + uuid.uuid4().hex[:12]
        reading = self.fmt.for_forced_reply(req.choice[0])  # a forced opener makes the reply calls
        state = ReplyState(ids=list(req.prompt_ids), n_prompt=len(req.prompt_ids), text=req.prefix, tools=req.tools,
                           fmt=self.fmt, tokenizer=self.tokenizer, pool=self.memory.recall(req.tools),
                           prediction=Prediction(predicted) if predicted else None, reasoning=req.reasoning)
        stats.prediction_tokens = len(predicted or ())
        choose = Choice.for_reply(req.guide, req.sampling.sampler(), req.top_logprobs)  # None: the plain argmax
        reply = _Reply(req, state, self._reply_text, self.eos_ids,
                       ReplyEvents(reading, lambda i: f"{ids}_{i}", req.reasoning), choose)
        reply.seat = seat
        hints = self._open_hints(req, method, hint_text, stats)
        if self.deterministic:  # every decode forward of the reply has these shapes
            reply.shapes = det.Shapes.for_reply(len(req.prompt_ids), req.max_new_tokens)
        done = False
        try:
            t0 = time.perf_counter()
            hit, cache = self.prefix_cache.lookup(req.prompt_ids, self._verifier.new_cache)
            forced = self._forced(req, req.max_new_tokens - 1, stats)  # the reply's first tokens, if forced
            logits = self._prefill(req.prompt_ids + forced, cache, hit, reply.seat)
            self.prefix_cache.store(req.prompt_ids + forced, cache)  # before decoding grows it
            self._sync()
            stats.prefill_s, stats.target_forwards = time.perf_counter() - t0, 1
            stats.cached_prompt_tokens = hit
            pending = forced + [int(logits[-1].argmax()) if choose is None else choose(logits[-1])]
            t1 = time.perf_counter()
            while True:
                yield from reply.commit(pending, logits, stats)
                forced = [] if reply.finish else self._forced(req, req.max_new_tokens - len(reply.new), stats)
                if forced:  # jump-forward: commit what the grammar forces now; the next forward feeds it
                    yield from reply.commit(forced, None, stats)
                if req.reasoning is not None and stats.reasoning_forwards is None and state.answer is not None:
                    stats.reasoning_tokens, stats.reasoning_forwards = len(reply.new), stats.target_forwards
                    stats.reasoning_s = time.perf_counter() - t1
                if reply.finish is not None:
                    break
                if cancel is not None and cancel.is_set():
                    return  # abandoned: the finally below stops the sidecar
                tree = self._draft(method, reply, hints, forced)
                if reply.predicted is not None:  # the hint read this round: what the sidecar predicts
                    yield reply.predicted
                    reply.predicted = None
                pending, logits = self._verify(tree, cache, reply, stats, choose)
            self._sync()
            stats.decode_s = time.perf_counter() - t1
            stats.host_s = max(0.0, stats.decode_s - stats.forward_s)
            done = True
            if self.payback is not None and method != "ar":  # the call a speculative method takes
                self.payback.observe(stats.prompt_tokens, stats.cached_prompt_tokens, stats.prefill_s, stats.decode_s)
        finally:
            if hints is not None:
                _record(stats, hints.close(abandoned=not done))
        self.memory.remember(req.tools, reply.new)
        yield from reply.close()
        if state.prediction is not None:
            stats.prediction_matched = matched_tokens(state.prediction.tokens, reply.new)
        gen = self._finish(req, reply, stats, ids)
        yield from reply.events.ready_for(gen.tool_calls)  # a call read only at the end (rounds sent the rest)
        if hints is not None:  # the wave ran: was its prediction exactly a call the target wrote?
            stats.prediction_exact = any({"name": c["name"], "arguments": c["arguments"]} in reply.predictions
                                         for c in gen.tool_calls)
            if self.payback is not None and hint_text is None:
                self.payback.observe_prediction(stats.prediction_exact)
        if self.call_log is not None and gen.tool_calls and not gen.invalid_tool_calls and not gen.tool_call_problems:
            self.call_log.record(req.messages, [t.to_openai() for t in req.tools], gen.tool_calls,
                                 model=self.model_name, method=method, hint=state.hint,
                                 hint_tokens=stats.accepted_by_source.get("hint", 0))
        yield gen

    def _prefill(self, ids: list[int], cache, hit: int, seat):
        """The last position's logits after `ids[hit:]` is fed (`Verifier.prefill`), the target to itself."""
        return seat.run(Job(fn=lambda: self._verifier.prefill(ids, cache, hit, self.prefix_cache.chunk)))

    def _forced(self, req: Prepared, limit: int, stats: DecodeStats) -> list[int]:
        """The tokens the grammar forces next (none without one), counted as the grammar's."""
        if req.guide is None or not self._jump_forward:
            return []
        forced = req.guide.forced(limit)
        stats.accepted_by_source["grammar"] += len(forced)
        return forced

    def _draft(self, method: str, reply: "_Reply", hints: HintSession | None, forced: list[int]):
        """The candidate tree for the next forward: the forced tokens (committed, not yet in the KV
        cache) below the last token the target chose, then the prediction, hint, schema and retrieval drafts."""
        state = reply.state
        answer = state.answer  # None while the reply reasons: a hint waits until the reasoning has closed
        if hints is not None and answer is not None and (hint := hints.poll(answer)) is not None:
            state.hint = hint
            state.pool.append(self.tokenizer.encode(hint, add_special_tokens=False))
            reply.predicted = _predicted(self.fmt, hint, hints.confidence)
            if reply.predicted is not None:
                reply.predictions += reply.predicted.calls
        drafters = [] if method == "ar" else [self._drafters["schema"], self._drafters["retrieval"]]
        if state.hint:
            drafters.insert(0, self._drafters["hint"])
        if method != "ar" and state.prediction is not None:
            drafters.insert(0, self._drafters["prediction"])
        # deterministic: a chain (the first draft), whose rows see their keys where `ar`'s row does; a
        # tree's row whose ancestors have gaps can come out in other bits (docs/deterministic.md)
        nodes = det.max_draft_nodes(self.max_draft_nodes) if self.deterministic else self.max_draft_nodes
        return build_tree(reply.new[-1 - len(forced)], [d for dr in drafters for d in dr.propose(state)],
                          nodes, chain=not self._verifier.layout.tree or self.deterministic, forced=forced)

    def _verify(self, tree, cache, reply: "_Reply", stats: DecodeStats, choose: Choice | None):
        """One target forward over the tree; the accepted drafts plus the target's own next token (the
        forced tokens at the tree's start are committed already), and their logits."""
        past = len(reply.req.prompt_ids) + len(reply.new) - 1 - tree.start
        verifier, fed = self._verifier, []

        def alone():  # the target to itself: the forward and walk a reply alone has always run
            nonlocal tree, past, fed
            fixed = {}
            if reply.shapes is not None:  # deterministic: a tree that fits the reply's shapes
                tree, past, fed = verifier.fit(tree, cache, past, reply.shapes)
                fixed = {"shapes": reply.shapes}
            return verifier.verify(tree, cache, past, choose=choose, **fixed), verifier.last_forward_s

        # beside other replies' trees, a normal mode tree is one row of a batched forward (batching.py)
        batchable = reply.shapes is None and self._batcher.max_batch > 1
        job = Job(fn=alone, row=(lambda: verifier.row(tree, cache, past)) if batchable else None)
        out, seconds = reply.seat.run(job)
        path, nxt, logits = out if job.batch == 1 else verifier.accept(tree, out, cache, past, choose)
        stats.target_forwards += len(fed)
        stats.forward_s += sum(fed)
        drafted = path[tree.start + 1:]
        stats.target_forwards += 1
        stats.forward_s += seconds
        stats.batch_sizes.append(job.batch)
        stats.rounds.append((len(tree.tokens), len(drafted), past))
        stats.draft_tokens += len(tree.tokens) - 1 - tree.start
        for node in drafted:
            stats.accepted_by_source[tree.sources[node]] += 1
        return [tree.tokens[i] for i in drafted] + [nxt], logits[tree.start:]

    def _open_hints(self, req: Prepared, method: str, hint_text: str | None, stats: DecodeStats):
        cores.take_back_lent_cores()  # what an earlier reply of this thread lent, if another thread closed it
        if method != "oospec" or not req.tools:
            return None
        sidecar = FixedHint(hint_text) if hint_text is not None else self.sidecar
        if sidecar is None:
            return None
        stats.sidecar = sidecar.name or type(sidecar).__name__
        request = HintRequest(req.messages, req.tools, self.fmt, req.choice)
        shares = cores.shares_cpu(sidecar.device, sidecar.cores, self.place)
        if hint_text is None and self.payback is not None and shares:
            stats.wave_estimate_s = _wave_estimate(sidecar, request)
            stats.call_estimate_s = self.payback.call_s(len(req.prompt_ids) - self.prefix_cache.peek(req.prompt_ids))
            stats.decode_estimate_s = self.payback.decode_s()
            hidden = self.payback.hidden_s(req.tool_s, stats.call_estimate_s)
            stats.hidden_estimate_s = hidden if req.tool_s else None
            stats.sidecar_skipped = self.payback.verdict(stats.wave_estimate_s, stats.decode_estimate_s, hidden)
            if stats.sidecar_skipped:
                return None
        follow_up = hint_text is None and follows_up(self.hint_follow_up, shares)
        return HintSession.open(sidecar, request, target=self.place, faults=self._logged_faults,
                                lend_cores=hint_text is None, follow_up=follow_up)

    def _sync(self) -> None:
        if self._verifier.device.type == "cuda":
            torch.cuda.synchronize(self._verifier.device)

    def _finish(self, req: Prepared, reply: "_Reply", stats: DecodeStats, ids: str) -> Generation:
        ended = reply.finish == "stop" and bool(reply.new) and reply.new[-1] in self.eos_ids  # the model ended it
        read = read_reply(reply.events, reply.text, req.tools, ids, reply.finish, ended)
        stats.new_tokens = len(reply.new)
        if stats.margins is not None:
            del stats.margins[len(reply.new):]
        return Generation(text=reply.text, token_ids=reply.new, stats=stats, prompt_tokens=len(req.prompt_ids),
                          logprobs=None if req.top_logprobs is None else reply.logprobs[:len(reply.new)], **read)


def _auto_layout(sidecar, target: cores.Place, kw: dict) -> tuple[cores.Place, cores.Place] | None:
    """Core sets for the target and the sidecar when `sidecar_placement="auto"` on a CPU finds a split
    faster than sharing every core (sidecar/layout.py); None keeps both on every core."""
    if sidecar is False or not isinstance(sidecar, (str, os.PathLike, type(None))) or target.device.type != "cpu":
        return None
    if kw.get("sidecar_placement", "auto") != "auto":
        return None
    return layout.auto_places()


def _wave_estimate(sidecar: Sidecar, request: HintRequest) -> float | None:
    """The sidecar's own estimate of its wave's seconds."""
    try:
        return sidecar.estimate(request)
    except Exception as e:  # an estimate that fails is no estimate: the wave runs
        log.debug("sidecar estimate failed: %s", e)
        return None


def _tool_seconds(speculative_tools, tools: list[Tool]) -> float | None:
    """The mean expected seconds of the speculative tools on offer in this request (names not offered
    play no part: the target cannot call them); None where none is offered or none has a latency yet."""
    if speculative_tools is None:
        return None
    if not isinstance(speculative_tools, dict):
        raise OoOSpecError(f"speculative_tools must be a dict of tool name -> expected seconds (or None), "
                           f"got {type(speculative_tools).__name__}")
    for name, seconds in speculative_tools.items():
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not seconds >= 0):
            raise OoOSpecError(f"speculative_tools[{name!r}] must be expected seconds >= 0 or None, got {seconds!r}")
    offered = {t.name for t in tools}
    known = [float(v) for k, v in speculative_tools.items() if k in offered and v is not None]
    return sum(known) / len(known) if known else None


def _predicted(fmt: ToolFormat, hint: str, confidence: float | None = None) -> CallPredicted | None:
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


class ReplyText:
    """A reply's text from its tokens: special tokens dropped, except the format's call markers.

    Mistral's `[TOOL_CALLS]` (and Llama 3's `<|python_tag|>`) are special tokens in their
    tokenizers, so `decode(skip_special_tokens=True)` alone would cut them out of the text that the
    format parses; a marker that is plain text in a tokenizer is left to the plain decode."""

    def __init__(self, tokenizer, fmt: ToolFormat):
        self.tokenizer = tokenizer
        self.keep: dict[int, str] = {}
        for marker in fmt.markers:
            ids = tokenizer.encode(marker, add_special_tokens=False)
            if len(ids) == 1 and not tokenizer.decode(ids, skip_special_tokens=True):
                self.keep[ids[0]] = marker

    def __call__(self, ids: list[int]) -> str:
        decode = self.tokenizer.decode
        cuts = [i for i, t in enumerate(ids) if t in self.keep] if self.keep else []
        if not cuts:
            return decode(ids, skip_special_tokens=True)
        parts, start = [], 0
        for i in cuts:
            parts += [decode(ids[start:i], skip_special_tokens=True), self.keep[ids[i]]]
            start = i + 1
        return "".join(parts) + decode(ids[start:], skip_special_tokens=True)


class _Reply:
    """The committed side of one reply: it writes the reply's state (tokens, text) that the drafters
    read, checks the stop conditions, and makes the events."""

    def __init__(self, req: Prepared, state: ReplyState, decode: ReplyText, eos: set[int], events: ReplyEvents,
                 choose: Choice | None = None):
        self.req, self.state, self.decode, self.eos, self.events = req, state, decode, eos, events
        self.choose = choose            # what picked the tokens; it holds their logprobs when they are asked for
        self.new: list[int] = []        # the committed new tokens (also at the end of `state.ids`)
        self.logprobs: list[dict] = []  # OpenAI's entry per committed token, when asked for
        self.finish: str | None = None  # "stop" | "length" once the reply is over
        self.shapes: det.Shapes | None = None  # deterministic mode: the shapes of its decode forwards
        self.predicted: CallPredicted | None = None  # a hint read in this round, not yet yielded
        self.predictions: list[dict] = []  # every call the reply's hints predicted

    @property
    def text(self) -> str:
        """The committed text, cut at a stop string once one appears."""
        return self.state.text

    def commit(self, pending: list[int], logits, stats: DecodeStats) -> Iterator[Event]:
        """Commit what the last forward decided, check every stop condition, and yield the new events.
        `logits` are the rows that chose the last of `pending`; the tokens before them (and all of them
        when `logits` is None) were forced by the grammar: their margin is infinite, their logprob 0."""
        if stats.margins is not None:
            rows = 0 if logits is None else len(logits)
            stats.margins += [float("inf")] * max(0, len(pending) - rows)
            if rows:
                top2 = logits.float().topk(2, dim=-1).values
                stats.margins += (top2[:, 0] - top2[:, 1]).tolist()[:len(pending)]
        before = len(self.new)
        for t in pending[:self.req.max_new_tokens - len(self.new)]:
            self.new.append(t)
            self.state.ids.append(t)
            if t in self.eos:
                self.finish = "stop"
                break
        scored = self._logprobs(pending, len(self.new) - before, logits is not None)
        text = self.req.prefix + self.decode(self.new)
        cut = _stop_at(text, self.req.stop, len(self.req.prefix))
        if cut is not None:
            self.state.text, self.finish = text[:cut], "stop"
        else:
            self.state.text = text
            if self.finish is None and len(self.new) >= self.req.max_new_tokens:
                self.finish = "length"
            if self.finish is None:
                # Hold back text that may still start a stop string, and a UTF-8 character cut in half.
                yield from self.events.feed(text[:len(text) - _partial_stop(text, self.req.stop)].rstrip("\ufffd"))
        if scored:
            yield LogprobsDelta(scored)

    def _logprobs(self, pending: list[int], kept: int, chosen: bool) -> list[dict]:
        """OpenAI's logprobs entries of the `kept` tokens just committed (when asked for): what `choose`
        recorded for the tokens it chose, 0 for the tokens a grammar forced before them."""
        if self.req.top_logprobs is None:
            return []
        taken = self.choose.take() if chosen else []
        entries = [TokenLogprob(t, 0.0) for t in pending[:len(pending) - len(taken)]] + taken
        scored = [e.openai(lambda t: self.decode.tokenizer.decode([t])) for e in entries[:kept]]
        self.logprobs += scored
        return scored

    def close(self) -> Iterator[ReasoningDelta | TextDelta | ToolCallDelta]:
        """The reply is over: everything still held back is decided."""
        yield from self.events.feed(self.text, final=True)


def _stop_at(text: str, stops: list[str], start: int) -> int | None:
    hits = [i for s in stops if s and (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def _partial_stop(text: str, stops: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    return max((k for s in stops for k in range(len(s) - 1, 0, -1) if text.endswith(s[:k])), default=0)
