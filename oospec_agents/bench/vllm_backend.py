"""`oospec bench --backend vllm`: the same records through vLLM (its CPU build, in `.venv-vllm`), with
vLLM's own AR, its `ngram` and `suffix` drafts, and ours (`oospec_agents.vllm.OoOSpecProposer`).

Every method gets the same prompt ids (`Engine.prompt_ids`, tool_choice as asked) and runs one request at
a time, greedy. Per request: vLLM's own timestamps give prefill (scheduled -> first token) and decode
(first -> last token); its per-request speculative metrics give the accepted draft tokens, so the target
forwards (vLLM steps) are the new tokens less the accepted ones (each step writes one token of its own).
`lossless`: every method's tokens equal `vllm-ar`'s.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: the methods, each vLLM's speculative_config (None: plain AR) given k
METHODS = ("vllm-ar", "vllm-ngram", "vllm-suffix", "vllm-oospec")
PROPOSER = "oospec_agents.vllm.OoOSpecProposer"


def speculative_config(method: str, k: int) -> dict | None:
    """vLLM's speculative_config for one of `METHODS`."""
    if method == "vllm-ar":
        return None
    if method == "vllm-ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if method == "vllm-suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    if method == "vllm-oospec":
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    raise ValueError(f"unknown vLLM method {method!r}; known: {', '.join(METHODS)}")


def open_llm(method: str, model: str, *, dtype: str = "float32", k: int = 8, max_model_len: int = 2048,
             max_num_seqs: int = 8, kv_gib: int = 1):
    """vLLM's in-process `LLM` for `method` on the CPU: eager (no compile), its KV cache capped at
    `kv_gib` GiB of RAM (VLLM_CPU_KVCACHE_SPACE, unless already set), per-request speculative metrics on."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))
    from vllm import LLM
    spec = speculative_config(method, k)
    extra = {"per_request_spec_decode_metrics": "summary"} if spec else {}
    return LLM(model, dtype=dtype, max_model_len=max_model_len, enforce_eager=True, max_num_seqs=max_num_seqs,
               speculative_config=spec, disable_log_stats=False, seed=0, **extra)


def close_llm(llm) -> None:
    """Stop vLLM's engine process now (rather than when the object is collected)."""
    llm.llm_engine.engine_core.shutdown()


@dataclass
class VllmReply:
    token_ids: list[int]
    text: str
    accepted: int         # draft tokens vLLM accepted
    drafted: int          # draft tokens proposed
    forwards: int         # vLLM steps for this request: the prefill's, then one per decode step
    prefill_s: float
    decode_s: float
    e2e_s: float


def generate(llm, prompts: list[list[int]], max_tokens: int, *, together: bool = False,
             schemas: list[dict | None] | None = None) -> list[VllmReply]:
    """Greedy replies to `prompts` (token ids): one request at a time, or all submitted at once
    (`together`: vLLM batches them). `schemas[i]`, where given, constrains reply i to that JSON schema
    with vLLM's structured outputs (`required_schema`)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    def params(i: int) -> SamplingParams:
        schema = schemas[i] if schemas else None
        return SamplingParams(temperature=0.0, max_tokens=max_tokens,
                              structured_outputs=None if schema is None else StructuredOutputsParams(json=schema))
    batches = [list(range(len(prompts)))] if together else [[i] for i in range(len(prompts))]
    out: list[VllmReply] = []
    for batch in batches:
        t0 = time.perf_counter()
        results = llm.generate([TokensPrompt(prompt_token_ids=list(prompts[i])) for i in batch],
                               [params(i) for i in batch], use_tqdm=False)
        wall = time.perf_counter() - t0
        out += [_reply(r, wall) for r in results]
    return out


def required_schema(tools: list[dict]) -> dict:
    """The JSON schema vLLM's server constrains a `tool_choice="required"` reply to (its own function)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.utils import get_json_schema_from_tools
    return get_json_schema_from_tools("required", [ChatCompletionToolsParam(**t) for t in tools])


