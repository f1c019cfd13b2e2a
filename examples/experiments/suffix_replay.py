"""Call memory's n-gram retrieval against Arctic Inference's suffix tree (drafters/suffix.py) on a
deployment's history, replayed without the cost of a real target (docs/reports/suffix-tree.md).

Each record's gold calls, rendered in the embedded target's format, are the reply: a tiny random model
with the embedded target's tokenizer and chat template is made to write them (tests/oospec_testing.py's
`ScriptedTarget`), so the engine drafts, verifies and commits exactly as it would for a target that
wrote those calls, and a forward costs milliseconds. Records run in file order through one engine per
method, whose call memory keeps the replies (`history`), or is cleared before each record (`cold`).

    .venv/bin/python examples/experiments/suffix_replay.py --data RECORDS.jsonl --sources tooltalk [--limit N] [--methods ar,toolspec,suffix,suffix_tree]
        [--scenarios cold,history] [--out FILE.json]

Per source and method: target forwards per record, tokens accepted from retrieval per record, and
tokens per forward; the replies must equal the script token for token (lossless).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

#: method -> (engine method, retrieval drafter: None is the engine's n-gram one)
METHODS = {"ar": ("ar", None), "toolspec": ("toolspec", None), "suffix": ("toolspec", "path"),
           "suffix_tree": ("toolspec", "tree")}


def main() -> None:
    from transformers import AutoTokenizer

    from oospec_agents import Engine
    from oospec_agents.bench.records import load_records
    from oospec_agents.data import only_sources
    from oospec_agents.drafters.suffix import SuffixDrafter
    from oospec_agents.models import resolve_reference
    from oospec_testing import ScriptedTarget, tiny_model

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=os.environ.get("OOSPEC_DATA"), required=not os.environ.get("OOSPEC_DATA"),
                   metavar="FILE.jsonl", help="records (docs/own-model.md#records; the runs in docs took the "
                                             "project's train-extra.jsonl); default: $OOSPEC_DATA")
    p.add_argument("--sources", required=True, help="comma-separated; each source is replayed on its own")
    p.add_argument("--limit", type=int, default=None, help="the first N records of each source")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--scenarios", default="cold,history")
    p.add_argument("--out", default=None, metavar="FILE.json")
    a = p.parse_args()

    tok = AutoTokenizer.from_pretrained(resolve_reference("embedded"))
    model = tiny_model("llama", tok)
    model.config.max_position_embeddings = 8192  # the engine's context window: the prompts are real ones
    script = ScriptedTarget(model, tok)
    methods = [m.strip() for m in a.methods.split(",")]
    records = load_records(a.data)
    out: dict = {}
    for source in a.sources.split(","):
        recs = [r for r in only_sources(records, source, a.data) if r.get("expected")][:a.limit]
        for scenario in a.scenarios.split(","):
            for m in methods:
                method, tree = METHODS[m]
                engine = Engine(model, tok, model_name="scripted",
                                drafters=None if tree is None else {"retrieval": SuffixDrafter(tree=tree == "tree")})
                t0, rows = time.perf_counter(), []
                for rec in recs:
                    if scenario == "cold":
                        engine.clear_call_memory()
                    engine.clear_prefix_cache()
                    req = engine.prepare(rec["messages"], rec["tools"], "required", max_new_tokens=512)
                    text = engine.fmt.render_calls(rec["expected"])
                    assert text.startswith(req.prefix), (rec["id"], req.prefix, text)
                    script.script(req.prompt_ids, text[len(req.prefix):])
                    gen = engine.generate(rec["messages"], rec["tools"], tool_choice="required",
                                          max_new_tokens=512, method=method)
                    s = gen.stats
                    rows.append({"id": rec["id"], "tokens": len(gen.token_ids), "forwards": s["target_forwards"],
                                 "retrieval": s["accepted_by_source"]["retrieval"],
                                 "schema": s["accepted_by_source"]["schema"],
                                 "exact": gen.token_ids == script.tokens})
                n = len(rows)
                fig = {"n": n, "lossless": all(r["exact"] for r in rows),
                       "forwards_per_record": sum(r["forwards"] for r in rows) / n,
                       "retrieval_per_record": sum(r["retrieval"] for r in rows) / n,
                       "schema_per_record": sum(r["schema"] for r in rows) / n,
                       "tokens_per_forward": sum(r["tokens"] for r in rows) / sum(r["forwards"] for r in rows),
                       "host_s": round(time.perf_counter() - t0, 1)}
                out.setdefault(source, {}).setdefault(scenario, {})[m] = fig | {"records": rows}
                print(f"{source:28} {scenario:8} {m:12} n={n} lossless={fig['lossless']} "
                      f"forwards/rec={fig['forwards_per_record']:.2f} retrieval/rec={fig['retrieval_per_record']:.2f} "
                      f"schema/rec={fig['schema_per_record']:.2f} tokens/forward={fig['tokens_per_forward']:.2f} "
                      f"({fig['host_s']} s)", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
