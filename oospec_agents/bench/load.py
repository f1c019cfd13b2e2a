"""`oospec bench --concurrency 1,2,4,8`: one engine under load from several client threads.

A fixed list of R requests (R = the largest level, or --limit records, at least the largest level;
records are repeated, as `<id>#2`, ... when there are fewer) is served, per method:

    sequential  one after another on one thread: the baseline, measured once per method
    level N     N client threads (`ThreadPoolExecutor(N)`) pulling from the same R requests

so every level serves the same requests. Only the engine's public calls are used
(`Engine.generate(...)` from several threads at once): with the engine's lock the calls queue, with
batched rounds (batching.py) concurrent replies share each target forward, and this bench measures either.

Per (method, level): wall seconds, requests/s, new tokens/s, p50 and p95 latency (a request's, from
the moment a client thread starts the call to its Generation), mean target forwards per request (the
reply's own count: a forward it shared counts once for it), the distinct target forwards of the
level, the mean batch (replies per verify forward), the throughput over the method's sequential
baseline, and `replies_differ`: the replies whose tokens differ from the same request's sequential
reply (reported, not failed: a batched forward may round differently in bf16).

Scenarios (`scenarios.py`):

    cold        before the baseline and before each level, the prefix cache and the call memory are
                cleared, so every level starts alike (within a level, a request may reuse a prefix
                an earlier one of the same level left: the same at every level, up to order)
    agent_loop  the measured request is turn 2 of each record (its expected call and a tool result
                appended, tool_choice=auto); before each pass the caches are cleared and every
                request's turn 1 is served once, one after another, untimed, so each measured
                request finds its conversation's prefix cached and its turn-1 reply in call memory

`--server URL` runs the same load against a running `oospec serve` through the `openai` SDK (one
client, shared by the threads). The server's caches cannot be cleared from here: `cold` there means
only that nothing is warmed on purpose. Its forwards come from the response's `oospec` stats.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .metrics import compare, tie_tolerance
from .scenarios import turns

#: the methods a load bench serves: the engine's own
LOAD_METHODS = ("ar", "toolspec", "oospec")
#: the scenarios it knows (a subset of scenarios.SCENARIOS)
LOAD_SCENARIOS = ("cold", "agent_loop")
#: the baseline's key in results.json; its rows say "sequential" where a level's give N
SEQUENTIAL = "sequential"


@dataclass
class LoadConfig:
    methods: tuple[str, ...] = ("toolspec",)
    levels: tuple[int, ...] = (1, 2, 4, 8)
    tool_choice: str = "required"
    max_new_tokens: int = 256
    scenario: str = "cold"      # "cold" | "agent_loop"
    warmup: bool = True         # one untimed request per method before its baseline
    progress: bool = True
    command: str | None = None  # the command line, for the report


@dataclass(frozen=True)
class Request:
    """One request of the load: what is measured, and the unmeasured turns that warm it (agent_loop)."""
    id: str
    source: str | None
    messages: list[dict]
    tools: list[dict]
    tool_choice: str
    before: list = field(default_factory=list)  # (messages, tool_choice): served untimed before a pass


@dataclass
class Reply:
    """What a client learned of one reply: enough for the figures and the comparison with the baseline."""
    same: object                     # what two replies must share to be the same reply (token ids, or text)
    new_tokens: int
    target_forwards: int | None      # None: the client cannot see them
    batch_sizes: list[int]
    verify_forwards: int | None      # this reply's verify forwards (None: unknown)
    cached_prompt_tokens: int | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    finish_reason: str | None = None
    #: requests that shared this reply's sidecar wave (1: alone; None: no wave's hint reached the reply,
    #: or the client cannot see it)
    wave_batch: int | None = None
    #: the top-2 logit margin of each new token (the engine's `record_margins`): a reply that differs from
    #: its sequential one at a token whose margin is within the dtype's tolerance differs by a numerical tie
    margins: list[float] | None = None


# ------------------------------------------------------------------ requests

def load_requests(records: list[dict], levels, scenario: str, tool_choice: str) -> list[Request]:
    """The R requests every pass serves: the records (repeated when fewer than the largest level), as
    the scenario's measured turn (`scenarios.turns`: "cold" as is, "agent_loop" turn 2 after turn 1)."""
    if scenario not in LOAD_SCENARIOS:
        raise ValueError(f"the load bench runs the scenarios {list(LOAD_SCENARIOS)}, not {scenario!r}")
    if not records:
        raise ValueError("the load bench needs at least one record")
    n = max(len(records), max(levels))
    out = []
    for i in range(n):
        rec = records[i % len(records)]
        turn = turns(rec, scenario, tool_choice)["warm" if scenario == "agent_loop" else "cold"]
        rid = rec["id"] if i < len(records) else f"{rec['id']}#{i // len(records) + 1}"
        out.append(Request(rid, rec.get("source"), turn.messages, turn.tools, turn.tool_choice, list(turn.before)))
    return out


