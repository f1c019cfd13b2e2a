"""A request on its way in, and the reply on its way out.

- `ChatRequest`: the typed request every caller hands the engine (`Engine.stream(request)`); its settings
  are declared once (`SETTINGS`, the engine's keyword names; `OPENAI_SETTINGS`, the names front-ends read),
  and `ChatRequest.build` is the keyword form's thin builder. `ChatRequest.of` reads a front-end's settings.
- The sampling rules every front-end shares: `read_sampling`, `choice_count`, `openai_logprobs`,
  `check_penalties` (`sampling.Sampling` checks the settings the engine draws with).
- `Prepared`: the request as `Engine.prepare` checked and rendered it (checks.py); one `Reply` (reply.py)
  decodes it.
- `Generation`: the finished reply.
"""
from __future__ import annotations

import dataclasses
import threading
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Union

from .errors import OoOSpecError, SamplingError
from .events import CallPredicted, LogprobsDelta, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallReady
from .formats import Reasoning
from .grammar import Guide
from .sampling import Sampling, check_logprobs
from .stats import DecodeStats
from .tools import Tool

__all__ = ["ChatRequest", "Event", "Generation", "Prepared", "SETTINGS", "OPENAI_SETTINGS", "settings",
           "read_sampling", "choice_count", "check_penalties", "openai_logprobs", "PENALTIES", "MAX_CHOICES"]


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


@dataclass(frozen=True)
class Prepared:
    """A request checked and rendered: what the decode loop needs, and nothing it has to look up.
    Decoded once: `guide` (a strict reply's grammar state) is handed to the one `Reply` that decodes it,
    which advances it as its tokens are committed."""
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
    method: str = "oospec"          # "ar" | "toolspec" | "oospec"
    predicted: list[int] = field(default_factory=list)  # the caller's predicted output, in target tokens



#: the most choices (`n`) one request may ask for: they are decoded one after another
MAX_CHOICES = 8


@dataclass
class ChatRequest:
    """One request for one reply: what every caller hands the engine (`Engine.stream(request)`)."""
    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: Any = "auto"
    max_new_tokens: int = 256
    method: str = "oospec"
    stop: list[str] | None = None
    strict: bool = False                 # every call under the grammar of valid calls (else the tools marked so)
    response_format: dict | None = None  # OpenAI's: a reply that calls no tool is JSON of its schema
    prediction: Any = None               # OpenAI's Predicted Outputs: drafted where the reply agrees with it
    sampling: Sampling = field(default_factory=Sampling)  # greedy unless it has a temperature
    logprobs: bool | int | None = None   # True (the chosen token's), or alternatives per token (0-20)
    # reasoning targets (docs/reasoning.md): arguments of the chat template, checked by the engine
    chat_template_kwargs: dict | None = None   # e.g. {"enable_thinking": False}
    reasoning_effort: str | None = None        # "low" | "medium" | "high", for templates that read it
    # speculative tools: {tool name: expected seconds or None}, for the engine's pay-back rule
    speculative_tools: dict | None = None

    @classmethod
    def build(cls, messages, tools=None, *, sampling: Sampling | None = None, temperature=None, top_p=None,
              top_k=None, min_p=None, seed=None, **settings) -> "ChatRequest":
        """The keyword form (`Engine.stream(messages, tools, **settings)`): `SETTINGS` by name, and the
        sampling as one `Sampling` or its settings one by one (never both). An unknown name is a TypeError."""
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise TypeError(f"unexpected request settings {unknown}; the settings are {list(SETTINGS)}")
        loose = (temperature, top_p, top_k, min_p, seed)
        if sampling is None:
            sampling = Sampling(*loose)
        elif not isinstance(sampling, Sampling):
            raise OoOSpecError(f"sampling must be an oospec_agents.sampling.Sampling, got {type(sampling).__name__}")
        elif any(s is not None for s in loose):
            raise OoOSpecError("give sampling= or temperature/top_p/top_k/min_p/seed, not both")
        return cls(messages, tools, sampling=sampling, **settings)

    @classmethod
    def of(cls, messages: list[dict], setting: Callable[[str], Any]) -> "ChatRequest":
        """A front-end's request, its settings read by name with `setting` (`settings`: a call's keyword
        arguments over a model's fields), None for unset. The names are `OPENAI_SETTINGS`: OpenAI's (vLLM's
        for `top_k`, `min_p`, `repetition_penalty`, `chat_template_kwargs`); `max_tokens` is 256 unset and a
        string `stop` is one stop sequence. Its sampling is checked now (`read_sampling`); the rest by the
        engine, when the request is streamed."""
        sampling, logprobs = read_sampling(setting)
        max_tokens, stop = setting("max_tokens"), setting("stop")
        return cls(messages, setting("tools"), setting("tool_choice") or "auto",
                   max_new_tokens=256 if max_tokens is None else max_tokens, method=setting("method") or "oospec",
                   stop=[stop] if isinstance(stop, str) else stop, response_format=setting("response_format"),
                   prediction=setting("prediction"), sampling=sampling, logprobs=logprobs,
                   chat_template_kwargs=setting("chat_template_kwargs"), reasoning_effort=setting("reasoning_effort"),
                   speculative_tools=setting("speculative_tools"))

    def stream(self, engine, cancel: threading.Event | None = None) -> Iterator[Event]:
        """`engine.stream(self)`: its events (bad input raises here, eagerly); setting `cancel` ends it after
        the round in progress."""
        return engine.stream(self, cancel=cancel)

    def stream_choices(self, engine, n: int = 1, cancel: threading.Event | None = None) -> Iterator[Event]:
        """The events of `n` choices (`for_choice`), one after another: choice i's events follow i
        Generations. Choice 0's stream is made now (bad input raises here, eagerly), each other one
        as it starts; a cancelled reply starts no other."""
        first = self.stream(engine, cancel)
        return first if n == 1 else self._choices(first, engine, n, cancel)

    def _choices(self, first: Iterator[Event], engine, n: int, cancel: threading.Event | None):
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

    def generate(self, engine) -> Generation:
        with closing(self.stream(engine)) as events:
            return _last(events)


#: the request's settings by the engine's names (`Engine.stream`'s keyword form): every field but `messages`
#: and `sampling`, whose settings go one by one (`SAMPLING`) or whole (`sampling=`)
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed")
SETTINGS = tuple(f.name for f in dataclasses.fields(ChatRequest) if f.name not in ("messages", "sampling"))
#: the names `ChatRequest.of` reads, OpenAI's (the integrations derive the keywords a call may carry from it)
OPENAI_SETTINGS = ("tools", "tool_choice", "max_tokens", "method", "stop", "response_format", "prediction",
                   "chat_template_kwargs", "reasoning_effort", "speculative_tools", *SAMPLING, "logprobs",
                   "top_logprobs", "logit_bias")


def _last(events: Iterable[Event]) -> Generation:
    gen = None
    for gen in events:
        pass
    if not isinstance(gen, Generation):
        raise RuntimeError("the engine's stream ended without a Generation")
    return gen


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
    sampling = Sampling(*(setting(name) for name in SAMPLING))
    return sampling, openai_logprobs(setting("logprobs"), setting("top_logprobs"))


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
