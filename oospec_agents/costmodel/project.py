"""`oospec project`: price a bench run's acceptance traces with a measured cost table.

This is a PROJECTION, never a measurement: the acceptance traces (tree nodes, accepted drafts and
context of every verify forward) come from a bench run, usually on the CPU, and only the cost of each
forward comes from `oospec profile` on the device in question. For every engine method:

    decode  = sum over its rounds of t(nodes, context) + the run's measured host time
    prefill = the cost table's prefill of the prompt's uncached tail after its cached prefix

AR is the engine's own `ar` run, priced the same way (every round one node), and speedups are the
bench's per-token ratios, (T_ar / N_ar) / (T_m / N_m). Host time (drafting, the tree mask, commits,
events) is added as measured in the bench run, unscaled: on a GPU host it is what it was on the CPU
that ran the bench, so the projected speedups are conservative where the GPU's host is faster.
"""
from __future__ import annotations

import json
from pathlib import Path

from .table import EXTRAPOLATE, CostModelError, CostTable, OutsideTable, read_json

KIND = "oospec projection"
BANNER = ("PROJECTION from CPU acceptance traces priced with a measured cost table: not a measurement. "
          "No time below was measured running these requests on the profiled device.")
HOST_NOTE = ("host time per round (drafting, the tree mask, commits, events) is the bench run's own, "
             "host_s summed over each run's rounds, unscaled")
PREFILL_NOTE = ("the prompt's uncached tail after its cached prefix: P(cached + new) - P(cached) from the table's "
               "prefill column (P(0) = 0), at least one forward of min(new, max k) tokens over the prefix")
SIDECAR_NOTE = ("the wave: the sidecar's prefill of the request's uncached shared prefix, then (steps + 1) forwards "
                "of `rows` tokens over the prefix (the fan-out of the rows' suffixes, then one per decode step), "
                "priced with the sidecar's cost table; its queueing is left out. In time: before the target's "
                "projected call (prefill + decode of the oospec run) ends")


def load_results(path: str | Path) -> dict:
    path = Path(path)
    results = read_json(path, "results file", "oospec bench")
    records = results.get("records")
    if not isinstance(records, list) or not records:
        raise CostModelError(f"{str(path)!r} holds no per-record runs: expected the results.json of `oospec bench`")
    if not any(isinstance(run.get("rounds"), list) for r in records for run in r.get("runs", {}).values()):
        raise CostModelError(f"{str(path)!r} has no acceptance traces (no \"rounds\" in its runs): it was written "
                             "before the bench recorded them; rerun `oospec bench` to get them")
    return results


def engine_methods(records: list[dict]) -> list[str]:
    """The methods whose every run carries its rounds, `ar` first: the ones the engine decoded."""
    names = list(records[0]["runs"])
    traced = [m for m in names if all(isinstance(r["runs"].get(m, {}).get("rounds"), list) for r in records)]
    if "ar" not in traced:
        raise CostModelError("the results have no traced `ar` run to project the speedups against: "
                             "run the bench with ar among --methods (it always runs by default)")
    return ["ar"] + [m for m in traced if m != "ar"]


def price_run(run: dict, cost: CostTable) -> dict:
    """One run's projected seconds: its verify forwards, host time and prefill."""
    rounds = run["rounds"]
    forward = sum(cost.verify(nodes, ctx) for nodes, _, ctx in rounds)
    cached = run.get("cached_prompt_tokens") or 0
    prefill = cost.prefill(run["prompt_tokens"] - cached, cached)
    host = run.get("host_s") or 0.0
    return {"forward_s": forward, "host_s": host, "decode_s": forward + host, "prefill_s": prefill,
            "rounds": len(rounds), "nodes": sum(n for n, _, _ in rounds),
            "outside_grid": sum(not cost.in_grid(n, ctx) for n, _, ctx in rounds),
            "measured_forward_s": run["decode_s"] - host if run.get("host_s") is not None else None}


def wave_s(profile: dict, sidecar: CostTable) -> float:
    """The sidecar wave's projected seconds (SIDECAR_NOTE). A two-phase wave (a large tool set,
    sidecar/wave.py: `phases`, `function_steps`, `first_rows` in its profile) is priced phase by phase:
    the first phase's rows and steps, then the rest of the rows over the cached prefix."""
    prefix, cached = profile["prefix_tokens"], profile.get("cached_prefix_tokens") or 0
    head = sidecar.prefill(prefix - cached, cached)
    if "phases" not in profile:
        return head + (profile["steps"] + 1) * sidecar.verify(profile["rows"], prefix)
    first = profile.get("first_rows", 1)
    t = head + (profile["function_steps"] + 1) * sidecar.verify(first, prefix)
    if profile["phases"] == 2:
        t += (profile["steps"] - profile["function_steps"] + 1) * sidecar.verify(profile["rows"] - first, prefix)
    return t


