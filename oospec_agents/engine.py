"""`Engine`: a target model (the sole verifier) and an optional sidecar behind one facade.

The engine builds its parts and one `Decoder` (decode.py) handed them, then stays a facade: a request
(`ChatRequest`, request.py) is checked and rendered (`checks.py`), decoded as one `Reply` (reply.py: its own
`DrafterStack`, drafters/stack.py) by the decoder's loop, verified by the target (`verify.py`), replies
decoding at once sharing its forwards (`batching.py`). Loading a target and a sidecar: `loading.py`.
docs/how-it-works.md draws the path of one request.

`Engine(target, tokenizer, sidecar=None, **keywords)`'s keywords (each in full: docs/how-it-works.md,
"The engine's keywords"): `memory_size` (retrieval's earlier replies per tool set), `prefix_cache_tokens`
(recent prompts' KV), `wave_payback` (a shared-core sidecar's wave runs only when it pays back),
`hint_follow_up`, `prefill_chunk`, `deterministic` (the same tokens whatever the method, tree and concurrency),
`call_log` (+ `call_log_max_mb`, `call_log_tool_results`), `max_batch` (replies sharing a verify forward),
`target_cores`, `drafters` (a drafter per slot in place of `drafters.stack.DEFAULT_DRAFTERS`).
"""
from __future__ import annotations

import copy
import functools
import threading
from types import MappingProxyType
from typing import Callable, Iterator, Mapping

from . import batch_attention, batching, checks, loading
from .batching import Batcher
from .calllog import DEFAULT_MAX_MB as DEFAULT_LOG_MB
from .calllog import open_call_log
from .chat import require_chat_template, template_renders_tools
from .checks import METHODS
from .decode import Decoder, Parts
from .drafters import Drafter, ReplyText
from .drafters.retrieval import CallMemory
from .drafters.stack import DEFAULT_DRAFTERS
from .errors import AdapterError, OoOSpecError
from .formats import ToolFormat, detect_format, detect_reasoning
from .grammar import Grammars, StrictLogitsProcessor
from .prefix_cache import DEFAULT_TOKENS as DEFAULT_PREFIX_TOKENS
from .prefix_cache import PrefixCache
from .reply import Reading
from .request import ChatRequest, Event, Generation, Prepared
from .sidecar import check_sidecar, cores
from .sidecar.payback import DEFAULT_RATIO, PayBack
from .stats import SOURCES
from .verify import Verifier, eos_ids

#: how prompts are prefilled (`Verifier.plan_prefill`): None, the default, one forward of the uncached tail,
#: exact where the target takes it (bf16 on a CPU that has it; docs/deterministic.md, "Cold against warm");
#: 1: one plain forward; 256: forwards of 256, exact on any target but slower
PREFILL_CHUNK = None
__all__ = ["Engine", "ChatRequest", "Event", "Generation", "Prepared", "METHODS", "SOURCES", "ReplyText"]
_KEEP = object()  # `with_parts`: the part stays as it is


