"""Do `ar`, `toolspec` and `oospec` give the same reply, with and without `deterministic=True`? And what
does each mode cost? Side by side in one run, on one loaded target (docs/deterministic.md).

    .venv/bin/python examples/experiments/deterministic_check.py --data RECORDS.jsonl \\
        --sources tooltalk,nestful,bfcl_multi_turn_base_first,callnavi --limit 40 --dtype bfloat16

Per record, each mode (the order alternates per record, so that a machine's load drifts over both) decodes
the record with every method. The two engines share one target and one prefix cache, cleared per record:
the first decode of a record prefills its prompt cold, the five others reuse it. Both modes prefill
alike (the exact one-forward prefill, the default on a bf16 CPU: a hit is the cold prefill bit for bit),
so a cold prefill's seconds are the prefill cost of either mode, counted for the mode that ran first. `oospec` gets a fixed hint, the record's
expected calls in the target's format (the sidecar's best case; a hint changes the draft tree, never the
tokens). A cache hit is the cold prefill bit for bit, so the replies of a mode differ only through the
decode forwards. Then, in deterministic mode, `--concurrency` K requests at once (threads: one `ar`, then
`toolspec` and `oospec` in turn), each checked against the mode's `ar`. One JSON line per
record goes to `--out` as it is done; the summary is printed at the end (or from `--out` with `--summary`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

METHODS = ("ar", "toolspec", "oospec")
MODES = ("normal", "deterministic")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("OOSPEC_DATA"), metavar="FILE.jsonl",
                   help="records (docs/own-model.md#records; docs/deterministic.md's runs took the project's "
                        "train-extra.jsonl); default: $OOSPEC_DATA")
    p.add_argument("--sources", default="tooltalk,nestful,bfcl_multi_turn_base_first,callnavi")
    p.add_argument("--limit", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--concurrency", default="4,8", metavar="K,K",
                   help="per record, also K requests at once (threads: ar, then toolspec and oospec in turn) in "
                        "deterministic mode, "
                        "each checked against its ar; '' for none")
    p.add_argument("--out", default="deterministic-check.jsonl")
    p.add_argument("--summary", action="store_true", help="only summarise --out")
    args = p.parse_args(argv)
    if not args.summary and not args.data:
        p.error("--data FILE.jsonl is required (or set OOSPEC_DATA): records in the format of "
                "docs/own-model.md#records")
    if not args.summary:
        run(args)
    print(summary([json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]))
    return 0


def run(args) -> None:
    import torch

    from oospec_agents import Engine
    from oospec_agents.bench.records import load_records, spread
    sources = set(args.sources.split(","))
    records = spread([r for r in load_records(args.data) if r["source"] in sources], args.limit)
    normal = Engine.from_pretrained("embedded", sidecar=False, dtype=args.dtype)
    engines = {"normal": normal,
               "deterministic": Engine(normal.target, normal.tokenizer, model_name=normal.model_name,
                                       deterministic=True).with_parts(prefix_cache=normal.prefix_cache)}  # the same
    # KV: prefilled alike
    print(f"{len(records)} records; {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {normal.target.dtype}", file=sys.stderr)
    with open(args.out, "w") as out:
        for i, rec in enumerate(records):
            hint = normal.fmt.render_calls(rec["expected"]) if rec.get("expected") else None
            row = {"id": rec["id"], "source": rec["source"]}
            normal.clear_prefix_cache()
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                engine = engines[mode]
                for method in METHODS:
                    t0 = time.perf_counter()
                    gen = engine.generate(rec["messages"], rec["tools"], tool_choice="required",
                                          max_new_tokens=args.max_new_tokens, method=method,
                                          hint=hint if method == "oospec" else None)
                    s = gen.stats
                    row[f"{mode}/{method}"] = {"tokens": gen.token_ids, "prefill_s": s.prefill_s, "decode_s": s.decode_s,
                                               "forwards": s.target_forwards, "cached": s.cached_prompt_tokens,
                                               "prompt_tokens": s.prompt_tokens,
                                               "wall_s": time.perf_counter() - t0}
            for k in (int(x) for x in args.concurrency.split(",") if x.strip()):
                row[f"concurrent/{k}"] = concurrent(engines["deterministic"], rec, hint, k, args.max_new_tokens,
                                                    row["deterministic/ar"]["tokens"])
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"{i + 1}/{len(records)} {rec['id']}: " + ", ".join(
                f"{m} {'same' if len({tuple(row[f'{m}/{x}']['tokens']) for x in METHODS}) == 1 else 'DIFFER'}"
                for m in MODES), file=sys.stderr, flush=True)


def concurrent(engine, rec: dict, hint: str | None, k: int, max_new_tokens: int, reference: list[int]) -> dict:
    """`k` requests for `rec` at once from threads (the first `ar`, then `toolspec` and `oospec` in turn: `ar`
    decodes a token a forward, and k of them would take k times as long); how many gave `reference`."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> list[int]:
        method = "ar" if i == 0 else ("toolspec", "oospec")[i % 2]
        return engine.generate(rec["messages"], rec["tools"], tool_choice="required", max_new_tokens=max_new_tokens,
                               method=method, hint=hint if method == "oospec" else None).token_ids
    with ThreadPoolExecutor(k) as pool:
        got = list(pool.map(one, range(k)))
    return {"requests": k, "same_as_ar": sum(g == reference for g in got)}


