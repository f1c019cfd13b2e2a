"""Scoring the embedded pair against the goals on dev.jsonl.

    python -m oospec_agents.train.evaluate target  --dev ../shared/data/toolcalls/dev.jsonl
    python -m oospec_agents.train.evaluate sidecar --dev ../shared/data/toolcalls/dev.jsonl --limit 60
    python -m oospec_agents.train.evaluate hint    --dev ../shared/data/toolcalls/dev.jsonl --limit 40
    python -m oospec_agents.train.evaluate sidecar --dev ../shared/data/toolcalls/dev.jsonl \
        ../shared/data/toolcalls/train-extra.jsonl --sources tooltalk,nestful,bfcl_simple,bfcl_multiple

`--dev` takes several files or globs; `--sources` keeps those sources; each mode prints its JSON,
then a per-source table.

- target: right tool / exact arguments of `Engine.from_pretrained("embedded")` with
  tool_choice="auto" on the BFCL simple and multiple records;
- sidecar: function-index accuracy / argument exact match of the sidecar adapter's rows, computed by
  the runtime's wave (the function row constrained to the offered names and null, as under "auto");
- hint: the share of generated tokens that the sidecar's hint drafted, with method="oospec".
"""
from __future__ import annotations

import argparse
import json
import sys

import torch


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
    cell = lambda v: f"{v:.1%}" if isinstance(v, float) and 0 <= v <= 1 else str(v)  # noqa: E731
    lines = ["| source | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    lines += [f"| {src} | " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for src, r in rows.items()]
    lines.append("| **all** | " + " | ".join(cell(overall.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from .data import load_many, select
    p = argparse.ArgumentParser(prog="python -m oospec_agents.train.evaluate")
    p.add_argument("what", choices=["target", "sidecar", "hint"])
    p.add_argument("--dev", required=True, nargs="+", action="extend", metavar="FILE_OR_GLOB",
                   help="dev JSONL: several files or globs (e.g. dev.jsonl and held-out sources of train-extra)")
    p.add_argument("--limit", type=int, default=None, help="records per source")
    p.add_argument("--sources", default=None, help="comma-separated sources (default per mode)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--details", action="store_true", help="list every record that is not exact")
    p.add_argument("--target-adapter", default=None, help="score this target adapter (default: the embedded one)")
    p.add_argument("--sidecar-adapter", default=None, help="score this sidecar adapter (default: the embedded one)")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    recs = load_many(a.dev)
    if a.what == "target":
        from .. import models
        from .run import evaluate_adapter
        res = evaluate_adapter("smollm2", a.target_adapter or models.EMBEDDED_TARGET_ADAPTER, recs, limit=a.limit,
                               sources=tuple(a.sources.split(",")) if a.sources else ("bfcl_simple", "bfcl_multiple"),
                               details=a.details)
    elif a.what == "sidecar":
        from .. import models
        from .sidecar_train import evaluate_sidecar
        dev = torch.device("cpu")
        m, t = models.load_model("smollm2", device=dev, dtype=models.resolve_dtype(None, dev),
                                 adapter=a.sidecar_adapter or models.EMBEDDED_SIDECAR_ADAPTER)
        res = evaluate_sidecar(m, t, recs, sources=a.sources.split(",") if a.sources else None,
                               limit_per_source=a.limit, details=a.details)
    else:
        from ..engine import Engine
        engine = Engine.from_pretrained("embedded", adapter=a.target_adapter, sidecar_adapter=a.sidecar_adapter)
        sources = a.sources.split(",") if a.sources else ["bfcl_simple", "bfcl_multiple"]
        res = hint_share(engine, select(recs, sources, a.limit))
    text = json.dumps(res, indent=2)
    print(text)
    table = source_table(res)
    if table:
        print("\n" + table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
