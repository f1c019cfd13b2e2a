"""α: how far the sidecar's hint agrees with the call the target writes itself.

The target is the only judge of a hint: a draft token is accepted where it equals the target's own
greedy token, so the label a hint is scored against is the target's own call, not a data set's gold.
In `oospec bench` the target's own call is `ar`'s reply (every lossless method writes it), read with
the tool format; the hint is the first call(s) the sidecar predicted for the reply (the
`CallPredicted` of the round its wave was first read; a follow-up wave, asked after the target wrote
its function, is not scored).

Per record with a hint (`score`):
- `calls`: the target's calls (one unit where it wrote none, or only calls that do not parse);
  `calls_ok`: those whose hint at the same position names the same function with exactly the same
  arguments (no slot more, none less);
- `functions_ok`: those whose hint at the same position names the same function;
- `slots`: the argument slots the target wrote (every key of its calls' arguments); `slots_ok`: those
  the hint, naming the same function, gave exactly the same value (equal as JSON, `1` is not `1.0`).

Over records (`aggregate`): `alpha_call` = calls_ok / calls, `alpha_slots` = slots_ok / slots,
`alpha_function` = functions_ok / calls, `alpha_n` = the records scored (those with a hint).
"""
from __future__ import annotations

import json
from pathlib import Path

_KEYS = ("calls", "calls_ok", "functions_ok", "slots", "slots_ok")


def _same(a, b) -> bool:
    """Equal as JSON text would be: `1` and `1.0`, `true` and `1` differ (their tokens do)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def target_calls(fmt, text: str) -> list[dict]:
    """The calls `text` (a reply as the target wrote it) holds, read with the tool format `fmt`: each
    `{"name", "arguments": dict}`, or with an `error` where it does not parse."""
    try:
        return fmt.parse(text)[1]
    except Exception:  # noqa: BLE001 - a reply that does not read as calls has none
        return []


def score(hint: list[dict] | None, target: list[dict]) -> dict | None:
    """One record's counts (module docstring), with `wrong_slots` (the target's slot -> what the hint
    said, for a right function) and `function` (the hint's first function, or None); None without a hint."""
    if hint is None:
        return None
    good = [c for c in target if "error" not in c and isinstance(c.get("arguments"), dict)]
    out = dict.fromkeys(_KEYS, 0) | {"calls": max(1, len(target)), "wrong_slots": {},
                                      "function": hint[0].get("name") if hint else None}
    for i, call in enumerate(good):
        h = hint[i] if i < len(hint) else None
        args = call["arguments"]
        out["slots"] += len(args)
        if h is None or h.get("name") != call["name"]:
            continue
        out["functions_ok"] += 1
        got = h.get("arguments") if isinstance(h.get("arguments"), dict) else {}
        for key, value in args.items():
            if key in got and _same(got[key], value):
                out["slots_ok"] += 1
            else:
                out["wrong_slots"][key] = got.get(key)
        out["calls_ok"] += _same(got, args)
    return out


def aggregate(scores: list[dict | None]) -> dict:
    """`alpha_call`, `alpha_slots`, `alpha_function` (None where there is nothing to score) and
    `alpha_n` over the records' `score`s (None: no hint)."""
    have = [s for s in scores if s is not None]
    tot = {k: sum(s[k] for s in have) for k in _KEYS}
    share = lambda k, of: tot[k] / tot[of] if tot[of] else None  # noqa: E731
    return {"alpha_call": share("calls_ok", "calls"), "alpha_slots": share("slots_ok", "slots"),
            "alpha_function": share("functions_ok", "calls"), "alpha_n": len(have)}


def forwards_ratio(figs: dict[str, dict], base: str = "toolspec") -> None:
    """Each method's target forwards over `base`'s, into its figures as `forwards_vs_<base>`."""
    ref = (figs.get(base) or {}).get("target_forwards")
    for f in figs.values():
        f[f"forwards_vs_{base}"] = f["target_forwards"] / ref if ref and f.get("target_forwards") else None


def _scored(results: dict) -> list[str]:
    return [m for m, f in results["methods"].items() if f.get("alpha_n")]


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def markdown_lines(results: dict) -> list[str]:
    """report.md's section: per source and method with a hint, α (whole call, slots, function), the
    hint's share of accepted tokens and the forwards over `toolspec`; none where no method hinted."""
    names = _scored(results)
    if not names:
        return []
    hint_first = (results.get("config") or {}).get("hint_first")
    lines = ["", "## The hint against the target's own call (α)", "",
             "α is scored against `ar`'s reply (the target's own call): `call` = the hint's whole call equals it, "
             "`slots` = share of the target's argument slots the hint got exactly, `function` = the same function; "
             "n = records with a hint. `hint share` = the hint's share of the accepted draft tokens. "
             "`fwd / toolspec` = target forwards over `toolspec`'s"
             + (" (with --hint-first: every hint in time)." if hint_first else "."), "",
             "| source | method | n | α call | α slots | α function | hint share | fwd / toolspec |",
             "|---|---|---|---|---|---|---|---|"]
    groups = [*results["sources"].items(), ("**all**", results["methods"])]
    for src, figs in groups:
        for m in names:
            f = figs.get(m) or {}
            lines.append(f"| {src} | {m} | {f.get('alpha_n', 0)} | {_pct(f.get('alpha_call'))} "
                         f"| {_pct(f.get('alpha_slots'))} | {_pct(f.get('alpha_function'))} "
                         f"| {_pct(f.get('hint_share_of_accepted'))} "
                         f"| {'–' if f.get('forwards_vs_toolspec') is None else format(f['forwards_vs_toolspec'], '.2f')} |")
    return lines


def plot(results: dict, path: str | Path) -> Path | None:
    """Grouped bars of α (whole call and slots) per source, for each method with a hint, into `path`;
    None (nothing drawn) without matplotlib or without a method that hinted."""
    names = _scored(results)
    try:
        import matplotlib
    except ImportError:
        return None
    if not names:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = {**results["sources"], "all": results["methods"]}
    bars = [(m, k) for m in names for k in ("alpha_call", "alpha_slots")]
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(groups) + 2), 4))
    for i, (m, k) in enumerate(bars):
        xs = [g + (i - (len(bars) - 1) / 2) * width for g in range(len(groups))]
        ys = [(figs.get(m) or {}).get(k) or 0.0 for figs in groups.values()]
        ax.bar(xs, ys, width, label=f"{m} {k.split('_')[1]}", hatch="//" if k == "alpha_slots" else None)
    ax.set_ylim(0, 1.05)
    ax.set_xticks(range(len(groups)), list(groups), rotation=20, ha="right")
    ax.set_ylabel("α against the target's own call")
    ax.legend(fontsize=8, ncol=min(len(bars), 4))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
