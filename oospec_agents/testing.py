"""TEST DOUBLE: `Scripted`, the real `Engine` on a scripted model, for tests of what surrounds decoding.

The model is a tiny randomly initialised Llama with SmolLM2's tokenizer, whose forward hook puts the
script's next token far above every other at each position (the engine passes its position ids): greedy
decoding, sampling and every method write the scripted reply, then the end-of-sequence token. Replies
are queued, one per request, in the order requests begin; everything else is the engine's own: prompt
rendering and checks, drafting and verification, stop cutting, events, finishing, stats and logprobs.
Front-end tests (LangChain, LlamaIndex, the server, the bench) run on it without loading real weights.

A request begins with a forward from position 0 (the engine keeps no prefix cache and decodes one
reply at a time): its rows are the prompt (and any tokens a grammar forced), and the reply written after
them is the next scripted one, less what the prompt already ends with (a forced call's opener). Each
reply is tied to its KV cache, so replies of several threads may take turns. Without call memory (unless
asked), a request decodes alike whatever came before it. Cheap: every scripted model shares one set of
weights, a forward takes a millisecond, and torch runs on one thread while a scripted reply computes.

`predictions` (reply k, in the order replies begin -> calls) give the engine a scripted sidecar whose
hint is those calls: the engine's own loop reads it and sends `CallPredicted` (method "oospec" only).
Given a `Reasoning`, the tokenizer gets a Qwen3-style `<think>` template (`chat_template`), so the
engine reads the replies' `<think>` blocks as reasoning. `requests` records each request's settings.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import threading
from typing import Iterator

import torch

from .engine import Engine, Event
from .formats import Reasoning
from .request import ChatRequest
from .sidecar import FixedHint, HintRequest, SidecarBase


#: Sampling settings every front-end refuses before decoding: (the field its error names, the settings,
#: a regex of its message). Each front-end's tests add what only it takes (`n`, penalties, ...).
BAD_SAMPLING = [
    ("temperature", {"temperature": -0.1}, r"temperature must be a number from 0 to 2 \(OpenAI's range.*, got -0.1"),
    ("temperature", {"temperature": 5}, r"temperature must be a number from 0 to 2 \(OpenAI's range.*, got 5"),
    ("top_p", {"top_p": 0}, r"top_p must be a number in \(0, 1\]"),
    ("top_k", {"top_k": -3}, "top_k must be >= 0"),
    ("min_p", {"min_p": 1.5}, r"min_p must be a number in \[0, 1\]"),
    ("seed", {"seed": 2 ** 64}, "seed must be an integer from"),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 21}, "top_logprobs must be an integer from 0 to 20"),
    ("top_logprobs", {"top_logprobs": 2}, "top_logprobs=2 needs logprobs=true"),
]

#: book_table(restaurant: str, people: int, time: str) as an OpenAI tool: the tool of `CALL_REPLIES`
BOOK_TABLE = {"type": "function", "function": {
    "name": "book_table", "description": "Book a table at a restaurant.",
    "parameters": {"type": "object", "properties": {"restaurant": {"type": "string"}, "people": {"type": "integer"},
                                                     "time": {"type": "string"}},
                   "required": ["restaurant", "people", "time"]}}}


def _book(arguments: str) -> str:
    return '<tool_call>\n{"name": "book_table", "arguments": ' + arguments + '}\n</tool_call>'


#: Replies (hermes text, as `Scripted` writes them) whose calls every front-end must class as
#: OpenAI does, and alike streamed and not: a call whose arguments parse but misfit the schema (a tool
#: call, its problem reported beside it), one whose arguments do not parse (an invalid call), and two
#: calls, the second a misfit.
CALL_REPLIES = {
    "misfit": "Booking it." + _book('{"restaurant": "Da Michele", "people": "4", "time": "19:30"}'),
    "unparseable": _book('{"restaurant": "Da Michele", "people": 4, "time": 19:30}'),
    "two_calls": _book('{"restaurant": "Da Michele", "people": 4, "time": "19:30"}') + "\n"
                 + _book('{"restaurant": "Pizzeria Bella", "people": "two", "time": "20:00"}'),
}




#: a call id as the engine gives it, `call_<reply>_<i>`: new each reply
CALL_ID = re.compile(r"\bcall_[0-9a-f]{12}_(\d+)\b")


def by_index(value):
    """`value` with each call id the engine gives (`CALL_ID`) as `call_<i>`: what two replies to one request
    have alike. Strings, and the strings in lists, tuples and dicts (keys too), are rewritten."""
    if isinstance(value, str):
        return CALL_ID.sub(r"call_\1", value)
    if isinstance(value, (list, tuple)):
        return type(value)(by_index(v) for v in value)
    if isinstance(value, dict):
        return {by_index(k): by_index(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------- templates

def chat_template(opens: bool = False, reads_reasoning: bool = True, effort: bool = False) -> str:
    """A Qwen3-style ChatML template with `<think>` blocks: tools in the system turn, earlier turns'
    `reasoning_content` written back (`reads_reasoning`), `enable_thinking=False` closing an empty block
    in the generation prompt (anything but a boolean is refused); with `opens`, the generation prompt
    opens the block itself (DeepSeek-R1 distills); with `effort`, a `reasoning_effort` line."""
    assistant_reasoning = ("{%- if message.reasoning_content is string %}{{- '<think>\\n' + "
                           "message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}{%- endif %}"
                           if reads_reasoning else "")
    generation = ("{{- '<think>\\n' }}" if opens else
                  "{%- if enable_thinking is defined and enable_thinking is false %}"
                  "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}")
    return "".join([
        "{%- if enable_thinking is defined and enable_thinking is not boolean %}"
        "{{- raise_exception('enable_thinking must be true or false') }}{%- endif %}",
        "{%- if reasoning_effort is defined %}{{- '<|im_start|>system\\nReasoning: ' + reasoning_effort + "
        "'<|im_end|>\\n' }}{%- endif %}" if effort else "",
        "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
        "{{- '\\n' + (tool | tojson) }}{%- endfor %}{{- '\\n</tools>\\nCall a function within <tool_call>"
        "</tool_call> XML tags; think first in <think></think> tags.<|im_end|>\\n' }}{%- endif %}",
        "{%- for message in messages %}",
        "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}", assistant_reasoning,
        "{{- message.content }}{%- for c in message.tool_calls or [] %}{{- '\\n<tool_call>\\n{\"name\": \"' + "
        "c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson) + '}\\n</tool_call>' }}"
        "{%- endfor %}{{- '<|im_end|>\\n' }}",
        "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + "
        "'\\n</tool_response><|im_end|>\\n' }}",
        "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}",
        "{%- endfor %}",
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}", generation, "{%- endif %}",
    ])


@functools.lru_cache(maxsize=None)
def tokenizer(reasoning: bool = False):
    """SmolLM2's tokenizer (the embedded target's), loaded once; with `reasoning`, a copy under
    `chat_template(effort=True)`."""
    from transformers import AutoTokenizer

    from .models import resolve_reference
    tok = AutoTokenizer.from_pretrained(resolve_reference("embedded"))
    if reasoning:
        tok.chat_template = chat_template(effort=True)
    return tok


# ---------------------------------------------------------------- the scripted model

class Script:
    """The replies a scripted model writes, one per request in the order requests begin, and the calls
    its sidecar predicts for them (reply k -> calls). `add` queues more."""

    def __init__(self, tok, replies=(), predictions: dict[int, list[dict]] | None = None):
        self.tokenizer, self.eos = tok, tok.eos_token_id
        self.replies, self.predictions = list(replies), dict(predictions or {})
        self.begun = 0  # replies begun
        self._writing: dict[int, tuple[int, list[int]]] = {}  # id(KV cache) -> (first reply position, tokens)
        self._lock = threading.Lock()

    def add(self, *replies: str, predicted: list[dict] | None = None) -> None:
        """Queue `replies`; with `predicted`, the sidecar predicts those calls for each of them."""
        with self._lock:
            for k in range(len(replies)):
                if predicted:
                    self.predictions[self.begun + len(self.replies) + k] = predicted
            self.replies.extend(replies)

    def predicted(self) -> list[dict] | None:
        """The calls predicted for the reply that begins next (None: none)."""
        return self.predictions.get(self.begun)

    def hook(self, module, args, kwargs, out):
        """The model's forward hook: the script's token far above every other, at each position."""
        positions = kwargs["position_ids"][0]
        key = id(kwargs.get("past_key_values"))
        if int(positions[0]) == 0:  # a prompt, from its start: the next reply begins after it
            self._writing[key] = self._begin(kwargs["input_ids"][0].tolist())
        start, tokens = self._writing[key]
        rows = out.logits.shape[1]
        for row, pos in enumerate(positions[-rows:].tolist()):
            k = pos + 1 - start  # the logits at `pos` choose the token after it
            out.logits[0, row, tokens[k] if 0 <= k < len(tokens) else self.eos] += 1e4

    def _begin(self, prompt: list[int]) -> tuple[int, list[int]]:
        with self._lock:
            if not self.replies:
                raise RuntimeError(f"the scripted model has no reply left for request {self.begun + 1}")
            reply = self.replies.pop(0)
            self.begun += 1
        said = self.tokenizer.decode(prompt[-64:])
        # what the prompt already ends with (a forced call's opener, an opened block) is not written again
        ahead = next((k for k in range(min(len(reply), len(said)), 1, -1)
                      if reply[:k].strip() and said.endswith(reply[:k])), 0)
        return len(prompt), self.tokenizer.encode(reply[ahead:], add_special_tokens=False) + [self.eos]


def scripted_model(script: Script):
    """A tiny random Llama (one layer, width 16; a millisecond a forward) with the script's hook. Every
    scripted model shares one set of weights, made once (read only: the engine never writes them)."""
    from transformers import AutoModelForCausalLM
    base = _base_model(script.tokenizer)
    with torch.device("meta"):  # no weights made, none initialised: the base's are assigned
        model = AutoModelForCausalLM.from_config(base.config, dtype=torch.float32)
    model.load_state_dict(base.state_dict(), assign=True)
    for name, buffer in base.named_buffers():  # the rotary frequencies, which the state leaves out
        module, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(module), leaf, buffer)
    model.eval().generation_config.eos_token_id = model.generation_config.pad_token_id = script.eos
    model.register_forward_hook(script.hook, with_kwargs=True)
    return model


@functools.lru_cache(maxsize=None)
def _base_model(tok):
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


class ScriptedSidecar(SidecarBase):
    """TEST DOUBLE: a sidecar whose hint for a request is the calls its script predicts for the reply
    that begins next (rendered in the request's format), ready at once; it declines where none are."""
    name = "scripted sidecar"

    def __init__(self, script: Script):
        self.script = script

    def submit(self, request: HintRequest):
        calls = self.script.predicted()
        if not calls:
            return _Declined()
        return FixedHint(request.fmt.render_calls(calls)).submit(request)


class _Declined:
    error, declined = None, True

    def poll(self):
        return None

    def cancel(self) -> None:
        pass


class Scripted(Engine):
    """The real `Engine` on a scripted model (the module's docstring) writing `replies`, one per request;
    `predictions` (reply k -> calls) give it a `ScriptedSidecar`; a `reasoning` makes its template a
    `<think>` one; `engine` keywords go to `Engine` (no call memory unless `memory_size` is given: a request
    then decodes alike whatever came before it). `script` queues more replies; `requests` holds each
    request's settings."""

    def __init__(self, *replies: str, predictions: dict[int, list[dict]] | None = None,
                 reasoning: Reasoning | None = None, model_name: str = "scripted-test-double", **engine):
        tok = tokenizer(reasoning is not None)
        self.script = Script(tok, replies, predictions)
        self.requests: list[dict] = []
        sidecar = None if predictions is None else ScriptedSidecar(self.script)
        engine = {"memory_size": 0, **engine}  # by default, a request decodes alike whatever came before it
        super().__init__(scripted_model(self.script), tok, sidecar, model_name=model_name, prefix_cache_tokens=0,
                         max_batch=1, wave_payback=None, hint_follow_up=False, **engine)

    def stream(self, request, tools=None, *, hint: str | None = None, record_margins: bool = False, cancel=None,
               **settings) -> Iterator[Event]:
        """`Engine.stream`, its request's settings recorded once it is checked."""
        if not isinstance(request, ChatRequest):
            request = ChatRequest.build(request, tools, **settings)  # bad settings raise here, as the engine's do
        events = super().stream(request, hint=hint, record_margins=record_margins, cancel=cancel)
        self.requests.append(settings_of(request))
        return _on_one_thread(events)


def _on_one_thread(events: Iterator[Event]) -> Iterator[Event]:
    """`events`, each computed with torch on one thread: a tiny model's forwards gain nothing from more,
    and on a busy machine the idle threads' spinning makes each forward and argmax ~10x slower."""
    with contextlib.closing(events):
        while True:
            with _ONE_THREAD:
                event = next(events, None)
            if event is None:
                return
            yield event


class _OneThread:
    """torch on one thread while any scripted reply computes (nested and threaded entries counted)."""

    def __init__(self):
        self.lock, self.inside, self.saved = threading.Lock(), 0, 1

    def __enter__(self):
        with self.lock:
            if self.inside == 0:
                self.saved = torch.get_num_threads()
                torch.set_num_threads(1)
            self.inside += 1

    def __exit__(self, *exc):
        with self.lock:
            self.inside -= 1
            if self.inside == 0:
                torch.set_num_threads(self.saved)


_ONE_THREAD = _OneThread()


def settings_of(request: ChatRequest) -> dict:
    """A request's settings as a dict: messages, tools, tool_choice, max_new_tokens, method, stop, those of
    the optional ones it sets, and its sampling's (those set, and `logprobs`)."""
    sampling = {**dataclasses.asdict(request.sampling), "logprobs": request.logprobs}
    return {"messages": request.messages, "tools": request.tools, "tool_choice": request.tool_choice,
            "max_new_tokens": request.max_new_tokens, "method": request.method, "stop": request.stop,
            **{k: v for k in ("response_format", "prediction", "chat_template_kwargs", "reasoning_effort")
               if (v := getattr(request, k)) is not None},
            **{k: v for k, v in sampling.items() if v is not None}}
