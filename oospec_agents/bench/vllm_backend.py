"""`oospec bench --backend vllm`: the same records through vLLM (its CPU build, in `.venv-vllm`), with
vLLM's own AR, its `ngram` and `suffix` drafts, and ours (`oospec_agents.vllm.OoOSpecProposer`).

Every method gets the same prompt ids (`Engine.prompt_ids`, tool_choice as asked) and the same structured
outputs, as vLLM's server sets them for the tool_choice (`constraints`), greedy; one request at a time,
or N kept in flight at once for each N of `concurrency` (vLLM batches them). Per request: vLLM's own timestamps give prefill (scheduled -> first token) and decode
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
    # vLLM's engine gives up on a step its worker has not answered in 300 s; a loaded CPU gets there
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
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
    finish_reason: str | None = None


def generate(llm, prompts: list[list[int]], max_tokens: int, *, together: bool = False,
             schemas: list[dict | None] | None = None, constraints: list[dict | None] | None = None,
             concurrency: int | None = None) -> list[VllmReply]:
    """Greedy replies to `prompts` (token ids): one request at a time, all submitted at once (`together`:
    vLLM batches them), or `concurrency` kept in flight (a new one joins as one ends). `constraints[i]`, where
    given, holds reply i to vLLM's structured outputs (`StructuredOutputsParams(**constraints[i])`: `json=`
    a schema or `structural_tag=`); `schemas[i]` is short for `{"json": schemas[i]}`."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams
    if constraints is None and schemas is not None:
        constraints = [None if s is None else {"json": s} for s in schemas]

    def params(i: int) -> SamplingParams:
        c = constraints[i] if constraints else None
        return SamplingParams(temperature=0.0, max_tokens=max_tokens,
                              structured_outputs=None if c is None else StructuredOutputsParams(**c))
    if concurrency is not None and concurrency > 1:
        return _in_flight(llm, prompts, params, concurrency)
    batches = [list(range(len(prompts)))] if together else [[i] for i in range(len(prompts))]
    out: list[VllmReply] = []
    for batch in batches:
        t0 = time.perf_counter()
        results = llm.generate([TokensPrompt(prompt_token_ids=list(prompts[i])) for i in batch],
                               [params(i) for i in batch], use_tqdm=False)
        wall = time.perf_counter() - t0
        out += [_reply(r, wall) for r in results]
    return out


def _in_flight(llm, prompts: list[list[int]], params, n: int) -> list[VllmReply]:
    """`prompts` through vLLM's engine with `n` requests in flight at once, in order; e2e_s per reply is
    the whole run's wall time (tokens per second = all new tokens / it)."""
    from vllm.inputs import TokensPrompt
    engine, pending, done = llm.llm_engine, list(range(len(prompts))), {}
    ids: dict[str, int] = {}  # the ids we gave and the ones vLLM returned -> the prompt's index
    t0 = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and len(set(ids.values())) - len(done) < n:
            i = pending.pop(0)
            rid = f"oospec-{i}-{time.monotonic_ns()}"
            ids[rid] = i
            ids[engine.add_request(rid, TokensPrompt(prompt_token_ids=list(prompts[i])), params(i))] = i
        for result in engine.step():
            if result.finished:
                done[ids[result.request_id]] = result
    wall = time.perf_counter() - t0
    return [_reply(done[i], wall) for i in range(len(prompts))]


def named_tool(record: dict, tool_choice: str) -> str:
    """The tool a named tool_choice forces for `record`: `tool_choice` itself, or for "named" the record's
    first expected call's tool (its first tool where it expects none)."""
    names = [t["function"]["name"] for t in record["tools"]]
    name = tool_choice
    if tool_choice == "named":
        expected = [c["name"] for c in record.get("expected") or [] if c.get("name") in names]
        name = expected[0] if expected else names[0]
    if name not in names:
        raise ValueError(f"--tool-choice {tool_choice!r}: record {record.get('id')!r} offers no tool {name!r} "
                         f"(it offers {', '.join(names)})")
    return name


