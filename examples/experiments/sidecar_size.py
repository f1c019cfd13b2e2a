"""Wave time of two sidecar bases side by side (#56 item 5, docs/sidecar-accuracy.md "A larger sidecar"):
the embedded SmolLM2-135M sidecar (its shipped adapter) against Gemma-3-270M with an adapter trained on it
(`oospec train-sidecar --base gemma3`).

    taskset -c 0 .venv/bin/python examples/experiments/sidecar_size.py --data my-records.jsonl \
        --sources bfcl_simple,bfcl_multiple,apibank_l1 --n 24 --gemma3-adapter DIR

Each record's wave runs on both sidecars in turn (the order alternating by record), from an empty prefix
cache (a cold prompt: what a new conversation costs) and again warm (its prefix cached: an agent loop's
next turn), one thread each; the medians are reported with the prefill and decode split.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, nargs="+")
    ap.add_argument("--sources", default=None)
    ap.add_argument("--n", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: the engine's on this CPU)")
    ap.add_argument("--smollm2-adapter", default=None)
    ap.add_argument("--gemma3-adapter", required=True, help="a sidecar adapter trained on Gemma-3-270M")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from oospec_agents import models
    from oospec_agents.sidecar.runtime import WorkerSpec, load_wave, wave_rows
    from wave_records import pick, request, save

    recs = pick(a.data, a.sources, a.n)
    dtype = getattr(torch, a.dtype) if a.dtype else models.resolve_dtype(None, torch.device("cpu"))
    adapters = {"embedded": a.smollm2_adapter or str(models.EMBEDDED_SIDECAR_ADAPTER),
                "gemma3": a.gemma3_adapter}
    waves = {ref: load_wave(WorkerSpec(ref, "cpu", dtype, adapter, 32)) for ref, adapter in adapters.items()}
    times: dict = {(ref, c): [] for ref in waves for c in ("cold", "warm")}
    split: dict = {ref: [] for ref in waves}
    for i, r in enumerate(recs):
        req = request(r)
        for ref in list(waves)[::1 if i % 2 == 0 else -1]:
            wave = waves[ref]
            rows, prefix, choices = wave_rows(req, options=wave.row_options)
            wave.prefix_cache.clear()
            for cache in ("cold", "warm"):
                t0 = time.perf_counter()
                profile = wave(prefix, rows, None, choices).profile
                times[(ref, cache)].append(time.perf_counter() - t0)
                if cache == "cold":
                    split[ref].append((profile["prefix_tokens"], profile["prefill_s"], profile["decode_s"]))
    med = statistics.median
    print(f"{len(recs)} records, {dtype}, {a.threads} thread(s), medians\n")
    print("| sidecar | cold wave | warm wave | cold prefill | cold decode | prefix tokens |")
    print("|---|---|---|---|---|---|")
    result = {"n": len(recs), "dtype": str(dtype), "threads": a.threads, "adapters": adapters}
    for ref in waves:
        p = split[ref]
        row = {"cold_s": med(times[(ref, "cold")]), "warm_s": med(times[(ref, "warm")]),
               "prefill_s": med(x[1] for x in p), "decode_s": med(x[2] for x in p), "prefix_tokens": med(x[0] for x in p)}
        result[ref] = row
        print(f"| {ref} | {row['cold_s']:.2f} s | {row['warm_s']:.2f} s | {row['prefill_s']:.2f} s | "
              f"{row['decode_s']:.2f} s | {row['prefix_tokens']:.0f} |")
    save(a.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