# ------------------------------------------------------------------ clients: in process, or a server

class EngineClient:
    """Serves requests on an `Engine` with its public calls, from any thread."""

    def __init__(self, engine, max_new_tokens: int):
        self.engine, self.max_new_tokens = engine, max_new_tokens

    def reset(self, requests: list[Request], method: str) -> None:
        """Before a pass: empty caches; then each request's unmeasured turns, one after another."""
        self.engine.clear_prefix_cache()
        self.engine.clear_call_memory()
        for req in requests:
            for messages, tool_choice in req.before:
                self.engine.generate(messages, req.tools, tool_choice=tool_choice, max_new_tokens=self.max_new_tokens,
                                     method=method)
        side = getattr(self.engine, "sidecar", None)
        if side is not None and not side.wait_idle():  # a cancelled wave may still be prefilling
            raise RuntimeError("the sidecar stayed busy for 30 s between load passes")

    def __call__(self, req: Request, method: str) -> Reply:
        gen = self.engine.generate(req.messages, req.tools, tool_choice=req.tool_choice,
                                   max_new_tokens=self.max_new_tokens, method=method, record_margins=True)
        s = gen.stats
        batch = list(getattr(s, "batch_sizes", None) or [])
        wave = getattr(s, "sidecar_profile", None)
        return Reply(tuple(gen.token_ids), s.new_tokens or len(gen.token_ids), s.target_forwards, batch,
                     len(batch) if batch else len(s.rounds), s.cached_prompt_tokens, s.prefill_s, s.decode_s,
                     getattr(gen, "finish_reason", None), None if not wave else int(wave.get("batched", 1)),
                     getattr(s, "margins", None))


class ServerClient:
    """Serves requests through a running `oospec serve` with the `openai` SDK: one client, every thread."""

    def __init__(self, url: str, max_new_tokens: int, api_key: str | None = None):
        from openai import OpenAI

        from .server import base_url
        self.root = base_url(url)
        self.max_new_tokens = max_new_tokens
        self.client = OpenAI(base_url=self.root + "/v1", api_key=api_key or "none", max_retries=0, timeout=600)
        try:
            self.model = self.client.models.list().data[0].id
        except Exception as e:  # noqa: BLE001 -- any failure here means: no usable server at that URL
            raise ValueError(f"cannot reach the server at {self.root}: {e}") from None

    def _create(self, messages, tools, tool_choice, method):
        return self.client.chat.completions.create(model=self.model, messages=messages, tools=tools,
                                                   tool_choice=tool_choice, max_tokens=self.max_new_tokens,
                                                   extra_body={"method": method})

    def reset(self, requests: list[Request], method: str) -> None:
        """The server's caches stay as they are; each request's unmeasured turns, one after another."""
        for req in requests:
            for messages, tool_choice in req.before:
                self._create(messages, req.tools, tool_choice, method)

    def __call__(self, req: Request, method: str) -> Reply:
        out = self._create(req.messages, req.tools, req.tool_choice, method)
        choice = out.choices[0]
        calls = tuple((c.function.name, c.function.arguments) for c in (choice.message.tool_calls or []))
        stats = ((out.model_extra or {}).get("oospec") or {}).get("stats") or {}
        batch = list(stats.get("batch_sizes") or [])
        # the response hides `rounds`: without batch sizes the verify forwards are unknown
        return Reply((choice.message.content or "", calls), out.usage.completion_tokens if out.usage else 0,
                     stats.get("target_forwards"), batch, len(batch) if batch else None,
                     stats.get("cached_prompt_tokens"), stats.get("prefill_s"), stats.get("decode_s"),
                     choice.finish_reason)


# ------------------------------------------------------------------ the bench

