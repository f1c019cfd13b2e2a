"""`oospec distill`: teach the sidecar the calls its own target writes.

    oospec distill --target embedded --data ../shared/data/toolcalls/train.jsonl --out DIR
    oospec distill --target ./my-model --data my-records.jsonl --out DIR --held-out 0.1 --steps 300

The target is the only judge of a hint, so the labels a sidecar should learn are the target's own
calls, not a data set's gold. The command:

1. **labels**: decodes each record's prompt with the target, greedily (method `toolspec`: lossless, so
   the target's own tokens), `--batch-size` requests at a time (the engine decodes them in shared
   rounds), and appends one line per record to DIR/labels.jsonl (`id`, `kind`: call, invalid or
   no_call, `calls`); a rerun skips the ids already there. A progress bar, and after the first batch an
   estimate of the time the rest will take;
2. **split**: holds out a seeded `--held-out` share of the records (DIR/split.json, kept across reruns),
   never trained on;
3. **α before**: the starting adapter (`--from-adapter`; default the sidecar's shipped adapter) scored
   on the held-out records against the target's labels (`sidecar_eval.evaluate_sidecar`: `alpha_call`,
   `alpha_slots`);
4. **training**: the sidecar's LoRA, from the starting adapter, on the wave rows labelled with the
   training part's labels (train/rows.py): the function the target wrote, its values, and null for the
   slots it omitted; calls that do not parse or misfit their schema are left out. Checkpoints go to
   DIR/checkpoint every `--checkpoint-every` steps; a rerun continues from the last one;
5. **α after**, and DIR/metrics.json. DIR is then an adapter directory: `sidecar_adapter=DIR`,
   `oospec bench --sidecar-adapter DIR`.
"""
from __future__ import annotations

import json
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

LABELS = "labels.jsonl"
SPLIT = "split.json"
METRICS = "metrics.json"


@dataclass
class DistillOptions:
    target: str = "embedded"
    sidecar: str = "embedded"        # the sidecar's model (its base); "embedded": SmolLM2-135M
    from_adapter: str | None = None  # the adapter training starts from (default: the sidecar's own)
    limit: int | None = None
    batch_size: int = 4              # labelling: requests decoded at once
    held_out: float = 0.2
    tool_choice: str = "required"    # as the requests the sidecar will hint will ask
    max_new_tokens: int = 256
    epochs: float = 1.0
    steps: int | None = None
    train_batch_size: int = 8
    lr: float = 3e-4
    seed: int = 0
    max_len: int = 1024
    checkpoint_every: int = 25
    stop_after: int | None = None    # end training after this many steps, with a checkpoint
    resume: bool = True
    dtype: str | None = None         # the target's dtype for labelling (default: the engine's)
    threads: int | None = None
    progress: bool = True


def check_data(paths) -> list[str]:
    """The data files, expanded; dev.jsonl is refused (it is what the sidecar is measured on)."""
    from .data import expand_paths
    files = expand_paths(paths)
    held = [f for f in files if Path(f).name == "dev.jsonl"]
    if held:
        raise ValueError(f"oospec distill never trains on {held[0]}: pass training prompts (train.jsonl, a call "
                         "log, your own records)")
    return files


def split(records: list[dict], share: float, seed: int, out: Path, resume: bool) -> tuple[list[dict], list[dict]]:
    """(train, held out): a seeded `share` of the records' ids held out, kept in DIR/split.json so a rerun
    holds out the same ones."""
    path = out / SPLIT
    ids = [r["id"] for r in records]
    if resume and path.exists():
        held = set(json.loads(path.read_text())["held_out"])
    else:
        n = min(len(ids) - 1, max(1, round(share * len(ids)))) if share > 0 and len(ids) > 1 else 0
        held = set(random.Random(seed).sample(sorted(ids), n))
        path.write_text(json.dumps({"share": share, "seed": seed, "held_out": sorted(held)}, indent=1) + "\n")
    return [r for r in records if r["id"] not in held], [r for r in records if r["id"] in held]


def read_labels(out: Path) -> dict[str, dict]:
    """DIR/labels.jsonl by record id; a torn last line, from an interrupted run, is cut off the file."""
    path, labels = out / LABELS, {}
    if path.exists():
        text = path.read_text()
        if text and not text.endswith("\n"):
            path.write_text(text[:text.rfind("\n") + 1])
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            labels[rec["id"]] = rec
    return labels


