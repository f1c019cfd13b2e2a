"""A lexical prior over the offered tools, for the wave's function row.

On tool sets it never saw, the 135M sidecar often picks the wrong tool of many (`callnavi`'s 21-101
tools: 40% function accuracy), while the words of the user's request name the right one: with this
prior at a weight that all but decides (100), the function row chose right on all 40 of those records.
The wave's function row adds `weight x prior` to the logits of each name it may write
(`Wave(prior_weight=...)`), so the model still chooses, and a wrong lexical guess is outvoted when
the model is sure.

    prior(tool) = score(tool) / max score - 1        in [-1, 0]: the best match 0, no match -1
    null (a text reply under "auto")  0               the decline keeps its standing against the best name
    no word of the request matches any tool          every prior 0: no opinion

BM25 is `bm25s`'s; the index is one request's tools (1-100 short documents, a few ms). Names are split
at `_`, `.`, `-` and camelCase, so `get_weather` matches "weather". docs/sidecar.md ("A lexical prior
over the tools") has the measurements behind the default weight.
"""
from __future__ import annotations

import re

from ..tools import Tool

#: characters of the request the prior reads (its user turns, latest last); a long paste gains little
MAX_QUERY_CHARS = 2000
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEP = re.compile(r"[_.\-/]+")


def words(text: str) -> str:
    """`getWeather_now` -> `get Weather now`: identifiers split into the words BM25 compares."""
    return _SEP.sub(" ", _CAMEL.sub(" ", text))


def tool_text(tool: Tool) -> str:
    """What a tool is matched on: its name (twice: it is the most telling part), description, and each
    parameter's name and description."""
    parts = [tool.name, tool.name, tool.description or ""]
    for name, spec in tool.properties.items():
        parts += [name, spec.get("description", "") if isinstance(spec, dict) else ""]
    return words(" ".join(parts))


def query_text(messages: list[dict]) -> str:
    """The user's turns, the latest last, clipped to the last MAX_QUERY_CHARS characters."""
    users = [m.get("content") or "" for m in messages if m.get("role") == "user"]
    return words(" ".join(u for u in users if isinstance(u, str)))[-MAX_QUERY_CHARS:]


def tool_prior(messages: list[dict], tools: list[Tool]) -> list[float]:
    """One prior per tool, in [-1, 0] (see the module's docstring); all 0 when nothing matches."""
    import bm25s
    if len(tools) < 2:
        return [0.0] * len(tools)
    corpus = bm25s.tokenize([tool_text(t) for t in tools], stopwords="en", show_progress=False)
    if not corpus.vocab:  # names and descriptions of stop words and single characters only
        return [0.0] * len(tools)
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    query = bm25s.tokenize([query_text(messages)], stopwords="en", show_progress=False, return_ids=False)[0]
    known = [w for w in query if w in retriever.vocab_dict]
    if not known:
        return [0.0] * len(tools)
    scores = retriever.get_scores(known)
    best = float(scores.max())
    return [0.0] * len(tools) if best <= 0 else [float(s) / best - 1.0 for s in scores]
