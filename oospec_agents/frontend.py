"""The seam every front-end stands on: LangChain's ChatOoOSpec, LlamaIndex's OoOSpec and the server.

- `ChatRequest`: one typed request, checked by the engine, instead of `**request` dicts; `ChatRequest.of`
  builds it from a front-end's settings (`settings`: a call's keyword arguments over a model's fields),
  its sampling one `sampling.Sampling`; `for_choice` (choice i of n: its own seed).
- `EngineLike`: what a front-end asks of an engine; `Engine` has it, and so has the test double
  (testing.ScriptedEngine).
- `read_sampling`, `choice_count`, `openai_logprobs`, `check_penalties`: the sampling rules, one place
  for every front-end (how many choices, OpenAI's `logprobs`/`top_logprobs` pair, penalties and
  `logit_bias`); `sampling.Sampling` checks the settings the engine draws with.
- `LazyEngine`: engine selection, loaded on first use and shared between chat-model objects.
- `Bridge`: the one sync-to-async bridge for the engine's blocking event stream; `aiterate` runs it on
  the loop's executor, the server's scheduler (serve/scheduler.py) on its queue's worker.
- `Usage`: token counts of a `Generation`, one definition for every front-end.
- `CallsSoFar`: tool calls folded from `ToolCallDelta`s, for front-ends that show a call as it grows.
- `ParallelToolCalls`: the `parallel_tool_calls=False` rule (the reply's first call only), for every front-end.
- `call_problems`: every call of a reply with a problem (a schema misfit, or arguments that cannot be
  read), in the reply's order: what each front-end reports beside the calls.
- `join_text_parts`: how the text parts of one message become its text.

Framework idioms stay in the front-ends; nothing here imports LangChain, LlamaIndex, FastAPI or the
server's package (serve/ imports this module, never the other way).
"""
from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import threading
from contextlib import aclosing, closing
from dataclasses import dataclass, field
from typing import (Any, AsyncIterator, Awaitable, Callable, Generic, Iterable, Iterator, Mapping, Protocol, TypeVar,
                    runtime_checkable)

from .chat import join_text_parts  # noqa: F401  (re-exported: the front-ends' text-part policy)
from .engine import Engine, Event, Generation
from .errors import SamplingError
from .events import ToolCallDelta
from .references import check_reference
from .sampling import Sampling, check_logprobs

T = TypeVar("T")

#: the most choices (`n`) one request may ask for: they are decoded one after another
MAX_CHOICES = 8


@runtime_checkable
class EngineLike(Protocol):
    """What a front-end asks of an engine: `Engine` is one; so is the test double `testing.ScriptedEngine`.
    `stream` takes `Engine.stream`'s arguments (`ChatRequest.stream` passes them) and yields its events,
    a `Generation` last."""
    model_name: str
    context_window: int

    def stream(self, messages, tools=None, *, tool_choice="auto", max_new_tokens: int = 256, method: str = "oospec",
               stop=None, cancel: threading.Event | None = None, **options: Any) -> Iterator[Event]: ...


def settings(*layers: Mapping[str, Any] | object) -> Callable[[str], Any]:
    """Settings by name, each from the first layer that has it: a mapping's key (a call's keyword
    arguments), an object's attribute (a chat model's fields); None where no layer has it."""
    def setting(name: str) -> Any:
        for layer in layers:
            if isinstance(layer, Mapping):
                if name in layer:
                    return layer[name]
            elif hasattr(layer, name):
                return getattr(layer, name)
        return None
    return setting


def read_sampling(setting: Callable[[str], Any]) -> tuple[Sampling, bool | int | None]:
    """A request's sampling, its settings read by name with `setting` (`settings`), checked: the
    `Sampling` the engine draws with (`temperature`, `top_p`, `top_k`, `min_p`, `seed`), and its one
    `logprobs` argument from OpenAI's `logprobs` and `top_logprobs` (`openai_logprobs`). A penalty
    (`PENALTIES`) or `logit_bias` that is not neutral is refused (`check_penalties`). A bad value is a
    `SamplingError` naming its field in `.param`."""
    check_penalties({name: setting(name) for name in PENALTIES}, setting("logit_bias"))
    sampling = Sampling(setting("temperature"), setting("top_p"), setting("top_k"), setting("min_p"), setting("seed"))
    return sampling, openai_logprobs(setting("logprobs"), setting("top_logprobs"))


