"""#49's measurement protocol for one source of train-extra.jsonl: log the target's calls on the first
60% of its records, `oospec adapt` on that log, and measure on the last 40%, before and after.

    .venv/bin/python examples/experiments/adapt_protocol.py --data TRAIN-EXTRA.jsonl --dev DEV.jsonl --source tooltalk --out adapt-out/tooltalk

1. Records: the source's, in file order (the converter's order: dialogue by dialogue), the first
   `--limit` of them. The first 60% are replayed through
   `Engine.from_pretrained("embedded", sidecar=False, call_log=OUT/calls.jsonl)`, greedily, with
   tool_choice="auto" and method toolspec: the log holds the target's verified calls. The last 40% are
   decoded the same way with no log; the target's calls are their labels (no gold is used), and a
   record where it writes no valid call is left out.
2. `oospec adapt --log OUT/calls.jsonl --out OUT/adapter --holdout 0` (the last 40% is the held-out
   part here), from the shipped sidecar adapter, with its training data replayed.
3. On the last 40%: the wave's agreement with the target (function, arguments exact, token agreement;
   `oospec_agents.train.adapt.agreement`) with the shipped adapter and the adapted one, split into calls
   to a function the log holds and calls to one it does not.
4. `oospec bench --methods toolspec,oospec --wave-payback off` on the labelled last 40% with the shipped
   adapter, then `--methods oospec --sidecar-adapter OUT/adapter`: target forwards per record, decode
   speedup over ar and hint tokens accepted per record, per group. On shared cores the pay-back rule
   would skip the wave, hence `off`. Then both `oospec` runs again with `--hint-first` (the target waits
   for the wave, so every hint is in time): on a CPU whose cores the wave shares, a hint can come after
   the reply, and then the timing, not the adapter, sets the forwards; these are a sidecar's on its own
   accelerator, the figure that carries over to any device.
5. dev.jsonl (the shipped adapter's sources, gold calls), `--dev-limit` records with one call per
   source: agreement before and after.

It writes OUT/summary.md and OUT/summary.json. A step whose output is in OUT already is not run again,
and the adapt step resumes from its checkpoint, so an interrupted run continues where it stopped.
A smoke run: `--limit 6 --max-steps 1 --min-records 1 --dev-limit 1`.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SHARE = 0.6


def main(argv=None) -> None:
    a = parser().parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.threads:
        from oospec_agents.sidecar.cores import set_threads
        set_threads(a.threads)
    first, last = split(a.data, a.source, a.limit)
    labelled = label(first, last, out, a.max_new_tokens)
    held = labelled["held"]
    if not held:
        raise SystemExit("the target wrote no valid call on any of the last 40%: nothing to measure")
    adapter = adapt(out, a)
    functions = set(labelled["functions"])
    agree = measure(held, functions, adapter, a.dev, a.dev_limit, out)
    bench = bench_runs(held, functions, adapter, out, a)
    summary = {"run": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:] if argv is None else argv),
               "source": a.source, "records": labelled["counts"], "adapt": _adapt_summary(adapter),
               "agreement": agree["held"], "dev": agree["dev"], "bench": bench,
               "commands": labelled["commands"] + _commands(out, adapter, a)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    print((out / "summary.md").read_text())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", required=True, help="a source of train-extra.jsonl (tooltalk, nestful, ...)")
    p.add_argument("--data", required=True, metavar="FILE.jsonl",
                   help="where the source's records are (the project's train-extra.jsonl, or yours: "
                        "docs/own-model.md#records)")
    p.add_argument("--dev", required=True, metavar="FILE.jsonl",
                   help="records with gold calls scored before and after (the project's dev.jsonl, or yours)")
    p.add_argument("--limit", type=int, default=None, help="the source's first N records (default: all)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--epochs", type=float, default=2.0, help="oospec adapt --epochs")
    p.add_argument("--replay-share", type=float, default=None, help="oospec adapt --replay-share (default: adapt's)")
    p.add_argument("--max-steps", type=int, default=None, help="oospec adapt --max-steps (smoke runs)")
    p.add_argument("--min-records", type=int, default=None, help="oospec adapt --min-records (default: adapt's)")
    p.add_argument("--max-len", type=int, default=None,
                   help="oospec adapt --max-len (default: adapt's; a source with many tools may need more)")
    p.add_argument("--dev-limit", type=int, default=15,
                   help="dev records per source, of those with one call (15: 45 records of bfcl_simple, "
                        "bfcl_multiple and apibank_l1; the parallel sources expect several calls)")
    p.add_argument("--bench-limit", type=int, default=None, help="bench the first N labelled records (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--no-hint-first", action="store_true",
                   help="skip the two --hint-first bench runs (on a CPU: most of the bench step's time)")
    p.add_argument("--threads", type=int, default=None, help="torch threads, here and in adapt and bench")
    return p


def split(data: str, source: str, limit: int | None) -> tuple[list[dict], list[dict]]:
    """The source's first `limit` records in file order: (first 60%, last 40%)."""
    from oospec_agents.bench.records import load_records
    from oospec_agents.data import only_sources
    records = only_sources(load_records(data), [source], data)[:limit]
    k = round(SHARE * len(records))
    if not 0 < k < len(records):
        raise SystemExit(f"{len(records)} records of {source!r}: too few to split 60/40")
    return records[:k], records[k:]


