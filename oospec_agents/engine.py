"""The decode loop: draft, verify in one target forward, commit, roll back -- until a stop.

    hint = ticket.poll()                      non-blocking; the sidecar's call as target-format text
    drafts = schema + retrieval + hint        each behind the one Drafter interface
    path, next_token = verify(tree(drafts))   one target forward, greedy acceptance
    commit path + next_token; crop the KV cache past rejected nodes

The target is the only model that commits tokens, so the output equals its greedy decoding.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from transformers import DynamicCache

from .chat import normalize_messages, render_prompt, template_renders_tools
from .drafters import DraftContext, HintDrafter, RetrievalDrafter, SchemaDrafter
from .errors import ContextLengthError, OoOSpecError
from .formats import ToolFormat, detect_format
from .sidecar import FixedHint, HintRequest
from .tools import Tool, check_calls, normalize_tools, resolve_tool_choice
from .verify import Verifier, build_tree

log = logging.getLogger(__name__)

METHODS = ("ar", "toolspec", "oospec")
SOURCES = ("schema", "retrieval", "hint")


@dataclass
class Generation:
    text: str                       # the whole assistant reply as generated, forced opener included
    token_ids: list[int]            # the new tokens only (after `Engine.prompt_ids`)
    tool_calls: list[dict]          # {"id", "name", "arguments": dict}, each valid against its schema
    invalid_tool_calls: list[dict]  # {"id", "name", "arguments": str, "error"}
    stats: dict
    content: str = ""               # the reply's text outside tool calls
    finish_reason: str = "stop"     # "stop" | "length" | "tool_calls"
    prompt_tokens: int = 0


@dataclass
class _Request:
    messages: list[dict]
    tools: list[Tool]
    choice: tuple[str, str | None]
    prefix: str                     # assistant text forced by tool_choice
    prompt_ids: list[int]
    max_new_tokens: int
    stop: list[str] = field(default_factory=list)


class Engine:
    """A target model (the sole verifier) plus an optional sidecar that posts call hints."""

    _shared: dict[tuple, "Engine"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, target, tokenizer, sidecar=None, *, fmt: ToolFormat | None = None,
                 model_name: str | None = None, max_draft_nodes: int = 48, memory_size: int = 32):
        self.target = target
        self.tokenizer = tokenizer
        self.sidecar = sidecar
        self.fmt = fmt or detect_format(getattr(tokenizer, "chat_template", None))
        # Templates that render `tools=` get them natively; others (SmolLM2) get the format's prompt.
        self.native_tools = template_renders_tools(tokenizer)
        self.model_name = model_name or getattr(target.config, "_name_or_path", None) or type(target).__name__
        self.context_window = int(getattr(target.config, "max_position_embeddings", 0) or 2048)
        self.max_draft_nodes = max_draft_nodes
        self._verifier = Verifier(target)
        eos = target.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        self._memory: list[list[int]] = []
        self._memory_size = memory_size
        self._drafters = {"schema": SchemaDrafter(), "retrieval": RetrievalDrafter(), "hint": HintDrafter()}
        # One request at a time owns the target: requests from several threads are serialised.
        self._lock = threading.Lock()
        self._logged_faults: set[str] = set()

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, target="embedded", sidecar=None, *, target_device=None, sidecar_device=None,
                        dtype=None, **kw) -> "Engine":
        """Load a target (HF id, local path, GGUF file, or "embedded") and an optional sidecar.

        `sidecar` is a model reference like `target`, an object implementing the Sidecar protocol,
        or None; with target="embedded" it defaults to the embedded sidecar.
        """
        from . import models
        t_dev, s_dev = models.default_devices(target_device, sidecar_device)
        t_dtype = models.resolve_dtype(dtype, t_dev)
        adapter = kw.pop("adapter", None)
        if str(target) == "embedded" and adapter is None and models.EMBEDDED_TARGET_ADAPTER.exists():
            adapter = models.EMBEDDED_TARGET_ADAPTER
        model, tok = models.load_model(target, device=t_dev, dtype=t_dtype, adapter=adapter)
        if sidecar is None and str(target) == "embedded":
            sidecar = "embedded"
        side = cls._load_sidecar(sidecar, s_dev, models.resolve_dtype(dtype, s_dev), kw)
        name = "embedded:SmolLM2-135M-Instruct" if str(target) == "embedded" else str(target)
        return cls(model, tok, side, model_name=name, **kw)

    @staticmethod
    def _load_sidecar(ref, device, dtype, kw):
        if ref is None or hasattr(ref, "submit"):
            return ref
        try:
            from .sidecar.worker import load_sidecar
        except ImportError:
            log.warning("no sidecar runtime available; method='oospec' will fall back to ToolSpec")
            return None
        return load_sidecar(ref, device=device, dtype=dtype, **{k: kw.pop(k) for k in list(kw) if k.startswith("sidecar_")})

    @classmethod
    def shared(cls, target="embedded", sidecar=None, **kw) -> "Engine":
        """A process-wide engine per distinct set of arguments, so chat-model objects share one."""
        key = (str(target), sidecar if isinstance(sidecar, (str, type(None))) else id(sidecar),
               tuple(sorted((k, str(v)) for k, v in kw.items() if v is not None)))
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls.from_pretrained(target, sidecar, **kw)
            return cls._shared[key]

    # ------------------------------------------------------------------ requests

    def _request(self, messages, tools, tool_choice, max_new_tokens=256, stop=None) -> _Request:
        msgs = normalize_messages(messages)
        tool_list = normalize_tools(tools)
        mode, name = resolve_tool_choice(tool_choice, tool_list)
        if mode == "required" and len(tool_list) == 1:  # one tool on offer: requiring a call names it
            mode, name = "named", tool_list[0].name
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise OoOSpecError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        offered = [] if mode == "none" else tool_list
        prompt = render_prompt(self.tokenizer, self.fmt, msgs, offered, self.native_tools)
        prefix = {"required": self.fmt.forced_prefix(), "named": self.fmt.forced_prefix(name)}.get(mode, "")
        ids = self.tokenizer.encode(prompt + prefix, add_special_tokens=False)
        if len(ids) + 1 > self.context_window:
            raise ContextLengthError(f"the prompt is {len(ids)} tokens, over the target's context window of "
                                     f"{self.context_window} tokens")
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        return _Request(msgs, offered, (mode, name), prefix, ids, min(max_new_tokens, self.context_window - len(ids)),
                        stop)

    def prompt_ids(self, messages, tools=None, *, tool_choice="auto") -> list[int]:
        """The exact ids the target is conditioned on before its first free token."""
        return list(self._request(messages, tools, tool_choice).prompt_ids)

    def generate(self, messages, tools=None, *, tool_choice="auto", max_new_tokens: int = 256,
                 method: str = "oospec", stop=None, hint: str | None = None, **kw) -> Generation:
        """Decode a reply greedily. `hint` injects a fixed call text instead of the sidecar's."""
        gen = None
        for item in self.stream(messages, tools, tool_choice=tool_choice, max_new_tokens=max_new_tokens,
                                method=method, stop=stop, hint=hint, **kw):
            gen = item
        return gen

    def stream(self, messages, tools=None, *, tool_choice="auto", max_new_tokens: int = 256,
               method: str = "oospec", stop=None, hint: str | None = None,
               record_margins: bool = False) -> Iterator[str | Generation]:
        """Yield text deltas as tokens are committed, then the final `Generation`."""
        if method not in METHODS:
            raise OoOSpecError(f"unknown method {method!r}; expected one of {METHODS}")
        req = self._request(messages, tools, tool_choice, max_new_tokens, stop)  # bad input raises here, eagerly
        return self._locked(self._decode(req, method, hint, record_margins))

    def _locked(self, steps):
        threads = torch.get_num_threads()
        with self._lock:
            try:
                yield from steps
            finally:
                torch.set_num_threads(threads)  # _decode may lend cores to a CPU sidecar's wave

    # ------------------------------------------------------------------ the loop

    def _decode(self, req: _Request, method: str, hint_text: str | None, record_margins: bool):
        tok, fmt = self.tokenizer, self.fmt
        stats: dict[str, Any] = {"method": method, "new_tokens": 0, "target_forwards": 0,
                                 "accepted_by_source": dict.fromkeys(SOURCES, 0), "draft_tokens": 0,
                                 "prefill_s": 0.0, "decode_s": 0.0, "hint_ready_s": None, "hint_bytes": None,
                                 "prompt_tokens": len(req.prompt_ids), "sidecar_error": None,
                                 "sidecar_declined": False, "sidecar_profile": None}
        ticket = self._submit(req, method, hint_text, stats)
        lent = self._lend_cores() if ticket is not None and hint_text is None else 0
        drafters = [] if method == "ar" else [self._drafters["schema"], self._drafters["retrieval"]]
        ctx = DraftContext(ids=list(req.prompt_ids), n_prompt=len(req.prompt_ids), text=req.prefix,
                           tools=req.tools, fmt=fmt, tokenizer=tok, memo={"pool": list(self._memory)})
        new: list[int] = []
        margins: list[float] = []
        emitted, finish = "", "length"
        cache = DynamicCache(config=self.target.config)
        sync = torch.cuda.synchronize if self._verifier.device.type == "cuda" else (lambda: None)

        t0 = time.perf_counter()
        logits = self._verifier.forward(req.prompt_ids, cache, 0, last_only=True)
        sync()
        stats["prefill_s"] = time.perf_counter() - t0
        stats["target_forwards"] = 1
        pending = [int(logits[-1].argmax())]
        t1 = time.perf_counter()
        while True:
            # Commit what the last forward decided, then check every stop condition.
            if record_margins:
                top2 = logits.float().topk(2, dim=-1).values
                margins += (top2[:, 0] - top2[:, 1]).tolist()[:len(pending)]
            pending = pending[:req.max_new_tokens - len(new)]
            for t in pending:
                new.append(t)
                if t in self.eos_ids:
                    finish = "stop"
                    break
            ctx.ids = list(req.prompt_ids) + new
            ctx.text = req.prefix + tok.decode(new, skip_special_tokens=True)
            cut = _stop_at(ctx.text, req.stop, len(req.prefix))
            # Hold back text that may still turn out to start a stop string.
            delta_end = len(ctx.text) - _partial_stop(ctx.text, req.stop) if cut is None else cut
            if not ctx.text[:delta_end].endswith("\ufffd") and delta_end > len(emitted):
                yield ctx.text[len(emitted):delta_end]
                emitted = ctx.text[:delta_end]
            if cut is not None:
                finish = "stop"
                break
            if finish == "stop" or len(new) >= req.max_new_tokens:
                break
            # Draft.
            if ticket is not None and ctx.hint is None:
                ctx.hint = self._poll(ticket, req, stats)
                if lent and (ctx.hint or stats["sidecar_error"] or getattr(ticket, "declined", False)):
                    # the wave is over: take the cores back
                    torch.set_num_threads(torch.get_num_threads() + lent)
                    lent = 0
                if ctx.hint:
                    ctx.memo["pool"].append(tok.encode(ctx.hint, add_special_tokens=False))
            drafts = [d for dr in drafters for d in dr.propose(ctx)]
            if ctx.hint:
                drafts = self._drafters["hint"].propose(ctx) + drafts
            tree = build_tree(new[-1], drafts, self.max_draft_nodes)
            # Verify: one forward over the whole tree, then keep the accepted path.
            past = len(req.prompt_ids) + len(new) - 1
            path, nxt, logits = self._verifier.verify(tree, cache, past)
            stats["target_forwards"] += 1
            stats["draft_tokens"] += len(tree.tokens) - 1
            for node in path[1:]:
                stats["accepted_by_source"][tree.sources[node]] += 1
            pending = [tree.tokens[i] for i in path[1:]] + [nxt]
        sync()
        stats["decode_s"] = time.perf_counter() - t1
        if ticket is not None:
            if ctx.hint is None and self._poll(ticket, req, stats) is not None:
                self._fault(stats, "sidecar hint late: it arrived after the reply was complete (reported, not used)")
            elif getattr(ticket, "declined", False):
                stats["sidecar_declined"] = True  # it predicted a text reply: no hint, no fault
            elif ctx.hint is None and stats["sidecar_error"] is None:
                self._fault(stats, "sidecar hint late: not ready when the reply was complete")
            _safe(ticket.cancel)
        text = ctx.text if _stop_at(ctx.text, req.stop, len(req.prefix)) is None else \
            ctx.text[:_stop_at(ctx.text, req.stop, len(req.prefix))]
        stats["new_tokens"] = len(new)
        stats["accepted_tokens"] = sum(stats["accepted_by_source"].values())
        stats["mean_accepted_tokens"] = len(new) / max(1, stats["target_forwards"])
        if record_margins:
            stats["margins"] = margins[:len(new)]
        self._remember(new)
        yield self._finish(req, text, new, finish, stats)

    def _finish(self, req: _Request, text: str, new: list[int], finish: str, stats: dict) -> Generation:
        content, parsed = self.fmt.parse(text)
        calls, invalid = check_calls(parsed, req.tools, id_prefix="call_" + uuid.uuid4().hex[:12])
        if calls and finish == "stop":
            finish = "tool_calls"
        return Generation(text=text, token_ids=new, tool_calls=calls, invalid_tool_calls=invalid, stats=stats,
                          content=content, finish_reason=finish, prompt_tokens=len(req.prompt_ids))

    def _remember(self, new: list[int]) -> None:
        self._memory.append(list(new))
        del self._memory[:-self._memory_size]

    # ------------------------------------------------------------------ the sidecar, behind a fuse

    def _submit(self, req: _Request, method: str, hint_text: str | None, stats: dict):
        if method != "oospec" or not req.tools:
            return None
        sidecar = FixedHint(hint_text) if hint_text is not None else self.sidecar
        if sidecar is None:
            return None  # no sidecar: oospec is ToolSpec
        try:
            return sidecar.submit(HintRequest(req.messages, req.tools, self.fmt, req.choice))
        except Exception as e:  # a sidecar fault never reaches the target's answer
            self._fault(stats, f"sidecar submit failed: {type(e).__name__}: {e}")
            return None

    def _lend_cores(self) -> int:
        """While a CPU sidecar's wave runs, leave it its own cores: oversubscribed cores slow both
        models several-fold. Returns how many threads the target gave up."""
        side_dev = getattr(self.sidecar, "device", None)
        side_threads = getattr(self.sidecar, "threads", None) or 0
        if self._verifier.device.type != "cpu" or side_dev is None or torch.device(side_dev).type != "cpu":
            return 0
        mine = torch.get_num_threads()
        lent = min(side_threads, mine - 1)
        if lent > 0:
            torch.set_num_threads(mine - lent)
        return max(lent, 0)

    def _poll(self, ticket, req: _Request, stats: dict) -> str | None:
        try:
            hint = ticket.poll()
        except Exception as e:
            hint = None
            ticket.error = getattr(ticket, "error", None) or f"sidecar poll failed: {type(e).__name__}: {e}"
        if getattr(ticket, "error", None) and stats["sidecar_error"] is None:
            self._fault(stats, ticket.error)
        if hint is None:
            return None
        stats["hint_ready_s"], stats["hint_bytes"] = hint.ready_s, hint.payload_bytes
        stats["sidecar_profile"] = getattr(hint, "profile", None)
        return hint.text if isinstance(hint.text, str) else None

    def _fault(self, stats: dict, message: str) -> None:
        stats["sidecar_error"] = message
        kind = message.split(":")[0]
        if kind not in self._logged_faults:  # logged once per kind, always visible in stats
            self._logged_faults.add(kind)
            log.warning("%s (the target decodes on without the hint)", message)


def _stop_at(text: str, stops: list[str], start: int) -> int | None:
    hits = [i for s in stops if s and (i := text.find(s, start)) >= 0]
    return min(hits) if hits else None


def _partial_stop(text: str, stops: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    return max((k for s in stops for k in range(len(s) - 1, 0, -1) if text.endswith(s[:k])), default=0)


def _safe(fn) -> None:
    try:
        fn()
    except Exception as e:
        log.warning("sidecar cleanup failed: %s", e)