@dataclass
class ChatRequest:
    """What a front-end asks of the engine for one reply."""
    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: Any = "auto"
    max_new_tokens: int = 256
    method: str = "oospec"
    stop: list[str] | None = None
    response_format: dict | None = None  # OpenAI's: a reply that calls no tool is JSON of its schema
    prediction: Any = None               # OpenAI's Predicted Outputs: drafted where the reply agrees with it
    sampling: Sampling = field(default_factory=Sampling)  # greedy unless it has a temperature
    logprobs: bool | int | None = None   # True (the chosen token's), or alternatives per token (0-20)
    # Reasoning targets (docs/reasoning.md): arguments of the chat template, checked by the engine
    chat_template_kwargs: dict | None = None   # e.g. {"enable_thinking": False}
    reasoning_effort: str | None = None        # "low" | "medium" | "high", for templates that read it
    # Speculative tools (#55): {tool name: expected seconds or None}, for the engine's pay-back rule
    speculative_tools: dict | None = None

    @classmethod
    def of(cls, messages: list[dict], setting: Callable[[str], Any]) -> "ChatRequest":
        """A front-end's request, its settings read by name with `setting` (`settings`: a call's keyword
        arguments over a model's fields), None for unset. The names are OpenAI's (vLLM's for `top_k`,
        `min_p`, `repetition_penalty`, `chat_template_kwargs`): `tools`, `tool_choice`, `max_tokens` (256
        unset), `method`, `stop` (a string is one stop sequence), `response_format`, `prediction`,
        `chat_template_kwargs`, `reasoning_effort`, `speculative_tools`, and `read_sampling`'s. Its sampling
        is checked now; the rest by the engine, when the request is streamed."""
        sampling, logprobs = read_sampling(setting)
        max_tokens, stop = setting("max_tokens"), setting("stop")
        return cls(messages, setting("tools"), setting("tool_choice") or "auto",
                   max_new_tokens=256 if max_tokens is None else max_tokens, method=setting("method") or "oospec",
                   stop=[stop] if isinstance(stop, str) else stop, response_format=setting("response_format"),
                   prediction=setting("prediction"), sampling=sampling, logprobs=logprobs,
                   chat_template_kwargs=setting("chat_template_kwargs"), reasoning_effort=setting("reasoning_effort"),
                   speculative_tools=setting("speculative_tools"))

    def stream(self, engine: EngineLike, cancel: threading.Event | None = None) -> Iterator[Event]:
        """The engine's event stream for this request (bad input raises here, eagerly: a bad template
        argument is a `TemplateArgumentError`); setting `cancel` ends it after the round in progress.
        With `logprobs`, the stream has `LogprobsDelta`s too; where the target reasons, `ReasoningDelta`s."""
        optional = ("response_format", "prediction", "chat_template_kwargs", "reasoning_effort",
                    "speculative_tools", "logprobs")
        extra = {k: v for k in optional if (v := getattr(self, k)) is not None}
        return engine.stream(self.messages, self.tools, tool_choice=self.tool_choice or "auto",
                             max_new_tokens=self.max_new_tokens, method=self.method, stop=self.stop, cancel=cancel,
                             sampling=self.sampling, **extra)

    def stream_choices(self, engine: EngineLike, n: int = 1, cancel: threading.Event | None = None) -> Iterator[Event]:
        """The events of `n` choices (`for_choice`), one after another: choice i's events follow i
        Generations. Choice 0's stream is made now (bad input raises here, eagerly), each other one
        as it starts; a cancelled reply starts no other."""
        first = self.stream(engine, cancel)
        return first if n == 1 else self._choices(first, engine, n, cancel)

    def _choices(self, first: Iterator[Event], engine: EngineLike, n: int, cancel: threading.Event | None):
        try:
            with closing(first) as events:
                yield from events
            for index in range(1, n):
                if cancel is not None and cancel.is_set():
                    return
                with closing(self.for_choice(index).stream(engine, cancel)) as events:
                    yield from events
        finally:
            first.close()  # when closed before it started

    def for_choice(self, index: int) -> "ChatRequest":
        """The request of choice `index` of several (`n`): the same, with its own seed, `seed + index`
        when a seed is given (without one, every choice draws a fresh seed)."""
        seed = self.sampling.seed
        if index == 0 or seed is None:
            return self
        return dataclasses.replace(self, sampling=dataclasses.replace(self.sampling, seed=seed + index))

    def generate(self, engine: EngineLike) -> Generation:
        with closing(self.stream(engine)) as events:
            return _last(events)