def label(records: list[dict], opts: DistillOptions, out: Path, engine=None) -> tuple[dict[str, dict], dict]:
    """Every record's label (train/traces.py `label_records`), those in DIR/labels.jsonl reused, the rest
    decoded by the target and appended batch by batch. Returns (labels by id, figures)."""
    from tqdm.auto import tqdm
    from .traces import label_records
    labels = read_labels(out)
    todo = [r for r in records if r["id"] not in labels]
    figures = {"records": len(records), "reused": len(records) - len(todo), "labelled_now": len(todo),
               "seconds": 0.0, "forwards": 0}
    if not todo:
        return labels, figures
    engine = engine or target_engine(opts.target, opts.dtype)
    bar = tqdm(total=len(todo), disable=not opts.progress, desc="target labels", unit="record")
    with open(out / LABELS, "a") as sink:
        def save(batch, seconds):
            for lab in batch:
                sink.write(json.dumps(lab, ensure_ascii=False) + "\n")
                figures["forwards"] += lab.get("target_forwards") or 0
            sink.flush()
            first = figures["seconds"] == 0.0
            figures["seconds"] += seconds
            if first and len(todo) > len(batch):
                rest = seconds / len(batch) * (len(todo) - len(batch))
                figures["estimate_s"] = round(rest, 1)
                print(f"oospec distill: {seconds / len(batch):.1f} s per record; the other {len(todo) - len(batch)} "
                      f"will take about {_duration(rest)}", file=sys.stderr)
        for lab in label_records(todo, engine, tool_choice=opts.tool_choice, max_new_tokens=opts.max_new_tokens,
                                 batch_size=opts.batch_size, on_batch=save, bar=bar):
            labels[lab["id"]] = lab
    bar.close()
    figures["seconds"] = round(figures["seconds"], 1)
    return labels, figures


def target_engine(target: str, dtype: str | None = None):
    """The target alone (no sidecar): "embedded", a HF id or a local directory."""
    import torch
    from ..engine import Engine
    return Engine.from_pretrained(target, sidecar=False, dtype=getattr(torch, dtype) if dtype else None)


def labelled(records: list[dict], labels: dict[str, dict], tool_choice: str) -> tuple[list[dict], dict]:
    """The records as traces of the target's own calls (`expected`), and counts by label kind. A record
    whose call does not parse or misfits its schema is left out; one where the target wrote no call is
    a "no call" example under tool_choice="auto" (the wave should decline), and left out otherwise."""
    traces, kinds = [], {"call": 0, "invalid": 0, "no_call": 0}
    for rec in records:
        lab = labels[rec["id"]]
        kinds[lab["kind"]] += 1
        if lab["kind"] == "call":
            traces.append(dict(rec, expected=lab["calls"], trace="target"))
        elif lab["kind"] == "no_call" and tool_choice == "auto":
            traces.append(dict(rec, expected=[], meta=(rec.get("meta") or {}) | {"no_call": True}, trace="target"))
    return traces, kinds


def starting_adapter(opts: DistillOptions):
    """The adapter training starts from, and the base model it goes on."""
    from .. import models
    start = opts.from_adapter or models.sidecar_adapter(opts.sidecar)
    base = models.adapter_base(start) if start is not None else opts.sidecar
    return start, "smollm2" if base == "embedded" else base


def alpha(base: str, adapter, held: list[dict], tool_choice: str, progress: bool) -> dict | None:
    """The sidecar (`base` + `adapter`) on the held-out records, against the target's calls: the
    evaluator's overall figures (`alpha_call`, `alpha_slots` among them) and α per source."""
    import torch
    from .. import models
    from ..sidecar.rows import RowOptions
    from .sidecar_eval import evaluate_sidecar
    if not held:
        return None
    cpu = torch.device("cpu")
    model, tok = models.load_model(base, device=cpu, dtype=models.resolve_dtype(None, cpu), adapter=adapter)
    res = evaluate_sidecar(model, tok, held, progress=progress, tool_choice=tool_choice,
                           row_options=RowOptions.for_adapter(adapter) if adapter else None)
    return {"adapter": None if adapter is None else str(adapter), **res["overall"],
            "by_source": {s: {k: v[k] for k in ("n", "alpha_call", "alpha_slots")} for s, v in res["by_source"].items()}}


def train(traces: list[dict], opts: DistillOptions, out: Path, start, base: str) -> dict:
    """The sidecar's LoRA on `traces`, from `start`, saved in `out`; checkpoints in out/checkpoint."""
    from .. import models
    from ..sidecar.rows import RowOptions
    from .lora import LoraConfigArgs, train_lora
    from .run import label_base, load_base
    from .sidecar_train import build_sidecar_examples
    lora = models.read_adapter(start) if start is not None else {}
    cfg = LoraConfigArgs(r=lora.get("r", 16), alpha=lora.get("lora_alpha", 32), lr=opts.lr, epochs=opts.epochs,
                         batch_size=opts.train_batch_size, seed=opts.seed, max_steps=opts.steps,
                         checkpoint_every=opts.checkpoint_every, threads=opts.threads,
                         **({"target_modules": tuple(sorted(lora["target_modules"]))} if lora.get("target_modules")
                            else {}))
    options = RowOptions.for_adapter(start) if start is not None else RowOptions()
    model, tok = load_base(base)
    examples, counts = build_sidecar_examples(tok, traces, seed=opts.seed, max_len=opts.max_len, row_options=options)
    _, result = train_lora(model, examples, out, cfg, checkpoint_dir=out / "checkpoint", resume=opts.resume,
                           progress=opts.progress, init_adapter=start, stop_after=opts.stop_after,
                           log_file=out / "train.log")
    label_base(out, base)
    options.save(out)
    return {"examples": {"total": len(examples), **counts}, "config": asdict(cfg), "steps": result.steps,
            "total_steps": result.total_steps, "done": result.steps >= result.total_steps,
            "resumed_from": result.resumed_from, "seconds": round(result.seconds, 1), "loss_curve": result.losses}


