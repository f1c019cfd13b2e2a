"""A request checked and rendered before it decodes: bad input raises here, naming the problem, and what
passes becomes a `Prepared` (request.py), from which one `Reply` decodes. `Engine.prepare` calls these."""
from __future__ import annotations

from dataclasses import dataclass

from .chat import normalize_messages, render_prompt, template_kwargs
from .drafters.prediction import prediction_text
from .errors import ContextLengthError, OoOSpecError, PredictionError
from .formats import Reasoning, ToolFormat
from .grammar import Grammars, response_schema
from .request import ChatRequest, Prepared
from .sampling import Sampling, check_logprobs
from .tools import Tool, normalize_tools, resolve_tool_choice

#: the decode methods: no drafts, the drafters without a sidecar, the drafters and the sidecar's hint
METHODS = ("ar", "toolspec", "oospec")


@dataclass(frozen=True)
class Renderer:
    """What rendering a prompt takes from the engine: its tokenizer and template's ways."""
    tokenizer: object
    fmt: ToolFormat
    reasoning: Reasoning | None     # how the template reasons (None: it does not)
    native_tools: bool              # the template renders `tools=` itself
    context_window: int
    grammars: Grammars


def prepare(r: Renderer, request: ChatRequest) -> Prepared:
    """`Engine.prepare`'s work (its docstring says what each setting does): the request checked, its prompt
    rendered, its decoding settings checked."""
    if not isinstance(request, ChatRequest):
        raise OoOSpecError(f"the engine takes an oospec_agents.ChatRequest (or the keyword form), "
                           f"got {type(request).__name__}")
    method = check_method(request.method)
    msgs = normalize_messages(request.messages)
    tool_list = normalize_tools(request.tools)
    mode, name = resolve_tool_choice(request.tool_choice or "auto", tool_list)
    schema = response_schema(request.response_format)
    check_max_new_tokens(request.max_new_tokens)
    kwargs = template_kwargs(r.tokenizer.chat_template, request.chat_template_kwargs, request.reasoning_effort)
    offered = [] if mode == "none" else tool_list
    prompt = render_prompt(r.tokenizer, r.fmt, msgs, offered, r.native_tools, kwargs)
    reasoning = None if r.reasoning is None else r.reasoning.for_prompt(prompt)
    forced = {"required": r.fmt.forced_prefix(), "named": r.fmt.forced_prefix(name)}.get(mode, "")
    prefix = "" if reasoning is not None else forced
    prompt_ids = r.tokenizer.encode(prompt + prefix, add_special_tokens=False)
    if len(prompt_ids) + 1 > r.context_window:
        raise ContextLengthError(f"the prompt is {len(prompt_ids)} tokens, over the target's context window of "
                                 f"{r.context_window} tokens")
    stops = check_stop(request.stop)
    guide = r.grammars.json_guide(schema, reasoning) if schema is not None and not offered \
        else r.grammars.guide(offered, mode, name, request.strict, reply=schema, reasoning=reasoning)
    return Prepared(msgs, offered, (mode, name), prefix, prompt_ids,
                    min(request.max_new_tokens, r.context_window - len(prompt_ids)), stops, guide,
                    reasoning=reasoning, method=method, **_decoding(r, request, offered))


def _decoding(r: Renderer, request: ChatRequest, offered: list[Tool]) -> dict:
    """`Prepared`'s decoding settings of `request`, checked: sampling, logprobs, speculative tools, prediction."""
    if not isinstance(request.sampling, Sampling):
        raise OoOSpecError(f"sampling must be an oospec_agents.sampling.Sampling, got {type(request.sampling).__name__}")
    return {"sampling": request.sampling, "top_logprobs": check_logprobs(request.logprobs),
            "tool_s": tool_seconds(request.speculative_tools, offered),
            "predicted": prediction_ids(r.tokenizer, request.prediction, r.context_window)}


def check_method(method) -> str:
    if method not in METHODS:
        raise OoOSpecError(f"unknown method {method!r}; expected one of {METHODS}")
    return method


def check_max_new_tokens(max_new_tokens) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise OoOSpecError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def check_stop(stop) -> list[str]:
    """Stop strings as a list: a string, a list of non-empty strings, or None."""
    stop = [stop] if isinstance(stop, str) else stop
    if stop is None:
        return []
    if not isinstance(stop, (list, tuple)):
        raise OoOSpecError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    for i, s in enumerate(stop):
        if not isinstance(s, str) or not s:
            raise OoOSpecError(f"stop[{i}] is {s!r}; every stop sequence must be a non-empty string")
    return list(stop)


def prediction_ids(tokenizer, prediction, context_window: int) -> list[int]:
    """A `prediction`'s target tokens, checked: none longer than the context window, which no reply fills."""
    text = prediction_text(prediction)
    ids = tokenizer.encode(text, add_special_tokens=False) if text else []
    if len(ids) > context_window:
        raise PredictionError(f"the prediction is {len(ids)} tokens, over the target's context window of "
                              f"{context_window} tokens")
    return ids


def tool_seconds(speculative_tools, tools: list[Tool]) -> float | None:
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
