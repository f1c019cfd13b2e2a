"""Token-level lossless check against AR, and the per-method aggregates that results.json reports.

A method is lossless on a record when its tokens equal AR's, or when they first diverge at a
numerical tie: AR's top-2 logits at that position lie within the dtype's rounding, so a forward
over several tokens may legitimately flip the argmax. Ties are counted apart from losses. A strict
variant (`--strict`, `oospec+strict`) is checked the same way against `ar+strict`, the masked
reference, and its margins.
"""
from __future__ import annotations

import torch

from . import alpha
from .methods import STRICT_SUFFIX, plain_name

#: top-2 logit margin at or below which a divergence counts as a numerical tie
TIE_TOLERANCE = {torch.bfloat16: 0.3, torch.float16: 0.06, torch.float32: 0.001}


def tie_tolerance(dtype: torch.dtype) -> float:
    return TIE_TOLERANCE.get(dtype, TIE_TOLERANCE[torch.bfloat16])


def compare(ref: list[int], ref_margins: list[float], out: list[int], tol: float) -> dict:
    """{"verdict": "exact" | "tie" | "loss", "at": first differing index or None, "margin": AR's margin there}."""
    n = min(len(ref), len(out))
    at = next((i for i in range(n) if ref[i] != out[i]), None)
    if at is None:
        if len(ref) == len(out):
            return {"verdict": "exact", "at": None, "margin": None}
        at = n  # one stopped where the other went on: the divergence is at the shorter one's end
    margin = ref_margins[at] if at < len(ref_margins) else None
    verdict = "tie" if margin is not None and margin <= tol else "loss"
    return {"verdict": verdict, "at": at, "margin": margin}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _sum(xs):
    """The sum, or None unless every record has the figure."""
    return None if not xs or any(x is None for x in xs) else sum(xs)


PROFILE_KEYS = ("queued_s", "prefix_tokens", "cached_prefix_tokens", "rows", "prefill_s", "steps", "decode_s",
                "wave_s")


def _mean_profile(profiles: list[dict | None]) -> dict | None:
    profiles = [p for p in profiles if p]
    if not profiles:
        return None
    return {k: _mean([p.get(k) for p in profiles]) for k in PROFILE_KEYS} | {"n": len(profiles)}


def aggregate(rows: list[dict], ref_rows: list[dict] | None) -> dict:
    """One method's figures over `rows` (per-record dicts from the runner); `ref_rows` are AR's, same order.

    Speedups are per-token time ratios over the records, (T_ar / N_ar) / (T_m / N_m), with T summed
    over records and N the new tokens: equal to the plain time ratio whenever the outputs are
    identical, and not skewed when a tie makes one output longer.
    """
    tokens = sum(r["new_tokens"] for r in rows)
    decode = sum(r["decode_s"] for r in rows)
    forwards = sum(r["target_forwards"] for r in rows)
    verdicts = [r["check"]["verdict"] for r in rows]
    out = {
        "n": len(rows),
        "lossless": all(v != "loss" for v in verdicts),
        "numerical_ties": verdicts.count("tie"),
        "losses": verdicts.count("loss"),
        "speedup_decode": None,
        "speedup_e2e": None,
        "mean_accepted_tokens": tokens / forwards if forwards else None,
        "target_forwards": forwards / len(rows) if rows else None,
        "new_tokens": tokens / len(rows) if rows else None,
        "prefill_s": _mean([r["prefill_s"] for r in rows]),
        "decode_s": _mean([r["decode_s"] for r in rows]),
        "decode_tok_s": tokens / decode if decode else None,
    }
    out.update(_hint_timing(rows))
    out.update(_rounds(rows, decode, forwards))
    out.update(_sidecar_figures(rows, tokens))
    # the prefix cache: prompt tokens whose KV was reused, the target's and the sidecar wave's
    for key in ("prompt_tokens", "cached_prompt_tokens", "sidecar_cached_prompt_tokens"):
        out[key] = _mean([r.get(key) for r in rows])
    if ref_rows:
        out.update(_speedups(rows, ref_rows))
    out["answer_part"] = answer_part(rows, ref_rows)
    if any("alpha" in r for r in rows):  # a method with a sidecar: its hints against the target's own call
        out |= alpha.aggregate([r.get("alpha") for r in rows])
    return out


def _hint_timing(rows: list[dict]) -> dict:
    """When the sidecar's hints were ready, how large, and how many came in time."""
    return {
        "hint_ready_s": _mean([r.get("hint_ready_s") for r in rows]),
        "hint_bytes": _mean([r.get("hint_bytes") for r in rows]),
        "hints": sum(r.get("hint_ready_s") is not None for r in rows),
        "hint_follow_ups": sum(r.get("hint_follow_ups") or 0 for r in rows),
        # a hint that lands after the reply is finished is reported but could not be used
        "hints_in_time": sum(r.get("hint_ready_s") is not None and r["hint_ready_s"] < r["prefill_s"] + r["decode_s"]
                             for r in rows),
    }


def _rounds(rows: list[dict], decode: float, forwards: int) -> dict:
    """A decode round's time, and the host's part of it."""
    rounds = forwards - len(rows)
    host = _sum([r.get("host_s") for r in rows])
    return {
        # one decode round = one verify forward plus drafting and bookkeeping
        "round_ms": 1000 * decode / rounds if rounds > 0 else None,
        # of which host work: everything in a round outside the target's forward (engine methods only)
        "host_ms_per_round": 1000 * host / rounds if host is not None and rounds > 0 else None,
        "host_share": host / decode if host is not None and decode else None,
    }


