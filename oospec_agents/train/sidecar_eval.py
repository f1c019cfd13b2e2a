"""`evaluate_sidecar`: the sidecar scored on what it serves.

Per record (its one expected call, or a "no call" record), the request is built as the engine builds
it under tool_choice="auto" and the runtime's own wave runs on it: `runtime.wave_rows` (the function
row constrained to the offered names and null, with the lexical prior), one or two phases as the
runtime decodes them, and `join` into the call the target would be hinted. The figures:

- `function_index_acc`: the joined call names the labelled function;
- `arg_exact_match` (strict; `arg_exact_lenient`): over the slots (every parameter of the labelled
  tool) of the calls whose function is right, the share whose value is the label's (absent = absent);
  with a wrong function no slot reaches the target, so those slots are not scored;
- `call_exact` (strict; `call_exact_lenient`): function and every slot right;
- `errors`: every strictly wrong slot by class (`taxonomy.CLASSES`), per source;
- `optional`: the decision "this optional slot is filled", against the labels: precision (of the
  optional slots the wave filled, the share the label fills too) and recall (of those the label fills,
  the share the wave filled), on calls whose function is right;
- `confidence`: the wave's calibrated probability that the whole call is exact (confidence.py), for
  every predicted call (one on a "no call" record is never exact): a reliability table and
  precision / recall of strict whole-call exactness at `THRESHOLDS`;
- `no_call`: on "no call" records, the share where the wave declined;
- `alpha_call` and `alpha_slots`: the whole call exact (as `call_exact`), and of the slots the label
  writes, the share the wave got exactly (a wrong function gets none). Scored against the target's
  own calls (`target_labelled`, `oospec distill`), they are the sidecar's agreement with its target,
  α, as `oospec bench` reports it from the hints it read.

The labels are the record's `expected` calls: gold, or the embedded target's own (`target_labelled`).
The strict scorer is the record's first acceptable value with optional arguments absent; the lenient
one is `taxonomy.lenient_right`.
"""
from __future__ import annotations

from .data import select
from .taxonomy import CLASSES, classify, lenient_right, possible_answer

#: the confidence thresholds whole-call precision and recall are reported at (the lower one is the
#: speculative tools runner's suggested default, docs/sidecar-accuracy.md)
THRESHOLDS = (0.7, 0.9)
_COUNTS = ("n", "function_ok", "slots", "slots_ok", "slots_lenient", "call_exact", "call_lenient", "label_slots",
           "label_slots_ok")


def evaluate_sidecar(model, tokenizer, records, *, sources=None, limit_per_source=None, progress=True,
                     details=False, prior_weight: float | None = None, calibration=None,
                     points: bool = False, row_options=None, tool_choice: str = "auto") -> dict:
    """The module's figures for `records` (those with one expected call, and "no call" records), overall
    and per source. `prior_weight` weighs the function row's lexical prior (None: the runtime's);
    `calibration` maps a call's log-probability to its confidence (None: the raw product,
    `Calibration.raw()`); `details=True` adds "misses" (each record with a wrong function or slot: what
    was expected and predicted, and each wrong slot's class); `points=True` adds "points", one
    [log-probability, strict exact, source] per predicted call (to fit a calibration on); `row_options`:
    the adapter's `rows.RowOptions` (None: today's rows), as the runtime reads them from its directory;
    `tool_choice`: "auto" (the function row may decline) or "required", as the requests will ask."""
    from tqdm.auto import tqdm
    from ..sidecar.confidence import Calibration
    from ..sidecar.wave import PRIOR_WEIGHT, Wave
    wave = Wave(model, tokenizer, prior_weight=PRIOR_WEIGHT if prior_weight is None else prior_weight)
    recs = select([r for r in records if len(r["expected"]) == 1 or no_call(r)], sources, limit_per_source)
    tally = _Tally(details)
    model.eval()
    for rec in tqdm(recs, disable=not progress, desc="eval-sidecar"):
        messages, tools, call, logprob = _predict(wave, rec, tool_choice, row_options)
        if no_call(rec):  # the wave should decline; a call it predicts is never exact
            tally.decline(rec, call, logprob)
        else:
            tally.call(rec, messages, tools, call, logprob)
    return tally.figures(calibration or Calibration.raw(), points)