def run_load_bench(engine, records: list[dict], config: LoadConfig = LoadConfig(), *, data: str | None = None,
                   client=None) -> dict:
    """Serve the same requests sequentially and at each concurrency level, per method; returns the
    results dict that `write_all` saves. `client` (a ServerClient) replaces the engine (pass engine=None)."""
    methods = list(dict.fromkeys(config.methods))
    if unknown := [m for m in methods if m not in LOAD_METHODS]:
        raise ValueError(f"the load bench serves the engine's methods {list(LOAD_METHODS)}; drop {unknown}")
    levels = sorted(set(config.levels))
    if not levels or levels[0] < 1:
        raise ValueError(f"concurrency levels must be integers >= 1, got {list(config.levels)}")
    requests = load_requests(records, levels, config.scenario, config.tool_choice)
    client = client or EngineClient(engine, config.max_new_tokens)
    tol = tie_tolerance(getattr(getattr(engine, "target", None), "dtype", None))
    started = time.time()
    bar = tqdm(total=len(methods) * (int(config.warmup) + len(requests) * (1 + len(levels))),
               desc="oospec bench --concurrency", unit="req", disable=not config.progress)
    out: dict[str, dict] = {}
    for method in methods:
        if config.warmup:
            bar.set_postfix_str(f"{method} warm-up")
            client.reset(requests[:1], method)
            client(requests[0], method)
            bar.update(1)
        bar.set_postfix_str(f"{method} sequential")
        base_rows, base_wall = _pass(client, requests, method, None, bar)
        base = figures(base_rows, base_wall)
        same = [(r.pop("same"), r.pop("margins")) for r in base_rows]
        for r in base_rows:
            r["differs"], r["tie"] = False, None
        base.update(replies_differ=0, replies_tie=0, x_sequential=1.0, rows=base_rows)
        per_level = {}
        for n in levels:
            bar.set_postfix_str(f"{method} x{n}")
            rows, wall = _pass(client, requests, method, n, bar)
            figs = figures(rows, wall)
            for r, (s, margins) in zip(rows, same):
                got, got_margins = r.pop("same"), r.pop("margins")
                r["differs"] = got != s
                r["tie"] = _tie(s, margins, got, got_margins, tol) if r["differs"] else None
            figs["replies_differ"] = sum(r["differs"] for r in rows)
            # of those, the ones whose first differing token is a numerical tie (None: margins unknown)
            ties = [r["tie"] for r in rows if r["differs"]]
            figs["replies_tie"] = None if None in ties else sum(ties)
            figs["x_sequential"] = figs["req_s"] / base["req_s"] if base["req_s"] else None
            figs["rows"] = rows
            per_level[str(n)] = figs
        out[method] = {SEQUENTIAL: base, "levels": per_level}
    bar.close()
    env = _env(engine, client)
    return {"env": env,
            "config": {"data": data, "n_records": len(records), "n_requests": len(requests),
                       "request_ids": [r.id for r in requests], "methods": methods, "levels": levels,
                       "tool_choice": config.tool_choice, "max_new_tokens": config.max_new_tokens,
                       "scenario": config.scenario, "warmup": config.warmup, "command": config.command,
                       "server": getattr(client, "root", None), "wall_s": round(time.time() - started, 1)},
            "scenario": config.scenario,
            "methods": out}


def _tie(ref, ref_margins, out, out_margins, tol: float) -> bool | None:
    """Whether two replies' token ids first differ at a numerical tie: either side's top-2 logit margin
    there within `tol` (`metrics.compare`); None where margins are unknown (a server's text)."""
    if not ref_margins or not isinstance(ref, tuple) or not isinstance(out, tuple):
        return None
    if compare(list(ref), ref_margins, list(out), tol)["verdict"] == "tie":
        return True
    return bool(out_margins) and compare(list(out), out_margins, list(ref), tol)["verdict"] == "tie"


def _pass(client, requests: list[Request], method: str, workers: int | None, bar) -> tuple[list[dict], float]:
    """Serve every request once: on this thread (workers None) or on `workers` client threads. Returns
    one row per request, in request order, and the pass's wall seconds."""
    client.reset(requests, method)
    rows: list[dict | None] = [None] * len(requests)
    lock = threading.Lock()

    def one(i: int) -> None:
        req = requests[i]
        t0 = time.perf_counter()
        reply = client(req, method)
        latency = time.perf_counter() - t0
        rows[i] = row(req, reply, latency)
        with lock:
            bar.update(1)

    t0 = time.perf_counter()
    # The sequential pass, too, runs on a client thread of its own (one after another): torch's CPU
    # kernels run faster on the thread that loaded the model for as long as no other thread has run any
    # (one OpenMP team; batching.py), which a server's or an async front-end's requests never do.
    with ThreadPoolExecutor(workers or 1, thread_name_prefix=f"load-{workers or 'sequential'}") as pool:
        list(pool.map(one, range(len(requests))))  # re-raises a client thread's error here
    return rows, time.perf_counter() - t0


