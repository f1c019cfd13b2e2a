"""Scoring the embedded pair against the goals on dev.jsonl.

    python -m oospec_agents.train.evaluate target  --dev ../shared/data/toolcalls/dev.jsonl
    python -m oospec_agents.train.evaluate target  --dev ../shared/data/toolcalls/dev.jsonl --strict
    python -m oospec_agents.train.evaluate sidecar --dev ../shared/data/toolcalls/dev.jsonl --limit 60
    python -m oospec_agents.train.evaluate hint    --dev ../shared/data/toolcalls/dev.jsonl --limit 40
    python -m oospec_agents.train.evaluate sidecar --dev ../shared/data/toolcalls/dev.jsonl \
        ../shared/data/toolcalls/train-extra.jsonl --sources tooltalk,nestful,bfcl_simple,bfcl_multiple
    python -m oospec_agents.train.evaluate sidecar --dev ../shared/data/toolcalls/dev.jsonl --labels target --limit 10
    python -m oospec_agents.train.evaluate calibrate --dev ../shared/data/toolcalls/train.jsonl --limit 100 \
        --out oospec_agents/adapters/smollm2-sidecar/confidence.json

`--dev` takes several files or globs; `--sources` keeps those sources; each mode prints its JSON,
then a per-source table.

- target: right tool / exact arguments of `Engine.from_pretrained("embedded")` with
  tool_choice="auto" on the BFCL simple and multiple records, and of the calls written, the share
  that parse and the share that validate against their tool's JSON Schema; `--strict` decodes
  every record under the grammar of valid calls (`engine.generate(..., strict=True)`);
- sidecar: the sidecar as the runtime serves it (`sidecar_eval.evaluate_sidecar`): function, slots and
  whole call exact under the strict and the lenient scorer, the wrong slots by class, the optional-slot
  decision and the confidence's reliability; `--labels gold` (the records' calls, the default),
  `target` (the embedded target's own calls, as the adapt protocol labels them) or `gold,target`;
  against the target, the figures' `alpha_call` and `alpha_slots` are the sidecar's α (sidecar_eval.py);
  `--out` also keeps `points` (each predicted call's log-probability, exact or not, source), so a
  calibration can be refitted or compared without decoding again;
- calibrate: fit the confidence's calibration (`sidecar.confidence.Calibration.fit`) on the wave's
  calls of TRAIN records (never dev or a held-out source) and write it to `--out` (an adapter's
  `confidence.json`);
- hint: the share of generated tokens that the sidecar's hint drafted, with method="oospec".
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import jsonschema
import torch

#: the 408 dev records of the goals: BFCL simple_python (208) and multiple (200)
BFCL_SOURCES = ("bfcl_simple", "bfcl_multiple")
_EMPTY_PARAMS = {"type": "object", "properties": {}}


def written_calls(fmt, gen, tools: list[dict]) -> dict:
    """What the calls a reply wrote are worth, checked from its text alone (not from the engine's own
    split into valid and invalid calls): `calls` written; `parsed`: their markup and JSON read as a
    call with an arguments object; `valid`: parsed, naming an offered tool, and valid against its
    JSON Schema (`jsonschema`); `cut_off`: the last call left open when max_new_tokens ran out (it
    does not parse)."""
    _, calls = fmt.parse(gen.text)
    schemas = {}
    for t in tools:
        fn = t.get("function", t)
        schemas[fn["name"]] = fn.get("parameters") or _EMPTY_PARAMS
    parsed = [c for c in calls if "error" not in c and isinstance(c.get("arguments"), dict)]

    def valid(call) -> bool:
        schema = schemas.get(call["name"])
        if schema is None:  # a tool that was not offered
            return False
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        return cls(schema).is_valid(call["arguments"])

    return {"calls": len(calls), "parsed": len(parsed), "valid": sum(map(valid, parsed)),
            "cut_off": int(bool(calls) and "error" in calls[-1] and gen.finish_reason == "length")}


class _Recorder:
    """The engine as `evaluate_target` sees it: each `generate` decodes with `overrides` (strict,
    tool_choice) on top of the scorer's arguments, and its reply is kept for `written_calls`."""

    def __init__(self, engine, **overrides):
        self.engine, self.overrides, self.replies = engine, overrides, []

    def generate(self, messages, tools=None, **kw):
        gen = self.engine.generate(messages, tools, **(kw | self.overrides))
        self.replies.append((messages, gen))
        return gen


