"""The decoding methods the benchmark compares, each a function `(BenchContext, Turn, ar) -> Run`.

Engine methods (`ar`, `toolspec`, `oospec`, `oracle`, `suffix`) report their own timings: `prefill_s` is the
target's forward over the prompt (and its first token), `decode_s` everything after. They first
serve the turn's unmeasured `before` requests (see scenarios.py), on a cleared prefix cache and
retrieval memory. With `--strict`, `ar`, `toolspec` and `oospec` also run as `ar+strict`,
`toolspec+strict` and `oospec+strict` (STRICT): the same method under the grammar of valid calls,
`engine.generate(..., strict=True)`, its forced tokens committed by jump-forward. With `--layout split`
(or `both`), `toolspec` and `oospec` also run as `toolspec@split` and `oospec@split` (SPLIT): the target
kept to its core set and the sidecar's worker process to its own (`BenchContext.split_engine`, the same
target model), beside the shared layout's rows, in the same interleaved loop. `suffix` is `toolspec`
with retrieval drafted by a suffix tree over the same prompt, output and call memory, as vLLM's `suffix`
method drafts (drafters/suffix.py, an optional dependency; docs/reports/suffix-tree.md).

transformers' `generate` methods (`hf_generate`, `prompt_lookup`, `assisted`) are timed from the
outside. Their `prefill_s` is a separate plain greedy `generate(max_new_tokens=1)` on the same prompt,
which is the same work as the engine's prefill plus `generate`'s own setup; their end-to-end time is
the full call, and `decode_s` is end-to-end minus that prefill. Target forwards are counted with a
forward hook on the target, so the assistant model's own forwards are not counted as target forwards.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch

from ..drafters.retrieval import CallMemory
from ..events import CallPredicted
from ..sidecar import cores
from .scenarios import Turn


@dataclass
class Run:
    token_ids: list[int]
    text: str
    prefill_s: float
    decode_s: float
    target_forwards: int
    accepted_by_source: dict = field(default_factory=dict)
    hint_ready_s: float | None = None
    hint_bytes: int | None = None
    margins: list[float] | None = None     # AR only: top-2 logit margin per token, for tie checks
    sidecar_error: str | None = None
    sidecar_profile: dict | None = None    # where the sidecar's wave spent its time (oospec)
    prompt_tokens: int | None = None
    cached_prompt_tokens: int = 0          # the target's prompt tokens reused from the prefix cache
    sidecar_cached_prompt_tokens: int | None = None
    sidecar_skipped: str | None = None     # why the wave did not run (the pay-back rule)
    wave_estimate_s: float | None = None   # the pay-back rule's two estimates, when it judged the request
    call_estimate_s: float | None = None
    decode_estimate_s: float | None = None
    host_s: float | None = None            # engine methods: decode time outside the target's forwards
    rounds: list | None = None             # engine methods: (tree nodes, accepted drafts, context) per round
    hint_follow_ups: int = 0               # follow-up waves asked for the function the target wrote
    reasoning: tuple | None = None         # a reply that reasoned: (tokens, forwards, decode s) until it closed
    sidecar: str | None = None             # the sidecar (or fixed hint) asked for a hint, by name
    predicted: list | None = None          # the call(s) the hint first predicted (alpha.py scores them)

    @classmethod
    def of(cls, gen) -> "Run":
        """An engine method's run: the `Generation`'s tokens and text, and its stats under their own names."""
        s = gen.stats
        same = {f.name: getattr(s, f.name) for f in fields(cls)
                if f.name not in ("token_ids", "text", "accepted_by_source", "rounds", "reasoning", "predicted")}
        return cls(gen.token_ids, gen.text, accepted_by_source=dict(s.accepted_by_source),
                   rounds=[list(r) for r in s.rounds], reasoning=None if s.reasoning_forwards is None else
                   (s.reasoning_tokens, s.reasoning_forwards, s.reasoning_s), **same)


@dataclass
class BenchContext:
    engine: object
    max_new_tokens: int = 256
    assistant: object | None = None        # draft model for `assisted`
    assistant_tokenizer: object | None = None  # set only when its vocabulary differs from the target's
    prompt_lookup_tokens: int = 10
    split_engine: object | None = None     # the same target on a core set, its sidecar on another (`@split`)
    temperature: float | None = None       # engine methods sample (`--temperature`), with ...
    seed: int = 0                          # ... this record's seed, the same for every method
    suffix: object | None = None           # the `suffix` method's drafter, made on its first run
    histories: dict = field(default_factory=dict)  # scenario `history`: each method's own call memory


# ------------------------------------------------------------------ our engine

def _engine(ctx: BenchContext, turn: Turn, method: str, hint: str | None = None, margins: bool = False,
            strict: bool = False, split: bool = False, retrieval=None) -> Run:
    if split:  # the process keeps to the target's cores for the run (the sidecar's worker to its own)
        if ctx.split_engine is None:
            raise ValueError(f"method '{method}{SPLIT_SUFFIX}' needs a split layout: pass --layout split or both")
        with cores.pinned(ctx.split_engine.place.cores):
            return _engine(replace(ctx, engine=ctx.split_engine, split_engine=None), turn, method, hint, margins,
                           strict, retrieval=retrieval)
    engine = ctx.engine  # retrieval drafted by `retrieval` for the run (None: the engine's own n-gram drafter)
    if turn.history:  # this method's replies to the earlier records, and no other method's
        key = (engine, method, strict, retrieval is not None)
        engine = engine.with_parts(memory=ctx.histories.setdefault(key, CallMemory(engine.memory.size)))
    if retrieval is not None:
        engine = engine.with_parts(drafters={"retrieval": retrieval})
    return _run(ctx, engine, turn, method, hint, margins, strict)


def _run(ctx: BenchContext, engine, turn: Turn, method: str, hint, margins: bool, strict: bool) -> Run:
    sample = {"temperature": ctx.temperature, "seed": ctx.seed} if ctx.temperature else {}
    if not turn.history:
        engine.clear_call_memory()  # each record is a fresh session: no method retrieves another's output
    engine.clear_prefix_cache()  # and starts cold: no method reuses the prompt another method prefilled
    for messages, tool_choice in turn.before:
        engine.generate(messages, turn.tools, tool_choice=tool_choice, max_new_tokens=ctx.max_new_tokens,
                        method=method, strict=strict, **sample)
    if not turn.keep_memory:
        engine.clear_call_memory()
    if not turn.cached:
        engine.clear_prefix_cache()
    _wait_for_sidecar(engine)
    gen, predicted = None, None
    for item in engine.stream(turn.messages, turn.tools, tool_choice=turn.tool_choice,
                              max_new_tokens=ctx.max_new_tokens, method=method, hint=hint, record_margins=margins,
                              strict=strict, **sample):
        if isinstance(item, CallPredicted) and predicted is None:  # the wave's own prediction, not a follow-up's
            predicted = [dict(c) for c in item.calls]
        gen = item
    return replace(Run.of(gen), predicted=predicted)


def _wait_for_sidecar(engine) -> None:
    """An earlier request's cancelled wave may still be in its prefill: measure on idle cores."""
    if engine.sidecar is not None and not engine.sidecar.wait_idle():
        raise RuntimeError("the sidecar stayed busy for 30 s between benchmark runs")


