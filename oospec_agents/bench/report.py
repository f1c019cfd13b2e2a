"""Write a benchmark's results: DIR/results.json, DIR/report.md and DIR/speedup.png."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from . import alpha
from .methods import STRICT_SUFFIX, plain_name, strict_name

#: how to get the plot that a run without matplotlib leaves out
MISSING_PLOT = 'which the bench extra installs: pip install "oospec-agents[bench]"'


def write_all(results: dict, out_dir: str | Path, render=None, draw=None,
              plot_name: str = "speedup.png") -> dict[str, Path]:
    """DIR/results.json, DIR/report.md (`render(results)`, default `markdown`) and DIR/<plot_name>
    (`draw(results, path)`, default `plot`); the agent benchmark passes its own (agent_report.py)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.json", "report": out / "report.md", "plot": out / plot_name}
    paths["results"].write_text(json.dumps(results, indent=2, ensure_ascii=False, default=str) + "\n")
    paths["report"].write_text((render or markdown)(results))
    try:
        (draw or plot)(results, paths["plot"])
    except ModuleNotFoundError as e:  # the tables and results stand without the picture
        if e.name != "matplotlib":
            raise
        print(f"no {plot_name}: drawing it takes matplotlib, {MISSING_PLOT}", file=sys.stderr)
        del paths["plot"]
    return paths


def _f(x, fmt="{:.2f}", suffix=""):
    return "–" if x is None else fmt.format(x) + suffix


def _lossless(f: dict) -> str:
    word = "yes" if f["lossless"] else f"**no: {f['losses']} lost**"
    return word + (f" ({f['numerical_ties']} ties)" if f["numerical_ties"] else "")


def _same_as_ar(f: dict) -> str:
    """Under --temperature: how many replies are `ar`'s tokens (sampling is lossless in distribution, not per reply)."""
    return f"{f['n'] - f['losses'] - f['numerical_ties']} of {f['n']}"


