"""The benchmark loop: one warm-up, then every method on each record, interleaved, checked against AR.

AR runs first on each record because it is the reference (and the oracle's hint); the other
methods follow in an order rotated per record, so drift and cache effects hit each one alike.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm.auto import tqdm

from .env import environment
from .methods import METHODS, BenchContext, Run
from .metrics import compare, summarize, tie_tolerance


@dataclass
class BenchConfig:
    methods: tuple[str, ...] = tuple(METHODS)
    tool_choice: str = "required"
    max_new_tokens: int = 256
    prompt_lookup_tokens: int = 10
    warmup: bool = True
    progress: bool = True


def check_methods(methods) -> list[str]:
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; expected some of {list(METHODS)}")
    # AR is the reference every other method is checked and timed against.
    return ["ar"] + [m for m in dict.fromkeys(methods) if m != "ar"]


def run_bench(engine, records: list[dict], config: BenchConfig = BenchConfig(), *, assistant=None,
              assistant_tokenizer=None, data: str | None = None) -> dict:
    """Run every method on every record; returns the results dict that report.write_all saves."""
    methods = check_methods(config.methods)
    ctx = BenchContext(engine, config.tool_choice, config.max_new_tokens, assistant, assistant_tokenizer,
                       config.prompt_lookup_tokens)
    tol = tie_tolerance(engine.target.dtype)
    started = time.time()
    bar = tqdm(total=len(records) * len(methods) + (len(methods) if config.warmup else 0),
               desc="oospec bench", unit="run", disable=not config.progress)
    if config.warmup:
        bar.set_postfix_str("warm-up")
        _run_record(ctx, records[0], methods, 0, tol, bar)
    rows = [_run_record(ctx, rec, methods, i, tol, bar) for i, rec in enumerate(records)]
    bar.close()
    results = summarize(rows, methods)
    results["env"] = environment(engine, assistant)
    results["config"] = {"data": data, "n_records": len(records), "methods": methods,
                         "tool_choice": config.tool_choice, "max_new_tokens": config.max_new_tokens,
                         "prompt_lookup_num_tokens": config.prompt_lookup_tokens, "warmup": config.warmup,
                         "tie_tolerance": tol, "wall_s": round(time.time() - started, 1)}
    results["records"] = rows
    return results


def _run_record(ctx: BenchContext, rec: dict, methods: list[str], index: int, tol: float, bar) -> dict:
    others = methods[1:]
    k = index % len(others) if others else 0
    runs: dict[str, Run] = {}
    for m in ["ar"] + others[k:] + others[:k]:
        bar.set_postfix_str(f"{rec['id']} {m}"[-48:])
        runs[m] = METHODS[m](ctx, rec, runs.get("ar"))
        bar.update(1)
    ref = runs["ar"]
    out = {}
    for m in methods:  # report in the requested order, whatever order they ran in
        r = runs[m]
        check = compare(ref.token_ids, ref.margins or [], r.token_ids, tol)
        row = {"new_tokens": len(r.token_ids), "prefill_s": r.prefill_s, "decode_s": r.decode_s,
               "target_forwards": r.target_forwards, "accepted_by_source": r.accepted_by_source or None,
               "hint_ready_s": r.hint_ready_s, "hint_bytes": r.hint_bytes, "sidecar_error": r.sidecar_error,
               "sidecar_profile": r.sidecar_profile, "check": check}
        if m == "ar" or check["verdict"] != "exact":
            row["text"] = r.text
        out[m] = row
    return {"id": rec["id"], "source": rec["source"], "runs": out}
