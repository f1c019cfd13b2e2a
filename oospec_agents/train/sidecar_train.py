"""`train_sidecar`: traces -> labelled wave rows -> packed LoRA training -> adapter + metrics.json."""
from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .data import TrainDataError, select
from .lora import LoraConfigArgs, train_lora
from .rows import pack, training_rows
from .sidecar_eval import evaluate_sidecar, no_call as _no_call  # noqa: F401 (evaluate_sidecar: its old home)
from .run import env_info, label_base, prepare_run, write_metrics

log = logging.getLogger(__name__)


def build_sidecar_examples(tokenizer, traces, *, seed=0, max_len=1024, max_null_rows=6, max_no_call_share=None,
                           row_options=None):
    """One packed example per trace (its first call); counts of rows by kind.

    A "no call" record (`expected` empty and `meta.no_call`: no offered tool fits) becomes one function
    row labelled null: the wave's answer under tool_choice="auto" when it should decline (`no_call`
    counts them). A record with no call and no such mark is skipped. `max_no_call_share` caps the
    no-call examples at that share of all examples (a seeded sample of them is kept; `no_call_dropped`
    counts the rest): at their natural third of train-extra they teach the function row to decline
    calls that look like them (run 20h, docs/training.md). `row_options`: the rows' `RowOptions`
    (sidecar/rows.py; None: today's rows)."""
    if max_no_call_share is not None and not 0 <= max_no_call_share < 1:
        raise ValueError(f"max_no_call_share must be in [0, 1), got {max_no_call_share}")
    rng = random.Random(seed)
    examples, counts = [], {"records": 0, "no_call": 0, "function_rows": 0, "slot_rows": 0, "too_long": 0,
                            "longest": 0, "skipped": 0, "no_call_dropped": 0}
    for rec in traces:
        no_call = _no_call(rec)
        if not rec["expected"] and not no_call:
            counts["skipped"] += 1
            continue
        try:
            prefix, rows = training_rows(rec["messages"], rec["tools"], None if no_call else rec["expected"][0],
                                         row_options)
        except ValueError as e:
            counts["skipped"] += 1
            log.warning("%s: %s", rec.get("id"), e)
            continue
        ex = pack(tokenizer, prefix, rows, max_null_rows=max_null_rows, rng=rng)
        counts["longest"] = max(counts["longest"], len(ex))
        if len(ex) > max_len:
            counts["too_long"] += 1
            continue
        examples.append((ex, no_call))
    if max_no_call_share is not None:
        calls = sum(not nc for _, nc in examples)
        idx = [i for i, (_, nc) in enumerate(examples) if nc]
        keep = set(random.Random(seed).sample(idx, min(len(idx), int(max_no_call_share * calls / (1 - max_no_call_share)))))
        counts["no_call_dropped"] = len(idx) - len(keep)
        examples = [e for i, e in enumerate(examples) if not e[1] or i in keep]
    for ex, no_call in examples:
        counts["records"] += 1
        counts["no_call"] += no_call
        counts["function_rows"] += ex.kinds.count("function")
        counts["slot_rows"] += ex.kinds.count("slot")
    examples = [ex for ex, _ in examples]
    if not examples:
        raise TrainDataError("the training set is empty: no record produced sidecar rows")
    return examples, counts


# --------------------------------------------------------------------------- evaluation
# `evaluate_sidecar` scores a sidecar as the runtime serves it: sidecar_eval.py.


def train_sidecar(*, base="smollm2", train, dev=None, out, teacher=None, cfg: LoraConfigArgs | None = None,
                  max_len=1024, limit=None, subsample=None, dev_limit=None, dtype="float32", resume=False,
                  progress=True, max_null_rows=6, eval_sources=None, init_adapter=None,
                  stop_after=None, exclude_sources=None, max_no_call_share=None, param_docs=False) -> dict:
    """Train the sidecar's slot-prediction adapter on packed wave rows; evaluate it on `dev`. `param_docs`:
    each slot row reads its parameter's documentation (sidecar/rows.py `RowOptions`, kept in the adapter's
    rows.json so that the runtime writes its rows alike)."""
    from .. import models
    from ..sidecar.rows import RowOptions
    options = RowOptions(param_docs=param_docs)
    cfg = cfg or LoraConfigArgs()
    out = Path(out)
    dev_records, traces, trace_stats, model, tok = prepare_run(base, train, dev, teacher, cfg, limit, dtype, progress,
                                                               exclude_sources)
    examples, counts = build_sidecar_examples(tok, traces, seed=cfg.seed, max_len=max_len,
                                              max_null_rows=max_null_rows, max_no_call_share=max_no_call_share,
                                              row_options=options)
    if subsample and subsample < len(examples):
        examples = random.Random(cfg.seed).sample(examples, subsample)
    _, result = train_lora(model, examples, out, cfg, resume=resume, progress=progress, init_adapter=init_adapter,
                           stop_after=stop_after,
                           log_file=out.with_name(out.name + "-train.log"))
    label_base(out, base)
    options.save(out)
    metrics = {"kind": "sidecar", "base": base, "param_docs": param_docs,
               "train": train if isinstance(train, list) else str(train),
               "traces": trace_stats,
               "examples": {"total": len(examples), **counts}, "max_len": max_len, "max_null_rows": max_null_rows,
               "max_no_call_share": max_no_call_share,
               "init_adapter": str(init_adapter) if init_adapter else None,
               "config": asdict(cfg), "train_seconds": round(result.seconds, 1), "steps": result.steps,
               "resumed_from": result.resumed_from, "loss_curve": result.losses, "env": env_info()}
    write_metrics(out, metrics)
    if dev_records:
        dev_t = torch.device("cpu")
        m, t = models.load_model(base, device=dev_t, dtype=models.resolve_dtype(None, dev_t), adapter=out)
        metrics["dev"] = evaluate_sidecar(m, t, dev_records, sources=eval_sources, limit_per_source=dev_limit,
                                          progress=progress, row_options=options)
        metrics["dev"]["file"] = dev if isinstance(dev, list) else str(dev)
        write_metrics(out, metrics)
    return metrics