def constraints(records: list[dict], tool_choice: str, strict: bool = False) -> list[dict | None]:
    """What vLLM's server (0.32, `--tool-call-parser hermes`) holds each reply to, as structured outputs.

    Not strict (VLLM_ENFORCE_STRICT_TOOL_CALLING=0, or a server without a tool parser): "required" -> its
    JSON schema of a list of `{"name", "parameters"}` calls, a named tool -> that tool's parameters schema
    (`get_json_schema_from_tools`), "auto" -> nothing. Strict (VLLM_ENFORCE_STRICT_TOOL_CALLING=1, vLLM's
    default, every tool `"strict": true`): hermes's structural tag (`<tool_call>\n{"name": "f",
    "arguments": ` + the tool's parameters schema + `}\n</tool_call>`) for every tool_choice, auto included."""
    if strict:
        return [{"structural_tag": structural_tag(r["tools"], tool_choice, r)} for r in records]
    if tool_choice == "auto":
        return [None] * len(records)
    return [{"json": required_schema(r["tools"], None if tool_choice == "required" else named_tool(r, tool_choice))}
            for r in records]


def strict_tools(tools: list[dict]) -> list[dict]:
    """`tools` with every function `"strict": true` (OpenAI's per-tool flag, which vLLM honours)."""
    return [dict(t, function=dict(t["function"], strict=True)) for t in tools]


def structural_tag(tools: list[dict], tool_choice: str, record: dict | None = None) -> str:
    """vLLM's own hermes structural tag for `tools` (made strict) under `tool_choice`, as its server builds it."""
    from vllm.entrypoints.openai.chat_completion.protocol import (ChatCompletionNamedToolChoiceParam,
                                                                  ChatCompletionToolsParam)
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
    choice = tool_choice
    if tool_choice not in ("auto", "required"):
        choice = ChatCompletionNamedToolChoiceParam(function={"name": named_tool(record or {"tools": tools}, tool_choice)})
    tag = get_model_structural_tag("hermes", [ChatCompletionToolsParam(**t) for t in strict_tools(tools)], choice,
                                   reasoning=False, strict_level=ToolStrictLevel.AUTO)
    return json.dumps(tag.model_dump())


def required_schema(tools: list[dict], name: str | None = None) -> dict:
    """The JSON schema vLLM's server constrains a `tool_choice="required"` reply to (its own function), or
    with `name` a reply to that named tool (the tool's parameters)."""
    from vllm.entrypoints.openai.chat_completion.protocol import (ChatCompletionNamedToolChoiceParam,
                                                                  ChatCompletionToolsParam)
    from vllm.tool_parsers.utils import get_json_schema_from_tools
    choice = "required" if name is None else ChatCompletionNamedToolChoiceParam(function={"name": name})
    return get_json_schema_from_tools(choice, [ChatCompletionToolsParam(**t) for t in tools])


#: what vLLM logs when its grammar refuses tokens it has committed ("failed to advance FSM"): the request ends
FSM_FAILURE_LOGS = ("grammar rejected tokens", "Failed to advance FSM")


def run_isolated(method: str, model: str, prompts: list[list[int]], max_tokens: int, *, dtype: str = "float32",
                 k: int = 8, warmup: bool = True, together: bool = False, max_num_seqs: int = 32,
                 schemas: list[dict | None] | None = None, constraints: list[dict | None] | None = None,
                 concurrency: list[int] | None = None, env: dict | None = None, timeout_s: float = 1800,
                 stats: dict | None = None) -> dict[str, list[VllmReply]]:
    """`method` over `prompts` in a vLLM of its own, in a child process (`python -m
    oospec_agents.bench.vllm_backend`): one vLLM per process, as vLLM expects, and nothing left behind.
    Returns {"one": replies one at a time}, with `together` {"together": all submitted at once}, and for
    each N > 1 of `concurrency` {"cN": N kept in flight}. `stats`, a dict, receives per run the proposer's
    counts (vllm-oospec: steps, propose_s, draft tokens proposed) and for every method `fsm_logs`, the
    requests vLLM ended because its grammar refused their tokens (from vLLM's log)."""
    if constraints is None and schemas is not None:
        constraints = [None if s is None else {"json": s} for s in schemas]
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"method": method, "model": model, "prompts": prompts, "max_tokens": max_tokens,
                                   "dtype": dtype, "k": k, "warmup": warmup, "together": together,
                                   "max_num_seqs": max_num_seqs, "constraints": constraints,
                                   "concurrency": [c for c in concurrency or [] if c > 1]}))
        child_env = dict(os.environ, OOSPEC_VLLM_STATS=str(Path(tmp) / "proposer.json"), **(env or {}))
        done = subprocess.run([sys.executable, "-m", "oospec_agents.bench.vllm_backend", str(job), str(out)],
                              env=child_env, timeout=timeout_s, stderr=subprocess.PIPE, text=True)
        sys.stderr.write(done.stderr[-20000:])
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"vLLM ({method}) exited with {done.returncode}; its output is above")
        result = json.loads(out.read_text())
    if stats is not None:
        stats.update(result["stats"])
        stats["fsm_logs"] = sum(done.stderr.count(m) for m in FSM_FAILURE_LOGS)
    return {name: [VllmReply(**r) for r in rows] for name, rows in result["runs"].items()}


