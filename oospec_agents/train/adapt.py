"""`oospec adapt --log PATH --out DIR`: the sidecar learns the deployment's tools from its call log.

The log's records (docs/call-log.md) are put in order (`meta.time`), a request logged more than once
(the same messages and tools) keeps only its newest record, and the newest `holdout` share is held
out. The sidecar's adapter (`--init-adapter`, the shipped one by default) trains on the rest through
train-sidecar's loop (`train.lora.train_lora`: progress bar, checkpoints, `--resume`), mixed with a
seeded sample of the data it was first trained on (`--replay`; `--replay-share` replay examples per
log example) so that what it knew does not fade. DIR gets the adapter, which loads as the shipped one
does (`Engine.from_pretrained(..., sidecar_adapter=DIR)`), and metrics.json: the wave's agreement with
the target's logged calls on the held-out part, before and after, split into calls to a function the
training part of the log holds and calls to one it does not.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import torch

from .cli import add_loop_options, loop_config

#: the fewest distinct logged requests `adapt` learns from (`--min-records`)
MIN_RECORDS = 50
#: the newest share of the log held out to measure on (`--holdout`)
HOLDOUT = 0.2
#: replay examples per training example of the log (`--replay-share`)
REPLAY_SHARE = 0.5
DEDUPE = "a request logged more than once (the same messages and tools) keeps its newest record"
#: the checkout the package lives in: an adapter's metrics.json names its training data as
#: `oospec train-sidecar` was given it there (../shared/data/toolcalls/train.jsonl)
CHECKOUT = Path(__file__).resolve().parents[2]
#: the held-out calls' two groups: the function is called in the log's training part, or it is not
HOLDS, LACKS = "log_holds", "log_lacks"
TOKENS = ("predicted-call token agreement, not the engine's accepted hint tokens: of the tokens of the "
          "target's call's name and argument values (the text the schema drafter cannot draft), the share "
          "the wave has right (none when its function is wrong), and their mean count per call")


# --------------------------------------------------------------------------- the log

def read_log(path) -> tuple[list[dict], str]:
    """The log's records in the order they were logged: by `meta.time` when every record has one
    (several writers may interleave), else in file order. Returns (records, the order used)."""
    from ..data import load_records
    records = load_records(path, kind="call log")
    times = [(r.get("meta") or {}).get("time") for r in records]
    if all(isinstance(t, (int, float)) for t in times):
        order = sorted(range(len(records)), key=times.__getitem__)  # stable: ties keep file order
        return [records[i] for i in order], "meta.time"
    return records, "file"


def request_key(rec: dict) -> str:
    return json.dumps([rec["messages"], rec.get("tools", [])], sort_keys=True, ensure_ascii=False)


def dedupe(records: list[dict]) -> tuple[list[dict], int]:
    """One record per request (`DEDUPE`): its newest, at its place in the order; (kept, dropped)."""
    newest = {request_key(r): i for i, r in enumerate(records)}
    keep = sorted(newest.values())
    return [records[i] for i in keep], len(records) - len(keep)


def split_newest(records: list[dict], holdout: float) -> tuple[list[dict], list[dict]]:
    """(older part, the newest `holdout` share): at least one record held out when `holdout` > 0."""
    if not 0 <= holdout < 1:
        raise ValueError(f"holdout must be at least 0 and below 1, got {holdout}")
    n_held = max(1, round(holdout * len(records))) if holdout else 0
    return records[:len(records) - n_held], records[len(records) - n_held:]


def needed(min_records: int, holdout: float) -> int:
    """Distinct requests a log needs: `min_records`, and one to train on plus one to hold out."""
    return max(min_records, 2 if holdout else 1)


# --------------------------------------------------------------------------- the adapter to start from

def adapter_recipe(adapter) -> dict:
    """How `adapter` was made: its LoRA shape (adapter_config.json), which the training must keep, and
    from its metrics.json (when there) the null rows per example, the row weighting and the data it
    was trained on (`replay_default`)."""
    from ..errors import AdapterError
    adapter = Path(adapter)
    cfg_path = adapter / "adapter_config.json"
    if not cfg_path.is_file():
        raise AdapterError(f"--init-adapter {str(adapter)!r} is not a LoRA adapter directory "
                           "(no adapter_config.json)")
    cfg = json.loads(cfg_path.read_text())
    metrics = json.loads((adapter / "metrics.json").read_text()) if (adapter / "metrics.json").is_file() else {}
    trained = (metrics.get("replay") or {}).get("files") or metrics.get("train")
    return {"lora": {"r": cfg["r"], "alpha": cfg["lora_alpha"], "dropout": cfg.get("lora_dropout", 0.0),
                     "target_modules": tuple(sorted(cfg["target_modules"]))},
            "max_null_rows": metrics.get("max_null_rows", 6),
            "weigh_rows": (metrics.get("config") or {}).get("weigh_rows", False),
            "trained_on": [trained] if isinstance(trained, str) else list(trained or [])}


def replay_default(trained_on: list[str]) -> list[str] | None:
    """The adapter's training files, a relative path read against the checkout; None when one is absent."""
    from .data import expand_paths
    files = [p if Path(p).is_absolute() else str(CHECKOUT / p) for p in trained_on]
    try:
        found = expand_paths(files)
    except ValueError:
        return None
    return found if found and all(Path(f).is_file() for f in found) else None


