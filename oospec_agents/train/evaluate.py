"""Scoring the embedded pair against the goals on dev.jsonl.

    python -m oospec_agents.train.evaluate target  --dev ../shared/data/toolcalls/dev.jsonl
    python -m oospec_agents.train.evaluate sidecar --dev ../shared/data/toolcalls/dev.jsonl --limit 60
    python -m oospec_agents.train.evaluate hint    --dev ../shared/data/toolcalls/dev.jsonl --limit 40

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
    """Tokens accepted from the hint drafter over all tokens generated, with method="oospec"."""
    from tqdm.auto import tqdm
    tot = {"n": 0, "new_tokens": 0, "hint": 0, "schema": 0, "retrieval": 0, "hint_missing": 0, "late": 0}
    for rec in tqdm(records, disable=not progress, desc="hint-share"):
        gen = engine.generate(rec["messages"], rec["tools"], tool_choice="auto", max_new_tokens=max_new_tokens,
                              method="oospec")
        tot["n"] += 1
        tot["new_tokens"] += gen.stats.new_tokens
        for k, v in gen.stats.accepted_by_source.items():
            tot[k] += v
        tot["hint_missing"] += gen.stats.hint_ready_s is None
        tot["late"] += bool(gen.stats.sidecar_error)
    tot["hint_share"] = round(tot["hint"] / max(1, tot["new_tokens"]), 4)
    return tot


def main(argv=None) -> int:
    from .data import load_records, select
    p = argparse.ArgumentParser(prog="python -m oospec_agents.train.evaluate")
    p.add_argument("what", choices=["target", "sidecar", "hint"])
    p.add_argument("--dev", required=True)
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
    recs = load_records(a.dev)
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
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