def run_isolated(method: str, model: str, prompts: list[list[int]], max_tokens: int, *, dtype: str = "float32",
                 k: int = 8, warmup: bool = True, together: bool = False, max_num_seqs: int = 32,
                 schemas: list[dict | None] | None = None, env: dict | None = None,
                 timeout_s: float = 1800) -> dict[str, list[VllmReply]]:
    """`method` over `prompts` in a vLLM of its own, in a child process (`python -m
    oospec_agents.bench.vllm_backend`): one vLLM per process, as vLLM expects, and nothing left behind.
    Returns {"one": replies one at a time} and, with `together`, {"together": all submitted at once}."""
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"method": method, "model": model, "prompts": prompts, "max_tokens": max_tokens,
                                   "dtype": dtype, "k": k, "warmup": warmup, "together": together,
                                   "max_num_seqs": max_num_seqs, "schemas": schemas}))
        done = subprocess.run([sys.executable, "-m", "oospec_agents.bench.vllm_backend", str(job), str(out)],
                              env=dict(os.environ, **(env or {})), timeout=timeout_s)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"vLLM ({method}) exited with {done.returncode}; its output is above")
        runs = json.loads(out.read_text())
    return {name: [VllmReply(**r) for r in rows] for name, rows in runs.items()}


def _child(job_path: str, out_path: str) -> None:
    """The child process of `run_isolated`."""
    job = json.loads(Path(job_path).read_text())
    llm = open_llm(job["method"], job["model"], dtype=job["dtype"], k=job["k"], max_num_seqs=job["max_num_seqs"],
                   max_model_len=max(2048, max(map(len, job["prompts"])) + job["max_tokens"] + job["k"] + 8))
    try:
        if job["warmup"]:
            generate(llm, job["prompts"][:1], 8)
        runs = {"one": generate(llm, job["prompts"], job["max_tokens"], schemas=job.get("schemas"))}
        if job["together"]:
            runs["together"] = generate(llm, job["prompts"], job["max_tokens"], together=True, schemas=job.get("schemas"))
    finally:
        close_llm(llm)
    Path(out_path).write_text(json.dumps({name: [asdict(r) for r in rows] for name, rows in runs.items()}))


def _reply(result, wall: float) -> VllmReply:
    completion = result.outputs[0]
    ids = list(completion.token_ids)
    spec = getattr(completion, "spec_decode_metrics", None)
    accepted = sum(j * n for j, n in enumerate(spec.histogram)) if spec is not None else 0
    drafted = int(spec.num_draft_tokens) if spec is not None else 0
    m = result.metrics
    prefill = max(0.0, m.first_token_ts - m.scheduled_ts) if m is not None else 0.0
    decode = max(0.0, m.last_token_ts - m.first_token_ts) if m is not None else 0.0
    return VllmReply(ids, completion.text, int(accepted), drafted, len(ids) - int(accepted), prefill, decode, wall)


def run_vllm_bench(records: list[dict], methods: list[str], *, model: str | None = None, dtype: str = "float32",
                   k: int = 8, max_new_tokens: int = 256, tool_choice: str = "auto", warmup: bool = True,
                   data: str | None = None, progress: bool = True) -> dict:
    """Each method over `records`, one vLLM at a time; the figures against `vllm-ar` (run first).
    tool_choice "required" is what vLLM's server does with it: the plain prompt, the reply held to
    vLLM's JSON schema of the calls by its structured outputs, on every method alike."""
    from ..vllm.model import embedded_target_dir
    for m in methods:
        speculative_config(m, k)  # an unknown method fails before anything loads
    methods = ["vllm-ar"] + [m for m in methods if m != "vllm-ar"]
    model = model or str(embedded_target_dir())
    # vLLM constrains a required call with its structured outputs, after the plain prompt (no opener forced)
    prompts = prompt_ids(records, "auto" if tool_choice == "required" else tool_choice, dtype)
    schemas = [required_schema(r["tools"]) for r in records] if tool_choice == "required" else None
    runs: dict[str, list[VllmReply]] = {}
    started = time.time()
    for method in methods:
        runs[method] = run_isolated(method, model, prompts, max_new_tokens, dtype=dtype, k=k, warmup=warmup,
                                    schemas=schemas)["one"]
        if progress:
            print(f"{method}: {sum(len(r.token_ids) for r in runs[method])} tokens, "
                  f"{sum(r.forwards for r in runs[method])} steps", flush=True)
    config = {"backend": "vllm", "model": model, "dtype": dtype, "k": k, "tool_choice": tool_choice,
              "sidecar": os.environ.get("OOSPEC_VLLM_SIDECAR"),  # vllm-oospec's hints (docs/vllm.md)
              "max_new_tokens": max_new_tokens, "data": data, "n_records": len(records),
              "wall_s": round(time.time() - started, 1)}
    return summarize(runs, records, config)