def _predict(wave, rec: dict, tool_choice: str, row_options) -> tuple[list[dict], list, dict | None, float | None]:
    """The wave's call for `rec`'s request, as the runtime builds and joins it: (the normalized messages, the
    offered tools, the joined call or None where the wave declines or writes no usable call, the call's
    log-probability)."""
    from ..chat import normalize_messages
    from ..formats import HermesFormat
    from ..sidecar import HintRequest
    from ..sidecar.confidence import call_logprob
    from ..sidecar.join import JoinError, join
    from ..sidecar.runtime import wave_rows
    from ..tools import normalize_tools
    messages = normalize_messages(rec["messages"])
    request = HintRequest(messages, normalize_tools(rec["tools"]), HermesFormat(), (tool_choice, None))
    rows, prefix, choices = wave_rows(request, options=row_options)
    result = wave(prefix, rows, None, choices)
    try:
        call = join(rows, result.texts, request.tools, request.tool_choice)
    except JoinError:  # a decline (NoCall) or no usable call: nothing is hinted
        call = None
    logprob = None if call is None else call_logprob(rows, result.row_logprobs, call, request.tool_choice)
    return messages, request.tools, call, logprob


class _Tally:
    """What `evaluate_sidecar` counts, per source: the slot counts of records with a call, the wrong slots'
    classes, the optional-slot decisions, the declines on "no call" records, each predicted call's
    log-probability and exactness, and (`details`) the misses."""

    def __init__(self, details: bool):
        self.details = details
        self.per: dict[str, dict] = {}
        self.errors: dict[str, dict] = {}
        self.optional: dict[str, dict] = {}
        self.declines: dict[str, dict] = {}
        self.misses: list[dict] = []
        self.scored: list[tuple] = []

    def decline(self, rec: dict, call: dict | None, logprob: float | None) -> None:
        """A "no call" record: the wave should decline."""
        src = rec["source"]
        if logprob is not None:
            self.scored.append((logprob, False, src))
        d = self.declines.setdefault(src, {"n": 0, "declined": 0})
        d["n"] += 1
        d["declined"] += call is None
        if self.details and call is not None:
            self.misses.append({"id": rec.get("id"), "expected": None, "function": call["name"], "wrong_values": {}})

    def call(self, rec: dict, messages: list[dict], tools: list, call: dict | None, logprob: float | None) -> None:
        """A record with one expected call: the function and, where it is right, every slot."""
        name, src, label = None if call is None else call["name"], rec["source"], rec["expected"][0]
        s = self.per.setdefault(src, dict.fromkeys(_COUNTS, 0))
        s["n"] += 1
        s["label_slots"] += len(label["arguments"])
        wrong, classes = {}, {}
        if name == label["name"]:
            s["function_ok"] += 1
            tool = next(t for t in tools if t.name == name)
            opt = self.optional.setdefault(src, {"predicted": 0, "labelled": 0, "both": 0})
            wrong, lenient_ok, classes = _score_slots(rec, label, call, tool, messages, s, opt)
            for cls in classes.values():
                self.errors.setdefault(src, dict.fromkeys(CLASSES, 0))[cls] += 1
            s["call_exact"] += not wrong
            s["call_lenient"] += lenient_ok
        exact = name == label["name"] and not wrong
        if logprob is not None:
            self.scored.append((logprob, exact, src))
        if self.details and not exact:
            self.misses.append({"id": rec.get("id"), "expected": label, "function": name, "wrong_values": wrong,
                                "classes": classes})

    def figures(self, calibration, points: bool) -> dict:
        """The figures, overall and per source (see the module's docstring)."""
        tot = {k: sum(v[k] for v in self.per.values()) for k in _COUNTS}
        out = {"overall": _rates(tot), "by_source": {k: _rates(v) for k, v in sorted(self.per.items())},
               "errors": _table_of(self.errors, CLASSES), "optional": _optional(self.optional),
               "confidence": _confidence(self.scored, calibration)}
        if self.declines:  # "no call" records: the share where the wave declined
            out["no_call"] = _no_call(self.declines)
        if points:
            out["points"] = [[round(lp, 6), exact, src] for lp, exact, src in self.scored]
        return out | ({"misses": self.misses} if self.details else {})


