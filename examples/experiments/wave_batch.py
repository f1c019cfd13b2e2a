"""What a batched wave saves (#58 item 3, docs/sidecar.md "Batched waves"): the waves of N requests run
one after another against the same N run as one (`Wave.many`), on the embedded sidecar as it is served.

    taskset -c 0 .venv/bin/python examples/experiments/wave_batch.py --data my-records.jsonl --n 8

Each repetition runs both variants in turn (the order rotating), each from an empty prefix cache (cold
prompts, as concurrent agents' first turns) and again with the prefixes cached (warm: an agent loop's
next turn), and reports the minimum over repetitions: seconds, sidecar forwards, and whether every
request's texts are the same both ways.
"""
from __future__ import annotations

import argparse
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, nargs="+")
    ap.add_argument("--sources", default=None, help="comma-separated sources to draw from")
    ap.add_argument("--n", type=int, default=8, help="requests at once")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: the engine's on this CPU)")
    ap.add_argument("--out", default=None, help="write the JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from oospec_agents import models
    from oospec_agents.sidecar.runtime import WorkerSpec, load_wave, wave_rows
    from wave_records import pick, request, save

    recs = pick(a.data, a.sources, a.n)
    cpu = torch.device("cpu")
    dtype = getattr(torch, a.dtype) if a.dtype else models.resolve_dtype(None, cpu)
    wave = load_wave(WorkerSpec("embedded", "cpu", dtype, str(models.EMBEDDED_SIDECAR_ADAPTER), 32))
    waves = []
    for r in recs:
        req = request(r)
        rows, prefix, choices = wave_rows(req, options=wave.row_options)
        waves.append((prefix, rows, None, choices))
    calls = []
    forward = wave.model.forward
    wave.model.forward = lambda *args, **kw: (calls.append(1), forward(*args, **kw))[1]

    def alone():
        return [wave(*w).texts for w in waves]

    def together():
        return [result.texts for result in wave.many(waves)]
    best: dict = {}
    texts: dict = {}
    for rep in range(a.reps):
        for variant in (("alone", alone), ("together", together))[::1 if rep % 2 == 0 else -1]:
            name, run = variant
            for cache in ("cold", "warm"):
                if cache == "cold":
                    wave.prefix_cache.clear()
                calls.clear()
                t0 = time.perf_counter()
                out = run()
                s = time.perf_counter() - t0
                key = (name, cache)
                best[key] = min(best.get(key, (s, len(calls))), (s, len(calls)))
                texts[key] = out
    rows = sum(len(w[1]) for w in waves)
    print(f"{len(waves)} requests, {rows} rows, {dtype}, {a.threads} thread(s), min of {a.reps}\n")
    print("| prompts | one after another | together | x | sidecar forwards | same texts |")
    print("|---|---|---|---|---|---|")
    result = {"n": len(waves), "rows": rows, "dtype": str(dtype), "threads": a.threads, "reps": a.reps}
    for cache in ("cold", "warm"):
        (sa, fa), (st, ft) = best[("alone", cache)], best[("together", cache)]
        same = sum(x == y for x, y in zip(texts[("alone", cache)], texts[("together", cache)]))
        print(f"| {cache} | {sa:.2f} s | {st:.2f} s | {sa / st:.2f}x | {fa} -> {ft} | {same} of {len(waves)} |")
        result[cache] = {"alone_s": sa, "together_s": st, "forwards_alone": fa, "forwards_together": ft,
                         "same_texts": same}
    save(a.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