def row(req: Request, reply: Reply, latency: float) -> dict:
    """One request's figures. Forwards, counted so that a forward shared by b replies counts once:

        distinct = prefill forwards + sum(1 / b for b in batch_sizes)

    Each of the b replies that shared a verify forward records b for it, so the b shares of 1/b add up
    to that forward once. The prefill forwards (target_forwards minus the verify forwards) count whole:
    a prompt is prefilled for its own reply. Without batch sizes (an engine without batched rounds, or
    a server that does not report them) every forward is the reply's alone: distinct = target_forwards."""
    batch = reply.batch_sizes
    if reply.target_forwards is None:
        distinct = None
    elif batch:
        distinct = (reply.target_forwards - len(batch)) + sum(1.0 / max(1, b) for b in batch)
    else:
        distinct = float(reply.target_forwards)
    verify = reply.verify_forwards
    # the (rows, distinct forwards) of this reply's verify forwards, for the mean batch: b=1 without sizes
    shares = None if verify is None else (verify, sum(1.0 / max(1, b) for b in batch) if batch else float(verify))
    return {"id": req.id, "source": req.source, "latency_s": latency, "new_tokens": reply.new_tokens,
            "target_forwards": reply.target_forwards, "distinct_forwards": distinct, "batch_sizes": batch,
            "verify_forwards": verify, "verify_shares": shares, "cached_prompt_tokens": reply.cached_prompt_tokens,
            "prefill_s": reply.prefill_s, "decode_s": reply.decode_s, "finish_reason": reply.finish_reason,
            "wave_batch": reply.wave_batch, "same": reply.same, "margins": reply.margins}


def figures(rows: list[dict], wall: float) -> dict:
    """A pass's figures over its rows."""
    lat = np.array([r["latency_s"] for r in rows], dtype=float)
    tokens = sum(r["new_tokens"] for r in rows)
    fwd = [r["target_forwards"] for r in rows]
    distinct = [r["distinct_forwards"] for r in rows]
    shares = [r["verify_shares"] for r in rows]
    known = all(s is not None for s in shares)
    verify_rows = sum(s[0] for s in shares) if known else 0
    verify_distinct = sum(s[1] for s in shares) if known else 0.0
    cached = [r["cached_prompt_tokens"] for r in rows]
    waves = [r["wave_batch"] for r in rows if r.get("wave_batch")]
    return {
        "n": len(rows), "wall_s": wall,
        "req_s": len(rows) / wall if wall > 0 else None,
        "tok_s": tokens / wall if wall > 0 else None,
        "new_tokens": tokens,
        "latency_p50_s": float(np.percentile(lat, 50)), "latency_p95_s": float(np.percentile(lat, 95)),
        "latency_mean_s": float(lat.mean()),
        "forwards_per_request": None if None in fwd else float(np.mean(fwd)),
        "forwards_total": None if None in distinct else float(sum(distinct)),
        # replies per verify forward: rows (one per reply per forward) over the distinct verify forwards
        "mean_batch": (verify_rows / verify_distinct) if known and verify_distinct > 0 else None,
        "cached_prompt_tokens": None if None in cached else float(np.mean(cached)),
        # the replies a sidecar wave's hint reached, and how many requests shared those waves on average
        "hints": len(waves),
        "mean_wave_batch": float(np.mean(waves)) if waves else None,
    }


def _env(engine, client) -> dict:
    if engine is None:
        return {"target": getattr(client, "model", None), "server": getattr(client, "root", None)}
    from .env import environment
    return environment(engine)


# ------------------------------------------------------------------ report and plot

_SCENARIO_TEXT = {
    "cold": "Every pass starts with an empty prefix cache and call memory",
    "agent_loop": "Turn 2 of each record (its expected call and a tool result appended, tool_choice=auto), "
                  "each request's turn 1 served once before every pass, untimed, so its prefix is cached",
}


def _f(x, fmt="{:.2f}", suffix=""):
    return "–" if x is None else fmt.format(x) + suffix


def _ties(f: dict) -> str:
    return f" ({f['replies_tie']} ties)" if f.get("replies_differ") and f.get("replies_tie") is not None else ""