def _child(job_path: str, out_path: str) -> None:
    """The child process of `run_isolated`."""
    job = json.loads(Path(job_path).read_text())
    llm = open_llm(job["method"], job["model"], dtype=job["dtype"], k=job["k"], max_num_seqs=job["max_num_seqs"],
                   max_model_len=max(2048, max(map(len, job["prompts"])) + job["max_tokens"] + job["k"] + 8))
    runs, stats = {}, {}
    c = job.get("constraints")
    try:
        if job["warmup"]:
            generate(llm, job["prompts"][:1], 8, constraints=c[:1] if c else None)
        plan = [("one", None)] + ([("together", 0)] if job["together"] else []) + \
            [(f"c{n}", n) for n in job.get("concurrency") or []]
        for name, n in plan:
            _reset_proposer()  # each run starts with no earlier replies in the proposer's memory
            before = _proposer_stats()
            runs[name] = generate(llm, job["prompts"], job["max_tokens"], constraints=c, together=n == 0,
                                  concurrency=n or None)
            stats[name] = _delta(_proposer_stats(), before)
    finally:
        close_llm(llm)
    Path(out_path).write_text(json.dumps({"runs": {name: [asdict(r) for r in rows] for name, rows in runs.items()},
                                          "stats": stats}))


def _reset_proposer() -> None:
    """Ask the proposer (at its next step) to forget earlier replies: a file beside its stats."""
    path = os.environ.get("OOSPEC_VLLM_STATS")
    if path:
        Path(path + ".reset").touch()


def _proposer_stats() -> dict:
    """The proposer's counts so far (OOSPEC_VLLM_STATS, which it writes after every step), or {}."""
    path = os.environ.get("OOSPEC_VLLM_STATS")
    try:
        return json.loads(Path(path).read_text()) if path else {}
    except (OSError, ValueError):
        return {}


