"""Is a prefix-cache hit the cold prefill bit for bit, and what does each way of prefilling cost?
(docs/deterministic.md, "Cold against warm").

    .venv/bin/python examples/experiments/exact_prefill_check.py timing --data RECORDS.jsonl --threads 1 --reps 3 --out timing-t1.jsonl \\
        --ids "nestful/executable_4,tooltalk/easy/CreateEvent-easy#0,nestful/executable_0,tooltalk/tooltalk/Calendar-Email-Reminder-SendEmail-2#4,callnavi/hot020"
    .venv/bin/python examples/experiments/exact_prefill_check.py summary --out timing-t1.jsonl
    .venv/bin/python examples/experiments/exact_prefill_check.py replies --data RECORDS.jsonl --max-new-tokens 48 \\
        --ids "nestful/executable_0,tooltalk/easy/CreateEvent-easy#0,nestful/executable_4"
    .venv/bin/python examples/experiments/exact_prefill_check.py replies --data RECORDS.jsonl --threads 1 --engines plain,exact \\
        --sources tooltalk,nestful,bfcl_multi_turn_base_first,callnavi --limit 16

Three engines on one bf16 embedded target: `plain` (`prefill_chunk=1`: the uncached tail in one forward),
`exact` (the default, `prefill_chunk=None`: one forward whose attention runs in canonical shapes) and
`chunk256` (forwards ending at multiples of 256, a hit cut back to them).

`timing`: per record and repetition, each engine in turn (the order rotates per repetition, so that the
machine's load drifts over all three) prefills the prompt cold, then warm twice from its own cold KV:
the whole prompt cached (`full`: the same request again) and all but its last 300 tokens (`partial`: a
new turn on a cached conversation). Each prefill's seconds and whether its logits and KV are the cold
ones bit for bit go to `--out`; the summary takes each (record, engine, case)'s minimum over the
repetitions (on a shared machine only the minimum of interleaved runs means much).

`replies`: per record, each engine decodes it twice with `toolspec` (prefix cache and call memory
cleared before the first): cold, then warm. Prints whether the warm reply is the cold one, both
replies and each prefill's seconds. `--sources`/`--limit` take records round-robin instead of `--ids`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

VARIANTS = {"plain": 1, "exact": None, "chunk256": 256}
PARTIAL = 300  # tokens of a new turn, uncached


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("timing", "replies", "summary"))
    p.add_argument("--data", default=os.environ.get("OOSPEC_DATA"), metavar="FILE.jsonl",
                   help="records (docs/own-model.md#records; the default --ids are records of the project's "
                        "train-extra.jsonl, which docs/deterministic.md's runs took); default: $OOSPEC_DATA")
    p.add_argument("--ids", required=False, default="nestful/executable_0,tooltalk/easy/CreateEvent-easy#0,"
                                                   "nestful/executable_4")
    p.add_argument("--sources", default=None, help="instead of --ids: the first --limit records of these "
                   "sources, round-robin (e.g. tooltalk,nestful,bfcl_multi_turn_base_first,callnavi)")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--engines", default=",".join(VARIANTS), help="which of plain,exact,chunk256 to run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's); 1 makes CPU seconds a count of the work alone")
    p.add_argument("--out", default="exact-prefill-timing.jsonl")
    args = p.parse_args(argv)
    if args.mode != "summary" and not args.data:
        p.error("--data FILE.jsonl is required (or set OOSPEC_DATA): records in the format of "
                "docs/own-model.md#records")
    if args.mode == "replies":
        return replies(args)
    if args.mode == "timing":
        timing(args)
    print(summary([json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]))
    return 0


def _setup(args):
    import torch

    from oospec_agents import Engine
    from oospec_agents.bench.records import load_records, spread
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sources:
        sources = set(args.sources.split(","))
        records = spread([r for r in load_records(args.data) if r["source"] in sources], args.limit)
    else:
        wanted = args.ids.split(",")
        by_id = {r["id"]: r for r in load_records(args.data) if r["id"] in wanted}
        records = [by_id[i] for i in wanted]
    base = Engine.from_pretrained("embedded", sidecar=False, dtype=args.dtype, prefill_chunk=1)
    engines = {name: base if chunk == 1 else Engine(base.target, base.tokenizer, model_name=base.model_name,
                                                    prefill_chunk=chunk)
               for name, chunk in VARIANTS.items() if name in args.engines.split(",")}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {base.target.dtype}; exact prefill: "
          f"{engines['exact']._verifier.exact_prefill}", file=sys.stderr)
    return records, engines


def timing(args) -> None:
    import torch

    from oospec_agents.prefix_cache import fork
    records, engines = _setup(args)
    names = list(engines)
    k = len(names)
    with open(args.out, "w") as out:
        for rep in range(args.reps):
            for rec in records:
                for name in names[rep % k:] + names[:rep % k]:
                    engine = engines[name]
                    v, pc = engine._verifier, engine.prefix_cache
                    ids = engine.prompt_ids(rec["messages"], rec["tools"], tool_choice="required")
                    n = len(ids)
                    cache = v.new_cache()
                    t0, c0 = time.perf_counter(), time.process_time()
                    cold = v.prefill(ids, cache, 0, pc.chunk)
                    row = {"id": rec["id"], "rep": rep, "engine": name, "prompt": n, "cold_s": time.perf_counter() - t0,
                           "cold_cpu": time.process_time() - c0}
                    for case, cached in (("full", n), ("partial", n - PARTIAL)):
                        hit = max(0, pc._aligned(min(cached, n - pc.min_tail)))
                        mine = fork(cache, hit, n)
                        t0, c0 = time.perf_counter(), time.process_time()
                        warm = v.prefill(ids, mine, hit, pc.chunk)
                        row[f"{case}_s"] = time.perf_counter() - t0
                        row[f"{case}_cpu"] = time.process_time() - c0
                        row[f"{case}_fed"] = n - hit
                        row[f"{case}_exact"] = bool(torch.equal(warm, cold)) and all(
                            torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
                            for a, b in zip(mine.layers, cache.layers))
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(json.dumps({k: round(x, 3) if isinstance(x, float) else x for k, x in row.items()}),
                          file=sys.stderr)


def summary(rows: list[dict]) -> str:
    """Per record, engine and case the minimum over the repetitions, of wall seconds and (where the
    rows have them) of the process's CPU seconds (both threads: less moved by other work on the machine)."""
    ids = sorted({r["id"] for r in rows}, key=lambda i: next(r["prompt"] for r in rows if r["id"] == i))
    prompt = {r["id"]: r["prompt"] for r in rows}
    engines = [e for e in VARIANTS if any(r["engine"] == e for r in rows)]
    exact: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        exact[r["engine"]] += [r["full_exact"], r["partial_exact"]]
    cases = ("cold", "full", "partial")
    lines = [f"{len(ids)} records, {max(r['rep'] for r in rows) + 1} repetitions; the minimum per record, engine "
             "and case"]
    for unit, what in (("s", "wall seconds"), ("cpu", "CPU seconds")):
        if not all(f"cold_{unit}" in r for r in rows):
            continue
        best: dict[tuple, dict] = defaultdict(dict)
        for r in rows:
            for case in cases:
                key = (r["id"], r["engine"])
                best[key][case] = min(best[key].get(case, 1e9), r[f"{case}_{unit}"])
        lines += ["", f"{what}:", "",
                  "| record | prompt tokens | " + " | ".join(f"{e} {c}" for e in engines for c in cases) + " |",
                  "|---|---:|" + "---:|" * 3 * len(engines)]
        for i in ids:
            lines.append(f"| {i} | {prompt[i]} | " + " | ".join(f"{best[(i, e)][c]:.2f}" for e in engines for c in cases)
                         + " |")
        tot = {(e, c): sum(best[(i, e)][c] for i in ids) for e in engines for c in cases}
        lines += ["", f"| engine ({what}) | cold | vs plain | full hit | vs plain | partial hit | vs plain | "
                  "warm == cold bit for bit |", "|---|---:|---:|---:|---:|---:|---:|---|"]
        for e in engines:
            cells = [f"{tot[(e, c)]:.2f} | {tot[(e, c)] / tot[('plain', c)] - 1:+.1%}" for c in cases]
            lines.append(f"| {e} | " + " | ".join(cells) + f" | {sum(exact[e])} of {len(exact[e])} |")
    return "\n".join(lines)


def replies(args) -> int:
    records, engines = _setup(args)
    changed = defaultdict(int)
    for i, rec in enumerate(records):
        order = list(engines.items())
        for name, engine in order[i % len(order):] + order[:i % len(order)]:
            engine.clear_prefix_cache()
            engine.clear_call_memory()
            gens = []
            for _ in range(2):
                engine.clear_call_memory()
                gens.append(engine.generate(rec["messages"], rec["tools"], tool_choice="required",
                                            max_new_tokens=args.max_new_tokens, method="toolspec"))
            cold, warm = gens
            same = cold.token_ids == warm.token_ids
            changed[name] += not same
            print(json.dumps({"id": rec["id"], "engine": name, "prompt": cold.prompt_tokens,
                              "cached": warm.stats.cached_prompt_tokens, "warm == cold": same,
                              "cold_prefill_s": round(cold.stats.prefill_s, 2), "warm_prefill_s": round(warm.stats.prefill_s, 2),
                              "cold": cold.text, "warm": warm.text}), flush=True)
    print("replies changed cold -> warm:", {name: changed[name] for name in engines}, f"of {len(records)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