def _hints(f: dict) -> str:
    if f.get("hints") is None:  # a results.json from before the column
        return "–"
    return f"{f['hints']} ({_f(f.get('mean_wave_batch'))})" if f["hints"] else "0"


def table_rows(results: dict) -> list[tuple[str, str, dict]]:
    """(method, concurrency, figures): each method's sequential baseline, then its levels."""
    out = []
    for m, figs in results["methods"].items():
        out.append((m, SEQUENTIAL, figs[SEQUENTIAL]))
        out += [(m, n, f) for n, f in figs["levels"].items()]
    return out


def markdown(results: dict) -> str:
    env, cfg = results["env"], results["config"]
    scenario = results["scenario"]
    where = (f"through the server at {cfg['server']} (model {env.get('target')!r})" if cfg.get("server") else
             f"target {env.get('target')} ({env.get('dtype')}) on {env.get('target_device_name')}; torch "
             f"{env.get('torch')}, {env.get('torch_threads')} threads")
    lines = ["# oospec bench --concurrency", "",
             "```bash", cfg.get("command") or "(command not recorded)", "```", "",
             f"{cfg['n_requests']} requests ({cfg['n_records']} records from `{cfg['data']}`), "
             f"tool_choice={cfg['tool_choice']}, max_new_tokens={cfg['max_new_tokens']}, {where}.", "",
             "Each method serves the same requests one after another on one thread (`sequential`), then with "
             "N client threads at once (`concurrency` N). Latency: one request, from its call to its reply "
             "(p50, p95). Forwards/request: a reply's own target forwards (the prefill's included). Forwards "
             "total: the distinct target forwards of the pass (a verify forward that b replies shared counts "
             "1/b for each; prefills whole). Mean batch: replies per verify forward. x sequential: requests/s "
             "over the method's sequential pass. Replies differ: replies whose tokens (through a server: text "
             "and calls) differ from the same request's sequential reply; ties: those whose first differing token "
             "is a numerical tie (either side's top-2 logit margin there within the dtype's tolerance, "
             "as `oospec bench` counts them). Hints (wave batch): replies that a "
             "sidecar wave's hint reached, and the requests that shared those waves on average.", "",
             f"## Scenario: {scenario}", "", f"{_SCENARIO_TEXT.get(scenario, scenario)}.", "",
             "| method | concurrency | req/s | tok/s | p50 | p95 | forwards/request | forwards total | mean batch "
             "| x sequential | replies differ | hints (wave batch) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, n, f in table_rows(results):
        lines.append(f"| {m} | {n} | {_f(f['req_s'])} | {_f(f['tok_s'], '{:.1f}')} "
                     f"| {_f(f['latency_p50_s'], '{:.2f}', ' s')} | {_f(f['latency_p95_s'], '{:.2f}', ' s')} "
                     f"| {_f(f['forwards_per_request'], '{:.1f}')} | {_f(f['forwards_total'], '{:.1f}')} "
                     f"| {_f(f['mean_batch'])} | {_f(f['x_sequential'], suffix='x')} "
                     f"| {f['replies_differ']} of {f['n']}{_ties(f)} | {_hints(f)} |")
    lines.append("")
    return "\n".join(lines)


def plot(results: dict, path: str | Path) -> None:
    """Requests/s against concurrency, one line per method; its sequential baseline dotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    levels = results["config"]["levels"]
    for i, (m, figs) in enumerate(results["methods"].items()):
        color = f"C{i}"
        xs = [int(n) for n in figs["levels"]]
        ys = [f["req_s"] or 0.0 for f in figs["levels"].values()]
        ax.plot(xs, ys, marker="o", color=color, label=m)
        ax.axhline(figs[SEQUENTIAL]["req_s"] or 0.0, color=color, linewidth=0.8, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xticks(levels, [str(n) for n in levels])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("requests / s (dotted: sequential)")
    env = results["env"]
    ax.set_title(f"{env.get('target')} ({results['scenario']}, {results['config']['n_requests']} requests)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(results: dict, out_dir: str | Path) -> dict[str, Path]:
    """DIR/results.json, DIR/report.md, DIR/load.png."""
    from .report import write_all as write
    return write(results, out_dir, render=markdown, draw=plot, plot_name="load.png")


def command_line(argv: list[str] | None) -> str | None:
    """The command as typed (`--api-key`'s value hidden), for the report."""
    if not argv:
        return None
    import shlex
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        if a == "--api-key":
            hide = True
        elif a.startswith("--api-key="):
            a = "--api-key=***"
        out.append(a)
    return shlex.join(out)
