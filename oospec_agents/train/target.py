"""The tool-calling target adapter: full assistant turns on the target's exact prompt ids.

Three kinds of examples, all conditioned on `Engine.prompt_ids(messages, tools, tool_choice="auto")`:
- **call**: the trace's call(s) in the target's format (`fmt.render_calls`), then the eos token;
- **answer**: the history with that call and a tool result, then a short text answer built from the
  result (API-Bank's own post-result replies are used too);
- **no tool**: the request with unrelated tools offered, then a short plain-text reply.
"""
from __future__ import annotations

import json
import random

from .augment import add_distractors, revalue, string_pools, trim_tools
from .data import TrainDataError, tool_name

NO_TOOL_REPLIES = (
    "I'm sorry, none of the available tools can help with that request.",
    "None of the tools I have can do that, so I can't help with this request directly.",
    "I don't have a suitable tool for that request.",
)


def _fake_result(call: dict, rng: random.Random) -> dict:
    """A plausible tool result for a call, for the answer-after-result examples."""
    name = call["name"].lower()
    args = call.get("arguments") or {}
    if "weather" in name:
        return {"temperature": rng.randint(-5, 35), "unit": args.get("unit", "celsius"),
                "condition": rng.choice(["sunny", "cloudy", "rainy", "windy"])}
    kind = rng.randrange(4)
    if kind == 0:
        return {"result": round(rng.uniform(1, 1000), rng.choice([0, 2]))}
    if kind == 1:
        return {"status": "success", "message": f"{call['name']} completed"}
    if kind == 2:
        return {"result": rng.choice(["approved", "found", "available", "scheduled", "updated"])}
    return {"count": rng.randint(0, 50), "status": "ok"}


def _answer_text(call: dict, result: dict) -> str:
    if "condition" in result and "temperature" in result:
        where = next((str(v) for k, v in (call.get("arguments") or {}).items()
                      if k in ("city", "location", "place")), None)
        return (f"It is currently {result['temperature']} degrees {result['unit']} and {result['condition']}"
                + (f" in {where}." if where else "."))
    if "result" in result:
        return f"The result is {result['result']}."
    if "message" in result:
        return f"Done: {result['message']} successfully."
    return "Here is what I found: " + ", ".join(f"{k}: {v}" for k, v in result.items()) + "."


def _value(v) -> str | None:
    """An argument's value as a thought would mention it; None for a long or nested one."""
    text = json.dumps(v) if not isinstance(v, str) else f'"{v}"'
    return text if len(text) <= 40 and not isinstance(v, (dict, list)) else None


def call_thought(calls: list[dict], rng: random.Random) -> str:
    """A sentence of reasoning before `calls`: which function(s), and the short values the call takes,
    in one of a few phrasings (the thinking adapter's training text)."""
    if len(calls) > 1:
        names = ", ".join(c["name"] for c in calls[:-1]) + " and " + calls[-1]["name"]
        return rng.choice([f"This needs {len(calls)} calls: {names}.",
                           f"I will call {names}, one call each.",
                           f"The request asks for several things, so I call {names}."])
    call = calls[0]
    said = [f"{k} {t}" for k, v in (call.get("arguments") or {}).items() if (t := _value(v)) is not None][:4]
    args = (", ".join(said[:-1]) + " and " + said[-1]) if len(said) > 1 else (said[0] if said else "")
    name = call["name"]
    if not args:
        return rng.choice([f"The request matches {name}, so I will call it.", f"I need to call {name} for this."])
    return rng.choice([f"The request matches {name}. I will call it with {args}.",
                       f"I need to call {name} with {args}.",
                       f"{name} fits this request; its arguments are {args}."])


NO_TOOL_THOUGHT = "None of the offered tools can do this, so I will answer without calling one."
ANSWER_THOUGHT = "The tool returned its result, so I will answer the user with it."


def _encode_answer(engine, text_or_calls, head: str = "") -> list[int]:
    tok = engine.tokenizer
    text = head + (engine.fmt.render_calls(text_or_calls) if isinstance(text_or_calls, list) else text_or_calls)
    eos = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else tok.eos_token_id
    return tok.encode(text, add_special_tokens=False) + [eos]


def _example(engine, messages, tools, answer, max_len, thought: str | None = None):
    """(ids, n_target) of one example; `thought`: a thinking target's reasoning before the answer (None:
    a target that does not reason; "" with thinking: the prompt closes an empty block, as
    `enable_thinking=False` asks)."""
    kwargs = None if thought is None or thought else {"enable_thinking": False}
    prompt = engine.prompt_ids(messages, tools, tool_choice="auto", chat_template_kwargs=kwargs)
    tgt = _encode_answer(engine, answer, f"<think>\n{thought}\n</think>\n\n" if thought else "")
    if len(prompt) + len(tgt) > max_len:
        return None
    return prompt + tgt, len(tgt)