def _call_rates(t: dict) -> dict:
    share = lambda k: round(t[k] / t["calls"], 4) if t["calls"] else None  # noqa: E731
    return {"calls": t["calls"], "parse": share("parsed"), "valid": share("valid"), "cut_off": t["cut_off"]}


def score_target(engine, records: list[dict], *, sources=BFCL_SOURCES, strict: bool = False,
                 tool_choice: str = "auto", method: str = "toolspec", max_new_tokens: int = 160,
                 progress: bool = True, details: bool = False) -> dict:
    """`target.evaluate_target`'s figures (right tool, exact and lenient arguments) of the records of
    `sources`, decoded with `strict` and `tool_choice`, and beside them, per source and overall, the
    calls written and the shares of them that parse and that validate (`written_calls`; null when no
    call was written). The result also names `strict` and `tool_choice`."""
    from .target import evaluate_target
    rec = _Recorder(engine, strict=strict, tool_choice=tool_choice)
    res = evaluate_target(rec, records, sources=sources, method=method, max_new_tokens=max_new_tokens,
                          progress=progress, details=details)
    scored = [r for r in records if not sources or r["source"] in sources]
    assert len(scored) == len(rec.replies) and all(m is r["messages"] for r, (m, _) in zip(scored, rec.replies))
    keys = ("calls", "parsed", "valid", "cut_off")
    per: dict[str, dict] = {}
    for r, (_, gen) in zip(scored, rec.replies):
        t = per.setdefault(r["source"], dict.fromkeys(keys, 0))
        for k, v in written_calls(engine.fmt, gen, r["tools"]).items():
            t[k] += v
    tot = {k: sum(t[k] for t in per.values()) for k in keys}
    res["overall"] |= _call_rates(tot)
    for src, t in per.items():
        res["by_source"][src] |= _call_rates(t)
    return res | {"strict": strict, "tool_choice": tool_choice}


def target_engine(adapter=None):
    """The target with `adapter` merged (default: the embedded one), no sidecar, as
    `run.evaluate_adapter` loads it."""
    from .. import models
    from ..engine import Engine
    dev = torch.device("cpu")
    model, tok = models.load_model("smollm2", device=dev, dtype=models.resolve_dtype(None, dev),
                                   adapter=adapter or models.EMBEDDED_TARGET_ADAPTER)
    return Engine(model, tok, None)


def hint_share(engine, records, *, max_new_tokens=160, progress=True) -> dict:
    """Tokens accepted from the hint drafter over all tokens generated, with method="oospec": in
    total (the top-level keys, as before) and per source."""
    from tqdm.auto import tqdm
    keys = ("n", "new_tokens", "hint", "schema", "retrieval", "hint_missing", "late")
    per: dict[str, dict] = {}
    for rec in tqdm(records, disable=not progress, desc="hint-share"):
        gen = engine.generate(rec["messages"], rec["tools"], tool_choice="auto", max_new_tokens=max_new_tokens,
                              method="oospec")
        t = per.setdefault(rec.get("source") or "?", dict.fromkeys(keys, 0))
        t["n"] += 1
        t["new_tokens"] += gen.stats.new_tokens
        for k, v in gen.stats.accepted_by_source.items():
            t[k] = t.get(k, 0) + v
        t["hint_missing"] += gen.stats.hint_ready_s is None
        t["late"] += bool(gen.stats.sidecar_error)
    for t in per.values():
        t["hint_share"] = round(t["hint"] / max(1, t["new_tokens"]), 4)
    tot = {k: sum(t.get(k, 0) for t in per.values()) for k in {k for t in per.values() for k in t} - {"hint_share"}}
    tot["hint_share"] = round(tot.get("hint", 0) / max(1, tot.get("new_tokens", 0)), 4)
    return tot | {"by_source": dict(sorted(per.items()))}


