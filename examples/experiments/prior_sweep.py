"""How much the lexical prior should weigh in the sidecar's function row (#20): per record, the
runtime's wave writes the function row once per weight (`Wave(prior_weight=w)`; the prefix is
prefilled once and cached), and the script prints function-index accuracy per source and weight.
docs/sidecar.md ("A lexical prior over the tools") has the tables.

    OMP_NUM_THREADS=2 .venv/bin/python examples/experiments/prior_sweep.py --data-dir DIR --set tune [--limit 40] [--adapter DIR]
        [--query all|last|last-twice]

Sets: `tune` (train-extra sources that no committed adapter was trained on and no report judges:
acebench_normal, hammerbench_single, hammerbench_multi, bfcl_exec_multiple, apibank_l2, and
hammerbench_irrelevant for declines) chooses the weight; `unseen` (the held-out sources of
docs/training.md) and `dev` (dev.jsonl) only report it. Records with one call, or none ("no call").
`--query` chooses the user turns the prior reads: `all` (the runtime's `rank.query_text`), the `last`
alone, or the `last-twice` beside all of them (docs/sidecar.md, "Which user turns it reads").
"""
from __future__ import annotations


import torch

from required_slots import scoring_parser

SETS = {
    "tune": ("train-extra.jsonl", ("acebench_normal", "hammerbench_single", "hammerbench_multi",
                                   "bfcl_exec_multiple", "apibank_l2", "hammerbench_irrelevant")),
    "unseen": ("train-extra.jsonl", ("tooltalk", "nestful", "callnavi", "bfcl_multi_turn_base_first",
                                     "acebench_special")),
    "dev": ("dev.jsonl", ("bfcl_simple", "bfcl_multiple", "apibank_l1")),
}
WEIGHTS = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 100.0)


def _users(messages: list[dict]) -> list[str]:
    return [m.get("content") or "" for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]


def _query(kind: str):
    """The query text of `--query kind`: the runtime's own for `all`."""
    from oospec_agents.sidecar import rank
    if kind == "all":
        return rank.query_text
    last = lambda ms: (_users(ms) or [""])[-1:]  # noqa: E731
    texts = last if kind == "last" else (lambda ms: _users(ms) + last(ms))
    return lambda ms: rank.words(" ".join(texts(ms)))[-rank.MAX_QUERY_CHARS:]


def main() -> None:
    p = scoring_parser(SETS)
    p.add_argument("--weights", type=float, nargs="+", default=WEIGHTS)
    p.add_argument("--query", choices=("all", "last", "last-twice"), default="all",
                   help="the user turns the prior reads (default: all, as the runtime)")
    a = p.parse_args()
    # the package's modules after the flags: --help answers without loading torch
    from oospec_agents import models
    from tqdm.auto import tqdm
    from oospec_agents.chat import normalize_messages
    from oospec_agents.data import load_records
    from oospec_agents.formats import HermesFormat
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.sidecar.rows import parse_value
    from oospec_agents.sidecar.wave import Wave
    from oospec_agents.sidecar.runtime import wave_rows
    from oospec_agents.tools import normalize_tools
    from oospec_agents.train.data import select
    from oospec_agents.train.sidecar_train import _no_call
    from oospec_agents.sidecar import rank
    rank.query_text = _query(a.query)  # tool_prior reads the module's name at each call
    file, sources = SETS[a.set]
    # the records evaluate_sidecar scores: one call, or "no call"
    recs = select([r for r in load_records(a.data_dir / file) if len(r["expected"]) == 1 or _no_call(r)],
                  list(sources), a.limit)
    model, tok = models.load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32,
                                   adapter=a.adapter or models.EMBEDDED_SIDECAR_ADAPTER)
    wave = Wave(model, tok)
    hits: dict = {}
    for rec in tqdm(recs, desc="prior-sweep"):
        req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), HermesFormat(),
                          ("auto", None))
        rows, prefix, choices = wave_rows(req)
        gold = rec["expected"][0]["name"] if rec["expected"] else None
        for w in a.weights:
            wave.prior_weight = w
            name = parse_value(wave(prefix, rows[:1], None, choices).texts[0])
            h = hits.setdefault(rec["source"], {}).setdefault(w, [0, 0])
            h[0] += name == gold
            h[1] += 1
    print("source".ljust(29) + "".join(f"{w:>8g}" for w in a.weights))
    calls = {w: [0, 0] for w in a.weights}
    for src, row in sorted(hits.items()):
        print(src.ljust(29) + "".join(f"{row[w][0] / row[w][1]:8.1%}" for w in a.weights))
        if not any(r["source"] == src and not r["expected"] for r in recs):
            for w in a.weights:
                calls[w][0] += row[w][0]
                calls[w][1] += row[w][1]
    print("calls, all sources".ljust(29) + "".join(f"{calls[w][0] / max(1, calls[w][1]):8.1%}" for w in a.weights))


if __name__ == "__main__":
    main()
