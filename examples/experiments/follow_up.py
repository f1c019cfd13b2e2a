"""What follow-up waves do to the target's forwards (#20): per record, `toolspec`, then `oospec` with the
embedded sidecar's hint in time (its waves finish before the target's next round, as on a device of
their own) with follow-up waves off and on (`Engine(hint_follow_up=...)`, sidecar/session.py). It
prints, per source, the target forwards, the hint tokens accepted and the follow-up waves asked,
and checks that every reply is token-identical to `toolspec`'s (lossless). docs/sidecar.md
("Follow-up waves") has the tables.

    OMP_NUM_THREADS=2 .venv/bin/python examples/experiments/follow_up.py --data-dir DIR --set unseen [--limit 40]

Sets: as examples/experiments/required_slots.py (`unseen`: the held-out sources of docs/training.md, `dev`:
dev.jsonl), with calls only. Counts only: no wall clock, so it may run beside other work.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from required_slots import print_sums, set_parser, set_records  # noqa: E402


def main() -> None:
    from tqdm.auto import tqdm
    from oospec_agents import Engine
    from oospec_agents.models import resolve_dtype
    from oospec_agents.sidecar.load import load_sidecar
    from oospec_testing import InTime
    a = set_parser(40).parse_args()
    recs = set_records(a.set, a.limit, a.data_dir)
    cpu = torch.device("cpu")
    target = Engine.from_pretrained("embedded", sidecar=False, target_device="cpu", dtype=torch.float32)
    side = InTime(load_sidecar("embedded", device=cpu, dtype=resolve_dtype(None, cpu), sidecar_placement="thread"))
    # the prompt's KV depends on the target alone: the engines share the target's prefix cache
    engines = {on: Engine(target.target, target.tokenizer, side, hint_follow_up=on).with_parts(
        prefix_cache=target.prefix_cache) for on in (False, True)}
    sums: dict = defaultdict(lambda: defaultdict(int))
    kw = dict(tool_choice="required", max_new_tokens=a.max_new_tokens)
    for rec in tqdm(recs, desc="follow-up"):
        target.clear_call_memory()  # each reply drafts from its own request only, as in the bench
        base = target.generate(rec["messages"], rec["tools"], method="toolspec", **kw)
        s = sums[rec["source"]]
        s["n"] += 1
        s["tokens"] += len(base.token_ids)
        s["toolspec_forwards"] += base.stats["target_forwards"]
        for on, engine in engines.items():
            engine.clear_call_memory()
            gen = engine.generate(rec["messages"], rec["tools"], method="oospec", **kw)
            if gen.token_ids != base.token_ids:
                raise SystemExit(f"{rec['id']}: oospec (follow-ups {on}) differs from toolspec: not lossless")
            name = "on" if on else "off"
            s[f"{name}_forwards"] += gen.stats["target_forwards"]
            s[f"{name}_hint"] += gen.stats["accepted_by_source"]["hint"]
            s[f"{name}_nodes"] += gen.stats["draft_tokens"]
            s["follow_ups"] += gen.stats["hint_follow_ups"]
    print_sums(sums, ("n", "tokens", "toolspec_forwards", "off_forwards", "on_forwards", "off_hint", "on_hint",
                      "off_nodes", "on_nodes", "follow_ups"))

if __name__ == "__main__":
    main()
