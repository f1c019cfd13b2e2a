"""More call examples from the same training records: fewer offered tools, and re-valued requests.

- `trim_tools`: a record whose prompt (every tool's JSON schema) is too long for `--max-len` keeps the
  tools it calls and as many of the others as fit; the call itself is unchanged.
- `revalue`: a record's argument values that the last user message spells out verbatim (numbers, and
  strings with other values of the same argument name elsewhere in the data) are swapped, in the
  message and in the expected call alike, so that the target learns to copy values from the request
  rather than remember them.
- `add_distractors`: a record offered few tools gets unrelated tools from other records beside its own,
  at seeded positions, with the call unchanged, so that the target learns to pick among several
  (BFCL's "multiple" records offer 2-4 tools where the training data's "simple" ones offer one).
"""
from __future__ import annotations

import copy
import random
import re

from .data import tool_name

MIN_STRING = 2  # shorter strings ("a", "x") are too ambiguous to swap
# verbs that start many tool names and say nothing of what a tool is about
GENERIC_WORDS = frozenset({"get", "set", "find", "fetch", "search", "list", "create", "update", "delete", "check",
                           "calculate", "calc", "compute", "query", "retrieve", "add", "remove", "lookup"})


def trim_tools(rec: dict, build, rng: random.Random):
    """The first non-None `build(rec')`, where rec' drops more and more of `rec`'s uncalled tools (seeded
    order); None if even the called tools alone don't build."""
    called = {c["name"] for c in rec["expected"]}
    keep = list(rec["tools"])
    others = [t for t in keep if tool_name(t) not in called]
    rng.shuffle(others)
    while others:
        drop = others.pop()
        keep = [t for t in keep if t is not drop]
        built = build(dict(rec, tools=keep))
        if built is not None:
            return built
    return None


def _name_words(name: str) -> set[str]:
    """The topic words of a tool name (`get_current_weather`, `weather.forecast`, `getWeather`), lower-case,
    without `GENERIC_WORDS`."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return {w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if len(w) > 2} - GENERIC_WORDS


def add_distractors(rec: dict, pool: list[dict], rng: random.Random, *, max_tools: int = 4) -> dict | None:
    """A copy of `rec` with 1 to `max_tools - len(tools)` unrelated tools from `pool` (fewer if fewer
    exist) inserted at seeded positions; None if `rec` already offers `max_tools` or none is unrelated.

    `pool` holds tools with distinct names. One is unrelated when its name is not offered already and
    shares no topic word (`_name_words`) with the name of any tool `rec` offers; otherwise the request
    could fit it too.
    """
    tools = list(rec["tools"])
    room = max_tools - len(tools)
    if room < 1:
        return None
    names = {tool_name(t) for t in tools}
    words = set().union(*(_name_words(n) for n in names))
    unrelated = [t for t in pool if tool_name(t) not in names and not (_name_words(tool_name(t)) & words)]
    if not unrelated:
        return None
    for t in rng.sample(unrelated, min(len(unrelated), rng.randint(1, room))):
        tools.insert(rng.randint(0, len(tools)), t)
    out = copy.deepcopy(rec)
    out["tools"] = copy.deepcopy(tools)
    out["id"] = f"{rec.get('id')}#distracted"
    return out


def _pattern(text: str) -> re.Pattern:
    """`text` as a whole token: not inside a longer word or number."""
    return re.compile(r"(?<![\w.])" + re.escape(text) + r"(?![\w]|\.\d)")


def _spelling(v) -> str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str) and len(v) >= MIN_STRING:
        return v
    return None


def _new_number(v, rng: random.Random):
    if isinstance(v, int):
        digits = len(str(abs(v)))
        lo = 0 if digits == 1 else 10 ** (digits - 1)
        choices = [n for n in (rng.randint(lo, 10 ** digits - 1) for _ in range(8)) if n != abs(v)]
        return None if not choices else (-choices[0] if v < 0 else choices[0])
    decimals = len(repr(v).split(".")[1]) if "." in repr(v) and "e" not in repr(v) else 0
    if not decimals:
        return None
    scale = 10 ** decimals
    for _ in range(8):
        n = round(rng.uniform(0, max(abs(v) * 2, 1)) * scale) / scale
        if n != abs(v) and repr(n) == f"{n:.{decimals}f}":
            return -n if v < 0 else n
    return None


def string_pools(records: list[dict]) -> dict[str, list[str]]:
    """Every string value each argument name takes in the records' expected calls."""
    pools: dict[str, set] = {}
    for r in records:
        for c in r["expected"]:
            for k, v in _leaves(c.get("arguments") or {}):
                if isinstance(v, str) and len(v) >= MIN_STRING:
                    pools.setdefault(k, set()).add(v)
    return {k: sorted(v) for k, v in pools.items()}