def _speedup(ref: list[dict], runs: list[dict], key: str, ref_tokens: int, tokens: int) -> float | None:
    t_ref, t = sum(_time(r, key) for r in ref), sum(_time(r, key) for r in runs)
    return (t_ref / ref_tokens) / (t / tokens) if t and tokens and ref_tokens else None


def _time(r: dict, key: str) -> float:
    return r["decode_s"] + (r["prefill_s"] if key == "e2e" else 0.0)


def project(results: dict, cost: CostTable, sidecar: CostTable | None = None) -> dict:
    records = results["records"]
    methods = engine_methods(records)
    priced = [{m: price_run(r["runs"][m], cost) for m in methods} for r in records]
    tokens = {m: sum(r["runs"][m]["new_tokens"] for r in records) for m in methods}
    out_methods = {}
    for m in methods:
        mine, ar = [p[m] for p in priced], [p["ar"] for p in priced]
        measured = [r["runs"][m] for r in records]
        measured_ar = [r["runs"]["ar"] for r in records]
        n = len(records)
        fwd = [p["measured_forward_s"] for p in mine]
        out_methods[m] = {
            "n": n,
            "rounds": sum(p["rounds"] for p in mine) / n,
            "mean_tree_nodes": sum(p["nodes"] for p in mine) / max(1, sum(p["rounds"] for p in mine)),
            "rounds_outside_grid": sum(p["outside_grid"] for p in mine),
            "forward_s": sum(p["forward_s"] for p in mine) / n,
            "measured_forward_s": sum(fwd) / n if None not in fwd else None,
            "host_s": sum(p["host_s"] for p in mine) / n,
            "decode_s": sum(p["decode_s"] for p in mine) / n,
            "prefill_s": sum(p["prefill_s"] for p in mine) / n,
            "speedup_decode": _speedup(ar, mine, "decode", tokens["ar"], tokens[m]),
            "speedup_e2e": _speedup(ar, mine, "e2e", tokens["ar"], tokens[m]),
            "measured_speedup_decode": _speedup(measured_ar, measured, "decode", tokens["ar"], tokens[m]),
            "measured_speedup_e2e": _speedup(measured_ar, measured, "e2e", tokens["ar"], tokens[m]),
        }
    out = {"kind": KIND, "label": BANNER,
           "bench": {k: results.get("env", {}).get(k) for k in
                     ("target", "target_device_name", "dtype", "sidecar", "sidecar_device_name", "scenario",
                      "torch_threads", "git_commit")},
           "cost": _meta(cost), "sidecar_cost": _meta(sidecar) if sidecar else None,
           "model": {"interpolation": f"linear in k and in context between grid points; clamped below the grid; "
                                      f"the last segment extended above it, up to {EXTRAPOLATE:g}x its end",
                     "prefill": PREFILL_NOTE, "host": HOST_NOTE},
           "methods": out_methods,
           "records": [{"id": r.get("id"), "source": r.get("source"), "projected": p} for r, p in zip(records, priced)]}
    if sidecar is not None and "oospec" in methods:
        out["sidecar"] = _sidecar(records, priced, sidecar)
    return out


def _sidecar(records: list[dict], priced: list[dict], sidecar: CostTable) -> dict:
    rows = []
    for r, p in zip(records, priced):
        run = r["runs"]["oospec"]
        prof = run.get("sidecar_profile")
        if not prof or prof.get("steps") is None:
            rows.append({"id": r.get("id"), "wave_s": None, "why": run.get("sidecar_skipped") or "no wave"})
            continue
        call = p["oospec"]["prefill_s"] + p["oospec"]["decode_s"]
        try:
            w = wave_s(prof, sidecar)
        except OutsideTable as e:
            raise OutsideTable(f"the sidecar's cost table, record {r.get('id')}: {e}") from None
        rows.append({"id": r.get("id"), "wave_s": w, "call_s": call, "in_time": w < call,
                     "prefix_tokens": prof["prefix_tokens"], "rows": prof["rows"], "steps": prof["steps"],
                     "measured_hint_ready_s": run.get("hint_ready_s"),
                     "measured_call_s": run["prefill_s"] + run["decode_s"]})
    waves = [w for w in rows if w["wave_s"] is not None]
    return {"note": SIDECAR_NOTE, "waves": len(waves), "in_time": sum(w["in_time"] for w in waves),
            "mean_wave_s": sum(w["wave_s"] for w in waves) / len(waves) if waves else None,
            "mean_call_s": sum(w["call_s"] for w in waves) / len(waves) if waves else None,
            "records": rows}


