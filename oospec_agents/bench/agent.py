"""`oospec bench --agent`: multi-step agent episodes, with tool time, per method.

An episode starts from a record's conversation and loops as an agent does: ask the model
(`tool_choice="auto"`), run the calls of its reply, append the reply and the tool results, ask again,
until a reply without calls or `max_steps` replies. The tools are simulated (agent_tools.py): each
call sleeps its latency and returns the dataset's own result or a canned one. The calls of one reply
run in parallel, as `create_agent`'s tool node and `FunctionAgent` run them; so a step's tool time is
its longest call's latency.

Methods (each also `@split` with `--layout split|both`: the target on its core set, the sidecar's
worker on its own, as the decode bench's `@split` rows):
    toolspec       the engine's `toolspec`; the tools run after the reply
    oospec         the engine's `oospec` (the sidecar's wave, the pay-back rule); tools after the reply
    oospec+tools   `oospec` plus `SpeculativeTools` (speculative.py), every simulated tool marked
                   speculative: fed by the stream's `CallPredicted` / `ToolCallReady` (`on_event`),
                   settled with the reply's calls, each verified call run through `runner.run`; the
                   engine is told the tools' expected latency (`speculative_tools=`: the runner's mean
                   of measured runs, or `--tool-latency`'s mean before any), which its pay-back rule weighs

With `--mcp` (stdio or http) every call, speculative or not, is a `tools/call` on a real MCP server
process (agent_tools.McpTools) whose annotations say which tools are read-only (a stated rule on the
tool's name); the runner holds only those (the bench trusts its own server), and results.json adds,
per method, `unsafe_early`: the early calls the server received of any tool it did not declare
read-only (always 0), beside `mcp_calls` and `early_calls`.

Every method runs every record, interleaved (the order rotated per record, as the decode bench does),
each episode on an empty prefix cache and call memory; within the episode both keep the earlier
steps, as one agent session's requests do. Each step records G (the reply's seconds, request to
`Generation`), g (the first `CallPredicted` that named the verified call(s), else the first one, in
seconds from the request) and T (the step's tool latency); agent_report.py turns them into the
figures of results.json.
"""
from __future__ import annotations

import concurrent.futures
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from ..engine import Generation
from ..events import CallPredicted
from ..sidecar import cores
from ..speculative import SpeculativeTools, call_key
from .agent_tools import Latency, McpTools, Simulator
from .methods import SPLIT_SUFFIX, _wait_for_sidecar
from .metrics import compare, tie_tolerance

#: the agent methods: name -> (the engine's method, whether a speculative runner runs the tools)
AGENT_METHODS = {"toolspec": ("toolspec", False), "oospec": ("oospec", False), "oospec+tools": ("oospec", True)}
DEFAULT_METHODS = tuple(AGENT_METHODS)


@dataclass
class AgentConfig:
    methods: tuple[str, ...] = DEFAULT_METHODS  # with their `@split` rows already added (`with_layout`)
    latency: Latency = field(default_factory=lambda: Latency(1.0))
    max_steps: int = 4
    max_new_tokens: int = 256
    warmup: bool = True
    progress: bool = True
    max_in_flight: int = 4                       # SpeculativeTools' bound on runs in flight
    mcp: str | None = None                       # serve the tools from an MCP server: "stdio" or "http"


def check_methods(names, layout: str = "shared") -> list[str]:
    """The agent methods asked for, each in the layouts asked for: `shared` as named, `split` as
    `m@split`, `both` as `m` then `m@split`. An unknown name is a ValueError naming the known ones."""
    names = list(dict.fromkeys(names))
    if not names:
        raise ValueError(f"--methods names no method; expected some of {list(AGENT_METHODS)}")
    unknown = [m for m in names if m.removesuffix(SPLIT_SUFFIX) not in AGENT_METHODS]
    if unknown:
        raise ValueError(f"unknown agent method(s) {unknown}; expected some of {list(AGENT_METHODS)} "
                         f"(each also as m{SPLIT_SUFFIX}, or all of them with --layout split|both)")
    if layout == "shared":
        return names
    out = []
    for m in names:
        if layout == "both" or m.endswith(SPLIT_SUFFIX):
            out.append(m)
        out.append(m.removesuffix(SPLIT_SUFFIX) + SPLIT_SUFFIX)
    return list(dict.fromkeys(out))


def engine_method(m: str) -> str:
    return AGENT_METHODS[m.removesuffix(SPLIT_SUFFIX)][0]


