"""What the sidecar's prompt carries, re-checked on larger tool sets (#20). docs/sidecar.md, "The
prompt on larger tool sets", has the tables this prints.

    .venv/bin/python examples/experiments/sidecar_prompt.py lengths                 # prefix tokens per source
    OMP_NUM_THREADS=1 .venv/bin/python examples/experiments/sidecar_prompt.py ablate [ADAPTER]
        # function accuracy on the unseen-tools sources with and without each tool's description sentence

`lengths`: the sidecar's shared prefix (sidecar/rows.py `render_prefix`) per source of dev.jsonl and
train-extra.jsonl, in the embedded sidecar's tokens: its median and largest size, the share of it that
is the compact tool list and the share that is the description sentences, and how many prefixes pass
1024 tokens (train-sidecar's --max-len: longer examples are not trained on). The two largest sources
are capped at 200 records. `ablate`: the runtime's wave scored as `evaluate sidecar` scores it, on 40
records per held-out source, once as shipped and once with every description left out of the prefix.
The records: OOSPEC_DATA_DIR=DIR, the directory holding the project's record set (dev.jsonl,
train-extra.jsonl; not in a clone) or yours under those names (docs/own-model.md#records).
"""
from __future__ import annotations

import collections
import json
import statistics
import sys

from required_slots import data_dir

HELD_OUT = ("tooltalk", "nestful", "callnavi", "bfcl_multi_turn_base_first", "acebench_special")


def lengths() -> None:
    from oospec_agents import models
    from oospec_agents.chat import normalize_messages
    from oospec_agents.sidecar import rows as R
    from oospec_agents.tools import normalize_tools
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(models.resolve_reference("embedded"))
    n = lambda text: len(tok.encode(text, add_special_tokens=False))  # noqa: E731
    by = collections.defaultdict(list)
    for split in ("dev.jsonl", "train-extra.jsonl"):
        for line in open(data_dir() / split):
            r = json.loads(line)
            if len(by[r["source"]]) >= 200 and r["source"] in ("bfcl_live_irrelevance", "acebench_normal"):
                continue
            tools = normalize_tools(r["tools"])
            by[r["source"]].append((len(tools), n(R.render_prefix(normalize_messages(r["messages"]), tools)),
                                    n("\n".join(R.compact_tool(t) for t in tools)),
                                    sum(n(": " + R.summarize(t.description)) for t in tools if R.summarize(t.description))))
    print("| source | records | tools (median, max) | prefix tokens (median, max) | tool list | descriptions | > 1024 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s, v in sorted(by.items()):
        total = sum(x[1] for x in v)
        print(f"| {s} | {len(v)} | {statistics.median(x[0] for x in v):.0f}, {max(x[0] for x in v)} | "
              f"{statistics.median(x[1] for x in v):.0f}, {max(x[1] for x in v)} | {sum(x[2] for x in v) / total:.0%} | "
              f"{sum(x[3] for x in v) / total:.0%} | {sum(x[1] > 1024 for x in v)} |")


def ablate(adapter=None) -> None:
    import torch
    from oospec_agents import models
    from oospec_agents.sidecar import rows as R
    from oospec_agents.train.data import load_many
    from oospec_agents.train.evaluate import source_table
    from oospec_agents.train.sidecar_train import evaluate_sidecar
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    model, tok = models.load_model("smollm2", device=cpu, dtype=torch.float32,
                                   adapter=adapter or models.EMBEDDED_SIDECAR_ADAPTER)
    recs = load_many([data_dir() / "train-extra.jsonl"], sources=HELD_OUT)
    shipped = R.summarize
    for name, summarize in (("as shipped", shipped), ("no descriptions", lambda description: "")):
        R.summarize = summarize
        res = evaluate_sidecar(model, tok, recs, limit_per_source=40, progress=False)
        print(f"\n{name}: " + json.dumps(res["overall"]) + "\n" + source_table(res))
    R.summarize = shipped


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "lengths"
    data_dir()  # OOSPEC_DATA_DIR unset: say so before loading a model
    lengths() if what == "lengths" else ablate(*sys.argv[2:3])
