"""Would an int8 sidecar make the CPU wave pay back? (#18, #20; measured once, not shipped.)

The same records' waves (every row, `tool_choice="auto"`, prefix cache off, so each wave is cold) with
the embedded sidecar in float32, in bfloat16, and in float32 with its `nn.Linear` layers quantized to
int8 by PyTorch's dynamic quantization (`torch.ao.quantization.quantize_dynamic`, int8 weights, the
activations quantized per batch). Prints each mode's mean wave time, its function-row accuracy, and how
many function rows differ from float32. docs/sidecar.md, "An int8 sidecar on the CPU", has the table.

    .venv/bin/python examples/experiments/sidecar_int8.py --data-dir DIR [--limit 5]     # records per source, both sets
    .venv/bin/python examples/experiments/sidecar_int8.py --data-dir DIR --bench int8|bf16 --limit 20 --out bench-out/int8

`--bench` runs `oospec bench --warm-tools`'s loop (ar, toolspec, oospec on `--limit` dev records, every
wave run: `wave_payback=None`; the sidecar in a thread, in its default dtype or quantized to int8) and
writes the usual report.md and results.json to `--out`.
"""
from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import torch

from required_slots import add_data_dir

SETS = {"unseen": ("train-extra.jsonl", ["tooltalk", "nestful", "callnavi", "bfcl_multi_turn_base_first"]),
        "dev": ("dev.jsonl", ["bfcl_simple", "bfcl_multiple", "apibank_l1"])}


def load(mode: str):
    from oospec_agents import models
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    model, tok = models.load_model("smollm2", device=torch.device("cpu"), dtype=dtype,
                                   adapter=models.EMBEDDED_SIDECAR_ADAPTER)
    if mode == "int8":
        with warnings.catch_warnings():  # torch points eager quantization at torchao; it still runs
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return model, tok


def main() -> None:
    from oospec_agents.chat import normalize_messages
    from oospec_agents.formats import HermesFormat
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.sidecar.rows import parse_value
    from oospec_agents.sidecar.wave import Wave
    from oospec_agents.sidecar.runtime import wave_rows
    from oospec_agents.tools import normalize_tools
    from oospec_agents.train.data import load_many, select
    p = argparse.ArgumentParser()
    p.add_argument("--limit", type=int, default=5, help="records per source")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bench", choices=["int8", "bf16"], default=None)
    p.add_argument("--out", default="bench-out/sidecar-int8")
    add_data_dir(p)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.bench:
        return bench(a.bench, a.limit, a.out, a.data_dir)
    sets = {name: [r for r in select(load_many([str(a.data_dir / f)]), sources, a.limit) if len(r["expected"]) == 1]
            for name, (f, sources) in SETS.items()}
    names: dict = {}
    print("| mode | set | records | mean wave | function right | function rows unlike float32 |")
    print("|---|---|---:|---:|---:|---:|")
    for mode in ("fp32", "bf16", "int8"):
        model, tok = load(mode)
        wave = Wave(model, tok, prefix_cache_tokens=0)
        wave.null_starts()
        for name, recs in sets.items():
            seconds, got = [], []
            for rec in recs:
                req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), HermesFormat(),
                                  ("auto", None))
                rows, prefix, choices = wave_rows(req)
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = wave(prefix, rows, None, choices).texts
                seconds.append(time.perf_counter() - t0)
                got.append(parse_value(out[0]))
            names[mode, name] = got
            right = sum(g == r["expected"][0]["name"] for g, r in zip(got, recs))
            unlike = sum(g != f for g, f in zip(got, names["fp32", name]))
            print(f"| {mode} | {name} | {len(recs)} | {sum(seconds) / len(seconds):.3f} s | {right} | {unlike} |",
                  flush=True)
    print(json.dumps({f"{m}/{s}": v for (m, s), v in names.items()}))


def bench(mode: str, limit: int, out: str, directory: Path) -> None:
    """`oospec bench --warm-tools --wave-payback off` on `limit` dev records, the sidecar's model
    quantized to int8 in place for `mode` "int8" (its default dtype, bf16 on a CPU with AMX, otherwise)."""
    from oospec_agents.bench.records import load_records, spread
    from oospec_agents.bench.report import write_all
    from oospec_agents.bench.runner import BenchConfig, run_bench
    from oospec_agents.engine import Engine
    engine = Engine.from_pretrained("embedded", "embedded", sidecar_placement="thread", wave_payback=None)
    if mode == "int8":
        wave = engine.sidecar.wave
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wave.model = torch.ao.quantization.quantize_dynamic(wave.model.float(), {torch.nn.Linear},
                                                                dtype=torch.qint8)
    records = spread(load_records(directory / "dev.jsonl"), limit)
    config = BenchConfig(("ar", "toolspec", "oospec"), "required", 256, 10, progress=False, scenario="warm_tools")
    paths = write_all(run_bench(engine, records, config, data="dev.jsonl"), out)
    print(paths["report"].read_text())


if __name__ == "__main__":
    main()