# --------------------------------------------------------------------------- 1. the log and the labels

def label(first: list[dict], last: list[dict], out: Path, max_new_tokens: int) -> dict:
    """OUT/calls.jsonl (the target's calls on `first`, logged by the engine) and OUT/labels.json (the
    target's calls on `last`); read back from OUT when there."""
    done = out / "labels.json"
    if done.is_file():
        return json.loads(done.read_text())
    from tqdm.auto import tqdm
    from oospec_agents import Engine
    log = out / "calls.jsonl"
    log.unlink(missing_ok=True)
    kw = dict(tool_choice="auto", method="toolspec", max_new_tokens=max_new_tokens)
    engine = Engine.from_pretrained("embedded", sidecar=False, call_log=str(log))
    for rec in tqdm(first, desc="log (first 60%)"):
        engine.generate(rec["messages"], rec["tools"], **kw)
    engine.close()
    engine = Engine.from_pretrained("embedded", sidecar=False)
    held = []
    for rec in tqdm(last, desc="labels (last 40%)"):
        gen = engine.generate(rec["messages"], rec["tools"], **kw)
        if gen.tool_calls and not gen.invalid_tool_calls and not gen.tool_call_problems:  # the log's rule
            held.append(dict(rec, expected=[{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls],
                             meta=dict(rec.get("meta") or {}, label="target, greedy, toolspec")))
    engine.close()
    logged = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    functions = sorted({c["name"] for r in logged for c in r["expected"]})
    labelled = {"held": held, "functions": functions,
                "counts": {"first": len(first), "logged": len(logged), "last": len(last), "labelled": len(held),
                           "functions_logged": len(functions),
                           "held_calls_to_logged_functions": sum(r["expected"][0]["name"] in functions for r in held)},
                "commands": [f'Engine.from_pretrained("embedded", sidecar=False, call_log="{log}") over the first '
                             f"{len(first)} records: generate(tool_choice='auto', method='toolspec', "
                             f"max_new_tokens={max_new_tokens})"]}
    with open(out / "heldout.jsonl", "w") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in held)
    done.write_text(json.dumps(labelled) + "\n")
    return labelled


# --------------------------------------------------------------------------- 2. adapt

def adapt_command(out: Path, a) -> list[str]:
    cmd = ["oospec", "adapt", "--log", str(out / "calls.jsonl"), "--out", str(out / "adapter"), "--holdout", "0",
           "--epochs", str(a.epochs), "--resume"]
    for flag, value in (("--replay-share", a.replay_share), ("--max-steps", a.max_steps),
                        ("--min-records", a.min_records), ("--max-len", a.max_len),
                        ("--threads", a.threads)):
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def adapt(out: Path, a) -> Path:
    adapter = out / "adapter"
    done = _metrics(adapter) if (adapter / "metrics.json").is_file() else None
    if done is None or done["steps"] < done["total_steps"]:  # not run, or stopped before its end
        _run(adapt_command(out, a))
    return adapter


def _metrics(adapter: Path) -> dict:
    return json.loads((adapter / "metrics.json").read_text())


def _adapt_summary(adapter: Path) -> dict:
    m = _metrics(adapter)
    return {k: m[k] for k in ("records", "replay", "examples", "config", "train_seconds", "steps")} | \
        {"epochs": m["config"]["epochs"]}


def _run(cmd: list[str]) -> None:
    print("+ " + " ".join(cmd), file=sys.stderr)
    subprocess.run([sys.executable, "-m", "oospec_agents.cli"] + cmd[1:], check=True)


# --------------------------------------------------------------------------- 3, 5. agreement