def _refused(param: str, message: str, code: str | None = None) -> SamplingError:
    error = SamplingError(message)
    error.param, error.code = param, code
    return error


def choice_count(n: Any) -> int:
    """How many choices a request asks for (OpenAI's `n`): None is 1; at most `MAX_CHOICES`."""
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise _refused("n", f"n must be an integer from 1 to {MAX_CHOICES} (the choices are decoded one after "
                            f"another), got {n!r}")
    return n


#: the penalties a request may carry: (the value that leaves the target's distribution as it is, the
#: documented range). OpenAI's two take -2 to 2; vLLM's `repetition_penalty` any number above 0.
PENALTIES = {"presence_penalty": (0, (-2, 2)), "frequency_penalty": (0, (-2, 2)),
             "repetition_penalty": (1, (0, None))}


def check_penalties(penalties: dict[str, Any], logit_bias: Any = None) -> None:
    """The penalties (`PENALTIES`: name -> value, None for unset) and `logit_bias` as every front-end
    refuses them. A value outside its documented range is a `SamplingError` stating the range; any
    other than the neutral one, and a non-empty `logit_bias`, is not served (its `code` is
    "unsupported_parameter"): each token's draw would depend on the tree node's own path, or on a bias
    the verification does not apply, and sampling keeps the target's own distribution."""
    for name, value in penalties.items():
        if value is None:
            continue
        neutral, (low, high) = PENALTIES[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                low < value if high is None else low <= value <= high):
            where = f"above {low}" if high is None else f"from {low} to {high}"
            raise _refused(name, f"{name} must be a number {where}, got {value!r} (and only {neutral} is served)")
        if value != neutral:
            raise _refused(name, f"{name}={value!r} is not served: sampling keeps the target's own distribution, "
                                 f"so {name} must be absent or {neutral}", "unsupported_parameter")
    if logit_bias:
        raise _refused("logit_bias", "logit_bias is not served: sampling keeps the target's own distribution, so "
                                     "logit_bias must be absent or empty", "unsupported_parameter")


def openai_logprobs(logprobs: Any, top_logprobs: Any) -> bool | int | None:
    """OpenAI's pair as the engine's one `logprobs` argument: `logprobs=True` asks for each token's
    log-probability, `top_logprobs` (0-20) for that many alternatives too. `top_logprobs` above 0
    without `logprobs=True` is an error (vLLM's rule; OpenAI's too), naming `top_logprobs`."""
    if top_logprobs is not None:
        check_logprobs(top_logprobs)
    if logprobs is not None and not isinstance(logprobs, bool):
        raise _refused("logprobs", f"logprobs must be true or false, got {logprobs!r}")
    if not logprobs:
        if top_logprobs:
            raise _refused("top_logprobs", f"top_logprobs={top_logprobs!r} needs logprobs=true")
        return None
    return True if top_logprobs is None else top_logprobs