def _score_slots(rec: dict, label: dict, call: dict, tool, messages, s: dict, opt: dict
                 ) -> tuple[dict, bool, dict]:
    """Score every slot of `tool` (the labelled function, which `call` names) into the source's counts `s`
    and its optional-slot counts `opt`. Returns (each strictly wrong slot's value, whether every slot is
    leniently right, each wrong slot's class)."""
    wrong, lenient_ok, classes = {}, True, {}
    possible = possible_answer(rec, tool.name)
    for param, spec in tool.properties.items():
        gold, got = label["arguments"].get(param), call["arguments"].get(param)
        required = param in tool.required
        s["slots"] += 1
        ok = got == gold
        s["slots_ok"] += ok
        s["label_slots_ok"] += ok and param in label["arguments"]
        lenient = lenient_right(param, gold, got, possible=possible, spec=spec, required=required)
        s["slots_lenient"] += lenient
        lenient_ok &= lenient
        if not ok:
            wrong[param] = got
            classes[param] = classify(gold, got, messages)
        if not required:
            opt["predicted"] += got is not None
            opt["labelled"] += gold is not None
            opt["both"] += got is not None and gold is not None
    return wrong, lenient_ok, classes


def _confidence(scored: list[tuple], calibration) -> dict:
    """The calibrated confidence of each predicted call against its strict exactness: the reliability
    table and the figures at each of `THRESHOLDS`."""
    from ..sidecar.confidence import reliability, threshold_figures
    conf = [(calibration(lp), exact) for lp, exact, _ in scored]
    return {"calibration": calibration.kind, "fitted_on": calibration.fitted_on, "n": len(conf),
            "reliability": reliability(conf), "thresholds": [threshold_figures(conf, t) for t in THRESHOLDS]}


def _no_call(declines: dict[str, dict]) -> dict:
    n, ok = sum(d["n"] for d in declines.values()), sum(d["declined"] for d in declines.values())
    return {"n": n, "declined": round(ok / n, 4),
            "by_source": {k: {"n": d["n"], "declined": round(d["declined"] / d["n"], 4)}
                          for k, d in sorted(declines.items())}}


def no_call(rec: dict) -> bool:
    """A "no call" record: no offered tool fits (`expected` empty, `meta.no_call` set)."""
    return not rec["expected"] and bool((rec.get("meta") or {}).get("no_call"))


def target_labelled(records: list[dict], engine, *, max_new_tokens: int = 160, progress: bool = True
                    ) -> tuple[list[dict], int]:
    """`records` labelled by `engine`'s own calls, as the adapt protocol labels them
    (examples/adapt_protocol.py): each decoded greedily with tool_choice="auto" and method toolspec,
    its first valid call becomes `expected` (no possible answer: that is the gold's); a record where
    it writes no valid call is left out. Returns (labelled records, how many were left out)."""
    from tqdm.auto import tqdm
    out, left = [], 0
    for rec in tqdm([r for r in records if r["expected"]], disable=not progress, desc="target-labels"):
        gen = engine.generate(rec["messages"], rec["tools"], tool_choice="auto", method="toolspec",
                              max_new_tokens=max_new_tokens)
        if not gen.tool_calls:
            left += 1
            continue
        meta = {k: v for k, v in (rec.get("meta") or {}).items() if k != "possible_answer"}
        first = gen.tool_calls[0]
        out.append(dict(rec, expected=[{"name": first["name"], "arguments": first["arguments"]}],
                        meta=meta | {"label": "embedded target"}))
    return out, left