def summary(rows: list[dict]) -> str:
    n = len(rows)
    lines = [f"{n} records", "",
             "| mode | replies where the methods differ | ar vs toolspec | ar vs oospec | toolspec vs oospec |",
             "|---|---|---|---|---|"]
    for mode in MODES:
        def differ(a, b):
            return sum(r[f"{mode}/{a}"]["tokens"] != r[f"{mode}/{b}"]["tokens"] for r in rows)
        anyd = sum(len({tuple(r[f"{mode}/{m}"]["tokens"]) for m in METHODS}) > 1 for r in rows)
        lines.append(f"| {mode} | {anyd}/{n} ({100 * anyd / max(n, 1):.0f}%) | {differ('ar', 'toolspec')} | "
                     f"{differ('ar', 'oospec')} | {differ('toolspec', 'oospec')} |")
    same = sum(r["normal/ar"]["tokens"] == r["deterministic/ar"]["tokens"] for r in rows)
    lines += ["", f"deterministic ar == normal ar on {same}/{n} records"]
    for k in sorted({int(key.split("/")[1]) for r in rows for key in r if key.startswith("concurrent/")}):
        runs = [r[f"concurrent/{k}"] for r in rows if f"concurrent/{k}" in r]
        lines.append(f"deterministic, {k} requests at once (ar, then toolspec and oospec in turn): "
                     f"{sum(x['same_as_ar'] for x in runs)}/{sum(x['requests'] for x in runs)} replies are ar's "
                     f"({len(runs)} records)")
    lines += ["",
              "| method | mode | decode s | forwards | new tokens | decode s vs normal |", "|---|---|---|---|---|---|"]
    for method in METHODS:
        base = sum(r[f"normal/{method}"]["decode_s"] for r in rows)
        for mode in MODES:
            k = f"{mode}/{method}"
            dec = sum(r[k]["decode_s"] for r in rows)
            lines.append(f"| {method} | {mode} | {dec:.1f} | {sum(r[k]['forwards'] for r in rows)} | "
                         f"{sum(len(r[k]['tokens']) for r in rows)} | {100 * (dec / max(base, 1e-9) - 1):+.0f}% |")
    lines += ["", "| mode | cold prefills | their prompt tokens | cold prefill s | s per 1000 prompt tokens | warm prefill s |",
              "|---|---|---|---|---|---|"]
    for mode in MODES:
        runs = [r[f"{mode}/{m}"] for r in rows for m in METHODS]
        cold = [x for x in runs if x["cached"] == 0]
        toks, secs = sum(x.get("prompt_tokens", 0) for x in cold), sum(x["prefill_s"] for x in cold)
        lines.append(f"| {mode} | {len(cold)} | {toks} | {secs:.1f} | {1000 * secs / max(toks, 1):.2f} | "
                     f"{sum(x['prefill_s'] for x in runs if x['cached'] > 0):.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