def uses_runner(m: str) -> bool:
    return AGENT_METHODS[m.removesuffix(SPLIT_SUFFIX)][1]


@dataclass
class Step:
    """One model request of an episode and the tools it called."""
    G: float                           # the reply's seconds, request to Generation
    g: float | None                    # the prediction's arrival, seconds from the request (None: none came)
    T: float                           # the step's tool latency: its longest call's (they run in parallel)
    tools_wall: float                  # the measured seconds from the reply's end to the last tool result
    calls: list[dict]                  # the verified calls, {"name", "arguments"}
    exact: bool | None                 # a tool step: did a prediction name exactly its call(s); None: no calls
    predicted: list[dict]              # the calls the step's predictions named, distinct, in order
    results: list[str]                 # the tool messages' contents, in call order
    token_ids: list[int]
    margins: list[float] | None
    text: str                          # the whole reply as the target wrote it
    content: str                       # its text outside the calls (the assistant message's content)
    target_forwards: int
    finish_reason: str
    invalid_calls: int                 # calls the reply wrote that could not be read (not run)
    sidecar_skipped: str | None
    hidden_estimate_s: float | None    # what the pay-back rule expected the wave to hide of the tool time

    def row(self, transcript: bool) -> dict:
        out = {k: getattr(self, k) for k in ("G", "g", "T", "tools_wall", "exact", "target_forwards",
                                             "finish_reason", "invalid_calls", "sidecar_skipped",
                                             "hidden_estimate_s")}
        out |= {"new_tokens": len(self.token_ids), "calls": [c["name"] for c in self.calls],
                "predicted": [c["name"] for c in self.predicted]}
        if transcript:  # the reference's, and any transcript that differs from it
            out |= {"text": self.text, "arguments": [c["arguments"] for c in self.calls], "results": self.results}
        return out


class AgentBench:
    """The engines, the simulated tools and one speculative runner per `+tools` row, for one run."""

    def __init__(self, engine, config: AgentConfig, tools: dict[str, dict], results=None, split_engine=None):
        """`tools`: {name: OpenAI function dict} of every tool the records offer."""
        self.engine, self.split_engine, self.config = engine, split_engine, config
        self.sim = Simulator(config.latency, results)
        self.mcp = McpTools(self.sim, tools, config.mcp) if config.mcp else None
        self.runners = {m: self._runner(m, list(tools)) for m in config.methods if uses_runner(m)}
        self.pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="oospec-agent-tools")

    def _runner(self, m: str, names: list[str]) -> SpeculativeTools:
        """Method `m`'s runner: every simulated tool, or with MCP the ones its server declares read-only;
        each expected to take `--tool-latency`'s mean until measured (the engine's pay-back rule)."""
        tools = self.mcp.speculative(m) if self.mcp else self.sim.speculative(names)
        return SpeculativeTools(tools, max_in_flight=self.config.max_in_flight,
                                tool_seconds=dict.fromkeys(tools, self.config.latency.expected))

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.mcp is not None:
            self.mcp.close()

    def episode(self, rec: dict, m: str) -> dict:
        """Run one episode of `rec` with method `m`; {"wall_s", "steps": [Step], "runner": stats delta}."""
        engine = self.split_engine if m.endswith(SPLIT_SUFFIX) else self.engine
        runner = self.runners.get(m)
        before = runner.stats if runner else None
        engine.clear_call_memory()   # each episode is a new session: no method retrieves another's output
        engine.clear_prefix_cache()  # and starts cold
        for each in {id(e): e for e in (self.engine, self.split_engine) if e is not None}.values():
            _wait_for_sidecar(each)  # both layouts' waves: a late one of the other engine shares these cores
        place = cores.pinned(engine.place.cores) if m.endswith(SPLIT_SUFFIX) else nullcontext()
        messages, steps = [dict(x) for x in rec["messages"]], []
        with place:
            began = time.perf_counter()
            for k in range(self.config.max_steps):
                self.sim.at(rec, k)
                step = self._step(engine, messages, rec["tools"], m, runner)
                steps.append(step)
                if not step.calls:
                    break
                messages += _turn(step, k)
            wall = time.perf_counter() - began
        after = runner.stats if runner else None
        return {"wall_s": wall, "steps": steps,
                "runner": None if runner is None else {k: after[k] - before[k] for k in after}}

    def _step(self, engine, messages, tools, m: str, runner: SpeculativeTools | None) -> Step:
        extra = {"speculative_tools": runner.expected_latency()} if runner is not None else {}
        predictions: list[tuple[float, list[dict]]] = []
        gen = None
        t0 = time.perf_counter()
        for event in engine.stream(messages, tools, tool_choice="auto", max_new_tokens=self.config.max_new_tokens,
                                   method=engine_method(m), record_margins=True, **extra):
            if runner is not None:
                runner.on_event(event)
            if isinstance(event, CallPredicted):
                predictions.append((time.perf_counter() - t0, event.calls))
            elif isinstance(event, Generation):
                gen = event
        G = time.perf_counter() - t0
        calls = [{"name": c["name"], "arguments": c["arguments"]} for c in gen.tool_calls]
        if runner is not None:
            runner.settle(calls)
        T = max((self.sim.answer(c["name"], c["arguments"])[0] for c in calls), default=0.0)
        t1 = time.perf_counter()
        results = self._run_tools(calls, runner, m)
        tools_wall = time.perf_counter() - t1
        g, exact = _lead(predictions, calls)
        s = gen.stats
        return Step(G, g, T, tools_wall, calls, exact, _distinct(predictions), results, list(gen.token_ids),
                    s.margins, gen.text, gen.content, s.target_forwards, gen.finish_reason, len(gen.invalid_tool_calls),
                    s.sidecar_skipped, getattr(s, "hidden_estimate_s", None))

    def _run_tools(self, calls: list[dict], runner: SpeculativeTools | None, m: str) -> list[str]:
        """Run the verified calls, in parallel when there are several; through the runner where there is
        one (it hands over an identical speculative run's result, else runs the call); with MCP, each a
        `tools/call` on the server."""
        def one(c):
            if self.mcp is not None:
                run = lambda: self.mcp.call(c["name"], c["arguments"], m)  # noqa: E731
            else:
                run = lambda: self.sim.call(c["name"], c["arguments"])  # noqa: E731
            return run() if runner is None else runner.run(c["name"], c["arguments"], run)
        if len(calls) < 2:
            return [one(c) for c in calls]
        return list(self.pool.map(one, calls))