def _rates(s: dict) -> dict:
    share = lambda k, of: round(s[k] / s[of], 4) if s[of] else None  # noqa: E731
    return {"n": s["n"], "function_index_acc": share("function_ok", "n"), "slots": s["slots"],
            "arg_exact_match": share("slots_ok", "slots"), "arg_exact_lenient": share("slots_lenient", "slots"),
            "call_exact": share("call_exact", "n"), "call_exact_lenient": share("call_lenient", "n"),
            # scored against the target's own calls (`--labels target`, `oospec distill`), these two are α:
            # the whole call exact, and the share of the label's written slots the wave got exactly
            "alpha_call": share("call_exact", "n"), "alpha_slots": share("label_slots_ok", "label_slots")}


def _table_of(per: dict[str, dict], keys) -> dict:
    tot = {k: sum(v.get(k, 0) for v in per.values()) for k in keys}
    return {"overall": tot, "by_source": {k: {c: v.get(c, 0) for c in keys} for k, v in sorted(per.items())}}


def _optional(per: dict[str, dict]) -> dict:
    def rate(o):
        return o | {"precision": round(o["both"] / o["predicted"], 4) if o["predicted"] else None,
                    "recall": round(o["both"] / o["labelled"], 4) if o["labelled"] else None}
    tot = {k: sum(v[k] for v in per.values()) for k in ("predicted", "labelled", "both")}
    return {"overall": rate(tot), "by_source": {k: rate(v) for k, v in sorted(per.items())}}


# --------------------------------------------------------------------------- tables

def _cell(v) -> str:
    return "-" if v is None else f"{v:.1%}" if isinstance(v, float) and 0 <= v <= 1 else str(v)


def errors_table(res: dict) -> str:
    """Wrong slots by class (`taxonomy.CLASSES`), per source and in all."""
    e = res["errors"]
    lines = ["| source | " + " | ".join(CLASSES) + " | wrong slots |", "|---" * (len(CLASSES) + 2) + "|"]
    for src, row in [*e["by_source"].items(), ("**all**", e["overall"])]:
        lines.append(f"| {src} | " + " | ".join(str(row[c]) for c in CLASSES) + f" | {sum(row.values())} |")
    return "\n".join(lines)


def optional_table(res: dict) -> str:
    """The optional-slot decision: filled by the wave, by the label, both; precision and recall."""
    o = res["optional"]
    lines = ["| source | wave fills | label fills | both | precision | recall |", "|---" * 6 + "|"]
    for src, row in [*o["by_source"].items(), ("**all**", o["overall"])]:
        lines.append(f"| {src} | {row['predicted']} | {row['labelled']} | {row['both']} | {_cell(row['precision'])} "
                     f"| {_cell(row['recall'])} |")
    return "\n".join(lines)


def confidence_table(res: dict) -> str:
    """The reliability table, then whole-call precision and recall at each threshold."""
    c = res["confidence"]
    lines = [f"confidence: {c['calibration']} ({c['fitted_on'] or 'not fitted'}), {c['n']} predicted calls", "",
             "| confidence | calls | mean confidence | observed exact |", "|---|---|---|---|"]
    lines += [f"| {b['bin']} | {b['n']} | {_cell(b['mean_confidence'])} | {_cell(b['observed_exact'])} |"
              for b in c["reliability"]]
    lines += ["", "| threshold | acted on | precision | recall |", "|---|---|---|---|"]
    lines += [f"| {t['threshold']} | {t['acted']} of {t['of']} | {_cell(t['precision'])} | {_cell(t['recall'])} |"
              for t in c["thresholds"]]
    return "\n".join(lines)
