"""`oospec bench --agent`'s figures: per-method means over the episodes, DIR/results.json, report.md, agent.png.

Per episode: wall (the whole episode), model (the replies' G summed), tool (the steps' T summed: a
step's longest call, as its calls run in parallel) and hidden = tool + model - wall, the tool time
the agent did not wait for. Per tool step (a step whose reply called a tool): G, g (the prediction's
arrival), T, and whether a prediction named exactly the verified call(s). alpha is the share of tool
steps with such a prediction; `bound_s` the most a hit could hide, summed per episode:
sum of [exact] * min(T, G - g) (a step takes max(G, g + T) instead of G + T); `captured` the share of
that bound the method hid.
"""
from __future__ import annotations

from pathlib import Path

from . import report
from .methods import SPLIT_SUFFIX
from .metrics import _mean
from .report import _f


def figures(rows: list[dict], m: str) -> dict:
    """Method `m`'s figures over `rows` (the runner's per-record rows)."""
    runs = [r["runs"][m] for r in rows]
    steps = [s for run in runs for s in run["steps"]]
    tool_steps = [s for s in steps if s["calls"]]
    model = [sum(s["G"] for s in run["steps"]) for run in runs]
    tool = [sum(s["T"] for s in run["steps"]) for run in runs]
    hidden = [t + g - run["wall_s"] for t, g, run in zip(tool, model, runs)]
    bound = [sum(_bound(s) for s in run["steps"]) for run in runs]
    verdicts = [run["check"]["verdict"] for run in runs]
    runner = [run["runner"] for run in runs if run["runner"] is not None]
    counts = {k: sum(r[k] for r in runner) for k in runner[0]} if runner else {}
    n = len(runs)
    out = {
        "n": n,
        "agent_wall_s": _mean([run["wall_s"] for run in runs]),
        "model_s": _mean(model), "tool_s": _mean(tool), "hidden_s": _mean(hidden),
        "steps": len(steps) / n, "tool_steps": len(tool_steps) / n,
        # without a runner nothing started early: its predictions are the distinct calls the stream named
        "predictions": counts.get("predictions", sum(len(s["predicted"]) for s in steps)),
        "hits": counts.get("hits", 0), "wasted": counts.get("wasted", 0),
        "runner": counts or None,
        "alpha": sum(bool(s["exact"]) for s in tool_steps) / len(tool_steps) if tool_steps else None,
        # the bound's terms, over the tool steps (g over those a prediction reached in time to be read)
        "G": _mean([s["G"] for s in tool_steps]), "g": _mean([s["g"] for s in tool_steps]),
        "T": _mean([s["T"] for s in tool_steps]),
        "bound_s": _mean(bound),
        "target_forwards": _mean([sum(s["target_forwards"] for s in run["steps"]) for run in runs]),
        "transcripts_equal": "loss" not in verdicts,
        "transcript_ties": verdicts.count("tie"), "transcript_losses": verdicts.count("loss"),
        "waves_skipped": sum(bool(s["sidecar_skipped"]) for s in steps),
        "invalid_calls": sum(s["invalid_calls"] for s in steps),
        "cut_off": sum(s["finish_reason"] == "length" for s in steps),
        "ended_at_max_steps": sum(bool(run["steps"][-1]["calls"]) for run in runs),
    }
    out["captured"] = out["hidden_s"] / out["bound_s"] if out["bound_s"] and out["bound_s"] > 0 else None
    return out


def _in_time(step: dict, G: float) -> bool:
    """Whether the step's prediction was exact and came before a reply of G seconds ended (a later one
    is never read: the engine polls the hint while it decodes)."""
    return bool(step["exact"]) and step["g"] is not None and step["g"] < G


def _bound(step: dict) -> float:
    """What a hit could hide in this step: min(T, G - g) where a prediction was exact, else 0."""
    if not step["exact"] or step["g"] is None:
        return 0.0
    return max(0.0, min(step["T"], step["G"] - step["g"]))


def summarize(rows: list[dict], methods: list[str]) -> dict:
    """{"methods": {m: figures}, "sources": {source: {m: figures}}}, each with `speedup_vs_toolspec`:
    the same layout's `toolspec` agent wall over `m`'s (and, for an `@split` row, also
    `speedup_vs_toolspec_shared`: over `toolspec` on every core)."""
    def block(recs):
        figs = {m: figures(recs, m) for m in methods}
        for m, f in figs.items():
            base = figs.get("toolspec" + (SPLIT_SUFFIX if m.endswith(SPLIT_SUFFIX) else ""))
            f["speedup_vs_toolspec"] = _ratio(base, f)
            if m.endswith(SPLIT_SUFFIX):
                f["speedup_vs_toolspec_shared"] = _ratio(figs.get("toolspec"), f)
        return figs

    sources: dict[str, list[dict]] = {}
    for r in rows:
        sources.setdefault(r["source"], []).append(r)
    return {"methods": block(rows), "sources": {s: block(rs) for s, rs in sources.items()},
            "two_devices": two_devices(rows, methods)}