def _last(events: Iterable[Event]) -> Generation:
    gen = None
    for gen in events:
        pass
    if not isinstance(gen, Generation):
        raise RuntimeError("the engine's stream ended without a Generation")
    return gen


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    accepted_prediction_tokens: int = 0  # of a `prediction`'s tokens, those in the reply (in order) ...
    rejected_prediction_tokens: int = 0  # ... and those not: OpenAI's two counts

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, gen: Generation) -> "Usage":
        s = gen.stats
        return cls(gen.prompt_tokens, len(gen.token_ids), s.cached_prompt_tokens, s.prediction_matched,
                   s.prediction_tokens - s.prediction_matched)

    @classmethod
    def of_choices(cls, gens: list[Generation]) -> "Usage":
        """Several choices of one prompt (`n`): the prompt counted once (the first choice's, with its
        cached tokens), the completion tokens and the prediction counts summed."""
        each = [cls.of(gen) for gen in gens]
        return cls(each[0].prompt_tokens, sum(u.completion_tokens for u in each), each[0].cached_prompt_tokens,
                   sum(u.accepted_prediction_tokens for u in each), sum(u.rejected_prediction_tokens for u in each))

    def openai(self) -> dict:
        """OpenAI's `usage` object."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_prompt_tokens},
                "completion_tokens_details": {"accepted_prediction_tokens": self.accepted_prediction_tokens,
                                              "rejected_prediction_tokens": self.rejected_prediction_tokens}}


@dataclass
class LazyEngine:
    """Which engine a chat model uses: a given one, or the shared engine for its models, loaded on
    first use (constructing a chat model loads nothing)."""
    model: str = "embedded"
    sidecar: Any = None
    options: dict = field(default_factory=dict)   # from_pretrained keywords: devices, dtype, ...
    engine: EngineLike | None = None

    def __post_init__(self) -> None:
        if self.engine is None:  # what costs nothing to check fails at construction, not at the first call
            for ref in (self.model, self.sidecar):
                check_reference(ref, probe_hub=False)

    def get(self, model: str | None = None) -> EngineLike:
        if self.engine is not None and model in (None, self.model):
            return self.engine
        options = {k: v for k, v in self.options.items() if v is not None}
        engine = Engine.shared(model or self.model, self.sidecar, **options)
        if model in (None, self.model):
            self.engine = engine
        return engine


class CallsSoFar:
    """Tool calls as they grow: feed it every `ToolCallDelta`; read `calls` at any time."""

    def __init__(self) -> None:
        self.calls: list[dict] = []   # per index: {"id", "name", "arguments": JSON text so far}

    def feed(self, delta: ToolCallDelta) -> dict:
        """Fold one delta in; returns the call it belongs to."""
        while len(self.calls) <= delta.index:
            self.calls.append({"id": None, "name": None, "arguments": ""})
        call = self.calls[delta.index]
        if delta.id is not None:
            call["id"] = delta.id
        if delta.name is not None:
            call["name"] = delta.name
        call["arguments"] += delta.arguments
        return call


@dataclass
class ParallelToolCalls:
    """The `parallel_tool_calls=False` rule, for every front-end: a reply keeps its first tool call only,
    in its stream and in its final message (OpenAI's `parallel_tool_calls`, which the server and
    ChatOoOSpec take; LlamaIndex's `allow_parallel_tool_calls`). One per reply: it remembers the id
    of the reply's first call as the stream shows it.

    - `keeps(delta)`: whether a stream sends a `ToolCallDelta` (those of the call at index 0).
    - `first(calls)`: of calls in the reply's order, the first (the calls so far, or a Generation's valid ones).
    - `shown(calls)`: of a Generation's calls, valid or invalid, the one the stream showed (by its id).
    With `allowed`, each keeps every call.
    """
    allowed: bool = True
    first_id: str | None = field(default=None, init=False)   # the id of the reply's first call, once seen

    @classmethod
    def openai(cls, parallel_tool_calls: bool | None) -> "ParallelToolCalls":
        """OpenAI's parameter: only False keeps one call (None, unset, keeps them all)."""
        return cls(parallel_tool_calls is not False)

    def keeps(self, delta: ToolCallDelta) -> bool:
        if delta.index == 0 and delta.id is not None:
            self.first_id = delta.id
        return self.allowed or delta.index == 0

    def first(self, calls: list[T]) -> list[T]:
        return calls if self.allowed else calls[:1]

    def shown(self, calls: list[dict]) -> list[dict]:
        return calls if self.allowed else [c for c in calls if c["id"] == self.first_id]


