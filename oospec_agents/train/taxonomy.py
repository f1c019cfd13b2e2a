"""What kind of wrong a wrong slot is, and the lenient scorer.

Every slot the evaluation scores as wrong (the function is right, the slot's value differs from the
label's under the strict scorer) falls in exactly one class, tried in this order:

- `optional_filled`: the label leaves the argument out (absent or null) and the wave wrote a value;
- `optional_dropped`: the label has a value and the wave left the argument out (the wave never leaves
  out a required, non-nullable argument, so in practice these are optional ones);
- `format`: both have a value and they are the same value written another way: the same words after
  normalising case, whitespace and punctuation (`"New York, NY"` ~ `"new york ny"`); the same number
  as text or number (`5` ~ `"5"` ~ `5.0`); the words of one run inside the other's (`"Paris"` ~
  `"Paris, FR"`, `"10 km"` ~ `10`, but not `1` ~ `10`); the same head before a comma
  (`"Kuala Lumpur, MY"` ~ `"Kuala Lumpur, Malaysia"`); the same date whichever shape (`"03/14"` ~ `"2023-03-14"`,
  `"March 14"` ~ `"2023-03-14"`: the numbers of the shorter are among the longer's); or lists of the
  same elements in another order;
- `context`: the label's value (each of its leaves, as words in a row, normalised as above) is written
  in an earlier message (the system turn, earlier user or assistant turns, tool results) but not in
  the last user turn: the value needs the conversation, not just the request;
- `wrong_value`: anything else (a value the model got wrong).

The lenient scorer (`lenient_right`) accepts, besides the strict value, any value the record's
`meta.possible_answer` (BFCL's full answer) lists for the argument, and, where leaving the argument
out is acceptable (the possible answer lists "" or does not name it; or, without a possible answer,
the label leaves an optional argument out), leaving it out or writing its schema default.
"""
from __future__ import annotations

import json
import re
from typing import Any

#: the classes of a wrong slot, in the order they are tried
CLASSES = ("optional_filled", "optional_dropped", "format", "context", "wrong_value")

_MONTHS = {m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                            "nov", "dec"))}
_MONTH_NAME = re.compile(r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b", re.I)
_DATE = re.compile(r"\d{1,4}[-/.]\d{1,2}(?:[-/.]\d{1,4})?|" + _MONTH_NAME.pattern, re.I)


def classify(gold: Any, predicted: Any, messages: list[dict]) -> str:
    """The class (`CLASSES`) of a slot whose predicted value is not the label's; None means absent."""
    if gold is None:
        return "optional_filled"
    if predicted is None:
        return "optional_dropped"
    if same_format(gold, predicted):
        return "format"
    if in_context(gold, messages):
        return "context"
    return "wrong_value"


def words(value: Any) -> list[str]:
    """A scalar as comparable words: lower case, split at whitespace and punctuation; a number (or a
    string that is one) as one word without a trailing `.0`."""
    if isinstance(value, bool):
        return [str(value).lower()]
    if isinstance(value, (int, float)):
        return [_number(value)]
    try:
        return [_number(float(str(value).strip()))]
    except ValueError:
        return re.findall(r"[^\W_]+", str(value).lower())


def normal(value: Any) -> str:
    """A scalar as comparable text: its `words`, joined."""
    return "".join(words(value))


def same_format(gold: Any, predicted: Any) -> bool:
    """Whether two values are one value in two shapes (see the module's `format`)."""
    if isinstance(gold, list) and isinstance(predicted, list):
        return sorted(map(_canon, gold)) == sorted(map(_canon, predicted)) or (
            len(gold) == len(predicted) and all(same_format(g, p) for g, p in zip(gold, predicted)))
    if isinstance(gold, dict) and isinstance(predicted, dict):
        return gold.keys() == predicted.keys() and all(same_format(gold[k], predicted[k]) for k in gold)
    if isinstance(gold, (list, dict)) or isinstance(predicted, (list, dict)):
        return False
    a, b = words(gold), words(predicted)
    if a == b or (a and b and (_within(a, b) or _within(b, a))):
        return True
    if "," in f"{gold}{predicted}" and words(str(gold).split(",")[0]) == words(str(predicted).split(",")[0]) != []:
        return True  # the same head, another qualifier: "Kuala Lumpur, MY" ~ "Kuala Lumpur, Malaysia"
    return _same_date(str(gold), str(predicted))


def in_context(gold: Any, messages: list[dict]) -> bool:
    """Whether every leaf of `gold` is written in a message before the last user turn (or in the
    system turn) and not all of them in the last user turn."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None:
        return False
    leaves = [w for w in map(words, _leaves(gold)) if w]
    if not leaves:
        return False
    before = [words(_content(m)) for i, m in enumerate(messages) if i != last]
    now = words(_content(messages[last]))
    return all(any(_within(v, b) for b in before) for v in leaves) and not all(_within(v, now) for v in leaves)


def lenient_right(param: str, gold: Any, predicted: Any, *, possible: dict | None, spec: dict | None,
                  required: bool) -> bool:
    """The lenient scorer for one slot (the module's last paragraph). `possible`: the record's
    possible answer for the called function ({param: [acceptable values]}), or None."""
    if predicted == gold:
        return True
    if possible is not None:
        accepted = possible.get(param)
        omit_ok = accepted is None or "" in accepted
        if predicted is not None and accepted is not None and any(predicted == v for v in accepted if v != ""):
            return True
    else:
        omit_ok = gold is None and not required
    if not omit_ok:
        return False
    return predicted is None or (isinstance(spec, dict) and "default" in spec and predicted == spec["default"])


def possible_answer(record: dict, name: str) -> dict | None:
    """The record's BFCL possible answer for its first call to `name` ({param: [values]}), or None."""
    for entry in (record.get("meta") or {}).get("possible_answer") or []:
        if isinstance(entry, dict) and name in entry and isinstance(entry[name], dict):
            return entry[name]
    return None


def _within(part: list[str], whole: list[str]) -> bool:
    """Whether the words `part` occur in `whole`, in a row."""
    n = len(part)
    return any(whole[i:i + n] == part for i in range(len(whole) - n + 1))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _leaves(value: Any) -> list:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [value]


def _content(message: dict) -> str:
    parts = [message.get("content") or ""]
    if not isinstance(parts[0], str):
        parts = [json.dumps(parts[0], ensure_ascii=False)]
    parts += [json.dumps(c, ensure_ascii=False) for c in message.get("tool_calls") or []]
    return " ".join(parts)


def _date_numbers(text: str) -> list[int] | None:
    """The numbers of a date-like text (a month name counts as its number), or None if it is not one."""
    if not _DATE.search(text):
        return None
    nums = [int(n) for n in re.findall(r"\d+", text)]
    nums += [_MONTHS[m[:3].lower()] for m in _MONTH_NAME.findall(text)]
    return nums or None


def _same_date(a: str, b: str) -> bool:
    """Two date-like texts where the numbers of the one with fewer are all among the other's."""
    x, y = _date_numbers(a), _date_numbers(b)
    if x is None or y is None:
        return False
    short, long_ = sorted((x, y), key=len)
    left = list(long_)
    for n in short:
        if n not in left:
            return False
        left.remove(n)
    return len(short) >= 2 or short == long_