def build_target_examples(engine, traces: list[dict], *, seed: int = 0, max_len: int = 1024,
                          answer_frac: float = 0.2, no_tool_frac: float = 0.1, trim: bool = False,
                          revalued: int = 0, distracted: int = 0, thinking: bool = False,
                          no_think_frac: float = 0.2) -> tuple[list, dict]:
    """Examples (ids, n_target) for the target adapter, and counts per kind.

    `traces` are records whose "expected" holds the calls to teach (ground truth or teacher calls).
    `trim`: a call example too long for `max_len` keeps its called tools and as many others as fit
    (`augment.trim_tools`). `revalued`: that many extra call examples per record with the values its
    request spells out swapped (`augment.revalue`; records with nothing to swap add none).
    `thinking`: examples for a target whose chat template reasons in `<think>` blocks
    (templates/smollm2-think.jinja): a sentence of reasoning (`call_thought`), then the answer; a share
    `no_think_frac` of them rendered with `enable_thinking=False` (an empty block in the prompt, the
    answer at once), so that the switch keeps working.
    """
    rng = random.Random(seed)
    out = _Examples(engine, max_len, seed, trim=trim, thinking=thinking, no_think_frac=no_think_frac)
    out.counts |= {kind: 0 for kind, on in (("call_trimmed", trim), ("call_revalued", revalued),
                                            ("call_distracted", distracted)) if on}
    pools = string_pools(traces) if revalued else {}
    # one tool per name (the last seen), for `add_distractors`
    tool_pool = list({tool_name(t): t for r in traces for t in r["tools"]}.values()) if distracted else []
    for rec in traces:
        if rec["expected"]:
            out.call(rec, "call")
            for _ in range(revalued):
                other = revalue(rec, pools, out.aug_rng)
                if other is not None:
                    out.call(other, "call_revalued")
            for _ in range(distracted):
                other = add_distractors(rec, tool_pool, out.aug_rng)
                if other is not None:
                    out.call(other, "call_distracted")
        msgs = rec["messages"]
        for i in _replies_to_results(msgs):
            out.add("answer_apibank", out.example(msgs[:i], rec["tools"], msgs[i]["content"], lambda: ANSWER_THOUGHT))
    with_calls = [r for r in traces if r["expected"]]
    for rec in rng.sample(with_calls, min(len(with_calls), int(len(with_calls) * answer_frac))):
        msgs, answer = _answered(rec, rng)
        out.add("answer", out.example(msgs, rec["tools"], answer, lambda: ANSWER_THOUGHT))
    # Plain text when no offered tool fits: the request with another record's unrelated tools.
    n_none = int(len(traces) * no_tool_frac)
    for rec in rng.sample(traces, min(len(traces), n_none)):
        other = _unrelated(rec, traces, rng)
        if other is not None:
            last_user = max(i for i, m in enumerate(rec["messages"]) if m.get("role") == "user")
            out.add("no_tool", out.example(rec["messages"][:last_user + 1], other["tools"],
                                           rng.choice(NO_TOOL_REPLIES), lambda: NO_TOOL_THOUGHT))
    if not out.examples:
        raise TrainDataError("the training set is empty: every record was too long or had no calls")
    order = list(range(len(out.examples)))
    rng.shuffle(order)
    return [out.examples[i] for i in order], out.counts


class _Examples:
    """The target examples built so far and their counts per kind, with the random streams that the
    augmentations (`aug_rng`) and the reasoning sentences (`think_rng`) draw from."""

    def __init__(self, engine, max_len: int, seed: int, *, trim: bool, thinking: bool, no_think_frac: float):
        self.engine, self.max_len, self.trim = engine, max_len, trim
        self.thinking, self.no_think_frac = thinking, no_think_frac
        self.aug_rng = random.Random(f"augment-{seed}")  # its own stream: the other kinds stay as without it
        self.think_rng = random.Random(f"think-{seed}")
        self.examples: list = []
        self.counts = {"call": 0, "answer": 0, "answer_apibank": 0, "no_tool": 0, "too_long": 0}

    def thought(self, text_of):
        """None without `thinking`; else "" (thinking off) or the sentence `text_of()`."""
        if not self.thinking:
            return None
        return "" if self.think_rng.random() < self.no_think_frac else text_of()

    def example(self, messages: list[dict], tools: list, answer, text_of):
        """The example of `answer` to `messages` (None where too long), its reasoning sentence `text_of()`."""
        return _example(self.engine, messages, tools, answer, self.max_len, self.thought(text_of))

    def add(self, kind: str, ex) -> None:
        if ex is None:
            self.counts["too_long"] += 1
        else:
            self.examples.append(ex)
            self.counts[kind] += 1

    def call(self, rec: dict, kind: str) -> None:
        """`rec`'s calls as an example of `kind`; with `trim`, one too long keeps the tools that fit."""
        # one sentence for `rec` and a trimmed copy of it: the same calls
        said = self.thought(lambda: call_thought(rec["expected"], self.think_rng))
        build = lambda r: _example(self.engine, r["messages"], r["tools"], r["expected"],  # noqa: E731
                                   self.max_len, said)
        ex = build(rec)
        if ex is None and self.trim:
            ex = trim_tools(rec, build, self.aug_rng)
            kind = "call_trimmed" if kind == "call" and ex is not None else kind
        self.add(kind, ex)