def prompt_ids(records: list[dict], tool_choice: str, dtype: str) -> list[list[int]]:
    """Each record's prompt as the engine renders it (the embedded target, no sidecar)."""
    from ..engine import Engine
    engine = Engine.from_pretrained("embedded", sidecar=False, dtype=dtype)
    try:
        return [engine.prompt_ids(r["messages"], r.get("tools"), tool_choice=tool_choice) for r in records]
    finally:
        engine.close()


def summarize(runs: dict[str, list[VllmReply]], records: list[dict], config: dict) -> dict:
    """results.json's shape: per method n, lossless (tokens equal vllm-ar's), speedups against vllm-ar,
    mean accepted tokens per step, target_forwards (vLLM steps), and the per-request rows."""
    ref = runs["vllm-ar"]
    base_decode, base_e2e = sum(r.decode_s for r in ref), sum(r.e2e_s for r in ref)
    methods = {}
    for name, rows in runs.items():
        forwards = sum(r.forwards for r in rows)
        decode, e2e = sum(r.decode_s for r in rows), sum(r.e2e_s for r in rows)
        methods[name] = {
            "n": len(rows), "lossless": all(r.token_ids == a.token_ids for r, a in zip(rows, ref)),
            "output_differences": sum(r.token_ids != a.token_ids for r, a in zip(rows, ref)),
            "speedup_decode": base_decode / decode if decode else None, "speedup_e2e": base_e2e / e2e if e2e else None,
            "mean_accepted_tokens": sum(r.accepted for r in rows) / max(1, forwards - len(rows)),
            "target_forwards": forwards, "steps_vs_ar": forwards / max(1, sum(x.forwards for x in ref)),
            "new_tokens": sum(len(r.token_ids) for r in rows), "draft_tokens": sum(r.drafted for r in rows),
            "accepted_tokens": sum(r.accepted for r in rows), "prefill_s": sum(r.prefill_s for r in rows),
            "decode_s": decode, "e2e_s": e2e, "numerical_ties": 0}
    rows = {name: [dict(asdict(r), id=rec.get("id")) for r, rec in zip(rs, records)] for name, rs in runs.items()}
    return {"methods": methods, "config": config, "env": environment(), "records": rows}


def environment() -> dict:
    import platform

    import torch
    import transformers
    import vllm
    from .env import device_name
    return {"device": device_name("cpu"), "cores": os.cpu_count(), "torch": torch.__version__,
            "transformers": transformers.__version__, "vllm": vllm.__version__, "python": platform.python_version(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def markdown(results: dict) -> str:
    cfg = results["config"]
    lines = ["# oospec bench --backend vllm", "",
             f"{cfg['n_records']} records from `{cfg['data']}`, vLLM {results['env']['vllm']} on "
             f"{results['env']['device']}, {cfg['dtype']}, k={cfg['k']}, tool_choice={cfg['tool_choice']}, "
             f"max_new_tokens={cfg['max_new_tokens']}, one request at a time, greedy; vllm-oospec's sidecar: "
             f"{cfg.get('sidecar') or 'none (schema, retrieval and call memory only)'}.", "",
             "Steps: vLLM's target forwards (prefill + decode steps). Decode/e2e speedups are against `vllm-ar`.", "",
             "| method | lossless | steps | steps / AR | accepted per step | decode speedup | e2e speedup |",
             "|---|---|---|---|---|---|---|"]
    for name, f in results["methods"].items():
        lines.append(f"| {name} | {'yes' if f['lossless'] else 'NO (' + str(f['output_differences']) + ')'} | "
                     f"{f['target_forwards']} | {f['steps_vs_ar']:.2f} | {f['mean_accepted_tokens']:.2f} | "
                     f"{f['speedup_decode'] or 0:.2f}x | {f['speedup_e2e'] or 0:.2f}x |")
    return "\n".join(lines) + "\n"


def run_cli(args, records: list[dict]) -> int:
    """`oospec bench --backend vllm ...` (from .venv-vllm) on the records the bench's flags chose."""
    methods = [m.strip() for m in (args.methods or "vllm-ar,vllm-ngram,vllm-oospec").split(",") if m.strip()]
    results = run_vllm_bench(records, methods, dtype=args.dtype or "float32",
                             k=args.num_speculative_tokens, max_new_tokens=args.max_new_tokens,
                             tool_choice=args.tool_choice or "auto", warmup=not args.no_warmup,
                             data=args.bfcl or args.data, progress=not args.quiet)
    from .server import write
    paths = write(results, args.out, render=markdown)
    if not args.quiet:
        print(paths["report"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":  # run_isolated's child (vLLM spawns its engine: this guard is required)
    _child(sys.argv[1], sys.argv[2])
