"""The sidecar wave on large tool sets (#20): the unbounded wave (one row per parameter of every tool)
against the bounded ones (`Wave(max_rows=..., top_tools=...)`), on the CPU. docs/sidecar.md, "Large tool
sets", has the table this prints and the choice it led to.

    OMP_NUM_THREADS=1 .venv/bin/python examples/experiments/wave_bound.py              # the timing table
    OMP_NUM_THREADS=1 .venv/bin/python examples/experiments/wave_bound.py accuracy 30  # the function row on 30 records
    OMP_NUM_THREADS=1 .venv/bin/python examples/experiments/wave_bound.py crossover    # one batch or two phases, by rows
    OMP_NUM_THREADS=1 .venv/bin/python examples/experiments/wave_bound.py target       # the target's own prefill, same records

The embedded sidecar (SmolLM2-135M-Instruct and its adapter) in float32 on one thread, as the engine's
sidecar thread runs on this CPU. `tool_choice="required"`. Every timed wave starts cold (its prefix
cache cleared), and the variants of a record run one after another, so they see the same load. An
unbounded wave whose fanned-out KV cache would pass `KV_LIMIT_GB` is not run: its size is printed.
The records: OOSPEC_DATA_DIR=DIR, the directory holding the project's record set (train-extra.jsonl,
dev.jsonl, train.jsonl; not in a clone) or yours under those names (docs/own-model.md#records).
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from required_slots import data_dir

KV_LIMIT_GB = 4.0
VARIANTS = {"unbounded": dict(max_rows=10 ** 9), "bounded": dict(top_tools=0), "top-2": dict(top_tools=2)}


def records(source: str, split: str = "train-extra") -> list[dict]:
    with open(data_dir() / f"{split}.jsonl", encoding="utf-8") as f:
        return [r for r in map(json.loads, f) if r["source"] == source and r["expected"]]


def by_tool_count(recs: list[dict], per: int = 1) -> list[dict]:
    """`per` records of each distinct tool count, smallest count first."""
    seen: dict[int, int] = {}
    out = []
    for r in sorted(recs, key=lambda r: (len(r["tools"]), r["id"])):
        if seen.get(len(r["tools"]), 0) < per:
            seen[len(r["tools"])] = seen.get(len(r["tools"]), 0) + 1
            out.append(r)
    return out


def spread(recs: list[dict], n: int) -> list[dict]:
    step = max(1, len(recs) // n)
    return recs[::step][:n]


def load():
    from oospec_agents.sidecar.load import load_sidecar
    torch.set_num_threads(1)
    sidecar = load_sidecar("embedded", device=torch.device("cpu"), dtype=torch.float32, sidecar_placement="thread")
    return sidecar.wave


def kv_bytes_per_token(model) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * next(model.parameters()).element_size()


def run(wave, rec: dict, *, cold: bool = True) -> dict:
    """One wave over a record's request: its profile, the hint's call and whether it is valid."""
    from oospec_agents.chat import normalize_messages
    from oospec_agents.formats import HermesFormat
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.sidecar.join import JoinError, join
    from oospec_agents.sidecar.runtime import wave_rows
    from oospec_agents.tools import check_calls, normalize_tools
    req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), HermesFormat(),
                      ("required", None))
    rows, prefix, choices = wave_rows(req)
    if cold:
        wave.prefix_cache.clear()
    t = time.perf_counter()
    result = wave(prefix, rows, None, choices)
    wave_s = time.perf_counter() - t
    try:
        call = join(rows, result.texts, req.tools, req.tool_choice)
        valid = check_calls([call], req.tools).all_fit
    except JoinError:
        call, valid = None, False
    return {"id": rec["id"], "tools": len(rec["tools"]), "wave_s": wave_s, **result.profile,
            "name": call and call["name"], "valid": valid, "expected": rec["expected"][0]["name"]}


def timing(wave, recs: list[dict]) -> list[dict]:
    from oospec_agents.chat import normalize_messages
    from oospec_agents.sidecar.rows import expand_rows
    from oospec_agents.sidecar.wave import Wave
    from oospec_agents.tools import normalize_tools
    waves = {k: Wave(wave.model, wave.tokenizer, max_row_tokens=wave.max_row_tokens, **kw) for k, kw in VARIANTS.items()}
    per_token = kv_bytes_per_token(wave.model)
    out = []
    for rec in recs:
        prefix, rows = expand_rows(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]))
        prefix_tokens = len(wave.tokenizer.encode(prefix, add_special_tokens=False))
        for name, w in waves.items():
            gb = len(rows) * (prefix_tokens + 24) * per_token / 1e9  # every row's own copy of the prefix's KV
            if name == "unbounded" and gb > KV_LIMIT_GB:
                res = {"id": rec["id"], "tools": len(rec["tools"]), "rows": len(rows), "skipped_kv_gb": gb,
                       "prefix_tokens": prefix_tokens}
            else:
                res = run(w, rec)
            res["variant"] = name
            out.append(res)
            print(json.dumps(res, default=str), flush=True)
    return out

def target_tokens(recs: list[dict]) -> dict[str, int | str]:
    """The embedded target's prompt tokens per record (tool_choice="required"): the same model as the
    sidecar, so its prefill alone takes longer than a wave whose prefix is several times shorter."""
    from oospec_agents import Engine
    from oospec_agents.errors import ContextLengthError
    engine = Engine.from_pretrained("embedded", sidecar=False, dtype=torch.float32)
    out: dict[str, int | str] = {}
    for rec in recs:
        try:
            out[rec["id"]] = len(engine.prompt_ids(rec["messages"], rec["tools"], tool_choice="required"))
        except ContextLengthError as e:
            out[rec["id"]] = f"over the context ({str(e)[:60]})"
    return out


def target_prefill(recs: list[dict]) -> list[dict]:
    """The embedded target's own prefill of each record's prompt (float32, one thread, one forward):
    the least time its call can take, for the hint's `wave s` to compare with."""
    from oospec_agents import Engine
    engine = Engine.from_pretrained("embedded", sidecar=False, dtype=torch.float32)
    out = []
    for rec in recs:
        ids = engine.prompt_ids(rec["messages"], rec["tools"], tool_choice="required")
        with torch.inference_mode():
            t = time.perf_counter()
            engine.target(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
            out.append({"id": rec["id"], "tools": len(rec["tools"]), "prompt_tokens": len(ids),
                        "prefill_s": time.perf_counter() - t})
        print(json.dumps(out[-1]), flush=True)
    return out


def table(results: list[dict], target: dict | None = None) -> str:
    target = target or {}
    lines = ["| record | tools | target prompt tokens | prefix tokens | variant | rows (of offered) | steps | prefill s | wave s | hint name | valid |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        if "skipped_kv_gb" in r:
            lines.append(f"| {r['id']} | {r['tools']} | {target.get(r['id'], '')} | {r['prefix_tokens']} | {r['variant']} | {r['rows']} | | | "
                         f"not run: {r['skipped_kv_gb']:.1f} GB of KV | | |")
            continue
        ok = "=" if r["name"] == r["expected"] else "!="
        lines.append(f"| {r['id']} | {r['tools']} | {target.get(r['id'], '')} | {r['prefix_tokens']} | {r['variant']} | "
                     f"{r['rows']} ({r['rows_offered']}) | {r['steps']} | {r['prefill_s']:.2f} | {r['wave_s']:.2f} | "
                     f"{r['name']} {ok} expected | {'yes' if r['valid'] else 'no'} |")
    return "\n".join(lines)


def accuracy(wave, recs: list[dict]) -> dict:
    """The bounded wave (and top-2's ranking) on `recs`, the prefix cache on as in an agent's session:
    the hint's name against `expected[0].name`, valid hints, rows, wave seconds."""
    from oospec_agents.sidecar.wave import Wave
    top2 = Wave(wave.model, wave.tokenizer, max_row_tokens=wave.max_row_tokens, top_tools=2)
    top2.prefix_cache = wave.prefix_cache  # the ranking pass reuses what the bounded wave prefilled
    rows, hits = [], []
    for rec in recs:
        r = run(wave, rec, cold=False)
        ranked = run(top2, rec, cold=False)
        r["top2"] = ranked.get("top_tools")
        r["expected_in_top2"] = r["expected"] in (ranked.get("top_tools") or [])
        r["chosen_in_top2"] = r["name"] in (ranked.get("top_tools") or [])
        rows.append(r)
        print(json.dumps(r, default=str), flush=True)
    n = len(rows)
    return {"n": n, "name_right": sum(r["name"] == r["expected"] for r in rows), "valid": sum(r["valid"] for r in rows),
            "expected_in_top2_by_first_token": sum(r["expected_in_top2"] for r in rows),
            "chosen_in_top2_by_first_token": sum(r["chosen_in_top2"] for r in rows),
            "rows_max": max(r["rows"] for r in rows), "rows_median": statistics.median(r["rows"] for r in rows),
            "wave_s_median": statistics.median(r["wave_s"] for r in rows), "wave_s_max": max(r["wave_s"] for r in rows)}


def crossover(wave, recs: list[dict]) -> list[dict]:
    """Where two phases start to pay: each record's wave in one batch (`max_rows` unbounded) and in two
    phases (`max_rows=2` forces them), both cold, by the number of rows offered."""
    from oospec_agents.sidecar.wave import Wave
    one = Wave(wave.model, wave.tokenizer, max_row_tokens=wave.max_row_tokens, max_rows=10 ** 9)
    two = Wave(wave.model, wave.tokenizer, max_row_tokens=wave.max_row_tokens, max_rows=2)
    out = []
    for rec in recs:
        a, b = run(one, rec), run(two, rec)
        out.append({"id": rec["id"], "rows": a["rows"], "prefix_tokens": a["prefix_tokens"],
                    "one_batch_s": a["wave_s"], "two_phases_s": b["wave_s"], "two_phase_rows": b["rows"]})
        print(json.dumps(out[-1]), flush=True)
    return out


def by_rows(recs: list[dict], lo: int, hi: int, n: int) -> list[dict]:
    """`n` records whose wave offers lo..hi rows (the function row and one per parameter), spread."""
    rows = lambda r: 1 + sum(len(t["function"].get("parameters", {}).get("properties", {})) for t in r["tools"])  # noqa: E731
    return spread([r for r in recs if lo <= rows(r) <= hi], n)


def big_records() -> list[dict]:
    """The timing table's large tool sets: one callnavi record of 21, 48, 82 and 101 tools, one BFCL
    multi-turn record of 18, 28 and 39."""
    return ([r for r in by_tool_count(records("callnavi")) if len(r["tools"]) in (21, 48, 82, 101)]
            + [r for r in by_tool_count(records("bfcl_multi_turn_base_first")) if len(r["tools"]) in (18, 28, 39)])


def main(argv: list[str]) -> None:
    data_dir()  # OOSPEC_DATA_DIR unset: say so before loading a model
    if argv[:1] == ["target"]:
        torch.set_num_threads(1)
        target_prefill(big_records())
        return
    wave = load()
    if argv[:1] == ["accuracy"]:
        n = int(argv[1]) if len(argv) > 1 else 30
        recs = spread(records("callnavi"), n * 2 // 3) + spread(records("bfcl_multi_turn_base_first"), n - n * 2 // 3)
        print(json.dumps(accuracy(wave, recs)))
        return
    if argv[:1] == ["crossover"]:
        live = records("bfcl_live_multiple", "train")
        recs = (by_rows(records("bfcl_multiple", "dev") + records("bfcl_parallel_multiple", "dev"), 10, 15, 4)
                + by_rows(live, 16, 24, 4) + by_rows(live, 25, 32, 4) + by_rows(live, 33, 48, 2))
        run(wave, recs[0])  # warm-up
        crossover(wave, recs)
        return
    recs = big_records() + spread(records("bfcl_multiple", "dev"), 2) + spread(records("bfcl_parallel_multiple", "dev"), 2)
    run(wave, recs[0])  # warm-up: the first forward of a process is slow
    print(table(timing(wave, recs), target_tokens(recs)))


if __name__ == "__main__":
    main(sys.argv[1:])