class Engine:
    """A target model (the sole verifier) plus an optional sidecar that posts call hints: a facade over
    the `Decoder` (decode.py) it builds. Its parts are chosen at construction, or on a copy (`with_parts`)."""

    _shared: dict[tuple, "Engine"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, target, tokenizer, sidecar=None, *, fmt: ToolFormat | None = None,
                 model_name: str | None = None, max_draft_nodes: int = 48, memory_size: int = 32,
                 prefix_cache_tokens: int = DEFAULT_PREFIX_TOKENS, wave_payback: float | None = DEFAULT_RATIO,
                 hint_follow_up: bool | None = None, target_cores: frozenset[int] | None = None,
                 prefill_chunk: int | None = PREFILL_CHUNK, deterministic: bool = False, call_log=None,
                 call_log_max_mb: float = DEFAULT_LOG_MB, call_log_tool_results: bool = False,
                 max_batch: int = batching.DEFAULT_MAX_BATCH,
                 drafters: Mapping[str, Drafter | Callable[[], Drafter]] | None = None):
        """A target and its tokenizer, an optional sidecar; the keywords: the module's docstring."""
        require_chat_template(tokenizer)
        self.target = target
        self.tokenizer = tokenizer
        self.fmt = fmt or detect_format(getattr(tokenizer, "chat_template", None))
        self.reasoning = detect_reasoning(getattr(tokenizer, "chat_template", None))  # None: it does not reason
        # Templates that render `tools=` get them natively; others (SmolLM2) get the format's prompt.
        self.native_tools = template_renders_tools(tokenizer)
        self.model_name = model_name or getattr(target.config, "_name_or_path", None) or type(target).__name__
        self.context_window = int(getattr(target.config, "max_position_embeddings", 0) or 2048)
        self.max_draft_nodes = max_draft_nodes
        self.deterministic = bool(deterministic)
        self._verifier = Verifier(target)
        self.hint_follow_up = hint_follow_up
        self.eos_ids = eos_ids(target)
        if self.deterministic and any(w is not None for w in self._verifier.layout.windows.values()):
            raise OoOSpecError(f"deterministic=True takes a target whose layers all attend to the whole past; "
                               f"{type(target).__name__} has sliding-window layers")
        self.place = cores.Place(self._verifier.device, target_cores)  # where the target decodes
        self._pinned: cores.Pinned | None = None  # what pinning the process to `target_cores` changed
        self._reading = Reading(tokenizer, self.fmt, ReplyText(tokenizer, self.fmt), frozenset(self.eos_ids))
        self._grammars = Grammars(tokenizer, self.fmt, self.eos_ids, target.config.get_text_config().vocab_size)
        # Replies from several threads share the target: their verify forwards are batched, the rest take
        # turns (batching.py). `batching_refusal`: why this target's rounds are not batched (None: they are).
        self.batching_refusal = batch_attention.install(target, self._verifier.layout.windows) \
            if max_batch > 1 else "max_batch=1"
        # the forward holds the target, not the engine: an engine dropped is freed (no cycle through it)
        self._batcher = Batcher(functools.partial(batch_attention.batched_forward, target, self._verifier.cache_kw,
                                                  device=self._verifier.device),
                                max_batch, batched=self.batching_refusal is None)
        self._use(Parts(drafters={**DEFAULT_DRAFTERS, **(drafters or {})}, memory=CallMemory(memory_size),
                        prefix_cache=PrefixCache(prefix_cache_tokens,
                                                 *self._verifier.plan_prefill(prefill_chunk, self.deterministic)),
                        sidecar=None if sidecar is None else check_sidecar(sidecar),
                        payback=None if wave_payback is None else PayBack(wave_payback),
                        call_log=open_call_log(call_log, max_mb=call_log_max_mb, tool_results=call_log_tool_results)))

    def _use(self, parts: Parts) -> None:
        """Decode with `parts`: the one place the parts and the `Decoder` handed them are set."""
        if set(parts.drafters) != set(DEFAULT_DRAFTERS):
            raise OoOSpecError(f"drafters has the slots {sorted(parts.drafters)}; they are {sorted(DEFAULT_DRAFTERS)}")
        self._parts = parts
        self._decoder = Decoder(self._verifier, self._batcher, self._reading, parts, max_draft_nodes=self.max_draft_nodes,
                                deterministic=self.deterministic, hint_follow_up=self.hint_follow_up, place=self.place,
                                model_name=self.model_name)

    def with_parts(self, *, drafters: Mapping[str, Drafter | Callable[[], Drafter]] | None = None, sidecar=_KEEP,
                   memory: CallMemory | None = None, prefix_cache: PrefixCache | None = None, payback=_KEEP,
                   call_log=_KEEP) -> "Engine":
        """This engine with other parts: the same target, tokenizer and rounds (replies of both share its
        forwards), a drafter in place of a slot's (`Engine(drafters=)`), another sidecar (None: none), call
        memory, prefix cache (another engine's: the KV of a prompt depends on the target alone), pay-back
        rule (None: every wave runs) or call log. This engine is left as it is; closing either closes the
        sidecar they share."""
        parts = self._parts
        changed = Parts(drafters={**parts.drafters, **(drafters or {})},  # an empty cache or memory is falsy
                        memory=parts.memory if memory is None else memory,
                        prefix_cache=parts.prefix_cache if prefix_cache is None else prefix_cache,
                        sidecar=parts.sidecar if sidecar is _KEEP else None if sidecar is None else check_sidecar(sidecar),
                        payback=parts.payback if payback is _KEEP else payback,
                        call_log=parts.call_log if call_log is _KEEP else call_log)
        other, cls = copy.copy(self), type(self)
        cls._use(other, changed)
        return other

    # the parts, read only (`with_parts` gives an engine with others)
    parts = property(lambda self: self._parts, doc="What this engine decodes with (`decode.Parts`).")
    sidecar = property(lambda self: self._parts.sidecar, doc="The sidecar (None: none).")
    memory = property(lambda self: self._parts.memory, doc="The call memory retrieval drafts from, per tool set.")
    prefix_cache = property(lambda self: self._parts.prefix_cache, doc="Recent prompts' KV, reused.")
    payback = property(lambda self: self._parts.payback, doc="The pay-back rule (None: every wave runs).")
    call_log = property(lambda self: self._parts.call_log, doc="Where verified calls are logged (None: nowhere).")
    drafters = property(lambda self: MappingProxyType(dict(self._parts.drafters)),
                        doc="The drafters by slot, drafted in `drafters.stack.ORDER`.")

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
        "process", ...) configure a loaded sidecar; `chat_template` (a Jinja string, or a file's path) replaces
        the target tokenizer's own;
        `freeze_gc` (default True) freezes the process's heap for the garbage collector once
        everything is loaded, so that its full passes (200+ ms over a loaded engine's objects) stop
        landing inside target forwards (gcheap.py); the rest go to `Engine(...)`."""
        return loading.from_pretrained(cls, target, sidecar, target_device=target_device,
                                       sidecar_device=sidecar_device, dtype=dtype, **kw)

    @classmethod
    def shared(cls, target="embedded", sidecar=None, **kw) -> "Engine":
        """A process-wide engine per distinct set of arguments, so chat-model objects share one."""
        key = (str(target), sidecar if isinstance(sidecar, (str, bool, type(None))) else id(sidecar),
               tuple(sorted((k, str(v)) for k, v in kw.items() if v is not None)))
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls.from_pretrained(target, sidecar, **kw)
            return cls._shared[key]

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
        `messages` may be a whole `ChatRequest` instead (then nothing else is given).

        Where the reply reasons (formats/reasoning.py), a call that `tool_choice` forces comes after the
        reasoning, not in the prompt: the grammar forces its opener there (grammar.py)."""
        request = messages if isinstance(messages, ChatRequest) else ChatRequest.build(
            messages, tools, tool_choice=tool_choice, max_new_tokens=max_new_tokens, stop=stop, strict=strict,
            response_format=response_format, chat_template_kwargs=chat_template_kwargs,
            reasoning_effort=reasoning_effort)
        return checks.prepare(checks.Renderer(self.tokenizer, self.fmt, self.reasoning, self.native_tools,
                                              self.context_window, self._grammars), request)

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

    def generate(self, request, tools=None, *, hint: str | None = None, record_margins: bool = False,
                 **settings) -> Generation:
        """Decode a reply (`stream`'s last item): greedily, or with a `temperature` (and `top_p`, `top_k`,
        `min_p`, `seed`) by sampling that keeps the target's distribution (sampling.py); `logprobs=True` (or
        the number of alternatives per token, up to 20) returns each new token's log-probability. `strict=True`
        decodes under the grammar of valid calls, and a JSON `response_format` under its schema's (the reference
        of both is `logits_processor`); `prediction` (OpenAI's Predicted Outputs: the text, or `{"type":
        "content", "content": ...}`) is drafted wherever the reply agrees with it; `chat_template_kwargs` and
        `reasoning_effort` go to the chat template (`prepare`). `hint` injects a fixed call text instead of the
        sidecar's; `record_margins` keeps each new token's top-2 logit margin in the stats."""
        gen = None
        for item in self.stream(request, tools, hint=hint, record_margins=record_margins, **settings):
            gen = item
        return gen

    def stream(self, request, tools=None, *, hint: str | None = None, record_margins: bool = False,
               cancel: threading.Event | None = None, **settings) -> Iterator[Event]:
        """A reply's events: `ReasoningDelta`s, `TextDelta`s and `ToolCallDelta`s in the round that commits their
        tokens, a `ToolCallReady` in the round a call's arguments close (one per `Generation.tool_calls` entry), a
        `CallPredicted` in the round the sidecar's hint is first read (a prediction, never a verified call: `oospec`
        only), then the final `Generation`. A consumer ignores the events it does not use.

        `request` is a `ChatRequest` (request.py: every setting is its field), or the messages, with `tools` and
        the settings by keyword (`ChatRequest.build`: `tool_choice`, `max_new_tokens`, `method`, `stop`, ...; the
        sampling as `sampling=` or `temperature`, `top_p`, `top_k`, `min_p`, `seed`). `speculative_tools`
        (`{name: expected seconds or None}`): the tools an agent starts early from the prediction (speculative.py);
        a sidecar on the target's cores then runs its wave where the tool time it can hide pays for it
        (sidecar/payback.py). Close the iterator (`contextlib.closing`) to abandon a reply early; or set `cancel`
        from any thread: the reply ends, with no Generation, after the round in progress."""
        if isinstance(request, ChatRequest):
            if tools is not None or settings:
                raise OoOSpecError("a ChatRequest carries every setting: give it alone (or the keyword form)")
        else:
            request = ChatRequest.build(request, tools, **settings)
        req = self.prepare(request)  # bad input raises here, eagerly
        return self._decoder.stream(req, hint_text=hint, record_margins=record_margins, cancel=cancel)

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

    def pin_target_cores(self) -> None:
        """Pin the process to the target's core set (`from_pretrained` does, once loaded on every core);
        `close` gives the process back the cores it had."""
        if self.place.cores is not None and self._pinned is None:
            self._pinned = cores.pin_process(self.place.cores)

    @property
    def max_batch(self) -> int:
        """The most replies whose verify forwards run as one (`Engine(max_batch=...)`)."""
        return self._batcher.max_batch
