"""`oospec bench --server URL`: one method end to end through a running `oospec serve`, per request.

Each record is one non-streamed chat completion, sent after the previous one is answered. Wall time
is measured here, around the HTTP call. The response's `"oospec"` stats report the engine's own
prefill and decode time, so the rest is the server's overhead over the in-process engine: HTTP,
JSON, rendering the prompt, the queue. Median and p95 of each are reported.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _call(url: str, body: dict | None, api_key: str | None, timeout: float = 600) -> dict:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:500]
        raise ValueError(f"the server at {url} answered {e.code}: {detail}") from None
    except urllib.error.URLError as e:
        raise ValueError(f"cannot reach the server at {url}: {e.reason}") from None


def run_server_bench(url: str, records: list[dict], *, method: str, tool_choice: str = "required",
                     max_new_tokens: int = 256, api_key: str | None = None, warmup: bool = True,
                     progress: bool = True, data: str | None = None) -> dict:
    root = base_url(url)
    model = _call(root + "/v1/models", None, api_key)["data"][0]["id"]

    def one(rec: dict) -> dict:
        body = {"model": model, "messages": rec["messages"], "tools": rec["tools"], "tool_choice": tool_choice,
                "max_tokens": max_new_tokens, "method": method}
        t0 = time.perf_counter()
        out = _call(root + "/v1/chat/completions", body, api_key)
        wall = time.perf_counter() - t0
        stats = out["oospec"]["stats"]
        engine_s = stats["prefill_s"] + stats["decode_s"]
        return {"id": rec["id"], "source": rec.get("source"), "wall_s": wall, "engine_s": engine_s,
                "overhead_s": wall - engine_s, "completion_tokens": out["usage"]["completion_tokens"],
                "finish_reason": out["choices"][0]["finish_reason"], "target_forwards": stats["target_forwards"],
                "replica": out["oospec"]["replica"]}

    started = time.time()
    if warmup:
        one(records[0])
    rows = [one(rec) for rec in tqdm(records, desc=f"oospec bench --server {method}", disable=not progress)]
    summary = {"n": len(rows), "method": method, "tokens": int(sum(r["completion_tokens"] for r in rows))}
    for key in ("wall_s", "engine_s", "overhead_s"):
        values = np.array([r[key] for r in rows])
        summary[key] = {"median": float(np.median(values)), "p95": float(np.percentile(values, 95)),
                        "mean": float(values.mean())}
    summary["tok_s"] = summary["tokens"] / max(1e-9, sum(r["wall_s"] for r in rows))
    config = {"server": root, "model": model, "data": data, "n_records": len(records), "tool_choice": tool_choice,
              "max_new_tokens": max_new_tokens, "warmup": warmup, "wall_s": round(time.time() - started, 1)}
    return {"server": summary, "config": config, "records": rows}


def markdown(results: dict) -> str:
    s, cfg = results["server"], results["config"]
    lines = ["# oospec bench --server", "",
             f"{s['n']} records from `{cfg['data']}` through {cfg['server']} (model {cfg['model']!r}), "
             f"method={s['method']}, tool_choice={cfg['tool_choice']}, max_new_tokens={cfg['max_new_tokens']}, "
             "one request at a time.", "",
             "Wall: the HTTP request as the client saw it. Engine: the prefill and decode time the response "
             "reports. Overhead: wall minus engine (HTTP, JSON, prompt rendering, queue).", "",
             "| per request | median | p95 | mean |", "|---|---|---|---|"]
    for key, label in (("wall_s", "wall"), ("engine_s", "engine"), ("overhead_s", "overhead")):
        v = s[key]
        lines.append(f"| {label} | {v['median'] * 1e3:.1f} ms | {v['p95'] * 1e3:.1f} ms | {v['mean'] * 1e3:.1f} ms |")
    lines += ["", f"{s['tokens']} completion tokens, {s['tok_s']:.1f} tok/s end to end.", ""]
    return "\n".join(lines)


def write(results: dict, out_dir: str | Path, render=None) -> dict[str, Path]:
    """DIR/results.json and DIR/report.md (`render(results)`, default this bench's `markdown`): the
    benches without a plot (the server's, vLLM's) write theirs here."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "report": out / "report.md"}
    paths["results"].write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    paths["report"].write_text((render or markdown)(results))
    return paths
