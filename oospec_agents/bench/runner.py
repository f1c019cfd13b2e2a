"""The benchmark loop: one warm-up, then every method on each record, interleaved, checked against AR.

AR runs first on each record because it is the reference (and the oracle's hint); the other
methods follow in an order rotated per record, so drift and cache effects hit each one alike.
With a warm scenario (scenarios.py) each record is measured twice, cold then warm. Every run is
checked against the cold AR's tokens (the target alone, from an empty cache); speedups are over the
AR of the same pass.

With `strict` (`--strict`), each engine method in `methods` (`ar`, `toolspec`, `oospec`) also runs
under the grammar of valid calls, as `ar+strict`, `toolspec+strict`, `oospec+strict`, in the same
rotation as the others. A strict run is checked against `ar+strict`'s tokens (the masked
reference); its speedups are over the plain `ar`, like every other method's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm.auto import tqdm

from . import alpha
from .env import environment
from ..sidecar import cores
from .methods import HF_METHODS, METHODS, SPLIT, STRICT, BenchContext, Run, reference, strict_name
from .metrics import compare, summarize, tie_tolerance
from .scenarios import turns


@dataclass
class BenchConfig:
    methods: tuple[str, ...] = tuple(METHODS)
    tool_choice: str = "required"
    max_new_tokens: int = 256
    prompt_lookup_tokens: int = 10
    warmup: bool = True
    progress: bool = True
    scenario: str = "cold"      # "cold" | "warm_tools" | "agent_loop" | "history" (see scenarios.py)
    strict: bool = False        # also run every engine method strict, as `<method>+strict`
    temperature: float | None = None  # sample (engine methods only): every method draws with one seed per record
    seed: int = 0                     # the first record's seed


def check_methods(methods) -> list[str]:
    unknown = [m for m in methods if m not in METHODS and m not in SPLIT]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; expected some of {list(METHODS) + list(SPLIT)}")
    # AR is the reference every other method is checked and timed against.
    return ["ar"] + [m for m in dict.fromkeys(methods) if m != "ar"]


def with_strict(methods: list[str]) -> list[str]:
    """`methods`, then the strict variant of each engine method among them (`ar+strict` first)."""
    return methods + [strict_name(m) for m in methods if strict_name(m) in STRICT]


def run_bench(engine, records: list[dict], config: BenchConfig = BenchConfig(), *, assistant=None,
              assistant_tokenizer=None, data: str | None = None, split_engine=None) -> dict:
    """Run every method on every record; returns the results dict that report.write_all saves.
    `split_engine` (the same target on a core set of its own, its sidecar on another) runs the `@split` methods."""
    methods = check_methods(config.methods)
    if config.strict:
        methods = with_strict(methods)
    if config.temperature and (outside := [m for m in methods if m in HF_METHODS]):
        raise ValueError(f"--temperature samples with the engine's methods only; drop {outside}")
    ctx = BenchContext(engine, config.max_new_tokens, assistant, assistant_tokenizer, config.prompt_lookup_tokens,
                       split_engine, config.temperature)
    tol = tie_tolerance(engine.target.dtype)
    passes = len(turns(records[0], config.scenario, config.tool_choice))
    started = time.time()
    bar = tqdm(total=(len(records) + int(config.warmup)) * len(methods) * passes,
               desc="oospec bench", unit="run", disable=not config.progress)
    if config.warmup:
        bar.set_postfix_str("warm-up")
        _run_record(ctx, records[0], methods, 0, tol, bar, config)
        ctx.histories.clear()  # scenario `history`: no method keeps the warm-up's replies
    rows = [_run_record(ctx, rec, methods, i, tol, bar, config) for i, rec in enumerate(records)]
    bar.close()
    measured = [r.get("warm", r["cold"]) for r in rows]
    results = summarize(measured, methods)
    results["env"] = environment(engine, assistant) | {"scenario": config.scenario,
                                                       "warm_tools": config.scenario == "warm_tools",
                                                       "agent_loop": config.scenario == "agent_loop"}
    results["config"] = {"data": data, "n_records": len(records), "methods": methods,
                         "tool_choice": config.tool_choice, "max_new_tokens": config.max_new_tokens,
                         "prompt_lookup_num_tokens": config.prompt_lookup_tokens, "warmup": config.warmup,
                         "scenario": config.scenario, "strict": config.strict, "wave_payback": _ratio(engine),
                         "sidecar_prior_weight": _prior_weight(engine),
                         "hint_follow_up": engine.hint_follow_up, "max_draft_nodes": engine.max_draft_nodes,
                         "tie_tolerance": tol, "wall_s": round(time.time() - started, 1),
                         "layout": _layout(engine, split_engine), "temperature": config.temperature,
                         "seed": config.seed if config.temperature else None}
    results["records"] = measured
    if passes > 1:  # the same records cold, side by side
        cold = [r["cold"] for r in rows]
        results["cold"] = summarize(cold, methods) | {"records": cold}
    return results


def _run_record(ctx: BenchContext, rec: dict, methods: list[str], index: int, tol: float, bar,
                config: BenchConfig) -> dict:
    """{"cold": row} or {"cold": row, "warm": row}; each row {"id", "source", "runs": {method: figures}}."""
    others = methods[1:]
    k = index % len(others) if others else 0
    order = ["ar"] + others[k:] + others[:k]
    out: dict[str, dict] = {}
    refs: dict[str, Run] = {}
    ctx.seed = config.seed + index  # under --temperature: one seed per record, the same for every method
    for name, turn in turns(rec, config.scenario, config.tool_choice).items():
        runs: dict[str, Run] = {}
        for m in order:
            bar.set_postfix_str(f"{rec['id']} {name} {m}"[-48:])
            runs[m] = (METHODS.get(m) or STRICT.get(m) or SPLIT[m])(ctx, turn, runs.get("ar"))
            bar.update(1)
        if name == "cold":  # the references: `ar`, and `ar+strict` for the strict runs
            refs = {m: runs[m] for m in ("ar", strict_name("ar")) if m in runs}
        out[name] = {"id": rec["id"], "source": rec["source"],
                     "runs": {m: _row(m, runs[m], refs[reference(m)], tol, ctx.engine.fmt) for m in methods}}
    return out


def _row(m: str, r: Run, ref: Run, tol: float, fmt) -> dict:
    check = compare(ref.token_ids, ref.margins or [], r.token_ids, tol)
    row = {"new_tokens": len(r.token_ids), "prefill_s": r.prefill_s, "decode_s": r.decode_s,
           "target_forwards": r.target_forwards, "accepted_by_source": r.accepted_by_source or None,
           "hint_ready_s": r.hint_ready_s, "hint_bytes": r.hint_bytes, "sidecar_error": r.sidecar_error,
           "sidecar_profile": r.sidecar_profile, "prompt_tokens": r.prompt_tokens,
           "cached_prompt_tokens": r.cached_prompt_tokens,
           "sidecar_cached_prompt_tokens": r.sidecar_cached_prompt_tokens, "sidecar_skipped": r.sidecar_skipped,
           "wave_estimate_s": r.wave_estimate_s, "call_estimate_s": r.call_estimate_s,
           "decode_estimate_s": r.decode_estimate_s, "host_s": r.host_s,
           "rounds": r.rounds, "hint_follow_ups": r.hint_follow_ups, "check": check}
    if r.sidecar is not None:  # a method with a sidecar (or a fixed hint): its hint against the target's own call
        row["predicted"] = r.predicted
        row["alpha"] = alpha.score(r.predicted, alpha.target_calls(fmt, ref.text))
    if r.reasoning is not None:  # a reply that reasoned: what came before its answer (metrics' `answer_part`)
        row["reasoning_tokens"], row["reasoning_forwards"], row["reasoning_s"] = r.reasoning
    if m == reference(m) or check["verdict"] != "exact":
        row["text"] = r.text
    return row


def _prior_weight(engine) -> float | None:
    """The sidecar wave's lexical prior weight: its `Wave`'s (a thread) or its `WorkerSpec`'s (a process,
    a Ray actor); None without a sidecar."""
    side = getattr(engine, "sidecar", None)  # a benchmark's engine may be a test double without one
    return None if side is None else side.describe().get("prior_weight")


def _layout(engine, split_engine) -> dict:
    """Where each layout's target and sidecar ran: `shared` (the engine's own place) and, with `@split`
    rows, `split` (two core sets)."""
    def where(e) -> dict:
        side = getattr(e, "sidecar", None)
        place = getattr(e, "place", None)
        return {"target": None if place is None else str(place),
                "sidecar": None if side is None else str(cores.Place(side.device, side.cores))}
    out = {"shared": where(engine)}
    if split_engine is not None:
        out["split"] = where(split_engine)
    return out


def _ratio(engine) -> float | str | None:
    ratio = getattr(getattr(engine, "payback", None), "ratio", None)
    return "off" if ratio == float("inf") else ratio
