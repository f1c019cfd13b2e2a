"""What keeping a required parameter's row off `null` does to the hint (#20): per record, the runtime's
wave writes its rows twice, as shipped (a required parameter's row never answers null) and without
that rule; each joined call, rendered in the target's format, is then verified by the embedded target
as the hint of an `oospec` request (`engine.generate(hint=...)`: the hint is there from the first
round, so the counts do not depend on timing). It prints, per source, the target forwards and the
hint tokens the target accepted, beside `toolspec`'s forwards, and checks that every reply is
token-identical to `toolspec`'s (lossless). docs/sidecar.md ("Required parameters") has the tables.

    OMP_NUM_THREADS=2 .venv/bin/python examples/experiments/required_slots.py --data-dir DIR --set unseen [--limit 40]

Sets: the records `oospec bench` takes for `--limit N` (round-robin over sources, with calls only):
`unseen` = the held-out sources of docs/training.md in train-extra.jsonl, `dev` = dev.jsonl.
Counts only: no wall clock, so it may run beside other work.
"""
from __future__ import annotations

import argparse
import os
from collections import defaultdict
from pathlib import Path

import torch

#: the record files the sets name live in one directory: the project's record set (dev.jsonl,
#: train-extra.jsonl; not in a clone) or yours under those names, in the format of docs/own-model.md#records
DATA_DIR_ENV = "OOSPEC_DATA_DIR"
DATA_DIR_HELP = ("the directory holding the record files by the project's names (dev.jsonl, train-extra.jsonl, "
                 "train.jsonl: the project's record set, which a clone does not hold; or yours under those names, "
                 "in the format of docs/own-model.md#records); default: $OOSPEC_DATA_DIR")


def add_data_dir(p: argparse.ArgumentParser) -> None:
    """`--data-dir DIR`, required unless OOSPEC_DATA_DIR names it: no default path into a sibling checkout."""
    env = os.environ.get(DATA_DIR_ENV)
    p.add_argument("--data-dir", type=Path, default=env, required=not env, metavar="DIR", help=DATA_DIR_HELP)


def scoring_parser(sets) -> argparse.ArgumentParser:
    """The flags the name-scoring experiments share: which set (`--set`), where its records are
    (`--data-dir`), records per source (`--limit`), the sidecar adapter (`--adapter`)."""
    p = argparse.ArgumentParser()
    p.add_argument("--set", choices=sets, required=True)
    add_data_dir(p)
    p.add_argument("--limit", type=int, default=40, help="records per source")
    p.add_argument("--adapter", default=None)
    return p


def data_dir() -> Path:
    """For the scripts without flags: OOSPEC_DATA_DIR, or an error naming it."""
    env = os.environ.get(DATA_DIR_ENV)
    if not env:
        raise SystemExit(f"set {DATA_DIR_ENV}=DIR: {DATA_DIR_HELP.split('; default')[0]}")
    return Path(env)
SETS = {"unseen": ("train-extra.jsonl", ("tooltalk", "nestful", "callnavi", "bfcl_multi_turn_base_first")),
        "dev": ("dev.jsonl", None)}


def main() -> None:
    from tqdm.auto import tqdm
    from oospec_agents import Engine, models
    from oospec_agents.chat import normalize_messages
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.sidecar.wave import Wave
    from oospec_agents.tools import normalize_tools
    a = set_parser(40).parse_args()
    recs = set_records(a.set, a.limit, a.data_dir)
    engine = Engine.from_pretrained("embedded", sidecar=False, target_device="cpu", dtype=torch.float32)
    model, tok = models.load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32,
                                   adapter=models.EMBEDDED_SIDECAR_ADAPTER)
    shipped = Wave(model, tok)
    without = Wave(model, tok, prefix_cache_tokens=0)
    without.null_starts = lambda: torch.empty(0, dtype=torch.long)  # the rule off: no token kept off
    sums: dict = defaultdict(lambda: defaultdict(int))
    for rec in tqdm(recs, desc="required-slots"):
        req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), engine.fmt,
                          ("required", None))
        kw = dict(tool_choice="required", max_new_tokens=a.max_new_tokens)
        engine.clear_call_memory()  # each reply drafts from its own request only, as in the bench
        base = engine.generate(rec["messages"], rec["tools"], method="toolspec", **kw)
        s = sums[rec["source"]]
        s["n"] += 1
        s["toolspec_forwards"] += base.stats["target_forwards"]
        s["tokens"] += len(base.token_ids)
        for name, wave in (("shipped", shipped), ("without", without)):
            hint = wave_hint(wave, req, engine.fmt)
            engine.clear_call_memory()
            gen = engine.generate(rec["messages"], rec["tools"], method="oospec", hint=hint, **kw)
            if gen.token_ids != base.token_ids:
                raise SystemExit(f"{rec['id']}: oospec ({name}) differs from toolspec: not lossless")
            s[f"{name}_forwards"] += gen.stats["target_forwards"]
            s[f"{name}_hint"] += gen.stats["accepted_by_source"]["hint"]
    print_sums(sums, ("n", "tokens", "toolspec_forwards", "without_forwards", "shipped_forwards", "without_hint",
                      "shipped_hint"))

def set_parser(limit: int) -> argparse.ArgumentParser:
    """The counting scripts' common options: --set, --data-dir, --limit (default `limit`) and --max-new-tokens."""
    p = argparse.ArgumentParser()
    p.add_argument("--set", choices=SETS, required=True)
    add_data_dir(p)
    p.add_argument("--limit", type=int, default=limit, help="records, spread over the sources as the bench does")
    p.add_argument("--max-new-tokens", type=int, default=256)
    return p


def set_records(name: str, limit: int, directory: Path) -> list[dict]:
    """The records with calls that `oospec bench --limit` takes from set `name` (round-robin over sources)."""
    from oospec_agents.bench.records import load_records, spread
    file, sources = SETS[name]
    recs = [r for r in load_records(directory / file) if r["expected"] and (sources is None or r["source"] in sources)]
    return spread(recs, limit)


def print_sums(sums: dict, cols: tuple[str, ...]) -> None:
    """A markdown table: one row per source of `sums` (source -> column -> count), then their total."""
    print("| source | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    total: dict = defaultdict(int)
    for src, s in sorted(sums.items()):
        print(f"| {src} | " + " | ".join(str(s[c]) for c in cols) + " |")
        for c in cols:
            total[c] += s[c]
    print("| **all** | " + " | ".join(str(total[c]) for c in cols) + " |")


def wave_hint(wave, req, fmt) -> str | None:
    """The call `wave` writes for `req`, joined and rendered in the target's format as the runtime does;
    None when its rows join to no usable call (then `oospec` drafts as `toolspec`)."""
    from oospec_agents.sidecar.join import JoinError, join
    from oospec_agents.sidecar.runtime import wave_rows
    rows, prefix, choices = wave_rows(req)
    try:
        call = join(rows, wave(prefix, rows, None, choices).texts, req.tools, req.tool_choice)
    except JoinError:
        return None
    return fmt.render_call(call["name"], call["arguments"])


if __name__ == "__main__":
    main()