def _delta(after: dict, before: dict) -> dict:
    """The numeric counts of `after` less `before` (one run's share)."""
    return {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _reply(result, wall: float) -> VllmReply:
    completion = result.outputs[0]
    ids = list(completion.token_ids)
    spec = getattr(completion, "spec_decode_metrics", None)
    accepted = sum(j * n for j, n in enumerate(spec.histogram)) if spec is not None else 0
    drafted = int(spec.num_draft_tokens) if spec is not None else 0
    m = result.metrics
    prefill = max(0.0, m.first_token_ts - m.scheduled_ts) if m is not None else 0.0
    decode = max(0.0, m.last_token_ts - m.first_token_ts) if m is not None else 0.0
    return VllmReply(ids, completion.text, int(accepted), drafted, len(ids) - int(accepted), prefill, decode, wall,
                     completion.finish_reason)


def run_vllm_bench(records: list[dict], methods: list[str], *, model: str | None = None, dtype: str = "float32",
                   k: int = 8, max_new_tokens: int = 256, tool_choice: str = "auto", strict: bool = False,
                   concurrency: list[int] | None = None, warmup: bool = True, data: str | None = None,
                   progress: bool = True, hint_first: bool = False) -> dict:
    """Each method over `records`, one vLLM at a time; the figures against `vllm-ar` (run first). The
    tool_choice ("auto", "required", "named": each record's expected tool, or a tool's name) and `strict`
    are what vLLM's server does with them (`constraints`): the plain prompt, the reply held by its structured
    outputs, on every method alike. `concurrency` (e.g. [1, 4, 8]): each level's requests kept in flight.
    `hint_first`: vllm-oospec's proposer waits for each request's wave (OOSPEC_VLLM_HINT_FIRST; a sidecar
    named by OOSPEC_VLLM_SIDECAR), so its steps are those of a sidecar always in time."""
    if hint_first and not os.environ.get("OOSPEC_VLLM_SIDECAR"):
        raise ValueError("--hint-first with --backend vllm needs a sidecar: set OOSPEC_VLLM_SIDECAR (docs/vllm.md)")
    from ..vllm.model import embedded_target_dir
    for m in methods:
        speculative_config(m, k)  # an unknown method fails before anything loads
    if tool_choice not in ("auto", "required"):
        for r in records:
            named_tool(r, tool_choice)  # a record without the tool fails before anything loads
    methods = ["vllm-ar"] + [m for m in methods if m != "vllm-ar"]
    levels = sorted(set(concurrency or [1]))
    model = model or str(embedded_target_dir())
    if strict:
        records = [dict(r, tools=strict_tools(r["tools"])) for r in records]
    # vLLM holds a forced call with its structured outputs, after the plain prompt (no opener forced)
    prompts = prompt_ids(records, "auto", dtype)
    held = constraints(records, tool_choice, strict)
    runs: dict[str, dict[str, list[VllmReply]]] = {}
    stats: dict[str, dict] = {}
    started = time.time()
    for method in methods:
        stats[method] = {}
        runs[method] = run_isolated(method, model, prompts, max_new_tokens, dtype=dtype, k=k, warmup=warmup,
                                    constraints=held if any(held) else None, concurrency=levels,
                                    env={"OOSPEC_VLLM_HINT_FIRST": "1"} if hint_first else None,
                                    stats=stats[method])
        if progress:
            print(f"{method}: {sum(len(r.token_ids) for r in runs[method]['one'])} tokens, "
                  f"{sum(r.forwards for r in runs[method]['one'])} steps one at a time", flush=True)
    config = {"backend": "vllm", "model": model, "dtype": dtype, "k": k, "tool_choice": tool_choice, "strict": strict,
              "concurrency": levels, "sidecar": os.environ.get("OOSPEC_VLLM_SIDECAR"),  # vllm-oospec's hints
              "sidecar_device": os.environ.get("OOSPEC_VLLM_SIDECAR_DEVICE"), "hint_first": hint_first,
              "max_new_tokens": max_new_tokens, "data": data, "n_records": len(records),
              "wall_s": round(time.time() - started, 1)}
    results = summarize({m: r["one"] for m, r in runs.items()}, records, config)
    for m, f in results["methods"].items():
        f.update(_run_stats(stats[m].get("one", {}), f["target_forwards"]), fsm_failures=stats[m].get("fsm_logs", 0))
        if "proposed_tokens" in f:  # drafted but not verified: cut by vLLM's grammar, or for a request that ended
            f["unscheduled_draft_tokens"] = f["proposed_tokens"] - f["draft_tokens"]
    results["concurrency"] = {str(n): _level(runs, stats, "one" if n == 1 else f"c{n}") for n in levels}
    return results


def _run_stats(s: dict, steps: int) -> dict:
    """The proposer's own figures for one run (empty where no proposer of ours ran)."""
    if not s:
        return {}
    return {"propose_s": round(s.get("propose_s", 0.0), 4), "proposer_steps": s.get("steps", 0),
            "propose_ms_per_step": round(1000 * s.get("propose_s", 0.0) / max(1, s.get("steps", 0)), 3),
            "proposed_tokens": s.get("draft_tokens", 0), "hint_in_time": (s.get("hinted", 0) / s["requests"]) if s.get("requests") else None}


def _level(runs: dict, stats: dict, name: str) -> dict:
    """One concurrency level: per method its steps, tokens per second (all new tokens over the run's wall
    time), replies equal to vllm-ar's at the same level, and the proposer's time."""
    ref = runs["vllm-ar"][name]
    out = {}
    for m, by_run in runs.items():
        rows = by_run[name]
        wall = max(r.e2e_s for r in rows) if name != "one" else sum(r.e2e_s for r in rows)
        tokens = sum(len(r.token_ids) for r in rows)
        out[m] = {"steps": sum(r.forwards for r in rows), "new_tokens": tokens, "wall_s": round(wall, 3),
                  "tokens_per_s": round(tokens / wall, 2) if wall else None,
                  "output_differences": sum(r.token_ids != a.token_ids for r, a in zip(rows, ref)),
                  "errors": sum(r.finish_reason not in ("stop", "length") for r in rows),
                  **_run_stats(stats[m].get(name, {}), 0)}
    base = out["vllm-ar"]["tokens_per_s"]
    for f in out.values():
        f["tokens_per_s_vs_ar"] = round(f["tokens_per_s"] / base, 3) if base and f["tokens_per_s"] else None
    return out


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
             f"{results['env']['device']}, {cfg['dtype']}, k={cfg['k']}, tool_choice={cfg['tool_choice']}"
             f"{', strict' if cfg.get('strict') else ''}, max_new_tokens={cfg['max_new_tokens']}, greedy; "
             f"vllm-oospec's sidecar: {cfg.get('sidecar') or 'none (schema, retrieval and call memory only)'}"
             f"{' (--hint-first: each wave waited for, so every hint was in time; its times are no speed figure)' if cfg.get('hint_first') else ''}.",
             "",
             "One request at a time. Steps: vLLM's target forwards (prefill + decode steps). Decode/e2e speedups "
             "are against `vllm-ar`. Unscheduled: draft tokens the proposer gave that vLLM did not verify (its "
             "grammar cut them, or the request had just ended); FSM: requests vLLM ended because its grammar "
             "refused committed tokens.", "",
             "| method | lossless | steps | steps / AR | accepted per step | decode speedup | e2e speedup | "
             "unscheduled | FSM | propose ms/step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, f in results["methods"].items():
        lines.append(f"| {name} | {'yes' if f['lossless'] else 'NO (' + str(f['output_differences']) + ')'} | "
                     f"{f['target_forwards']} | {f['steps_vs_ar']:.2f} | {f['mean_accepted_tokens']:.2f} | "
                     f"{f['speedup_decode'] or 0:.2f}x | {f['speedup_e2e'] or 0:.2f}x | "
                     f"{_or_dash(f.get('unscheduled_draft_tokens'))} | {f.get('fsm_failures', 0)} | "
                     f"{_or_dash(f.get('propose_ms_per_step'))} |")
    levels = results.get("concurrency") or {}
    if len(levels) > 1 or "1" not in levels:
        lines += ["", "## Requests in flight at once", "",
                  "| in flight | method | equal to vllm-ar | steps | tokens/s | x AR | errors | propose ms/step |",
                  "|---|---|---|---|---|---|---|---|"]
        for n, by_method in levels.items():
            for name, f in by_method.items():
                lines.append(f"| {n} | {name} | {'yes' if not f['output_differences'] else 'NO'} | {f['steps']} | "
                             f"{f['tokens_per_s']} | {_or_dash(f['tokens_per_s_vs_ar'])} | {f['errors']} | "
                             f"{_or_dash(f.get('propose_ms_per_step'))} |")
    return "\n".join(lines) + "\n"


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def run_cli(args, records: list[dict]) -> int:
    """`oospec bench --backend vllm ...` (from .venv-vllm) on the records the bench's flags chose."""
    methods = [m.strip() for m in (args.methods or "vllm-ar,vllm-ngram,vllm-oospec").split(",") if m.strip()]
    results = run_vllm_bench(records, methods, dtype=args.dtype or "float32",
                             k=args.num_speculative_tokens, max_new_tokens=args.max_new_tokens,
                             tool_choice=args.tool_choice or "auto", strict=args.strict,
                             concurrency=args.concurrency, warmup=not args.no_warmup, hint_first=args.hint_first,
                             data=args.bfcl or args.data, progress=not args.quiet)
    from .server import write
    paths = write(results, args.out, render=markdown)
    if not args.quiet:
        print(paths["report"].read_text())
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":  # run_isolated's child (vLLM spawns its engine: this guard is required)
    _child(sys.argv[1], sys.argv[2])