def two_devices(rows: list[dict], methods: list[str]) -> dict | None:
    """A projection, not a measurement: the agent on two devices, where the wave costs the target
    nothing. Each step's model time is `toolspec`'s on every core (G: the hint's drafts, which save
    forwards on top, are not counted), its tool time T, and where the `oospec+tools@split` row's
    prediction named the verified call(s) exactly and came before G, the tool starts at that row's g (a
    wave on one CPU core: a GPU's would come sooner): the step takes max(G, g + T) instead of G + T. Device-neutral
    otherwise: the forwards column says what the drafts add. None without both rows."""
    spec = next((m for m in ("oospec+tools" + SPLIT_SUFFIX, "oospec+tools") if m in methods), None)
    if "toolspec" not in methods or spec is None:
        return None
    serial, projected, forwards = [], [], []
    for r in rows:
        base, fast = r["runs"]["toolspec"]["steps"], r["runs"][spec]["steps"]
        if len(base) != len(fast):  # transcripts differ: the steps do not line up
            continue
        serial.append(sum(b["G"] + b["T"] for b in base))
        projected.append(sum(max(b["G"], f["g"] + b["T"]) if _in_time(f, b["G"]) else b["G"] + b["T"]
                             for b, f in zip(base, fast)))
        forwards.append((sum(f["target_forwards"] for f in fast), sum(b["target_forwards"] for b in base)))
    if not serial:
        return None
    return {"from": spec, "n": len(serial), "toolspec_wall_s": _mean(serial), "oospec+tools_wall_s": _mean(projected),
            "speedup": _mean(serial) / _mean(projected),
            "forwards_ratio": sum(f for f, _ in forwards) / max(1, sum(b for _, b in forwards))}


def _ratio(base: dict | None, f: dict) -> float | None:
    return base["agent_wall_s"] / f["agent_wall_s"] if base and f["agent_wall_s"] else None


def write_all(results: dict, out_dir) -> dict[str, Path]:
    """DIR/results.json, DIR/report.md and DIR/agent.png."""
    return report.write_all(results, out_dir, markdown, plot, "agent.png")


def _cell(key: str, fmt: str = "{:.3f}", suffix: str = ""):
    return lambda f: _f(f[key], fmt, suffix)


#: the main table's columns after method and n: (title, cell of a method's figures)
COLUMNS = [("wall s", _cell("agent_wall_s")), ("model s", _cell("model_s")), ("tool s", _cell("tool_s")),
           ("hidden s", _cell("hidden_s")), ("speedup vs toolspec", _cell("speedup_vs_toolspec", "{:.2f}", "x")),
           ("alpha", _cell("alpha", "{:.0%}")), ("G s", _cell("G")), ("g s", _cell("g")), ("T s", _cell("T")),
           ("bound s", _cell("bound_s")), ("captured", _cell("captured", "{:.0%}")),
           ("hits / predictions / wasted", lambda f: f"{f['hits']} / {f['predictions']} / {f['wasted']}"),
           ("steps", _cell("steps", "{:.1f}")), ("target forwards", _cell("target_forwards", "{:.1f}")),
           ("transcripts", lambda f: _transcripts(f))]


