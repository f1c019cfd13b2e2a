"""`oospec demo`: one tool-call request on the embedded pair, decoded by `ar`, `toolspec` and `oospec`,
and a short summary: the conditions, the call, each method's target forwards and seconds, where the
accepted tokens came from, and whether the outputs are identical. `--json` prints every method's full
stats instead.

Every method prefills the same prompt, so a spread in their prefill seconds is this machine's noise,
not speculation's doing (4.16 s against 1.92 s has been seen on a busy 2-core VM). The end-to-end
speedup therefore counts one prefill, the methods' median, for each; the measured totals stand beside.
"""
from __future__ import annotations

import json
import statistics
import time

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}

METHODS = ("ar", "toolspec", "oospec")
MAX_NEW_TOKENS = 64

#: what each source of accepted draft tokens is, in the summary's words
SOURCE_WORDS = {"hint": "the sidecar's hint", "schema": "the tool schema", "retrieval": "retrieval",
                "grammar": "the grammar", "prediction": "the prediction"}


def add_parser(sub, name):
    p = sub.add_parser(name, help="run one tool-call request on the embedded models and print a summary")
    p.add_argument("--model", default="embedded", help="the target: 'embedded', a HF id, a local dir or a .gguf")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated, from ar,toolspec,oospec (ar, the baseline, always runs)")
    p.add_argument("--tool-choice", default="required")
    p.add_argument("--prompt", default="What is the weather like in Paris today, in celsius?")
    p.add_argument("--json", action="store_true",
                   help="print each method's text, tool calls and full stats as JSON instead of the summary")
    p.set_defaults(run=run)


def quiet() -> None:
    """Silence the libraries' known noise (weight-loading progress bars, deprecation notices, logging)
    for the demo's whole process. The library's loads hold back only the bars and the libraries' deprecation
    warnings, unless asked (quiet.py); silencing logging and every warning is the demo's choice."""
    import logging
    import os
    import warnings
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category)
    for name in ("transformers", "torch", "gguf", "peft", "huggingface_hub", "accelerate", "oospec_agents"):
        logging.getLogger(name).setLevel(logging.ERROR)  # sidecar faults still show in the summary
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def methods_of(text: str) -> list[str]:
    asked = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in asked if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; expected some of {list(METHODS)}")
    return ["ar"] + [m for m in METHODS[1:] if m in asked]


def measure(engine, messages, tools, tool_choice, methods) -> dict:
    """Each method from the same cold start (no cached prompt, no remembered call), so their figures
    compare, after a warm-up: the request once by `ar` and by `toolspec` (a process's first forwards of
    each shape are slow; `oospec`'s trees are `toolspec`'s). The warm-up runs no sidecar wave, so the
    pay-back rule has no estimate of one yet and `oospec`'s wave runs, as on an engine's first request."""
    for method in ("ar", "toolspec"):
        engine.generate(messages, tools, tool_choice=tool_choice, max_new_tokens=MAX_NEW_TOKENS, method=method)
    gens = {}
    for method in methods:
        engine.clear_call_memory()   # no method drafts from another's reply
        engine.clear_prefix_cache()  # and each prefills the whole prompt
        if engine.sidecar is not None:
            engine.sidecar.wait_idle()
        gens[method] = engine.generate(messages, tools, tool_choice=tool_choice, max_new_tokens=MAX_NEW_TOKENS,
                                       method=method)
    return gens


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _call_text(call: dict) -> str:
    args = call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"],
                                                                                  ensure_ascii=False)
    return f"{call['name']}({args})"


def _sources(stats) -> str:
    parts = [f"{n} from {SOURCE_WORDS.get(s, s)}" for s, n in
             sorted(stats.accepted_by_source.items(), key=lambda kv: -kv[1]) if n]
    return ", ".join(parts + [f"{stats.target_forwards} from the target's own forwards"])