def measure(held: list[dict], functions: set[str], adapter: Path, dev: str, dev_limit: int, out: Path) -> dict:
    """The wave's agreement on the labelled last 40% and on dev (gold), with the shipped adapter and
    `adapter`; read back from OUT/agreement.json when there."""
    done = out / "agreement.json"
    if done.is_file():
        return json.loads(done.read_text())
    import torch
    from oospec_agents import models
    from oospec_agents.data import load_records
    from oospec_agents.train.adapt import agreement
    from oospec_agents.train.data import select
    from oospec_agents.train.sidecar_train import evaluate_sidecar
    dev = select([r for r in load_records(dev) if len(r["expected"]) == 1], None, dev_limit)
    cpu = torch.device("cpu")
    res: dict = {"held": {}, "dev": {}}
    for when, path in (("before", models.EMBEDDED_SIDECAR_ADAPTER), ("after", adapter)):
        model, tok = models.load_model("smollm2", device=cpu, dtype=models.resolve_dtype(None, cpu), adapter=path)
        res["held"][when] = agreement(model, tok, held, functions)
        res["dev"][when] = evaluate_sidecar(model, tok, dev)
    done.write_text(json.dumps(res, indent=2) + "\n")
    return res


# --------------------------------------------------------------------------- 4. bench

def bench_commands(out: Path, adapter: Path, a) -> dict[str, list[str]]:
    common = ["--data", str(out / "heldout.jsonl"), "--wave-payback", "off", "--max-new-tokens",
              str(a.max_new_tokens)] + (["--threads", str(a.threads)] if a.threads else []) + \
        (["--limit", str(a.bench_limit)] if a.bench_limit else [])
    after = ["--sidecar-adapter", str(adapter)]
    return {"before": ["oospec", "bench", "--methods", "toolspec,oospec", "--out", str(out / "bench-before")] + common,
            "after": ["oospec", "bench", "--methods", "oospec", "--out", str(out / "bench-after")] + after + common,
            # every hint in time (the target waits for the wave): the forwards a sidecar on its own
            # accelerator gives, which on a CPU whose cores the wave shares the timing hides
            **({} if a.no_hint_first else {
                "before-hint-first": ["oospec", "bench", "--methods", "oospec", "--hint-first", "--quiet",
                                      "--out", str(out / "bench-before-hint-first")] + common,
                "after-hint-first": ["oospec", "bench", "--methods", "oospec", "--hint-first", "--quiet",
                                     "--out", str(out / "bench-after-hint-first")] + after + common})}


def bench_runs(held: list[dict], functions: set[str], adapter: Path, out: Path, a) -> dict:
    """Per group (and overall): toolspec's and oospec's figures before and after (`bench.metrics.aggregate`)."""
    from oospec_agents.bench.metrics import aggregate
    from oospec_agents.train.adapt import HOLDS, LACKS
    runs = {}
    for when, cmd in bench_commands(out, adapter, a).items():
        results = out / f"bench-{when}" / "results.json"
        if not results.is_file():
            _run(cmd)
        runs[when] = json.loads(results.read_text())["records"]
    group = {r["id"]: HOLDS if r["expected"][0]["name"] in functions else LACKS for r in held}  # bench keeps ids
    out_: dict = {}
    for g in (HOLDS, LACKS, "overall"):
        pick = lambda rows: [r for r in rows if g == "overall" or group[r["id"]] == g]  # noqa: E731
        before, after = pick(runs["before"]), pick(runs["after"])
        if not before:
            out_[g] = {"n": 0}
            continue
        figs = lambda rows, m: aggregate([r["runs"][m] for r in rows], [r["runs"]["ar"] for r in rows])  # noqa: E731
        out_[g] = {"n": len(before), "toolspec": figs(before, "toolspec"), "oospec_before": figs(before, "oospec"),
                   "oospec_after": figs(after, "oospec"),
                   **({} if "before-hint-first" not in runs else {
                       "oospec_before_hint_first": figs(pick(runs["before-hint-first"]), "oospec"),
                       "oospec_after_hint_first": figs(pick(runs["after-hint-first"]), "oospec")})}
    return out_


def _commands(out: Path, adapter: Path, a) -> list[str]:
    return [" ".join(adapt_command(out, a))] + [" ".join(c) for c in bench_commands(out, adapter, a).values()]


# --------------------------------------------------------------------------- the summary