def _meta(cost: CostTable) -> dict:
    return {k: cost.meta.get(k) for k in ("config", "device", "device_name", "dtype", "torch", "transformers",
                                          "torch_threads")} | {"k": cost.k, "context": cost.context,
                                                               "noisy_points": len(cost.meta.get("noisy") or [])}


def _f(x, fmt="{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def to_markdown(p: dict) -> str:
    b, c = p["bench"], p["cost"]
    lines = [f"# Projected speedups ({c['config']} on {c['device_name']}, {c['dtype']})", "",
             f"> **{p['label']}**", "",
             f"- Acceptance traces: `oospec bench`, target {b['target']} on {b['target_device_name']} "
             f"({b['dtype']}), scenario {b['scenario']}, commit {b['git_commit']}.",
             f"- Cost table: {c['config']} on {c['device_name']} ({c['dtype']}, torch {c['torch']}, "
             f"transformers {c['transformers']}), k {c['k']}, context {c['context']}"
             + (f"; **{c['noisy_points']} of its points were noisy** (runs spread over 10%: a busy device?)."
                if c["noisy_points"] else "."),
             f"- Interpolation: {p['model']['interpolation']}.",
             f"- Prefill: {p['model']['prefill']}.",
             f"- Host: {p['model']['host']}.", "",
             "| method | rounds / record | tree nodes / round | projected forwards s | measured forwards s | "
             "host s | **projected decode speedup** | measured decode speedup | **projected e2e speedup** | "
             "measured e2e speedup |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m, f in p["methods"].items():
        lines.append(f"| {m} | {f['rounds']:.1f} | {f['mean_tree_nodes']:.1f} | {_f(f['forward_s'], '{:.3f}')} | "
                     f"{_f(f['measured_forward_s'], '{:.3f}')} | {_f(f['host_s'], '{:.3f}')} | "
                     f"**{_f(f['speedup_decode'])}x** | {_f(f['measured_speedup_decode'])}x | "
                     f"**{_f(f['speedup_e2e'])}x** | {_f(f['measured_speedup_e2e'])}x |")
    outside = {m: f["rounds_outside_grid"] for m, f in p["methods"].items() if f["rounds_outside_grid"]}
    lines += ["", "Seconds are per record (means). \"Measured\" columns are the bench run's own, on "
              f"{b['target_device_name']}: they compare with the projection only when the cost table was "
              "profiled on that same machine."]
    if outside:
        lines.append(f"Rounds priced by extrapolation past the grid's end: {outside}.")
    s = p.get("sidecar")
    if s:
        sc = p["sidecar_cost"]
        lines += ["", f"## Sidecar wave ({sc['config']} on {sc['device_name']}, {sc['dtype']}): projected", "",
                  f"{s['note']}.", "",
                  f"**{s['in_time']} of {s['waves']} hints projected in time**; mean wave "
                  f"{_f(s['mean_wave_s'], '{:.3f}')} s against a mean call of {_f(s['mean_call_s'], '{:.3f}')} s.", "",
                  "| record | prefix tokens | rows | steps | projected wave s | projected call s | in time |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for w in s["records"]:
            if w["wave_s"] is None:
                lines.append(f"| {w['id']} | | | | – | | {w['why']} |")
            else:
                lines.append(f"| {w['id']} | {w['prefix_tokens']} | {w['rows']} | {w['steps']} | {w['wave_s']:.3f} | "
                             f"{w['call_s']:.3f} | {'yes' if w['in_time'] else 'no'} |")
    return "\n".join(lines) + "\n"


def add_parser(sub, name):
    p = sub.add_parser(name, help="project decode/e2e speedups on a profiled device from a bench run's traces",
                       description=__doc__)
    p.add_argument("--results", required=True, help="results.json of `oospec bench` (with acceptance traces)")
    p.add_argument("--cost", required=True, help="the target's cost.json from `oospec profile`")
    p.add_argument("--sidecar-cost", default=None,
                   help="the sidecar's cost.json: projects whether its hints arrive in time")
    p.add_argument("--out", default="projection.md",
                   help="markdown report; the JSON goes next to it with a .json suffix (default projection.md)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=run)


def run(args):
    results = load_results(args.results)
    cost = CostTable.load(args.cost)
    sidecar = CostTable.load(args.sidecar_cost) if args.sidecar_cost else None
    p = project(results, cost, sidecar) | {"results_file": str(args.results)}
    md = Path(args.out).with_suffix(".md")
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(to_markdown(p))
    md.with_suffix(".json").write_text(json.dumps(p, indent=1) + "\n")
    if not args.quiet:
        print(md.read_text())
    print(f"wrote {md}, {md.with_suffix('.json')}")
    return 0