def ar(ctx, turn, ref=None):
    return _engine(ctx, turn, "ar", margins=True)


def toolspec(ctx, turn, ref=None):
    return _engine(ctx, turn, "toolspec")


def oospec(ctx, turn, ref=None):
    return _engine(ctx, turn, "oospec")


def oracle(ctx, turn, ref: Run):
    # AR's whole reply (forced opener included) is the hint: the hint drafter aligns it to the
    # committed text, which starts with the same opener, and proposes the rest.
    return _engine(ctx, turn, "oospec", hint=ref.text)


def suffix(ctx, turn, ref=None):
    if ctx.suffix is None:  # an optional dependency: imported only when asked for
        from ..drafters.suffix import SuffixDrafter
        ctx.suffix = SuffixDrafter()
    return _engine(ctx, turn, "toolspec", retrieval=ctx.suffix)


def ar_strict(ctx, turn, ref=None):
    # the masked reference: greedy decoding of the target's logits masked by the grammar
    return _engine(ctx, turn, "ar", margins=True, strict=True)


def toolspec_strict(ctx, turn, ref=None):
    return _engine(ctx, turn, "toolspec", strict=True)


def oospec_strict(ctx, turn, ref=None):
    return _engine(ctx, turn, "oospec", strict=True)


def toolspec_split(ctx, turn, ref=None):
    return _engine(ctx, turn, "toolspec", split=True)


