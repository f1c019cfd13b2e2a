"""How the sidecar's function row should choose a tool name (#20): greedily, token by token (the
runtime's wave), or by each offered name's whole probability.

A constrained greedy row picks the best *first token* among the names, and a first token that many
names share (`"Get`, `"Trip`) collects the probability of all of them: it can beat a name that is more
likely as a whole. This script feeds the function row's prefix once, then every offered name (and
`null`) as one token tree in a single forward (each name's tokens see the prefix and their own
ancestors), and scores per record, from the same logits:

    greedy   the runtime's rule: walk the tree, at each step the child token with the best logit plus
             the best prior of the names it continues (`wave._constrain`)
    sum      argmax over names of  sum of log p(token) over the name's tokens + weight x prior
    mean     the same with the log-probability averaged over the name's tokens

and prints function-index accuracy per source, method and prior weight.

    OMP_NUM_THREADS=2 .venv/bin/python examples/experiments/name_scoring.py --data-dir DIR --set tune [--limit 40] [--weights 0 6]

Sets as in `prior_sweep.py`: `tune` chooses, `unseen` and `dev` only report.
"""
from __future__ import annotations


import torch

from prior_sweep import SETS
from required_slots import scoring_parser


def score_record(model, tok, prefix: str, suffix: str, choices: dict[str, float]):
    """Prefill prefix + suffix but its last token, then feed that token with every choice's tokens below
    it as one draft tree (`verify.build_tree`, verified as the target's trees are). Returns (names, their
    token ids, the tree, the log-probabilities after each of its nodes: the root's score a name's first
    token)."""
    from transformers import DynamicCache

    from oospec_agents.drafters.base import Draft
    from oospec_agents.verify import Verifier, build_tree
    names = list(choices)
    cands = [tok.encode(n, add_special_tokens=False) for n in names]
    # the wave encodes the suffix and each choice apart; the same here
    ids = tok.encode(prefix, add_special_tokens=False) + tok.encode(suffix, add_special_tokens=False)
    tree = build_tree(ids[-1], [Draft(c, "name") for c in cands], max_nodes=1 + sum(map(len, cands)))
    verifier, cache = Verifier(model), DynamicCache(config=model.config)
    verifier.forward(ids[:-1], cache, 0, last_only=True)
    logits = verifier.forward(tree.tokens, cache, len(ids) - 1, tree)
    return names, cands, tree, torch.log_softmax(logits.float(), -1)


def choose(method: str, names, cands, tree, logp, prior: list[float], w: float) -> str:
    """The name `method` picks (see the module's docstring), each name's prior weighed by `w`."""
    if method == "greedy":  # wave._constrain's walk: the best token plus the best prior it continues
        node, left = 0, list(range(len(names)))
        while len(left) > 1:
            k = tree.depths[node]
            best: dict[int, float] = {}
            for j in left:
                if len(cands[j]) > k:
                    best[cands[j][k]] = max(best.get(cands[j][k], w * prior[j]), w * prior[j])
            t = max(best, key=lambda t: float(logp[node, t]) + best[t])
            left = [j for j in left if len(cands[j]) > k and cands[j][k] == t]
            node = tree.children[node][t]
        return names[left[0]]
    scores = []
    for j, c in enumerate(cands):
        node, s = 0, 0.0
        for t in c:
            s += float(logp[node, t])
            node = tree.children[node][t]
        scores.append((s / len(c) if method == "mean" else s) + w * prior[j])
    return names[max(range(len(names)), key=scores.__getitem__)]


def main() -> None:
    from tqdm.auto import tqdm

    from oospec_agents import models
    from oospec_agents.chat import normalize_messages
    from oospec_agents.data import load_records
    from oospec_agents.formats import HermesFormat
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.sidecar.rows import parse_value
    from oospec_agents.sidecar.runtime import wave_rows
    from oospec_agents.tools import normalize_tools
    from oospec_agents.train.data import select
    from oospec_agents.train.sidecar_train import _no_call
    p = scoring_parser(SETS)
    p.add_argument("--weights", type=float, nargs="+", default=(0.0, 2.0, 4.0, 6.0, 8.0))
    a = p.parse_args()
    file, sources = SETS[a.set]
    recs = select([r for r in load_records(a.data_dir / file) if len(r["expected"]) == 1 or _no_call(r)],
                  list(sources), a.limit)
    model, tok = models.load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32,
                                   adapter=a.adapter or models.EMBEDDED_SIDECAR_ADAPTER)
    methods = ("greedy", "sum", "mean")
    hits: dict = {}
    for rec in tqdm(recs, desc="name-scoring"):
        req = HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), HermesFormat(),
                          ("auto", None))
        rows, prefix, choices = wave_rows(req)
        got = score_record(model, tok, prefix, rows[0].suffix, choices[0])
        prior = list(choices[0].values())
        gold = rec["expected"][0]["name"] if rec["expected"] else None
        for m in methods:
            for w in a.weights:
                name = parse_value(choose(m, *got, prior, w))
                h = hits.setdefault(rec["source"], {}).setdefault((m, w), [0, 0])
                h[0] += name == gold
                h[1] += 1
    cols = [(m, w) for m in methods for w in a.weights]
    print("source".ljust(29) + "".join(f"{m[:4]}{w:g}".rjust(9) for m, w in cols))
    calls = {c: [0, 0] for c in cols}
    for src, row in sorted(hits.items()):
        print(src.ljust(29) + "".join(f"{row[c][0] / row[c][1]:9.1%}" for c in cols))
        if not any(r["source"] == src and not r["expected"] for r in recs):
            for c in cols:
                calls[c][0] += row[c][0]
                calls[c][1] += row[c][1]
    print("calls, all sources".ljust(29) + "".join(f"{calls[c][0] / max(1, calls[c][1]):9.1%}" for c in cols))


if __name__ == "__main__":
    main()