def markdown(results: dict) -> str:
    env, cfg, methods = results["env"], results["config"], results["methods"]
    layout = cfg.get("layout") or {}
    lines = [
        "# oospec bench --agent",
        "",
        f"{cfg['n_records']} episodes from `{cfg['data']}`: tool_choice=auto until a reply without calls or "
        f"{cfg['max_steps']} replies, max_new_tokens={cfg['max_new_tokens']}; simulated tools of latency "
        f"`{cfg['tool_latency']}` (mean {cfg['tool_latency_mean_s']:.3f} s), a reply's calls run in parallel; "
        f"target {env['target']} ({env.get('dtype')}) on {env.get('target_device_name')}"
        + (f", sidecar {env['sidecar']}" if env.get("sidecar") else "") + ".",
        *(["", f"`@split` rows: the target on `{layout['split']['target']}`, the sidecar's worker on "
           f"`{layout['split']['sidecar']}`; the other rows: the target on `{layout['shared']['target']}`."]
          if "split" in layout else []),
        "",
        "Seconds are means per episode. hidden = tool + model - wall. alpha: the share of tool steps whose "
        "prediction named exactly the verified call(s); G, g, T: means over the tool steps of the reply's "
        "seconds, the prediction's arrival (from the request) and the step's tool latency; bound: the most a "
        "hit could hide, sum of [exact] x min(T, G - g); captured = hidden / bound. Speedup: the same layout's `toolspec` wall over "
        f"the row's. Transcripts are checked against `{cfg['reference']}`'s (tokens and tool results; a "
        f"divergence at a top-2 logit margin <= {cfg['tie_tolerance']} is a numerical tie, counted apart).",
        "",
        "| method | n | " + " | ".join(title for title, _ in COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    lines += [f"| {m} | {f['n']} | " + " | ".join(cell(f) for _, cell in COLUMNS) + " |" for m, f in methods.items()]
    lines += _mcp_lines(cfg.get("mcp"), methods)
    shared = {m: f["speedup_vs_toolspec_shared"] for m, f in methods.items() if f.get("speedup_vs_toolspec_shared")}
    if shared:
        lines += ["", "`@split` rows against `toolspec` on every core: "
                  + ", ".join(f"{m} {v:.2f}x" for m, v in shared.items()) + "."]
    runners = {m: f["runner"] for m, f in methods.items() if f["runner"]}
    if runners:
        keys = list(next(iter(runners.values())))
        lines += ["", "The speculative runner's counters (totals over the episodes). `hits`: verified calls handed a run "
                  "a prediction started; `ready_hits`: a run a `ToolCallReady` started (the verified call, before the "
                  "reply ended); `wasted`: runs dropped unclaimed (cancelled where the tool had not finished).", "",
                  "| method | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        lines += ["| " + " | ".join([m] + [str(r[k]) for k in keys]) + " |" for m, r in runners.items()]
    notes = [f"{m}: " + ", ".join(f"{n} {what}" for what, n in _notes(f, cfg["max_steps"]) if n)
             for m, f in methods.items() if any(n for _, n in _notes(f, cfg["max_steps"]))]
    if notes:
        lines += ["", "Per method, over all steps: " + "; ".join(notes) + "."]
    proj = results.get("two_devices")
    if proj:
        lines += ["", "## Projected onto two devices (a projection, not a measurement)", "",
                  f"The wave on its own device costs the target nothing: each step's model time G and tool time T "
                  f"are `toolspec`'s on every core, and where `{proj['from']}`'s prediction was exact the tool starts at "
                  f"its g: max(G, g + T) instead of G + T ({proj['n']} episodes whose steps line up). Agent wall per "
                  f"episode: toolspec {proj['toolspec_wall_s']:.3f} s, oospec+tools {proj['oospec+tools_wall_s']:.3f} s, "
                  f"**{proj['speedup']:.2f}x**, before the hint's drafts: its target forwards are "
                  f"{proj['forwards_ratio']:.2f}x toolspec's, which a device where forwards set the time adds on top."]
    names = list(methods)
    lines += ["", "## Agent wall seconds per source", "", "| source | n | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
    for src, figs in results["sources"].items():
        lines.append(f"| {src} | {next(iter(figs.values()))['n']} | "
                     + " | ".join(_f(figs[m]["agent_wall_s"], "{:.3f}") for m in names) + " |")
    lines += ["", f"Run took {cfg['wall_s']} s (git {env.get('git_commit')}).", ""]
    return "\n".join(lines)


def _mcp_lines(mcp: dict | None, methods: dict) -> list[str]:
    """With --mcp: what served the tools, and per method the server's count of calls, early calls and
    early calls of tools it did not declare read-only (`unsafe_early`, always 0)."""
    if not mcp:
        return []
    lines = ["", f"Every tool call was a `tools/call` on a real MCP server process ({mcp['transport']}; the bench trusts "
             f"its annotations): {mcp['rule']} ({len(mcp['read_only'])} tools read-only). Per method, the calls the "
             "server received / of them started early / early calls of a tool not declared read-only:", "",
             "| method | mcp calls | early calls | unsafe early |", "|---|---|---|---|"]
    return lines + [f"| {m} | {f.get('mcp_calls')} | {f.get('early_calls')} | {f.get('unsafe_early')} |"
                    for m, f in methods.items()]


def _notes(f: dict, max_steps: int) -> list[tuple[str, int]]:
    """What else happened in a method's steps, worth a line when it did."""
    return [("waves skipped by the pay-back rule", f["waves_skipped"]), ("unreadable calls (not run)", f["invalid_calls"]),
            ("replies cut off at max_new_tokens", f["cut_off"]),
            (f"episodes ended at {max_steps} replies", f["ended_at_max_steps"])]


def _transcripts(f: dict) -> str:
    word = "same" if f["transcripts_equal"] else f"**{f['transcript_losses']} differ**"
    return word + (f" ({f['transcript_ties']} ties)" if f["transcript_ties"] else "")


def plot(results: dict, path) -> None:
    """One bar per method: model seconds, then the tool seconds the agent waited for (wall - model),
    with the serial sum (model + tool) marked: the gap between the bar's top and the mark is the time hidden."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    names = list(methods)
    model = [methods[m]["model_s"] or 0.0 for m in names]
    waited = [max(0.0, (methods[m]["agent_wall_s"] or 0.0) - x) for m, x in zip(names, model)]
    serial = [x + (methods[m]["tool_s"] or 0.0) for m, x in zip(names, model)]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(names) + 2), 4))
    xs = range(len(names))
    ax.bar(xs, model, 0.6, label="model (replies)")
    ax.bar(xs, waited, 0.6, bottom=model, label="waiting for tools (wall - model)")
    ax.scatter(xs, serial, marker="_", s=900, color="black", label="model + tool (nothing hidden)", zorder=3)
    ax.set_xticks(list(xs), names, rotation=20, ha="right")
    ax.set_ylabel("seconds per episode")
    env, cfg = results["env"], results["config"]
    ax.set_title(f"{env['target']}, tools {cfg['tool_latency']} s, {cfg['n_records']} episodes", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