def source_table(res: dict) -> str:
    """A markdown table of a result's `by_source` figures, with the overall row last."""
    rows = dict(res.get("by_source") or {})
    overall = res.get("overall") or {k: v for k, v in res.items() if not isinstance(v, (dict, list))}
    if not rows:
        return ""
    cols = [c for c in next(iter(rows.values())) if not isinstance(next(iter(rows.values()))[c], (dict, list))]
    cell = lambda v: "-" if v is None else f"{v:.1%}" if isinstance(v, float) and 0 <= v <= 1 else str(v)  # noqa: E731
    lines = ["| source | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {src} | " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for src, r in rows.items()]
    lines.append("| **all** | " + " | ".join(cell(overall.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from ..data import only_sources
    from .data import DataError, load_many, select
    p = _parser()
    a = p.parse_args(argv)
    labels = _checked_labels(p, a)
    sources = [s.strip() for arg in a.sources or () for s in arg.split(",") if s.strip()] or \
        (None if a.what in ("sidecar", "calibrate") else list(BFCL_SOURCES))
    try:
        recs = load_many(a.dev)
        if sources:  # an unknown source is an error that names it
            recs = only_sources(recs, sources, a.dev)
    except DataError as e:
        p.error(str(e))
    if a.threads:
        from ..sidecar.cores import set_threads  # every thread count is set in one place
        set_threads(a.threads)
    if a.what == "target":
        res = score_target(target_engine(a.target_adapter), select(recs, sources, a.limit), sources=tuple(sources),
                           strict=a.strict, tool_choice=a.tool_choice, details=a.details)
    elif a.what in ("sidecar", "calibrate"):
        return _sidecar(a, recs, sources, labels)
    else:
        from ..engine import Engine
        engine = Engine.from_pretrained("embedded", adapter=a.target_adapter, sidecar_adapter=a.sidecar_adapter)
        res = hint_share(engine, select(recs, sources, a.limit))
    _report(res, a.out)
    return 0


def _parser() -> argparse.ArgumentParser:
    """`python -m oospec_agents.train.evaluate`'s options."""
    p = argparse.ArgumentParser(prog="python -m oospec_agents.train.evaluate")
    p.add_argument("what", choices=["target", "sidecar", "hint", "calibrate"])
    p.add_argument("--dev", required=True, nargs="+", action="extend", metavar="FILE_OR_GLOB",
                   help="dev JSONL: several files or globs (e.g. dev.jsonl and held-out sources of train-extra)")
    p.add_argument("--limit", type=int, default=None, help="records per source")
    p.add_argument("--sources", action="append", default=None, metavar="SOURCE[,SOURCE...]",
                   help="score only the records whose `source` is one of these: a comma-separated list, and/or "
                        "the option given several times; a source with no record is an error. Default: for target "
                        "and hint bfcl_simple,bfcl_multiple (the 408 BFCL simple + multiple records of dev.jsonl), "
                        "for sidecar every source")
    p.add_argument("--strict", action="store_true",
                   help="target: decode every record under the grammar of valid calls (generate(..., strict=True))")
    p.add_argument("--tool-choice", default="auto", choices=["auto", "required"],
                   help="target: the tool_choice of every request (default auto, as the goals are measured)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--details", action="store_true", help="list every record that is not exact")
    p.add_argument("--target-adapter", default=None, help="score this target adapter (default: the embedded one)")
    p.add_argument("--sidecar-adapter", default=None, help="score this sidecar adapter (default: the embedded one)")
    p.add_argument("--sidecar-base", default=None,
                   help='the sidecar adapter\'s base model (default: the one it names: "smollm2", "gemma3", a hub id)')
    p.add_argument("--labels", default="gold", metavar="gold|target|gold,target",
                   help="sidecar: score against the records' gold calls, the embedded target's own calls, or both")
    p.add_argument("--calibration", default=None, metavar="FILE",
                   help="sidecar: the confidence calibration (default: the adapter's confidence.json, else the raw "
                        "product of the rows' probabilities)")
    p.add_argument("--prior-weight", type=float, default=None,
                   help="sidecar: weigh the function row's lexical prior by this (default: the runtime's, "
                        "sidecar/wave.py PRIOR_WEIGHT; 0: none)")
    return p


def _checked_labels(p: argparse.ArgumentParser, a) -> list[str]:
    """The labels `--labels` names, once the options fit together (`p.error` where they do not)."""
    if a.what != "target" and (a.strict or a.tool_choice != "auto"):
        p.error("--strict and --tool-choice apply to `target` only")
    if a.prior_weight is not None and a.what not in ("sidecar", "calibrate"):
        p.error("--prior-weight applies to `sidecar` and `calibrate` only")
    labels = [x.strip() for x in a.labels.split(",") if x.strip()]
    if not labels or set(labels) - {"gold", "target"} or (labels != ["gold"] and a.what != "sidecar"):
        p.error(f"--labels takes gold, target or gold,target (and applies to `sidecar` only), got {a.labels!r}")
    if a.what == "calibrate":
        if a.out is None:
            p.error("calibrate needs --out FILE (an adapter's confidence.json)")
        held = [f for f in a.dev if os.path.basename(f) == "dev.jsonl"]
        if held:
            p.error(f"calibrate fits on training records only, not {held[0]}: pass train.jsonl (or train-extra's "
                    "sources the adapter was trained on)")
    return labels


def _report(res: dict, out: str | None, tables: tuple[str, ...] = ()) -> None:
    """Print a result's JSON (less its `points`), its per-source table (and the no-call one), then
    `tables`; write the whole JSON to `out` when given."""
    print(json.dumps({k: v for k, v in res.items() if k != "points"}, indent=2))
    table = source_table(res)
    if table:
        print("\n" + table)
    if res.get("no_call"):  # sidecar: "no call" records, where the function row should decline
        print("\n" + source_table({"by_source": res["no_call"]["by_source"],
                                   "overall": {k: v for k, v in res["no_call"].items() if k != "by_source"}}))
    for t in tables:
        print("\n" + t)
    if out:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out, "w") as f:
            f.write(json.dumps(res, indent=2) + "\n")


def _sidecar(a, recs: list[dict], sources, labels: list[str]) -> int:
    """`sidecar` (per label: the figures and their tables) and `calibrate` (fit, write, print)."""
    from .. import models
    from ..sidecar.confidence import Calibration
    from ..sidecar.rows import RowOptions
    from .data import select
    from .sidecar_eval import (confidence_table, errors_table, evaluate_sidecar, no_call, optional_table,
                               target_labelled)
    dev = torch.device("cpu")
    adapter = a.sidecar_adapter or models.EMBEDDED_SIDECAR_ADAPTER
    base = a.sidecar_base or models.adapter_base(adapter)
    m, t = models.load_model(base, device=dev, dtype=models.resolve_dtype(None, dev), adapter=adapter)
    options = RowOptions.for_adapter(adapter)  # its rows, as the runtime writes them
    if a.what == "calibrate":
        res = evaluate_sidecar(m, t, recs, sources=sources, limit_per_source=a.limit, prior_weight=a.prior_weight,
                               points=True, row_options=options)
        pts = res.pop("points")
        if not pts:
            raise SystemExit("calibrate: the wave predicted no call on these records: nothing to fit")
        files = ", ".join(os.path.basename(f) for f in a.dev)
        cal = Calibration.fit([lp for lp, _, _ in pts], [ex for _, ex, _ in pts],
                              fitted_on=f"{files} ({len(pts)} predicted calls, --limit {a.limit} per source)")
        cal.save(a.out)
        res["confidence"]["fitted"] = {"a": cal.a, "b": cal.b, "n": cal.n, "file": a.out}
        print(json.dumps(res["confidence"], indent=2))
        return 0
    calibration = Calibration.load(a.calibration) if a.calibration else Calibration.for_adapter(adapter)
    picked = select([r for r in recs if len(r["expected"]) == 1 or no_call(r)], sources, a.limit)
    results = {}
    for label in labels:
        scored, left = picked, 0
        if label == "target":
            from ..engine import Engine
            engine = Engine.from_pretrained("embedded", sidecar=False, adapter=a.target_adapter)
            scored, left = target_labelled(picked, engine)
            engine.close()
            print(f"target labels: {len(scored)} records labelled, {left} left out (the target wrote no valid call)",
                  file=sys.stderr)
        results[label] = evaluate_sidecar(m, t, scored, details=a.details, prior_weight=a.prior_weight,
                                          calibration=calibration, points=True,  # in --out: a refit needs no rerun
                                          row_options=options)
        results[label]["labels"] = {"kind": label, "records": len(scored),
                                    "left_out": left}  # target: it wrote no valid call (no-call records aside)
    for label, res in results.items():
        if len(results) > 1:
            print(f"\n## labels: {label}\n")
        out = a.out if len(results) == 1 or not a.out else "{0}.{2}{1}".format(*os.path.splitext(a.out), label)
        _report(res, out, (errors_table(res), optional_table(res), confidence_table(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