def replay_sample(files, n: int, seed: int) -> tuple[list[dict], int]:
    """`n` records drawn (seeded) from the replay files; (sample, records in the files)."""
    from .data import load_many
    records = load_many(files)
    return random.Random(seed).sample(records, min(n, len(records))), len(records)


# --------------------------------------------------------------------------- measuring

def agreement(model, tokenizer, held: list[dict], functions: set[str], *, progress: bool = True,
              row_options=None) -> dict:
    """The wave's agreement with the target's logged calls on `held`, each scored on its first call (the
    one call a wave predicts, as training uses): `evaluate_sidecar`'s figures (function_index_acc,
    arg_exact_match over the called tool's slots, call_exact) and the token agreement (`TOKENS`), for
    `HOLDS` (calls to one of `functions`, those of the log's training part), `LACKS` and overall; and,
    against the same calls, the wrong slots by class (`errors`, taxonomy.py) and the optional-slot
    decision (`optional`), per group (sidecar_eval.py). `row_options`: the adapter's rows (rows.py)."""
    from .sidecar_train import evaluate_sidecar
    recs = [dict(r, id=f"held_{i}", source=HOLDS if r["expected"][0]["name"] in functions else LACKS,
                 expected=r["expected"][:1]) for i, r in enumerate(held)]
    res = evaluate_sidecar(model, tokenizer, recs, progress=progress, details=True, row_options=row_options)
    misses = {m["id"]: m for m in res["misses"]}
    def count(value) -> int:  # tokens of a value as the call writes it, after its key's ": "
        return len(tokenizer.encode(" " + json.dumps(value, ensure_ascii=False), add_special_tokens=False))
    tokens = {g: [0, 0] for g in (HOLDS, LACKS)}  # right, all
    for r in recs:
        call, miss = r["expected"][0], misses.get(r["id"], {"function": r["expected"][0]["name"], "wrong_values": {}})
        values = {k: count(v) for k, v in call["arguments"].items()}
        right = 0 if miss["function"] != call["name"] else \
            count(call["name"]) + sum(n for k, n in values.items() if k not in miss["wrong_values"])
        tokens[r["source"]][0] += right
        tokens[r["source"]][1] += count(call["name"]) + sum(values.values())

    def figures(stats: dict | None, right: int, total: int) -> dict:
        if not stats or not stats["n"]:
            return {"n": 0}
        return stats | {"token_agreement": round(right / max(1, total), 4),
                        "tokens_right_per_call": round(right / stats["n"], 2)}
    out = {g: figures(res["by_source"].get(g), *tokens[g]) for g in (HOLDS, LACKS)}
    out["overall"] = figures(res["overall"], *map(sum, zip(*tokens.values())))
    out["errors"], out["optional"] = res["errors"], res["optional"]
    return out


def served_hint_tokens(held: list[dict], functions: set[str]) -> dict:
    """The hint tokens the target accepted when the held-out requests were served with method="oospec"
    (`meta.hint_tokens`, the adapter of that time, timing included), per group: mean and count."""
    out = {}
    for group in (HOLDS, LACKS, "overall"):
        got = [r["meta"].get("hint_tokens", 0) for r in held if (r.get("meta") or {}).get("method") == "oospec"
               and group in ("overall", HOLDS if r["expected"][0]["name"] in functions else LACKS)]
        out[group] = {"n": len(got), "mean": round(sum(got) / len(got), 2) if got else None}
    return out


