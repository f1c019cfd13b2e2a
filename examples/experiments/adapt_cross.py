"""#49's second table: a sidecar adapted on one source, measured on another (a deployment's tools drift).

    .venv/bin/python examples/experiments/adapt_cross.py adapt-out/tooltalk adapt-out/nestful adapt-out/bfcl_multi_turn_base_first

Each argument is an OUT of `examples/experiments/adapt_protocol.py` that has run through its labels (OUT/heldout.jsonl,
OUT/labels.json); one with an adapted sidecar (OUT/adapter) is also measured on the others. For every
ordered pair (A adapted, B),
A's adapted sidecar is scored on B's labelled last 40% (the target's greedy calls; no gold) with
`oospec_agents.train.adapt.agreement`, the figures split by whether A's log holds the called function;
"before" is the shipped adapter on the same records (B's agreement.json, or scored here). The
table goes to stdout and, with `--out FILE`, to FILE (markdown) and FILE.json.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="OUT", help="adapt_protocol.py output folders")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, metavar="FILE")
    a = p.parse_args(argv)
    if len(a.runs) < 2:
        p.error("give at least two protocol folders")
    if a.threads:
        from oospec_agents.sidecar.cores import set_threads
        set_threads(a.threads)
    import torch
    from oospec_agents import models
    from oospec_agents.train.adapt import agreement
    runs = {Path(r).name: Path(r) for r in a.runs}
    held = {n: [json.loads(line) for line in (d / "heldout.jsonl").read_text().splitlines()] for n, d in runs.items()}
    logged = {n: set(json.loads((d / "labels.json").read_text())["functions"]) for n, d in runs.items()}
    cpu = torch.device("cpu")
    before = {}  # the shipped adapter on each B: B's agreement.json, or scored here (a B that was not adapted)
    for n, d in runs.items():
        if (d / "agreement.json").is_file():
            before[n] = json.loads((d / "agreement.json").read_text())["held"]["before"]["overall"]
    if len(before) < len(runs):
        model, tok = models.load_model("smollm2", device=cpu, dtype=models.resolve_dtype(None, cpu),
                                       adapter=models.EMBEDDED_SIDECAR_ADAPTER)
        for n in runs:
            if n not in before:
                before[n] = agreement(model, tok, held[n], set())["overall"]
        del model
    rows = []
    for src, d in runs.items():
        if not (d / "adapter" / "adapter_model.safetensors").is_file():
            continue  # measured on only (callnavi: its requests are too long to adapt on here)
        model, tok = models.load_model("smollm2", device=cpu, dtype=models.resolve_dtype(None, cpu),
                                       adapter=d / "adapter")
        for dst in runs:
            if dst == src:
                continue
            after = agreement(model, tok, held[dst], logged[src])
            rows.append({"adapted_on": src, "measured_on": dst, "before": before[dst], "after": after})
        del model
    table = markdown(rows)
    print(table)
    if a.out:
        Path(a.out).write_text(table)
        Path(a.out + ".json").write_text(json.dumps(rows, indent=2) + "\n")


def markdown(rows: list[dict]) -> str:
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    lines = ["| adapted on | measured on (last 40%) | n | function before -> after | arguments exact before -> after "
             "| calls to a function A's log holds: n, function after |",
             "|---|---|---:|---|---|---|"]
    for r in rows:
        b, a, h = r["before"], r["after"]["overall"], r["after"]["log_holds"]
        lines.append(f"| {r['adapted_on']} | {r['measured_on']} | {a['n']} | {pct(b['function_index_acc'])} -> "
                     f"{pct(a['function_index_acc'])} | {pct(b['arg_exact_match'])} -> {pct(a['arg_exact_match'])} | "
                     f"{h['n']}" + (f", {pct(h['function_index_acc'])}" if h["n"] else "") + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
