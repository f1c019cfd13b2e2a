"""#56 item 6, one idea measured on its own: a copy-from-prompt prior for string slots. While a slot row
writes a JSON string, every token of the conversation's user turns gains `--weight` logits (the values a
call needs are often words the user wrote: a city, a name, a title). The experiment's wave (`CopyWave`,
a `Wave` whose `_constrain_row` adds the bias before the row's constraints) stands in for the runtime's
while `evaluate_sidecar` runs; the package keeps no hook for it (measured, not shipped:
docs/sidecar-accuracy.md).

    .venv/bin/python examples/experiments/copy_prior.py --weight 0,1,2 --dev my-records.jsonl \
        --sources bfcl_simple,bfcl_multiple,apibank_l1 --limit 40

Scored as `python -m oospec_agents.train.evaluate sidecar` scores (the shipped adapter, gold labels,
strict), once per weight (0: the wave as served).
"""
from __future__ import annotations

import argparse
import json

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", required=True, nargs="+")
    ap.add_argument("--sources", default=None)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--weight", default="0,1,2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from oospec_agents import models
    from oospec_agents.sidecar import runtime
    from oospec_agents.sidecar import wave as wave_module
    from oospec_agents.sidecar.rows import RowOptions
    from oospec_agents.train.data import load_many
    from oospec_agents.train.sidecar_eval import evaluate_sidecar

    cpu = torch.device("cpu")
    adapter = models.EMBEDDED_SIDECAR_ADAPTER
    model, tok = models.load_model("embedded", device=cpu, dtype=models.resolve_dtype(None, cpu), adapter=adapter)
    user_ids: dict[int, torch.Tensor] = {}  # id(rows) -> the user turns' token ids
    plain_rows = runtime.wave_rows

    def wave_rows(request, **kw):
        rows, prefix, choices = plain_rows(request, **kw)
        text = " ".join(m["content"] for m in request.messages if m["role"] == "user" and isinstance(m["content"], str))
        ids = set(tok.encode(text, add_special_tokens=False)) | set(tok.encode(" " + text, add_special_tokens=False))
        user_ids[id(rows)] = torch.tensor(sorted(ids), dtype=torch.long)
        return rows, prefix, choices
    runtime.wave_rows = wave_rows
    results = {}
    recs = load_many(a.dev)
    sources = a.sources.split(",") if a.sources else None
    plain_wave = wave_module.Wave
    for w in (float(x) for x in a.weight.split(",")):

        class CopyWave(plain_wave):
            """The wave, with `w` logits on every user-turn token while a slot row writes a string."""

            def _constrain_row(self, job, row, logits, w=w):
                ids, so_far = user_ids.get(id(job.rows)), job.out[row]
                if w and ids is not None and job.rows[row].kind == "slot" \
                        and tok.decode(so_far).lstrip().startswith('"'):
                    logits[ids] += w
                super()._constrain_row(job, row, logits)
        wave_module.Wave = CopyWave
        try:
            res = evaluate_sidecar(model, tok, recs, sources=sources, limit_per_source=a.limit,
                                   row_options=RowOptions.for_adapter(adapter), progress=False)
        finally:
            wave_module.Wave = plain_wave
        o = res["overall"]
        results[w] = {"overall": o, "by_source": {s: v["call_exact"] for s, v in res["by_source"].items()}}
        print(f"weight {w:g}: function {o['function_index_acc']:.1%}, slots {o['arg_exact_match']:.1%}, "
              f"whole call {o['call_exact']:.1%}; per source "
              + ", ".join(f"{s} {v['call_exact']:.0%}" for s, v in res["by_source"].items()), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