def _replies_to_results(msgs: list[dict]) -> list[int]:
    """Where a history holds a real text reply that follows a tool result (API-Bank's do)."""
    return [i for i, m in enumerate(msgs) if m.get("role") == "assistant" and not m.get("tool_calls")
            and m.get("content") and i > 0 and msgs[i - 1].get("role") == "tool"]


def _answered(rec: dict, rng: random.Random) -> tuple[list[dict], str]:
    """`rec`'s conversation with its calls made and answered (made-up results), and the text reply that
    sums them up."""
    calls = [dict(c, id=f"call_{k}") for k, c in enumerate(rec["expected"])]
    results = [_fake_result(c, rng) for c in calls]
    msgs = list(rec["messages"]) + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls]}]
    msgs += [{"role": "tool", "tool_call_id": c["id"], "name": c["name"], "content": json.dumps(r)}
             for c, r in zip(calls, results)]
    return msgs, " ".join(_answer_text(c, r) for c, r in zip(calls, results))


def _unrelated(rec: dict, traces: list[dict], rng: random.Random, tries: int = 20) -> dict | None:
    """Another record (of `tries` drawn) whose tools share no name with `rec`'s and no longer word with its
    messages, from another source; None when none of them is."""
    names = {tool_name(t) for t in rec["tools"]}
    words = {w.lower() for m in rec["messages"] for w in str(m.get("content") or "").split() if len(w) > 4}
    for _ in range(tries):
        other = rng.choice(traces)
        o_names = {tool_name(t) for t in other["tools"]}
        o_words = {w.lower() for t in other["tools"] for w in
                   (tool_name(t) + " " + str((t.get("function") or t).get("description", ""))).split()}
        if not (names & o_names) and not (words & o_words) and other["source"] != rec["source"]:
            return other
    return None


# --------------------------------------------------------------------------- evaluation

def _lenient_ok(call: dict, possible: dict | None) -> bool:
    """BFCL-style: every given argument is among the acceptable values; required ones present."""
    if not possible or call["name"] not in possible:
        return False
    spec = possible[call["name"]]
    args = call["arguments"]
    for k, v in args.items():
        if k not in spec or not any(v == ok or (isinstance(ok, str) and isinstance(v, str)
                                                and v.strip().lower() == ok.strip().lower()) for ok in spec[k]):
            return False
    return all(k in args for k, oks in spec.items() if "" not in oks)


def evaluate_target(engine, records: list[dict], *, sources=("bfcl_simple", "bfcl_multiple"),
                    method: str = "toolspec", max_new_tokens: int = 160, limit: int | None = None,
                    progress: bool = True, details: bool = False) -> dict:
    """Right-tool and exact-argument rates of `engine.generate(..., tool_choice="auto")`.

    - right_tool: the names of the calls written equal the expected names, in order;
    - exact_args: the calls parse, validate, and equal the expected calls exactly;
    - lenient_args: as exact, but each value may be any of BFCL's acceptable values.
    `method` only changes speed: every method returns the target's greedy output.
    `details=True` adds "misses": each record that is not exact, with what was expected and written.
    """
    from tqdm.auto import tqdm
    recs = [r for r in records if not sources or r["source"] in sources][:limit]
    per, misses = {}, []
    for rec in tqdm(recs, disable=not progress, desc="eval-target"):
        gen = engine.generate(rec["messages"], rec["tools"], tool_choice="auto", max_new_tokens=max_new_tokens,
                              method=method)
        names = [c["name"] for c in gen.tool_calls + gen.invalid_tool_calls]
        exp = rec["expected"]
        right = names == [c["name"] for c in exp]
        fit = not gen.invalid_tool_calls and not gen.tool_call_problems  # every call parses and fits its schema
        exact = right and fit and \
            [(c["name"], c["arguments"]) for c in gen.tool_calls] == [(c["name"], c["arguments"]) for c in exp]
        poss = (rec.get("meta") or {}).get("possible_answer") or []
        lenient = exact or (right and fit and len(poss) == len(gen.tool_calls)
                            and all(_lenient_ok(c, p) for c, p in zip(gen.tool_calls, poss)))
        s = per.setdefault(rec["source"], {"n": 0, "right_tool": 0, "exact_args": 0, "lenient_args": 0})
        s["n"] += 1
        s["right_tool"] += right
        s["exact_args"] += exact
        s["lenient_args"] += lenient
        if details and not exact:
            misses.append({"id": rec.get("id"), "right_tool": right, "lenient": lenient, "expected": exp,
                           "text": gen.text})
    tot = {k: sum(s[k] for s in per.values()) for k in ("n", "right_tool", "exact_args", "lenient_args")}
    rate = lambda s: {"n": s["n"], **{k: round(s[k] / max(1, s["n"]), 4)
                                      for k in ("right_tool", "exact_args", "lenient_args")}}
    out = {"overall": rate(tot), "by_source": {k: rate(v) for k, v in sorted(per.items())}, "method": method}
    return out | ({"misses": misses} if details else {})