def distill(data, out, opts: DistillOptions | None = None, *, engine=None) -> dict:
    """Label, split, score, train, score again; DIR/metrics.json (returned). `engine`: the target's
    engine, where the caller has one loaded (else it is loaded when a record needs labelling)."""
    from .data import load_many
    opts = opts or DistillOptions()
    if not 0 <= opts.held_out < 1:
        raise ValueError(f"--held-out must be at least 0 and below 1, got {opts.held_out}")
    if opts.threads:
        from ..sidecar.cores import set_threads
        set_threads(opts.threads)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = _with_ids(load_many(check_data(data), limit=opts.limit))
    labels, label_figures = label(records, opts, out, engine)
    train_recs, held_recs = split(records, opts.held_out, opts.seed, out, opts.resume)
    traces, kinds = labelled(train_recs, labels, opts.tool_choice)
    held, _ = labelled(held_recs, labels, opts.tool_choice)
    start, base = starting_adapter(opts)
    old = _read_metrics(out)
    metrics = {"target": opts.target, "sidecar": opts.sidecar, "base": base, "data": [str(d) for d in
               ([data] if isinstance(data, (str, Path)) else data)], "options": asdict(opts),
               "labels": label_figures | {"kinds_train": kinds}, "train_records": len(train_recs),
               "held_out_records": len(held_recs), "held_out_scored": len(held)}
    metrics["alpha_before"] = old.get("alpha_before") if old.get("held_out_scored") == len(held) and \
        old.get("alpha_before", {}).get("adapter") == (None if start is None else str(start)) else \
        alpha(base, start, held, opts.tool_choice, opts.progress)
    _write(out, metrics)
    if not traces:
        raise ValueError("no training record has a call from the target: nothing to distil (see labels.jsonl)")
    metrics["train"] = train(traces, opts, out, start, base)
    if metrics["train"]["done"]:
        metrics["alpha_after"] = alpha(base, out, held, opts.tool_choice, opts.progress)
    _write(out, metrics)
    return metrics


def _with_ids(records: list[dict]) -> list[dict]:
    """Every record with an id (its position where it has none); a repeated id is an error."""
    out = [r if r.get("id") is not None else dict(r, id=f"#{i}") for i, r in enumerate(records)]
    ids = [r["id"] for r in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"record id {dup!r} appears more than once: labels are kept by id")
    return out


def _read_metrics(out: Path) -> dict:
    try:
        return json.loads((out / METRICS).read_text())
    except (OSError, ValueError):
        return {}


def _write(out: Path, metrics: dict) -> None:
    (out / METRICS).write_text(json.dumps(metrics, indent=2, default=str) + "\n")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


# --------------------------------------------------------------------------- the command

def add_parser(sub, name):
    import argparse
    p = sub.add_parser(name, help="label prompts with the target's own calls and train the sidecar's LoRA on them",
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", required=True, help='"embedded", a HF id, or a local model directory')
    p.add_argument("--data", required=True, nargs="+", action="extend", metavar="FILE.jsonl",
                   help="the prompts: records in the shared tool-call format (your records, a call log); "
                        "several files or globs")
    p.add_argument("--out", required=True, metavar="DIR", help="labels, checkpoints, the adapter and metrics.json")
    p.add_argument("--sidecar", default="embedded", help="the sidecar's model (HF id, directory, or embedded)")
    p.add_argument("--from-adapter", default=None, metavar="DIR",
                   help="start training from this adapter (same base model as the sidecar, e.g. "
                        "oospec_agents/adapters/smollm2-target); default: the sidecar's own adapter")
    p.add_argument("--limit", type=int, default=None, help="use only the first N records")
    p.add_argument("--batch-size", type=int, default=4, help="labelling: requests the target decodes at once")
    p.add_argument("--held-out", type=float, default=0.2, metavar="SHARE",
                   help="share of the records held out of training, for α before and after")
    p.add_argument("--tool-choice", default="required", choices=("required", "auto"),
                   help="how the requests ask for a call, when labelling and scoring")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=None, help="at most this many training steps")
    p.add_argument("--train-batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--stop-after", type=int, default=None,
                   help="end training after this many steps with a checkpoint (a rerun continues)")
    p.add_argument("--no-resume", dest="resume", action="store_false",
                   help="train from the start (labels.jsonl is still reused; delete it to label again)")
    p.add_argument("--dtype", default=None, help="the target's dtype when labelling (default: the engine's)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(run=_run)


def _run(args) -> int:
    from ..cli import print_json
    fields = DistillOptions.__dataclass_fields__
    opts = DistillOptions(**{k: v for k, v in vars(args).items() if k in fields})
    metrics = distill(args.data, args.out, opts)
    print_json({k: metrics.get(k) for k in ("labels", "alpha_before", "alpha_after")}
               | {"train": {k: v for k, v in metrics["train"].items() if k != "loss_curve"}})
    return 0

