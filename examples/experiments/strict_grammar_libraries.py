"""Compile and mask times of xgrammar 0.2.9 and llguidance 1.9.1 on the SmolLM2 tokenizer, interleaved
(docs/strict.md). Needs both installed: pip install llguidance==1.9.1; pip install --no-deps xgrammar==0.2.9
apache-tvm-ffi. Run from the repository root:
    python examples/experiments/strict_grammar_libraries.py --data RECORDS.jsonl
RECORDS.jsonl: records with tools and expected calls (docs/own-model.md#records; docs/strict.md's run took
the project's dev.jsonl), or OOSPEC_DATA; 40 records with a call, spread over the file, are timed."""
import argparse, json, os, statistics, time, sys
_ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
_ap.add_argument("--data", default=os.environ.get("OOSPEC_DATA"), metavar="FILE.jsonl",
                 help="records with tools and expected calls (docs/own-model.md#records); default: $OOSPEC_DATA")
_args = _ap.parse_args()
if not _args.data:
    _ap.error("--data FILE.jsonl is required (or set OOSPEC_DATA): records in the format of docs/own-model.md#records")
import torch, llguidance, llguidance.hf, xgrammar as xgr
from transformers import AutoTokenizer
from oospec_agents import models
tok = AutoTokenizer.from_pretrained(models.resolve_reference("embedded"))
V = len(tok)
recs = [json.loads(l) for l in open(_args.data, encoding="utf-8")]
recs = [r for r in recs if r.get("expected")][:: max(1, len(recs) // 40)][:40]
def schema(tools):
    return {"anyOf": [{"type": "object", "properties": {"name": {"const": t["function"]["name"]}, "arguments": t["function"].get("parameters", {"type": "object"})},
                       "required": ["name", "arguments"], "additionalProperties": False} for t in tools]}
t0 = time.perf_counter(); lt = llguidance.hf.from_tokenizer(tok); ll_tok_s = time.perf_counter() - t0
t0 = time.perf_counter(); xi = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V); xc = xgr.GrammarCompiler(xi, cache_enabled=False, max_threads=1); xg_tok_s = time.perf_counter() - t0
res = {k: [] for k in ("ll_compile", "xg_compile", "ll_mask", "xg_mask", "ll_first_mask", "xg_first_mask")}
ll_bm = torch.full((1, (V + 31) // 32), -1, dtype=torch.int32); xg_bm = xgr.allocate_token_bitmask(1, V)
skipped = 0
for r in recs:
    sch = schema(r["tools"]); js = json.dumps(sch)
    call = r["expected"][0]; text = json.dumps({"name": call["name"], "arguments": call["arguments"]})
    ids = tok.encode(text, add_special_tokens=False)
    for lib in ("ll", "xg") if len(res["ll_mask"]) % 2 == 0 else ("xg", "ll"):  # alternate order
        try:
            t0 = time.perf_counter()
            if lib == "ll":
                m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(js, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}), log_level=0)
                assert not m.is_error(), m.get_error()
            else:
                cg = xc.compile_json_schema(js, any_whitespace=False, separators=(", ", ": ")); m = xgr.GrammarMatcher(cg)
            res[lib + "_compile"].append(time.perf_counter() - t0)
        except Exception as e:
            skipped += 1; print("skip", lib, r["id"], str(e)[:80]); continue
        times = []
        for i, t in enumerate(ids):
            t0 = time.perf_counter()
            if lib == "ll":
                m.unsafe_compute_mask_ptr(ll_bm.data_ptr(), ll_bm.numel() * 4)
            else:
                m.fill_next_token_bitmask(xg_bm)
            times.append(time.perf_counter() - t0)
            ok = m.consume_token(t) if lib == "ll" else m.accept_token(t)
            if not ok: print("reject", lib, r["id"], i); break
        res[lib + "_first_mask"].append(times[0]); res[lib + "_mask"] += times[1:]
med = lambda x: statistics.median(x) * 1000
print(f"records {len(recs)}  tokenizer setup: llguidance {ll_tok_s:.2f}s xgrammar {xg_tok_s:.2f}s")
for k, v in res.items():
    print(f"{k:14s} n={len(v):4d} median {med(v):8.3f} ms  p90 {sorted(v)[int(.9*len(v))]*1000:8.3f} ms")