def _shape(s: str) -> tuple:
    """What a swapped-in string must share with the original: capital, digits, punctuation, words."""
    return (s[:1].isupper(), any(ch.isdigit() for ch in s), sorted({ch for ch in s if not ch.isalnum() and ch != " "}),
            min(len(s.split()), 3))


def _enum_params(rec: dict) -> set[tuple[str, str]]:
    out = set()
    for t in rec["tools"]:
        f = t.get("function") or t
        for k, s in ((f.get("parameters") or {}).get("properties") or {}).items():
            if isinstance(s, dict) and "enum" in s:
                out.add((f.get("name"), k))
    return out


def revalue(rec: dict, pools: dict[str, list[str]], rng: random.Random) -> dict | None:
    """A copy of `rec` with the values its last user message spells out swapped; None if none can be.

    A value is swapped only when it appears exactly once in the last user message and nowhere else in
    the conversation, and is not an enum member. Numbers keep their digits / decimals; strings take
    another value of the same argument name and `_shape` from `pools`.
    """
    msgs = rec["messages"]
    last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
    if last is None or not isinstance(msgs[last].get("content"), str):
        return None
    text = msgs[last]["content"]
    elsewhere = " ".join(str(m.get("content") or "") for i, m in enumerate(msgs) if i != last)
    enums = _enum_params(rec)
    swaps: dict = {}  # old value -> new value
    for call in rec["expected"]:
        for k, v in _leaves(call.get("arguments") or {}):
            s = _spelling(v)
            if s is None or (call["name"], k) in enums or v in swaps:
                continue
            pat = _pattern(s)
            if len(pat.findall(text)) != 1 or pat.search(elsewhere):
                continue
            if isinstance(v, str):
                pool = [p for p in pools.get(k, ()) if p != v and _shape(p) == _shape(v)
                        and not _pattern(p).search(text)]
                new = rng.choice(pool) if pool else None
            else:
                new = _new_number(v, rng)
            # the new value must not be spelt in the request already (the swaps are applied in turn)
            if new is not None and not _pattern(_spelling(new)).search(text) \
                    and all(new != o for o in [*swaps, *swaps.values()]):
                swaps[v] = new
    if not swaps:
        return None
    for old, new in swaps.items():
        text = _pattern(_spelling(old)).sub(lambda _m, s=_spelling(new): s, text)
    out = copy.deepcopy(rec)
    out["messages"][last]["content"] = text
    for call in out["expected"]:
        call["arguments"] = _swapped(call.get("arguments") or {}, swaps)
    out["id"] = f"{rec.get('id')}#revalued"
    return out


def _leaves(args: dict):
    """(name, value) of each scalar argument and each scalar element of a list argument."""
    for k, v in args.items():
        for x in (v if isinstance(v, list) else [v]):
            yield k, x


def _swapped(v, swaps):
    """`v` with every swapped value replaced, however deep (a value spelt once in the request is
    the same value wherever the call repeats it)."""
    if isinstance(v, list):
        return [_swapped(x, swaps) for x in v]
    if isinstance(v, dict):
        return {k: _swapped(x, swaps) for k, x in v.items()}
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return v
    for old, new in swaps.items():
        if type(v) is type(old) and v == old:
            return new
    return v
