"""What the verify tree's node budget (`Engine(max_draft_nodes=...)`, 48 by default) buys on this device.

Per record, the shipped wave writes its hint once (rendered in the target's format, as the runtime
joins it); then `toolspec` and `oospec` (that hint from the first round: `engine.generate(hint=...)`)
decode the record once per budget, all budgets back to back on the same record, so that a drift of
the machine's speed over the run touches every budget alike. It prints, per method and budget, the
target forwards, the draft nodes a round verifies, the decode seconds and the ms a round costs, and
checks that every reply is token-identical to `toolspec`'s at the first budget given (lossless).
docs/bench.md ("The tree budget on a CPU") has the run.

    OMP_NUM_THREADS=2 .venv/bin/python examples/experiments/tree_budget.py --data-dir DIR --set unseen --limit 20 --budgets 48,32,24,16,12,8

Sets as in examples/experiments/required_slots.py. Wall clock: run it on an idle machine, never beside tests.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from required_slots import set_parser, set_records, wave_hint


def main() -> None:
    from tqdm.auto import tqdm
    from oospec_agents import Engine, models
    from oospec_agents.chat import normalize_messages
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.sidecar.wave import Wave
    from oospec_agents.tools import normalize_tools
    p = set_parser(20)
    p.add_argument("--budgets", default="48,32,24,16,12,8", help="max_draft_nodes values, comma-separated")
    a = p.parse_args()
    budgets = [int(b) for b in a.budgets.split(",")]
    recs = set_records(a.set, a.limit, a.data_dir)
    torch.set_num_threads(2)
    engine = Engine.from_pretrained("embedded", sidecar=False, target_device="cpu", dtype=torch.float32,
                                    prefix_cache_tokens=0)  # every decode prefills alike; decode_s excludes it
    model, tok = models.load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32,
                                   adapter=models.EMBEDDED_SIDECAR_ADAPTER)
    wave = Wave(model, tok)
    kw = dict(tool_choice="required", max_new_tokens=a.max_new_tokens)
    engine.generate(recs[0]["messages"], recs[0]["tools"], method="toolspec", **kw)  # warm-up, not counted
    sums: dict = defaultdict(lambda: defaultdict(float))
    for rec in tqdm(recs, desc="tree-budget"):
        req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), engine.fmt,
                          ("required", None))
        hint = wave_hint(wave, req, engine.fmt)
        reference = None
        for budget in budgets:
            engine.max_draft_nodes = budget
            for method in ("toolspec", "oospec"):
                engine.clear_call_memory()  # each reply drafts from its own request only, as in the bench
                gen = engine.generate(rec["messages"], rec["tools"], method=method,
                                      hint=hint if method == "oospec" else None, **kw)
                reference = gen.token_ids if reference is None else reference
                if gen.token_ids != reference:
                    raise SystemExit(f"{rec['id']}: {method} at {budget} nodes differs: not lossless")
                s = sums[method, budget]
                s["forwards"] += gen.stats.target_forwards
                s["rounds"] += len(gen.stats.rounds)
                s["nodes"] += sum(n - 1 for n, _, _ in gen.stats.rounds)  # draft nodes (the root is no draft)
                s["decode_s"] += gen.stats.decode_s
    print(f"{len(recs)} records of {a.set}; every reply equal to toolspec's at {budgets[0]} nodes\n")
    print("| method | budget | target forwards | draft nodes a round | decode s | ms a round |\n|---|---:|---:|---:|---:|---:|")
    for (method, budget), s in sorted(sums.items(), key=lambda kv: (kv[0][0] != "toolspec", -kv[0][1])):
        print(f"| {method} | {budget} | {s['forwards']:.0f} | {s['nodes'] / s['rounds']:.1f} | "
              f"{s['decode_s']:.1f} | {1000 * s['decode_s'] / s['rounds']:.0f} |")


if __name__ == "__main__":
    main()