def table(held_out: dict) -> str:
    """A markdown table of `metrics["held_out"]`: each figure before -> after, per group."""
    cols = (("function", "function_index_acc"), ("arguments exact", "arg_exact_match"),
            ("call exact", "call_exact"), ("token agreement", "token_agreement"),
            ("tokens right / call", "tokens_right_per_call"))
    cell = lambda v: "-" if v is None else f"{v:.1%}" if isinstance(v, float) and v <= 1 else str(v)  # noqa: E731
    lines = ["| held-out calls | n | " + " | ".join(c for c, _ in cols) + " |", "|---" * (len(cols) + 2) + "|"]
    names = {HOLDS: "function the log holds", LACKS: "function the log lacks", "overall": "**all**"}
    for group, name in names.items():
        before, after = held_out["before"][group], held_out["after"][group]
        lines.append(f"| {name} | {before['n']} | " + " | ".join(
            f"{cell(before.get(k))} -> {cell(after.get(k))}" for _, k in cols) + " |")
    return "\n".join(lines) + _errors_before_after(held_out)


def _errors_before_after(held_out: dict) -> str:
    """The wrong slots by class and the optional-slot decision, before -> after, in all (an older
    metrics.json without them: nothing)."""
    from .taxonomy import CLASSES
    before, after = held_out["before"].get("errors"), held_out["after"].get("errors")
    if not before or not after:
        return ""
    lines = ["", "", "| wrong slots | " + " | ".join(CLASSES) + " |", "|---" * (len(CLASSES) + 1) + "|",
             "| before -> after | " + " | ".join(f"{before['overall'][c]} -> {after['overall'][c]}" for c in CLASSES)
             + " |"]
    ob, oa = held_out["before"]["optional"]["overall"], held_out["after"]["optional"]["overall"]
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    lines += ["", f"optional slots filled: precision {pct(ob['precision'])} -> {pct(oa['precision'])}, "
                  f"recall {pct(ob['recall'])} -> {pct(oa['recall'])}"]
    return "\n".join(lines)


# --------------------------------------------------------------------------- adapting