def _lead(predictions: list[tuple[float, list[dict]]], calls: list[dict]) -> tuple[float | None, bool | None]:
    """(g, exact): `exact` when one prediction named every verified call exactly (name and canonical
    arguments; None for a step without calls), and g that prediction's arrival (else the first one's)."""
    if not calls:
        return (predictions[0][0] if predictions else None), None
    wanted = {call_key(c["name"], c["arguments"]) for c in calls}
    for seconds, predicted in predictions:
        named = {_key(c) for c in predicted}
        if wanted <= named:
            return seconds, True
    return (predictions[0][0] if predictions else None), False


def _key(call: dict):
    try:
        return call_key(call.get("name"), call.get("arguments") or {})
    except ValueError:  # a prediction that is no runnable call
        return None


def _distinct(predictions) -> list[dict]:
    seen, out = set(), []
    for _, calls in predictions:
        for c in calls:
            if (k := _key(c)) not in seen:
                seen.add(k)
                out.append(c)
    return out


def _turn(step: Step, k: int) -> list[dict]:
    """The assistant message of a step with calls, and one tool message per call. The call ids are the
    step's and the call's index, the same in every method, so every method's next prompt is the same."""
    ids = [f"call_{k}_{i}" for i in range(len(step.calls))]
    assistant = {"role": "assistant", "content": step.content, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"],
                                                                                             ensure_ascii=False)}}
        for i, c in zip(ids, step.calls)]}
    return [assistant] + [{"role": "tool", "tool_call_id": i, "name": c["name"], "content": r}
                          for i, c, r in zip(ids, step.calls, step.results)]


def transcript_check(ref: list[Step], out: list[Step], tol: float) -> dict:
    """{"verdict": "exact" | "tie" | "loss", "step", "at", "margin", "what"}: the first step where `out`'s
    transcript leaves `ref`'s. Tokens are compared as the decode bench compares them (metrics.compare),
    with either side's top-2 logit margin at the divergence (a numerical tie: both within the dtype's
    rounding); then the tool results. Later steps follow from a divergence and are not compared."""
    for k, (a, b) in enumerate(zip(ref, out)):
        if a.token_ids != b.token_ids:
            check = compare(a.token_ids, a.margins or [], b.token_ids, tol)
            if check["verdict"] == "loss" and b.margins:  # the other side's margin at the same place
                swapped = compare(b.token_ids, b.margins, a.token_ids, tol)
                check = swapped if swapped["verdict"] == "tie" else check
            return check | {"step": k, "what": "tokens"}
        if a.results != b.results:
            return {"verdict": "loss", "at": None, "margin": None, "step": k, "what": "tool results"}
    if len(ref) != len(out):
        return {"verdict": "loss", "at": None, "margin": None, "step": min(len(ref), len(out)), "what": "steps"}
    return {"verdict": "exact", "at": None, "margin": None, "step": None, "what": None}