def oospec_split(ctx, turn, ref=None):
    return _engine(ctx, turn, "oospec", split=True)


# ------------------------------------------------------------------ transformers' generate

def _hf(ctx: BenchContext, turn: Turn, **extra) -> Run:
    """`generate` keeps no cache across calls: a turn's `before` would leave it nothing, so it is skipped."""
    engine = ctx.engine
    model, tok = engine.target, engine.tokenizer
    prompt = engine.prompt_ids(turn.messages, turn.tools, tool_choice=turn.tool_choice)
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    base = dict(attention_mask=torch.ones_like(ids), do_sample=False, temperature=None, top_p=None, top_k=None,
                max_new_tokens=min(ctx.max_new_tokens, engine.context_window - len(prompt)),
                pad_token_id=model.generation_config.pad_token_id)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(**kw):
        sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, **{**base, **kw})
        sync()
        return out, time.perf_counter() - t0

    _, prefill = timed(max_new_tokens=1)
    forwards = [0]
    hook = model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:
        out, total = timed(**extra)
    finally:
        hook.remove()
    new = out[0, len(prompt):].tolist()
    prefix = engine.prepare(turn.messages, turn.tools, turn.tool_choice).prefix
    return Run(new, prefix + tok.decode(new, skip_special_tokens=True), prefill, max(0.0, total - prefill),
               forwards[0], prompt_tokens=len(prompt))


def hf_generate(ctx, turn, ref=None):
    return _hf(ctx, turn)


def prompt_lookup(ctx, turn, ref=None):
    return _hf(ctx, turn, prompt_lookup_num_tokens=ctx.prompt_lookup_tokens)


def assisted(ctx, turn, ref=None):
    if ctx.assistant is None:
        raise ValueError("method 'assisted' needs a draft model: pass --assistant MODEL")
    extra = {"assistant_model": ctx.assistant}
    if ctx.assistant_tokenizer is not None:  # transformers' universal assisted decoding
        extra.update(tokenizer=ctx.engine.tokenizer, assistant_tokenizer=ctx.assistant_tokenizer)
    return _hf(ctx, turn, **extra)


#: transformers' own decoders (greedy only here)
HF_METHODS = ("hf_generate", "prompt_lookup", "assisted")

METHODS: dict[str, Callable[..., Run]] = {
    "ar": ar, "hf_generate": hf_generate, "prompt_lookup": prompt_lookup, "assisted": assisted,
    "toolspec": toolspec, "oospec": oospec, "oracle": oracle, "suffix": suffix,
}

#: The strict variant of a method's name, and the methods that have one (the engine's own decoders).
STRICT_SUFFIX = "+strict"
STRICT: dict[str, Callable[..., Run]] = {
    "ar" + STRICT_SUFFIX: ar_strict, "toolspec" + STRICT_SUFFIX: toolspec_strict,
    "oospec" + STRICT_SUFFIX: oospec_strict,
}


#: The split-layout variant of a method's name, and the methods that have one.
SPLIT_SUFFIX = "@split"
SPLIT: dict[str, Callable[..., Run]] = {"toolspec" + SPLIT_SUFFIX: toolspec_split, "oospec" + SPLIT_SUFFIX: oospec_split}


def strict_name(method: str) -> str:
    return method + STRICT_SUFFIX


def plain_name(method: str) -> str:
    """`oospec+strict` -> `oospec`; any other name unchanged."""
    return method[:-len(STRICT_SUFFIX)] if method.endswith(STRICT_SUFFIX) else method


def reference(method: str) -> str:
    """The method whose tokens `method`'s are checked against: `ar`, or for a strict variant `ar+strict`
    (the masked reference). Speedups are over `ar` for every method."""
    return strict_name("ar") if method.endswith(STRICT_SUFFIX) else "ar"