def markdown(results: dict) -> str:
    env, cfg, methods = results["env"], results["config"], results["methods"]
    runtime = {"ProcessSidecar": " (its own process)", "RaySidecar": " (a Ray actor)"}.get(env.get("sidecar_runtime"), "")
    dev = env["target_device_name"] + (f", sidecar on {env['sidecar_device_name']}{runtime}"
                                       if env.get("sidecar_device_name") else "")
    sampled = bool(cfg.get("temperature"))
    lines = [
        "# oospec bench",
        "",
        f"{cfg['n_records']} records from `{cfg['data']}`, tool_choice={cfg['tool_choice']}, "
        f"max_new_tokens={cfg['max_new_tokens']}; target {env['target']} ({env['dtype']}) on {dev}; "
        f"torch {env['torch']}, transformers {env['transformers']}, {env['torch_threads']} threads.",
        "",
        "Speedups are over `ar` (per-token time; decode excludes the prompt's prefill, e2e includes it). "
        "Accepted tokens = tokens committed per target forward. Lossless: tokens equal AR's except at "
        f"numerical ties (AR's top-2 logit margin <= {cfg['tie_tolerance']}).",
        *_scenario_lines(cfg.get("scenario", "cold")),
        *_strict_lines(cfg),
        *_layout_lines(cfg),
        *_sampling_lines(cfg),
        *(["", "**--hint-first**: the target waited for the sidecar's wave before its first decode round, so every "
               "hint was in time: the target forwards are a sidecar's that is always in time (on its own "
               "accelerator); `oospec`'s wall-clock speedups are not speed figures in this run."]
          if cfg.get("hint_first") else []),
        "",
        "| method | n | speedup decode | speedup e2e | decode tok/s | mean accepted tokens | target forwards "
        "| hint_ready_s | hint_bytes | vs oracle | " + ("same tokens as ar |" if sampled else "lossless |"),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, f in methods.items():
        lines.append(f"| {name} | {f['n']} | {_f(f['speedup_decode'], suffix='x')} | {_f(f['speedup_e2e'], suffix='x')} "
                     f"| {_f(f['decode_tok_s'], '{:.1f}')} | {_f(f['mean_accepted_tokens'])} "
                     f"| {_f(f['target_forwards'], '{:.1f}')} | {_f(f['hint_ready_s'], '{:.3f}')} "
                     f"| {_f(f['hint_bytes'], '{:.0f}')} | {_f(f['vs_oracle'], '{:.0%}')} "
                     f"| {_same_as_ar(f) if sampled else _lossless(f)} |")
    if any(f.get("answer_part") for f in methods.values()):
        lines += _answer_part(methods)
    if any(m.endswith(STRICT_SUFFIX) for m in methods):
        lines += _strict_against_plain(methods)
    if "cold" in results:
        lines += _warm_against_cold(results)
    if cfg.get("wave_payback") == "off" and "oospec" in methods and "toolspec" in methods:
        lines += _payback_sweep(results)
    lines += _per_source(results, "Decode speedup per source", lambda f: _f(f["speedup_decode"], suffix="x"))
    lines += _per_source(results, "Tokens per target forward, per source", lambda f: _f(f["mean_accepted_tokens"]))
    lines += alpha.markdown_lines(results)
    lines += _accepted_lines(methods)
    lines += _time_lines(methods)
    lines += _wave_lines(methods)
    skipped = {m: f["waves_skipped"] for m, f in methods.items() if f.get("waves_skipped")}
    if skipped:
        lines += ["", "Waves the pay-back rule skipped (the sidecar shares the target's cores, and its wave was "
                  "expected to cost more than the share of the decode a hint can save): " + ", ".join(f"{m}: {n}/{methods[m]['n']}" for m, n in skipped.items())]
    errors = {m: f["sidecar_errors"] for m, f in methods.items() if f["sidecar_errors"]}
    if errors:
        lines += ["", "Sidecar errors (the target decoded on without a hint): "
                  + ", ".join(f"{m}: {n}" for m, n in errors.items())]
    lines += ["", f"Run took {cfg['wall_s']} s (git {env.get('git_commit')}).", ""]
    return "\n".join(lines)


def _accepted_lines(methods: dict) -> list[str]:
    """The draft tokens each method accepted, by drafter (none where no method drafted)."""
    accepted = {m: f["accepted_by_source"] for m, f in methods.items() if f["accepted_by_source"]}
    if not accepted:
        return []
    # strict runs add the tokens their grammar forced (committed unverified: jump-forward)
    sources = ["schema", "retrieval", "hint"] + (["grammar"] if any(a.get("grammar") for a in accepted.values())
                                                 else [])
    lines = ["", "## Accepted draft tokens by drafter", "", "| method | " + " | ".join(sources) + " |",
             "|---" * (len(sources) + 1) + "|"]
    return lines + ["| " + " | ".join([m] + [str(a.get(s, 0)) for s in sources]) + " |" for m, a in accepted.items()]


def _time_lines(methods: dict) -> list[str]:
    """Where each method's time goes: prefill, decode, per round, host share, hints in time."""
    lines = ["", "## Where the time goes", "",
             "| method | e2e s / record | prefill s | decode s | ms per decode round | of which host ms "
             "| host share of decode | hints in time |",
             "|---|---|---|---|---|---|---|---|"]
    for m, f in methods.items():
        e2e = None if f["prefill_s"] is None else f["prefill_s"] + f["decode_s"]
        hints = f"{f['hints_in_time']}/{f['hints']}" if f["hints"] else "–"
        lines.append(f"| {m} | {_f(e2e, '{:.3f}')} | {_f(f['prefill_s'], '{:.3f}')} | {_f(f['decode_s'], '{:.3f}')} "
                     f"| {_f(f['round_ms'], '{:.1f}')} | {_f(f.get('host_ms_per_round'), '{:.2f}')} "
                     f"| {_f(f.get('host_share'), '{:.1%}')} | {hints} |")
    return lines


def _wave_lines(methods: dict) -> list[str]:
    """The sidecar's wave against the target's call, per method that ran one (none where none did)."""
    waves = {m: (f["sidecar_wave"], f) for m, f in methods.items() if f.get("sidecar_wave")}
    if not waves:
        return []
    lines = ["", "The sidecar's wave against the target's call (means over the records whose wave finished; "
             "times from the request's arrival):", "",
             "| method | waves | prefix tokens | of them cached | rows | queued s | wave prefill s | decode steps "
             "| wave decode s | hint_ready_s | target prefill s | target call s | hint share |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, (w, f) in waves.items():
        lines.append(f"| {m} | {w['n']} | {_f(w['prefix_tokens'], '{:.0f}')} "
                     f"| {_f(w.get('cached_prefix_tokens'), '{:.0f}')} | {_f(w['rows'], '{:.1f}')} "
                     f"| {_f(w['queued_s'], '{:.3f}')} | {_f(w['prefill_s'], '{:.3f}')} | {_f(w['steps'], '{:.1f}')} "
                     f"| {_f(w['decode_s'], '{:.3f}')} | {_f(f['hint_ready_s'], '{:.3f}')} "
                     f"| {_f(f['prefill_s'], '{:.3f}')} | {_f(f['prefill_s'] + f['decode_s'], '{:.3f}')} "
                     f"| {_f(f['hint_share'], '{:.0%}')} |")
    return lines


_SCENARIO_TEXT = {
    "warm_tools": "Scenario **warm tools**: before each measured request, every method's engine served one request "
                  "with the same system prompt and tools and another user message, so those are in the prefix "
                  "cache and the question is not; the retrieval memory is cleared after it. The tables show "
                  "the warm request; *Warm against cold* sets it beside the same request on an empty cache.",
    "agent_loop": "Scenario **agent loop**: each record is turn 1; the measured request is turn 2, the same "
                  "conversation plus the record's expected call(s) and a tool result for each, with "
                  "tool_choice=auto, as an agent loop sends after every tool call. Warm: the prefix cache "
                  "kept turn 1; cold: emptied before turn 2. Retrieval keeps turn 1's reply in both.",
    "history": "Scenario **history**: each record on an empty prefix cache, but every method's retrieval memory "
               "holds the replies that method wrote to the earlier records, in record order (per tool set, as "
               "a deployment's call memory does); the warm-up's replies are forgotten.",
}


def _scenario_lines(scenario: str) -> list[str]:
    return ["", _SCENARIO_TEXT[scenario]] if scenario in _SCENARIO_TEXT else []


def _sampling_lines(cfg: dict) -> list[str]:
    if not cfg.get("temperature"):
        return []
    return ["", f"`--temperature {cfg['temperature']}`: every method samples (sampling.py: lossless in "
            f"distribution), with one seed per record (from {cfg['seed']}) for all of them; one uniform is "
            "drawn per committed token, so where the logits agree bit for bit a method gives `ar`'s tokens; "
            "`same tokens as ar` counts the replies where they did. Where bf16 logits differ by a rounding, a "
            "draw may land on another token: that is no loss, as a sampled reply is one draw of the target's "
            "distribution (the statistical tests of tests/test_sampling.py check that distribution)."]


def _layout_lines(cfg: dict) -> list[str]:
    layout = cfg.get("layout") or {}
    if "split" not in layout:
        return []
    shared, split = layout["shared"], layout["split"]
    return ["", f"`--layout`: the `@split` rows keep the target to `{split['target']}` and the sidecar's worker "
            f"process to `{split['sidecar']}` (a core set is a device); the other rows run the target on "
            f"`{shared['target']}` with the sidecar on `{shared['sidecar']}`. Every speedup is over `ar` on "
            "the shared layout."]


def _strict_lines(cfg: dict) -> list[str]:
    if not cfg.get("strict"):
        return []
    return ["", f"`--strict`: the `{STRICT_SUFFIX}` rows decode under the grammar of valid calls "
            "(`engine.generate(..., strict=True)`: the grammar masks the target's logits, jump-forward commits "
            f"the tokens it forces). They are checked against `{strict_name('ar')}`'s tokens (the masked "
            "reference) and their margins; their speedups are over the plain `ar`, like every row's."]


def _answer_part(methods: dict) -> list[str]:
    """A reasoning target: the reply after its reasoning closed (where the calls are), per method."""
    spec = methods.get("toolspec", {}).get("answer_part") or {}
    lines = ["", "## After the reasoning: the answer part", "",
             "The target reasons in a block first; these figures count the reply after the forward that closed "
             "the block (the calls, where the sidecar's hint is drafted), over the records where it closed.", "",
             "| method | records | reasoning tokens | answer tokens | answer forwards | tokens per forward "
             "| answer decode speedup over ar | over toolspec |",
             "|---|---|---|---|---|---|---|---|"]
    for m, f in methods.items():
        a = f.get("answer_part")
        if not a:
            continue
        over = a["speedup_decode"] / spec["speedup_decode"] if a["speedup_decode"] and spec.get("speedup_decode") \
            else None
        lines.append(f"| {m} | {a['n']} | {_f(a['reasoning_tokens'], '{:.1f}')} | {_f(a['new_tokens'], '{:.1f}')} "
                     f"| {_f(a['target_forwards'], '{:.1f}')} | {_f(a['mean_accepted_tokens'])} "
                     f"| {_f(a['speedup_decode'], suffix='x')} | {_f(over, suffix='x')} |")
    return lines


def _strict_against_plain(methods: dict) -> list[str]:
    """One row per engine method that ran both ways: its speed strict over its speed non-strict."""
    pairs = [(plain_name(m), m) for m in methods if m.endswith(STRICT_SUFFIX) and plain_name(m) in methods]
    lines = ["", "## Strict against non-strict", "",
             "Per-token time of each method non-strict over strict, on the same records in this run (>1: strict "
             "is faster). Grammar tokens: forced by the grammar and committed without a forward (jump-forward), "
             f"per record and as a share of the strict reply's tokens. Lossless: against `{strict_name('ar')}`. "
             "A forced run before the reply's first free token rides in the prefill forward: its tokens count in "
             "the reply but their time in prefill s, so the decode ratio credits them and the e2e ratio does not.",
             "",
             "| method | decode tok/s | strict decode tok/s | strict / non-strict decode | strict / non-strict e2e "
             "| target forwards | strict target forwards | grammar tokens / record | grammar share | strict lossless |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for p, s in pairs:
        f, g = methods[p], methods[s]
        grammar = (g["accepted_by_source"] or {}).get("grammar", 0)
        tokens = g["new_tokens"] * g["n"] if g["new_tokens"] is not None else 0
        lines.append(f"| {p} | {_f(f['decode_tok_s'], '{:.1f}')} | {_f(g['decode_tok_s'], '{:.1f}')} "
                     f"| {_f(g.get('over_non_strict_decode'), suffix='x')} | {_f(g.get('over_non_strict_e2e'), suffix='x')} "
                     f"| {_f(f['target_forwards'], '{:.1f}')} | {_f(g['target_forwards'], '{:.1f}')} "
                     f"| {_f(grammar / g['n'] if g['n'] else None, '{:.1f}')} "
                     f"| {_f(grammar / tokens if tokens else None, '{:.0%}')} | {_lossless(g)} |")
    oo = methods.get(strict_name("oospec"))
    if oo and "oospec" in methods and oo.get("over_non_strict_decode") is not None:
        r = oo["over_non_strict_decode"]
        lines += ["", f"Goal: `{strict_name('oospec')}` decodes at least as fast as `oospec`: "
                  f"{r:.2f}x, **{'met' if r >= 1 else 'missed'}**; lossless against the masked reference: "
                  f"{'yes' if oo['lossless'] else '**no**'}."]
    return lines


def _warm_against_cold(results: dict) -> list[str]:
    warm, cold = results["methods"], results["cold"]["methods"]
    base = "toolspec" if "toolspec" in warm else None
    lines = ["", "## Warm against cold", "",
             "Per record means. Speedups over the `ar` of the same pass"
             + (f"; *over {base}* is the e2e speedup's ratio to {base}'s in that pass." if base else "."), "",
             "| method | prompt tokens | cached (target) | cached (sidecar) | prefill s cold | prefill s warm "
             "| warm / cold prefill | e2e s cold | e2e s warm | speedup e2e cold | speedup e2e warm "
             + (f"| over {base} cold | over {base} warm " if base else "") + "|",
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if base else "")]

    def over(figs, m):
        a, b = figs[m]["speedup_e2e"], figs[base]["speedup_e2e"]
        return _f(a / b if a and b else None, suffix="x")

    for m in warm:
        w, c = warm[m], cold[m]
        e2e = lambda f: None if f["prefill_s"] is None else f["prefill_s"] + f["decode_s"]  # noqa: E731
        share = w["prefill_s"] / c["prefill_s"] if w["prefill_s"] is not None and c["prefill_s"] else None
        lines.append(f"| {m} | {_f(w['prompt_tokens'], '{:.0f}')} | {_f(w['cached_prompt_tokens'], '{:.0f}')} "
                     f"| {_f(w['sidecar_cached_prompt_tokens'], '{:.0f}')} | {_f(c['prefill_s'], '{:.3f}')} "
                     f"| {_f(w['prefill_s'], '{:.3f}')} | {_f(share, '{:.0%}')} | {_f(e2e(c), '{:.3f}')} "
                     f"| {_f(e2e(w), '{:.3f}')} | {_f(c['speedup_e2e'], suffix='x')} | {_f(w['speedup_e2e'], suffix='x')} "
                     + (f"| {over(cold, m)} | {over(warm, m)} " if base else "") + "|")
    lossy = [m for m in cold if not cold[m]["lossless"]]
    ties = {m: cold[m]["numerical_ties"] for m in cold if cold[m]["numerical_ties"]}
    lines += ["", "Cold pass lossless: " + ("yes" if not lossy else f"**no** ({', '.join(lossy)})")
              + (" (ties: " + ", ".join(f"{m} {n}" for m, n in ties.items()) + ")" if ties else "") + "."]
    return lines


SWEEP_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5)


def payback_sweep(records: list[dict], ratios=SWEEP_RATIOS) -> dict[float, dict]:
    """What the pay-back rule would have given at each share, from a run that always ran the wave
    (--wave-payback off) and recorded its estimates: a record whose estimated wave exceeds share x the
    estimated decode takes `toolspec`'s time on it (the same decode without a wave).
    {share: {"skipped", "over_toolspec"}}."""
    e2e = lambda r: r["prefill_s"] + r["decode_s"]  # noqa: E731
    ts = sum(e2e(rec["runs"]["toolspec"]) for rec in records)
    out = {}
    for ratio in (float("inf"), *ratios):
        total, skipped = 0.0, 0
        for rec in records:
            o = rec["runs"]["oospec"]
            w, d = o.get("wave_estimate_s"), o.get("decode_estimate_s")
            skip = w is not None and d is not None and w > ratio * d
            skipped += skip
            total += e2e(rec["runs"]["toolspec"] if skip else o)
        out[ratio] = {"skipped": skipped, "over_toolspec": ts / total if total else None}
    return out


def _payback_sweep(results: dict) -> list[str]:
    passes = {"cold": results["cold"]["records"], "warm": results["records"]} if "cold" in results \
        else {"cold": results["records"]}
    sweeps = {name: payback_sweep(recs) for name, recs in passes.items()}
    lines = ["", "## What the pay-back rule would skip", "",
             "This run always ran the wave (`--wave-payback off`) and recorded the rule's estimates. At each "
             "share, a record whose estimated wave exceeds share x the estimated decode takes `toolspec`'s time "
             "instead (the same decode without a wave): `oospec` end to end over `toolspec`, and waves skipped.",
             "", "| share | " + " | ".join(f"{n}: over toolspec | {n}: skipped" for n in sweeps) + " |",
             "|---|" + "---|---|" * len(sweeps)]
    for ratio in next(iter(sweeps.values())):
        cells = " | ".join(f"{_f(sw[ratio]['over_toolspec'], suffix='x')} | {sw[ratio]['skipped']}" for sw in sweeps.values())
        lines.append(f"| {'never skip' if ratio == float('inf') else ratio} | {cells} |")
    return lines


def _per_source(results: dict, title: str, cell) -> list[str]:
    """A markdown table: one row per source, one column per method, `cell(figures)` in each."""
    names = list(results["methods"])
    lines = ["", f"## {title}", "", "| source | n | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for src, figs in results["sources"].items():
        n = next(iter(figs.values()))["n"]
        lines.append(f"| {src} | {n} | " + " | ".join(cell(figs[m]) for m in names) + " |")
    return lines


def plot(results: dict, path: str | Path) -> None:
    """Grouped bars: decode speedup over AR, one group per source plus "all", one bar per method."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {**results["sources"], "all": results["methods"]}
    names = [m for m in results["methods"] if m != "ar"] or list(results["methods"])
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(groups) + 2), 4))
    for i, m in enumerate(names):
        xs = [g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))]
        ys = [figs[m]["speedup_decode"] or 0.0 for figs in groups.values()]
        ax.bar(xs, ys, width, label=m, hatch="//" if m.endswith(STRICT_SUFFIX) else None)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)), list(groups), rotation=20, ha="right")
    ax.set_ylabel("decode speedup over ar (x)")
    env = results["env"]
    ax.set_title(f"{env['target']} on {env['target_device_name'][:40]} ({env['dtype']})", fontsize=9)
    ax.legend(fontsize=8, ncol=min(len(names), 4))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
