"""`train_target`: data -> traces -> examples -> LoRA -> adapter + metrics.json, and the steps that
`train_sidecar` (sidecar_train.py) shares with it."""
from __future__ import annotations

import json
import logging
import platform
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .. import models
from .data import TrainDataError, load_many, select, source_counts
from .lora import LoraConfigArgs, train_lora
from .traces import build_traces

log = logging.getLogger(__name__)


def load_base(base: str, dtype="float32", device="cpu"):
    """(model, tokenizer) of a base model in training dtype on `device`; clear error if unknown."""
    from ..errors import ModelLoadError
    device = torch.device(device)
    try:
        return models.load_model(base, device=device, dtype=models.resolve_dtype(dtype, device))
    except ModelLoadError:
        raise
    except Exception as e:  # e.g. a hub id that does not exist offline
        raise ModelLoadError(f"unknown base model {base!r}: {type(e).__name__}: {e}") from None


def env_info() -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
            "python": platform.python_version()}


def label_base(out: Path, base: str) -> None:
    """Name the base model in adapter_config.json by its reference, not this machine's cache path."""
    cfg_path = Path(out) / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = models.base_id(base) or base
    if isinstance(cfg.get("target_modules"), list):  # peft writes a set in hash order: keep the file stable
        cfg["target_modules"] = sorted(cfg["target_modules"])
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_metrics(out: Path, metrics: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def prepare_run(base, train, dev, teacher, cfg, limit, dtype, progress, exclude_sources=None):
    """What both training commands start from: checked records, traces, threads, the base model.

    `train` and `dev` are a file, a glob, or a list of them; `exclude_sources` holds whole sources
    out of training (an unseen-tools dev set). Per-source counts go to stderr and the metrics."""
    records = load_many(train, limit=limit, exclude_sources=exclude_sources)
    dev_records = load_many(dev) if dev else None
    counts = source_counts(records)
    print("training records per source: " + ", ".join(f"{k} {v['records']}" + (f" ({v['no_call']} no call)"
                                                                                if v["no_call"] else "")
                                                       for k, v in counts.items()), file=sys.stderr)
    traces, trace_stats = build_traces(records, teacher, progress=progress)
    trace_stats["sources"] = counts
    trace_stats["excluded_sources"] = sorted(exclude_sources or [])
    if not traces:
        raise TrainDataError("the training set is empty: the teacher wrote no valid call on any record")
    if cfg.threads:
        from ..sidecar.cores import set_threads  # every thread count is set in one place
        set_threads(cfg.threads)
    model, tok = load_base(base, dtype)
    return dev_records, traces, trace_stats, model, tok


def train_target(*, base="smollm2", train, dev=None, out, teacher=None, cfg: LoraConfigArgs | None = None,
                 max_len=1024, limit=None, subsample=None, dev_limit=None, dtype="float32", resume=False,
                 progress=True, eval_sources=("bfcl_simple", "bfcl_multiple"), init_adapter=None,
                 stop_after=None, trim_tools=False, revalue=0, distract=0, exclude_sources=None,
                 thinking=False) -> dict:
    """Train the tool-calling target adapter; evaluate on `dev` (tool_choice="auto").

    `trim_tools` / `revalue` / `distract`: more call examples from the same records (see `train.augment`).
    `thinking`: a thinking target: the prompts rendered by `models.THINKING_CHAT_TEMPLATE`, a sentence of
    reasoning in a `<think>` block before each answer (`target.build_target_examples`)."""
    from ..engine import Engine
    from .target import build_target_examples
    cfg = cfg or LoraConfigArgs()
    out = Path(out)
    dev_records, traces, trace_stats, model, tok = prepare_run(base, train, dev, teacher, cfg, limit, dtype, progress,
                                                               exclude_sources)
    if thinking:
        from ..models import THINKING_CHAT_TEMPLATE
        tok.chat_template = THINKING_CHAT_TEMPLATE.read_text()
    engine = Engine(model, tok, None)
    examples, counts = build_target_examples(engine, traces, seed=cfg.seed, max_len=max_len, trim=trim_tools,
                                             revalued=revalue, distracted=distract, thinking=thinking)
    if subsample and subsample < len(examples):
        examples = random.Random(cfg.seed).sample(examples, subsample)
    t0 = time.perf_counter()
    _, result = train_lora(model, examples, out, cfg, resume=resume, progress=progress, init_adapter=init_adapter,
                           stop_after=stop_after,
                           log_file=out.with_name(out.name + "-train.log"))
    metrics = {"kind": "target", "base": base, "train": train if isinstance(train, list) else str(train),
               "traces": trace_stats,
               "examples": {"total": len(examples), **counts}, "max_len": max_len,
               "augment": {"trim_tools": trim_tools, "revalue": revalue, "distract": distract},
               "thinking": thinking,
               "init_adapter": None if init_adapter is None else str(init_adapter), "config": asdict(cfg),
               "train_seconds": round(result.seconds, 1), "steps": result.steps, "resumed_from": result.resumed_from,
               "loss_curve": result.losses, "env": env_info()}
    log.warning("trained %d steps in %.0fs", result.steps, time.perf_counter() - t0)
    label_base(out, base)
    write_metrics(out, metrics)
    if dev_records:
        metrics["dev"] = evaluate_adapter(base, out, dev_records, sources=eval_sources, limit=dev_limit,
                                          progress=progress)
        metrics["dev"]["file"] = dev if isinstance(dev, list) else str(dev)
        write_metrics(out, metrics)
    return metrics


def evaluate_adapter(base, adapter, dev_records, *, sources=("bfcl_simple", "bfcl_multiple"), limit=None,
                     method="toolspec", progress=True, dtype=None, details=False) -> dict:
    """Load base + merged adapter the way `Engine.from_pretrained` does, and score it."""
    from ..engine import Engine
    from .target import evaluate_target
    dev = torch.device("cpu")
    model, tok = models.load_model(base, device=dev, dtype=models.resolve_dtype(dtype, dev), adapter=adapter)
    engine = Engine(model, tok, None)
    return evaluate_target(engine, select(dev_records, sources, limit), sources=sources, method=method,
                           progress=progress, details=details)