def call_problems(gen: Generation) -> list[dict]:
    """{"id", "name", "error"} per call of the reply that has a problem, in the reply's order: a tool call
    that misfits its schema (`Generation.tool_call_problems`), or an invalid call (why it cannot be read).
    Each front-end reports them beside the message's calls; the ids are the calls' own."""
    failed = gen.tool_call_problems + [{k: c[k] for k in ("id", "name", "error")} for c in gen.invalid_tool_calls]
    return sorted(failed, key=lambda c: int(c["id"].rsplit("_", 1)[1]))  # check_calls numbers them <prefix>_<i>


_END = object()


class Bridge(Generic[T]):
    """The sync-to-async bridge: a blocking iterator driven on a worker thread, its items handed to
    the event loop it was made on. Every front-end's async path goes through it: `aiterate` for the
    integrations, the server's `Job` (serve/scheduler.py) for its queue.

    - Whoever owns the worker calls `run()` on it: one thread runs the whole iteration (torch's grad
      mode and the decode state are per thread). `make_iterator` is called there, and the iterator
      is closed there, with `closing()`.
    - `items()` is the consumer's side, on the loop; the iterator's error is re-raised there.
    - `cancelled` is set when the consumer stops early (or the loop is gone): the worker stops after
      its current item, and does not start one if it is set before `run()`. Pass the event the
      engine's stream polls every round and the engine stops too, with or without an item to hand over.
    """

    def __init__(self, make_iterator: Callable[[], Iterator[T]], cancelled: threading.Event | None = None,
                 on_cancel: Callable[[], None] = lambda: None):
        self._make_iterator = make_iterator
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._on_cancel = on_cancel
        self.cancelled = threading.Event() if cancelled is None else cancelled

    def cancel(self) -> None:
        """Stop the worker after its current item; `on_cancel` runs the first time only."""
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._on_cancel()

    def _put(self, item: Any, error: BaseException | None = None) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (item, error))
        except RuntimeError:  # the loop is gone: nobody is listening any more
            self.cancelled.set()

    def run(self) -> None:
        """On the worker thread: make the iterator, hand over its items until it ends or the bridge
        is cancelled, close it."""
        error = None
        try:
            with closing(self._make_iterator()) as items:
                for item in ([] if self.cancelled.is_set() else items):
                    if self.cancelled.is_set():
                        break
                    self._put(item)
        except BaseException as e:  # re-raised on the loop, in the consumer
            error = e
        self._put(_END, error)

    async def items(self, worker: Awaitable | None = None) -> AsyncIterator[T]:
        """The iterator's items on the loop. Leaving early cancels the bridge; with `worker` (the
        future running `run()`), it is awaited too, so the iterator is closed when the consumer resumes."""
        try:
            while True:
                item, error = await self._queue.get()
                if item is _END:
                    if error is not None:
                        raise error
                    return
                yield item
        finally:
            self.cancel()
            if worker is not None:
                await asyncio.shield(worker)


async def aiterate(make_iterator: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
    """Drive a blocking iterator on one worker thread and hand its items to the running event loop.

    - One thread of the loop's default executor runs the whole iteration (a `Bridge`), in a copy of
      the caller's contextvars (callbacks and tracing see the caller's context).
    - The iterator is made and closed on that thread, with `closing()`.
    - When the consumer stops early, the worker stops after its current item and closes the
      iterator; the bridge awaits the worker, so the engine is free when the consumer resumes.
    """
    bridge = Bridge(make_iterator)
    worker = asyncio.get_running_loop().run_in_executor(None, contextvars.copy_context().run, bridge.run)
    async with aclosing(bridge.items(worker)) as items:
        async for item in items:
            yield item