def markdown(s: dict) -> str:
    from oospec_agents.train.adapt import HOLDS, LACKS, table
    from oospec_agents.train.evaluate import source_table
    c, ad = s["records"], s["adapt"]
    names = {HOLDS: "function the log holds", LACKS: "function the log lacks", "overall": "**all**"}
    num = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
    lines = [f"# Adapting the sidecar on `{s['source']}` (#49's protocol)", "",
             f"`{s['run']}`", "",
             f"{c['first'] + c['last']} records of `{s['source']}` in file order. First 60%: {c['first']} replayed "
             f"through the embedded target, {c['logged']} verified calls logged ({c['functions_logged']} functions). "
             f"Last 40%: {c['last']}, of which the target called on {c['labelled']} (the labels; "
             f"{c['held_calls_to_logged_functions']} call a function the log holds).", "",
             f"`oospec adapt`: {ad['records']['distinct']} distinct logged requests "
             f"({ad['records']['repeats_dropped']} repeats dropped) + {ad['replay']['records']} replayed records of "
             f"the shipped adapter's training data (share {ad['replay']['share']}: replay examples per log example), "
             f"{ad['epochs']} epochs, {ad['steps']} steps, {ad['train_seconds']:.0f} s.", "",
             "## The sidecar's agreement with the target, last 40% (before -> after)", "",
             table(s["agreement"]), "",
             "## Decoding the last 40% (`oospec bench`, `--wave-payback off`)", "",
             "| calls | n | toolspec forwards | oospec forwards before -> after | oospec / toolspec before -> after "
             "| decode speedup over ar: toolspec, oospec before -> after "
             "| hint tokens accepted / record before -> after |",
             "|---|---|---|---|---|---|---|"]
    for g, name in names.items():
        b = s["bench"][g]
        if not b["n"]:
            lines.append(f"| {name} | 0 | | | | | |")
            continue
        t, o0, o1 = b["toolspec"], b["oospec_before"], b["oospec_after"]
        hint = lambda f: (f["accepted_by_source"] or {}).get("hint", 0) / f["n"]  # noqa: E731
        lines.append(f"| {name} | {b['n']} | {num(t['target_forwards'])} | {num(o0['target_forwards'])} -> "
                     f"{num(o1['target_forwards'])} | {num(o0['target_forwards'] / t['target_forwards'])} -> "
                     f"{num(o1['target_forwards'] / t['target_forwards'])} | {num(t['speedup_decode'], '{:.2f}x')}, "
                     f"{num(o0['speedup_decode'], '{:.2f}x')} -> {num(o1['speedup_decode'], '{:.2f}x')} | "
                     f"{num(hint(o0))} -> {num(hint(o1))} |")
    lines += ["", "### Every hint in time (`--hint-first`: the target waits for the wave; the forwards of a sidecar "
              "on its own accelerator)", "",
              "| calls | n | toolspec forwards | oospec forwards before -> after | oospec / toolspec before -> after "
              "| hint tokens accepted / record before -> after |", "|---|---|---|---|---|---|"]
    for g, name in names.items():
        b = s["bench"][g]
        if not b["n"] or "oospec_before_hint_first" not in b:
            lines.append(f"| {name} | {b['n']} | | | | (not run) |")
            continue
        t, o0, o1 = b["toolspec"], b["oospec_before_hint_first"], b["oospec_after_hint_first"]
        lines.append(f"| {name} | {b['n']} | {num(t['target_forwards'])} | {num(o0['target_forwards'])} -> "
                     f"{num(o1['target_forwards'])} | {num(o0['target_forwards'] / t['target_forwards'])} -> "
                     f"{num(o1['target_forwards'] / t['target_forwards'])} | {num(hint(o0))} -> {num(hint(o1))} |")
    dev = {"by_source": {src: {"n": f["n"], **{f"{k} before": f[k] for k in ("function_index_acc", "arg_exact_match")},
                               **{f"{k} after": s["dev"]["after"]["by_source"][src][k]
                                  for k in ("function_index_acc", "arg_exact_match")}}
                         for src, f in s["dev"]["before"]["by_source"].items()}}
    dev["overall"] = {"n": s["dev"]["before"]["overall"]["n"],
                      **{f"{k} {w}": s["dev"][w]["overall"][k] for w in ("before", "after")
                         for k in ("function_index_acc", "arg_exact_match")}}
    lines += ["", "## dev.jsonl (gold calls), before and after", "", source_table(dev), "",
              "## Commands", ""] + [f"- `{cmd}`" for cmd in s["commands"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