def summary(prompt: str, tools: list[dict], tool_choice: str, gens: dict, *, models: dict | None = None,
            shares_cpu: bool = False) -> str:
    """The demo's human summary of one request decoded by each method in `gens` (ar first). `models`:
    {"target": ..., "sidecar": ..., "conditions": ...} lines to show first."""
    ar = gens["ar"]
    names = ", ".join(t["function"]["name"] for t in tools)
    lines = ["oospec demo", ""] + [f"  {k:<12} {v}" for k, v in (models or {}).items()]
    lines += [f"  request      {prompt}",
             f"  tools        {names}   (tool_choice={tool_choice})"]
    problems = {p["id"]: p["error"] for p in ar.tool_call_problems}
    calls = [_call_text(c) + (f" (misfits its schema: {problems[c['id']]})" if c["id"] in problems else "")
             for c in ar.tool_calls] + [f"invalid: {_call_text(c)} ({c['error']})" for c in ar.invalid_tool_calls]
    lines += [f"  tool call    {c}" for c in calls] or [f"  reply        {ar.content or ar.text!r} (no tool call)"]
    lines += ["", f"  {'method':<9} {'target forwards':>15} {'tokens':>7} {'prefill':>8} {'decode':>8} "
                  f"{'total':>8}   speedup over ar (decode, end to end)"]
    base = ar.stats
    prefills = [g.stats.prefill_s for g in gens.values()]
    prefill = statistics.median(prefills)
    for method, gen in gens.items():
        s = gen.stats
        lines.append(f"  {method:<9} {s.target_forwards:>15} {s.new_tokens:>7} {s.prefill_s:>7.2f}s {s.decode_s:>7.2f}s "
                     f"{s.prefill_s + s.decode_s:>7.2f}s   {base.decode_s / max(s.decode_s, 1e-9):.2f}x, "
                     f"{(prefill + base.decode_s) / max(prefill + s.decode_s, 1e-9):.2f}x")
    lines += [f"  {'':<9} end to end counts one prefill for every method, the median {prefill:.2f}s: each",
              f"  {'':<9} prefilled the same {base.prompt_tokens}-token prompt, in {min(prefills):.2f}-{max(prefills):.2f}s "
              "(this machine's noise)", ""]
    for method, gen in gens.items():
        if method != "ar":
            lines.append(f"  {method + ':':<9} {gen.stats.new_tokens} tokens = {_sources(gen.stats)}")
    if "oospec" in gens:
        s = gens["oospec"].stats
        if s.sidecar_skipped:
            side = f"the sidecar's wave did not run: {s.sidecar_skipped}"
        elif s.sidecar_error:
            side = f"the sidecar gave no hint ({s.sidecar_error}); the target decoded on without it"
        elif s.sidecar_declined:
            side = "the sidecar predicted no call, so there was no hint"
        elif s.hint_ready_s is not None:
            side = f"the sidecar's hint was ready {s.hint_ready_s:.2f}s after the request ({s.hint_bytes} B)"
        else:
            side = "no sidecar hint"
        lines.append(f"  {'sidecar:':<9} {side}")
        if shares_cpu:
            lines += [f"  {'':<9} it shares the target's CPU cores here, so its wave's seconds land on the call;",
                      f"  {'':<9} later requests run it only where the pay-back rule expects it to pay back"]
    lines.append("")
    diffs = {m: first_difference(ar.token_ids, g.token_ids) for m, g in gens.items() if m != "ar"}
    if all(d is None for d in diffs.values()):
        lines.append(f"  lossless: every method's {len(ar.token_ids)} tokens are identical to ar's "
                     f"(the target alone, greedy)")
    else:
        for m, d in diffs.items():
            if d is not None:
                lines.append(f"  NOT identical: {m} differs from ar at new token {d} (in bf16 a near tie can round "
                             f"differently in a multi-token forward; float32 is exact: docs/bench.md)")
    lines.append("  forwards are the portable figure; seconds are this machine's, for this one request;")
    lines.append("  the README's Benchmark has many records and their conditions")
    return "\n".join(lines)


def conditions(engine, shares: bool) -> dict:
    """The lines that say what the figures were measured under: layout and pay-back, then the device,
    dtype, threads, date and commit."""
    import torch

    from .bench.env import git_commit
    side = engine.sidecar
    layout = "no sidecar" if side is None else \
        "shared (the sidecar on the target's cores)" if shares else f"split (the sidecar on {side.device})"
    payback = "pay-back off" if engine.payback is None else "pay-back on (a first request runs the wave: no estimate yet)"
    return {"layout": f"{layout}; {payback}",
            "measured": f"one request; {engine.place.device.type}, {str(engine.target.dtype).removeprefix('torch.')}, "
                        f"torch threads {torch.get_num_threads()}; {time.strftime('%Y-%m-%d', time.gmtime())}, "
                        f"git {git_commit() or 'unknown'}"}


def as_json(gens: dict) -> dict:
    return {m: {"text": g.text, "tool_calls": g.tool_calls, "tool_call_problems": g.tool_call_problems,
                "invalid_tool_calls": g.invalid_tool_calls,
                "stats": g.stats.to_dict()} for m, g in gens.items()}


def run(args):
    quiet()
    from .engine import Engine
    from .sidecar import cores
    methods = methods_of(args.methods)
    engine = Engine.from_pretrained(args.model)
    messages = [{"role": "user", "content": args.prompt}]
    gens = measure(engine, messages, [WEATHER_TOOL], args.tool_choice, methods)
    if args.json:
        from .cli import print_json
        print_json(as_json(gens))
        return 0
    dtype = str(engine.target.dtype).removeprefix("torch.")
    side = engine.sidecar
    shares = side is not None and cores.shares_cpu(side.device, side.cores, engine.place)
    models = {"target": f"{engine.model_name} ({engine.place.device.type}, {dtype})",
              "sidecar": "none" if side is None else f"{side.name} ({side.device})",
              **conditions(engine, shares)}
    print(summary(args.prompt, [WEATHER_TOOL], args.tool_choice, gens, models=models, shares_cpu=shares))
    return 0