def _sidecar_figures(rows: list[dict], tokens: int) -> dict:
    """The accepted tokens per drafter, the hint's share of them, and the sidecar's waves."""
    by_source: dict[str, int] = {}
    for r in rows:
        for k, v in (r.get("accepted_by_source") or {}).items():
            by_source[k] = by_source.get(k, 0) + v
    return {
        "accepted_by_source": by_source or None,
        # share of all generated tokens that were accepted from the sidecar's hint
        "hint_share": by_source["hint"] / tokens if tokens and "hint" in by_source else None,
        # the hint's share of the accepted draft tokens (every drafter's together)
        "hint_share_of_accepted": by_source["hint"] / accepted if (accepted := sum(by_source.values()))
        and "hint" in by_source else None,
        # where the sidecar's waves spent their time, averaged over the records that had one
        "sidecar_wave": _mean_profile([r.get("sidecar_profile") for r in rows]),
        "sidecar_errors": sum(bool(r.get("sidecar_error")) for r in rows),
        # waves the pay-back rule did not run (a sidecar on the target's cores that could not pay back)
        "waves_skipped": sum(bool(r.get("sidecar_skipped")) for r in rows),
    }


def _speedups(rows: list[dict], ref_rows: list[dict]) -> dict:
    """Per-token decode and end-to-end time of AR's rows over this method's (None where there is no time)."""
    tokens = sum(r["new_tokens"] for r in rows)
    decode = sum(r["decode_s"] for r in rows)
    e2e = sum(r["prefill_s"] + r["decode_s"] for r in rows)
    ref_tokens = sum(r["new_tokens"] for r in ref_rows)
    ref_decode = sum(r["decode_s"] for r in ref_rows)
    ref_e2e = sum(r["prefill_s"] + r["decode_s"] for r in ref_rows)
    out = {}
    if decode and tokens:
        out["speedup_decode"] = (ref_decode / ref_tokens) / (decode / tokens)
    if e2e and tokens:
        out["speedup_e2e"] = (ref_e2e / ref_tokens) / (e2e / tokens)
    return out


def answer_part(rows: list[dict], ref_rows: list[dict] | None) -> dict | None:
    """A reasoning target's figures after its reasoning closed (the calls and the content), over the
    records where every method's reply closed its block; None where none did. The reasoning part runs to
    the end of the forward that committed the block's end, so the part's first tokens may be answer
    tokens that forward accepted with it. `speedup_decode`: per-token decode time over `ar`'s part."""
    def part(r):
        return (r["new_tokens"] - r["reasoning_tokens"], r["target_forwards"] - r["reasoning_forwards"],
                r["decode_s"] - r["reasoning_s"])
    keep = [i for i, r in enumerate(rows) if "reasoning_forwards" in r
            and (ref_rows is None or "reasoning_forwards" in ref_rows[i])]
    if not keep:
        return None
    tokens, forwards, decode = (sum(x) for x in zip(*(part(rows[i]) for i in keep)))
    out = {"n": len(keep), "reasoning_tokens": _mean([rows[i]["reasoning_tokens"] for i in keep]),
           "new_tokens": tokens / len(keep), "target_forwards": forwards / len(keep),
           "mean_accepted_tokens": tokens / forwards if forwards else None, "decode_s": decode / len(keep),
           "speedup_decode": None}
    if ref_rows is not None and tokens and decode > 0:
        ref_tokens, _, ref_decode = (sum(x) for x in zip(*(part(ref_rows[i]) for i in keep)))
        out["speedup_decode"] = (ref_decode / ref_tokens) / (decode / tokens) if ref_tokens and ref_decode else None
    return out


def summarize(records: list[dict], methods: list[str]) -> dict:
    """{"methods": {m: figures}, "sources": {source: {m: figures}}} over the runner's per-record output.

    Every method gets `vs_oracle` (its decode speedup over the oracle's) when the oracle ran. A strict
    variant (`oospec+strict`) whose plain method ran gets `over_non_strict_decode` and
    `over_non_strict_e2e`: its per-token speed over the plain method's (>1: strict is faster).
    """
    def block(recs):
        ref = [r["runs"]["ar"] for r in recs] if "ar" in methods else None
        figs = {m: aggregate([r["runs"][m] for r in recs], ref) for m in methods}
        alpha.forwards_ratio(figs)
        top = (figs.get("oracle") or {}).get("speedup_decode")
        for f in figs.values():
            f["vs_oracle"] = f["speedup_decode"] / top if top and f["speedup_decode"] else None
        for m, f in figs.items():
            if m.endswith(STRICT_SUFFIX) and plain_name(m) in figs:
                plain = figs[plain_name(m)]
                for k in ("decode", "e2e"):  # both over the same `ar`: the ratio is per-token time, plain / strict
                    a, b = f[f"speedup_{k}"], plain[f"speedup_{k}"]
                    f[f"over_non_strict_{k}"] = a / b if a and b else None
        return figs

    sources: dict[str, list[dict]] = {}
    for r in records:
        sources.setdefault(r["source"], []).append(r)
    return {"methods": block(records), "sources": {s: block(rs) for s, rs in sources.items()}}