def adapt(*, log, out, replay=None, replay_share: float = REPLAY_SHARE, init_adapter=None,
          holdout: float = HOLDOUT, min_records: int = MIN_RECORDS, base: str = "smollm2", cfg=None,
          max_null_rows: int | None = None, max_len: int = 1024, dtype: str = "float32", device=None,
          resume: bool = False, progress: bool = True, stop_after: int | None = None) -> dict:
    """Adapt the sidecar to the call log `log`; write the adapter and metrics.json to `out`.

    `replay`: files or globs of the data `init_adapter` was trained on (default: the files its
    metrics.json names); `cfg` (`LoraConfigArgs`): the loop's settings, the LoRA shape always taken
    from `init_adapter`; `max_null_rows`: default `init_adapter`'s. Raises `TrainDataError` for a log
    with fewer than `min_records` distinct requests."""
    from .. import models
    from .lora import train_lora
    from .run import env_info, label_base, load_base, write_metrics
    from ..sidecar.rows import RowOptions
    from .sidecar_train import build_sidecar_examples
    out = Path(out)
    init_adapter = Path(init_adapter or models.EMBEDDED_SIDECAR_ADAPTER)
    recipe, cfg, max_null_rows = _under_recipe(init_adapter, cfg, max_null_rows)
    if replay_share < 0:
        raise ValueError(f"replay_share must be 0 or more, got {replay_share}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if cfg.threads:
        from ..sidecar.cores import set_threads  # every thread count is set in one place
        set_threads(cfg.threads)

    ordered, order, records, repeats = _distinct_log(log, min_records, holdout)
    train, held = split_newest(records, holdout)
    functions = {c["name"] for r in train for c in r["expected"]}
    if replay_share and replay is None:
        replay = _default_replay(recipe, init_adapter)

    model, tok = load_base(base, dtype, device)
    options = RowOptions.for_adapter(init_adapter)  # the rows it was trained on: the adapted one keeps them
    build = partial(build_sidecar_examples, tok, seed=cfg.seed, max_len=max_len, max_null_rows=max_null_rows,
                    row_options=options)
    log_examples, replayed, described = _training_examples(build, train, replay, replay_share, cfg.seed, max_len)
    metrics = {
        "kind": "adapt", "base": base, "log": str(log), "init_adapter": str(init_adapter),
        "records": {"read": len(ordered), "order": order, "repeats_dropped": repeats, "distinct": len(records),
                    "train": len(train), "held_out": len(held), "holdout": holdout, "dedupe": DEDUPE,
                    "functions_in_train": len(functions)},
        **described, "max_len": max_len, "max_null_rows": max_null_rows, "config": asdict(cfg), "env": env_info()}
    print(f"adapt: {len(ordered)} logged records, {repeats} repeats dropped, {len(train)} to train on "
          f"({len(log_examples)} examples + {len(replayed)} replayed), {len(held)} newest held out", file=sys.stderr)

    before = _measure(base, init_adapter, held, functions, device, progress) if held else None
    _, result = train_lora(model, log_examples + replayed, out, cfg, resume=resume, progress=progress,
                           init_adapter=init_adapter, stop_after=stop_after,
                           log_file=out.with_name(out.name + "-train.log"))
    del model
    label_base(out, base)
    options.save(out)
    metrics |= {"train_seconds": round(result.seconds, 1), "steps": result.steps, "total_steps": result.total_steps,
                "resumed_from": result.resumed_from, "loss_curve": result.losses}
    if result.steps < result.total_steps:  # stopped early (`stop_after`): nothing to measure yet
        print(f"adapt: stopped at step {result.steps} of {result.total_steps}; --resume continues", file=sys.stderr)
    elif held:
        metrics["held_out"] = _held_out(before, _measure(base, out, held, functions, device, progress), held, functions)
    write_metrics(out, metrics)
    return metrics


def _under_recipe(init_adapter: Path, cfg, max_null_rows: int | None) -> tuple[dict, object, int]:
    """`init_adapter`'s recipe, the loop's settings (`LoraConfigArgs`, default ones where `cfg` is None) with
    its LoRA shape and rows' weighing, and `max_null_rows` (by default the adapter's)."""
    from .lora import LoraConfigArgs
    recipe = adapter_recipe(init_adapter)
    cfg = replace(cfg or LoraConfigArgs(), **recipe["lora"], weigh_rows=recipe["weigh_rows"])
    return recipe, cfg, recipe["max_null_rows"] if max_null_rows is None else max_null_rows


def _held_out(before: dict, after: dict, held: list[dict], functions: set[str]) -> dict:
    """metrics.json's "held_out": the agreement before and after adapting, and the hint tokens served."""
    return {"before": before, "after": after, "served_hint_tokens": served_hint_tokens(held, functions),
            "tokens": TOKENS}


def _training_examples(build, train: list[dict], replay, replay_share: float, seed: int,
                       max_len: int) -> tuple[list[dict], list[dict], dict]:
    """The log's training examples and the replayed ones (`replay_share` per log example, a seeded sample of
    `replay`'s records), each built by `build(records)`, and their metrics.json entries "replay" and "examples"."""
    from .data import source_counts
    log_examples, log_counts = build(train)
    if log_counts["too_long"]:  # never silently: a long-prompt deployment may lose most of its log here
        print(f"adapt: warning: {log_counts['too_long']} of the log's {len(train)} requests are longer than "
              f"--max-len {max_len} tokens and are left out; --max-len {log_counts['longest']} keeps them all",
              file=sys.stderr)
    sample, replayed, replay_counts, replay_total = [], [], None, 0
    n_replay = round(replay_share * len(log_examples))
    if n_replay:
        sample, replay_total = replay_sample(replay, n_replay, seed)
        replayed, replay_counts = build(sample)
    return log_examples, replayed, {
        "replay": {"files": [str(Path(f).resolve()) for f in (replay or [])], "share": replay_share,
                   "share_means": "replay examples per training example of the log",
                   "records": replay_counts["records"] if replay_counts else 0, "of": replay_total,
                   "sources": source_counts(sample) if sample else {}},
        "examples": {"total": len(log_examples) + len(replayed), "log": log_counts, "replay": replay_counts}}


def _distinct_log(log, min_records: int, holdout: float) -> tuple[list[dict], str, list[dict], int]:
    """The call log's records as read, their order, the distinct requests among them and the repeats
    dropped; `TrainDataError` when too few are distinct to learn from."""
    from .data import TrainDataError
    ordered, order = read_log(log)
    records, repeats = dedupe(ordered)
    need = needed(min_records, holdout)
    if len(records) < need:
        raise TrainDataError(
            f"the call log {str(log)!r} is too small to learn from: {len(records)} distinct requests "
            f"({len(ordered)} records, {repeats} repeats dropped); adapting needs at least {need} "
            f"(--min-records {min_records}), {need - len(records)} more")
    return ordered, order, records, repeats


def _default_replay(recipe: dict, init_adapter: Path) -> list[str]:
    """The files `init_adapter` was trained on, to replay; `TrainDataError` where they are not here."""
    from .data import TrainDataError
    replay = replay_default(recipe["trained_on"])
    if replay is None:
        named = recipe["trained_on"] or "files its metrics.json does not name"
        raise TrainDataError(
            f"no replay data: the adapter {str(init_adapter)!r} was trained on {named} (read against "
            f"{CHECKOUT}), which are not here; pass --replay FILE (the data it was trained on) or "
            "--replay-share 0 (no replay: what it knew may then fade)")
    return replay


def _measure(base, adapter, held, functions, device, progress) -> dict:
    """`agreement` of base + `adapter`, merged and in the runtime's dtype, with its rows, as the engine
    loads it."""
    from .. import models
    from ..sidecar.rows import RowOptions
    model, tok = models.load_model(base, device=device, dtype=models.resolve_dtype(None, device), adapter=adapter)
    return agreement(model, tok, held, functions, progress=progress, row_options=RowOptions.for_adapter(adapter))


# --------------------------------------------------------------------------- the command

def _share(text: str) -> float:
    share = float(text)
    if not 0 <= share < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {share}")
    return share


def _at_least_0(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module's text as written, and every option's default."""


def add_parser(sub, name):
    p = sub.add_parser(name, help="train the sidecar's adapter further on the call log (the target's verified calls)",
                       description=__doc__, formatter_class=_Help)
    p.add_argument("--log", required=True, metavar="PATH", help="the call log (call_log=PATH, oospec serve --call-log)")
    p.add_argument("--out", required=True, metavar="DIR", help="where the adapter and metrics.json go")
    p.add_argument("--replay", default=None, nargs="+", action="extend", metavar="FILE_OR_GLOB",
                   help="the data the adapter was trained on, sampled into the mix (none given: the files its "
                        "metrics.json names; for the shipped adapter ../shared/data/toolcalls/train.jsonl)")
    p.add_argument("--replay-share", type=_at_least_0, default=REPLAY_SHARE, metavar="F",
                   help="replay examples per training example of the log (0: no replay)")
    p.add_argument("--init-adapter", default=None, metavar="DIR",
                   help="the adapter to start from (none given: the shipped sidecar adapter)")
    p.add_argument("--holdout", type=_share, default=HOLDOUT, metavar="F",
                   help="the newest share of the log held out to measure before and after")
    p.add_argument("--min-records", type=int, default=MIN_RECORDS, metavar="N",
                   help="refuse a log with fewer distinct requests (repeats dropped)")
    p.add_argument("--base", default="smollm2", help='the sidecar base model ("smollm2": the embedded one)')
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (none given: cuda when there is one)")
    p.add_argument("--max-null-rows", type=int, default=None,
                   help="null rows of uncalled tools per example (none given: the init adapter's, from its "
                        "metrics.json)")
    add_loop_options(p, epochs=2.0)
    p.set_defaults(run=_run)


def _run(args) -> int:
    from ..cli import print_json
    metrics = adapt(log=args.log, out=args.out, replay=args.replay, replay_share=args.replay_share,
                    init_adapter=args.init_adapter, holdout=args.holdout, min_records=args.min_records,
                    base=args.base, cfg=loop_config(args), max_null_rows=args.max_null_rows, max_len=args.max_len,
                    dtype=args.dtype, device=args.device, resume=args.resume, progress=not args.no_progress,
                    stop_after=args.stop_after)
    print_json({k: v for k, v in metrics.items() if k not in ("loss_curve", "env")})
    if "held_out" in metrics:
        print("\n" + table(metrics["held_out"]))
    return 0
