"""How sure the sidecar's function row is when it declines (#20): per record, the logit of ' null' minus
that of the best name's first token (' "' for every JSON name in SmolLM2's tokens), at the function
row's first step, as the runtime's wave computes it. docs/training.md ("Declining") has the table.

    OMP_NUM_THREADS=1 .venv/bin/python examples/experiments/decline_margin.py ADAPTER_DIR --data-dir DIR [--limit 40]

Call records (dev BFCL simple / multiple, API-Bank, and the held-out unseen sources) should not decline;
"no call" records (acebench_special, held out) should. It prints, for a range of margins m, the share
of each that declines when the wave declines only where logit(null) - logit(best name) > m, and the
AUC of the margin (no call against calls: 0.5 is chance).
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from required_slots import add_data_dir

CALLS_DEV = ("bfcl_simple", "bfcl_multiple", "apibank_l1")
CALLS_UNSEEN = ("tooltalk", "nestful", "callnavi", "bfcl_multi_turn_base_first")
NO_CALL = ("acebench_special",)


def margins(model, tok, records) -> list[float]:
    from oospec_agents.chat import normalize_messages
    from oospec_agents.formats import HermesFormat
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.sidecar.runtime import wave_rows
    from oospec_agents.tools import normalize_tools
    out = []
    for rec in records:
        req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), HermesFormat(),
                          ("auto", None))
        rows, prefix, choices = wave_rows(req)
        ids = tok.encode(prefix + rows[0].suffix, add_special_tokens=False)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
        firsts = {tok.encode(c, add_special_tokens=False)[0] for c in choices[0]}
        null = tok.encode(" null", add_special_tokens=False)[0]
        out.append(float(logits[null] - max(logits[t] for t in firsts - {null})))
    return out


def auc(positive: list[float], negative: list[float]) -> float:
    """The chance that a random positive scores above a random negative (ties count half)."""
    return sum((p > n) + 0.5 * (p == n) for p in positive for n in negative) / (len(positive) * len(negative))


def main() -> None:
    from oospec_agents import models
    from oospec_agents.train.data import load_many, select
    p = argparse.ArgumentParser()
    p.add_argument("adapter", nargs="?", default=None)
    p.add_argument("--limit", type=int, default=40)
    add_data_dir(p)
    a = p.parse_args()
    torch.set_num_threads(1)
    model, tok = models.load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32,
                                   adapter=a.adapter or models.EMBEDDED_SIDECAR_ADAPTER)
    model.eval()
    dev = load_many([a.data_dir / "dev.jsonl"])
    extra = load_many([a.data_dir / "train-extra.jsonl"])
    groups = {"dev calls": select([r for r in dev if len(r["expected"]) == 1], CALLS_DEV, a.limit),
              "unseen calls": select([r for r in extra if len(r["expected"]) == 1], CALLS_UNSEEN, a.limit),
              "unseen no call": select(extra, NO_CALL, a.limit)}
    got = {k: margins(model, tok, v) for k, v in groups.items()}
    print(json.dumps({k: {"n": len(v), "median": round(statistics.median(v), 2)} for k, v in got.items()}))
    for calls in ("dev calls", "unseen calls"):  # 0.5: the margin tells "no call" apart no better than chance
        print(f"AUC, unseen no call against {calls}: {auc(got['unseen no call'], got[calls]):.3f}")
    print("| margin m | " + " | ".join(f"{k} declined (n={len(v)})" for k, v in got.items()) + " |")
    print("|---:|" + "---:|" * len(got))
    for m in (-2, -1, 0, 1, 2, 3, 4, 5, 6, 8):
        print(f"| {m} | " + " | ".join(f"{sum(x > m for x in v) / len(v):.1%}" for v in got.values()) + " |")


if __name__ == "__main__":
    main()