def run_agent_bench(engine, records: list[dict], config: AgentConfig, *, results: dict | None = None,
                    split_engine=None, data: str | None = None) -> dict:
    """Every method's episode on every record, interleaved; returns what agent_report.write_all saves.
    `results`: the dataset's recorded tool results (agent_tools.recorded_results)."""
    from .agent_report import summarize
    if config.max_steps < 1:
        raise ValueError(f"--max-steps must be >= 1, got {config.max_steps}")
    if not records:
        raise ValueError("the agent benchmark got no record")
    methods = list(config.methods)
    if split_engine is None and (split := [m for m in methods if m.endswith(SPLIT_SUFFIX)]):
        raise ValueError(f"method(s) {split} need a split layout: pass --layout split or both")
    tol = tie_tolerance(getattr(getattr(engine, "target", None), "dtype", None))
    tools: dict[str, dict] = {}
    for rec in records:
        for t in rec["tools"]:
            tools.setdefault(t["function"]["name"], t["function"])
    bench = AgentBench(engine, config, dict(sorted(tools.items())), results, split_engine)
    started = time.time()
    bar = tqdm(total=(len(records) + int(config.warmup)) * len(methods), desc="oospec bench --agent", unit="episode",
               disable=not config.progress)
    try:
        if config.warmup:
            _record(bench, records[0], methods, 0, tol, bar)
        rows = [_record(bench, rec, methods, i, tol, bar) for i, rec in enumerate(records)]
    finally:
        bar.close()
        bench.close()
    out = summarize(rows, methods)
    if bench.mcp is not None:
        for m, counts in bench.mcp.counts(methods).items():
            out["methods"][m] |= counts
    out["episodes"] = rows
    out["env"] = _environment(engine)
    out["config"] = {"data": data, "n_records": len(records), "methods": methods, "tool_latency": str(config.latency),
                     "tool_latency_mean_s": config.latency.expected, "max_steps": config.max_steps,
                     "max_new_tokens": config.max_new_tokens, "tool_choice": "auto", "warmup": config.warmup,
                     "tools_in_parallel": True, "max_in_flight": config.max_in_flight, "tie_tolerance": tol,
                     "reference": methods[0], "wall_s": round(time.time() - started, 1),
                     "layout": _layouts(engine, split_engine), "mcp": _mcp_config(bench.mcp)}
    return out


def _mcp_config(mcp: McpTools | None) -> dict | None:
    if mcp is None:
        return None
    from .agent_tools import WRITE_VERBS
    return {"transport": mcp.transport, "server": mcp.SERVER, "trusted": [mcp.SERVER], "read_only": mcp.read_only,
            "rule": "destructive when the tool name's first word is a write verb, else read-only",
            "write_verbs": sorted(WRITE_VERBS)}


def _record(bench: AgentBench, rec: dict, methods: list[str], index: int, tol: float, bar) -> dict:
    """One record's episodes, every method, the order after the first rotated by the record's index."""
    others = methods[1:]
    k = index % len(others) if others else 0
    runs = {}
    for m in [methods[0]] + others[k:] + others[:k]:
        bar.set_postfix_str(f"{rec['id']} {m}"[-48:])
        runs[m] = bench.episode(rec, m)
        bar.update(1)
    ref = runs[methods[0]]["steps"]
    row = {"id": rec["id"], "source": rec["source"], "runs": {}}
    for m in methods:
        r = runs[m]
        check = transcript_check(ref, r["steps"], tol)
        keep = m == methods[0] or check["verdict"] != "exact"
        row["runs"][m] = {"wall_s": r["wall_s"], "runner": r["runner"], "check": check,
                          "steps": [s.row(keep) for s in r["steps"]]}
    return row


def _environment(engine) -> dict:
    from .env import environment
    if getattr(engine, "target", None) is None:  # a test double that decodes without a model
        return {"target": getattr(engine, "model_name", type(engine).__name__), "target_device_name": "none",
                "dtype": None, "sidecar": None, "git_commit": None}
    return environment(engine)


def _layouts(engine, split_engine) -> dict:
    from .runner import _layout
    return _layout(engine, split_engine)
