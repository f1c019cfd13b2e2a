"""The schema drafts in the formats vLLM holds a forced call to never leave vLLM's grammar: for every prefix
of a reply that vLLM's own grammar accepts (xgrammar, compiled from the schema or structural tag vLLM's
server builds: `bench.vllm_backend.constraints`), the prefix followed by the drafted forced text is still
accepted. Replies: the records' expected calls (unseen tool sets of train-extra), written compact, as
json.dumps writes them, and as SmolLM2 writes them under vLLM's grammar (`[\\n  {...}\\n]`, `{\\n  "k": v\\n}`).
No model runs: this is the drafter against the grammar, character by character."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("xgrammar")
pytest.importorskip("vllm")

from oospec_agents.bench.vllm_backend import named_tool, required_schema, strict_tools, structural_tag  # noqa: E402
from oospec_agents.drafters.schema import forced_text  # noqa: E402
from oospec_agents.formats import HermesFormat  # noqa: E402
from oospec_agents.formats.vllm_json import Layout, VllmArgumentsFormat, VllmCallListFormat, reply_format  # noqa: E402
from oospec_agents.tools import normalize_tools  # noqa: E402

EXTRA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "toolcalls" / "train-extra.jsonl"
UNSEEN = ("tooltalk", "nestful", "callnavi", "bfcl_multi_turn_base_first")
N = 12


@pytest.fixture(scope="module")
def records() -> list[dict]:
    if not EXTRA.exists():
        pytest.fail(f"the records are not at {EXTRA}")
    rows = [json.loads(line) for line in EXTRA.read_text().splitlines() if line.strip()]
    picked, by_source = [], {}
    for r in rows:  # round-robin over the unseen sources, records that expect a call
        if r["source"] in UNSEEN and r["expected"] and by_source.get(r["source"], 0) < N // len(UNSEEN):
            by_source[r["source"]] = by_source.get(r["source"], 0) + 1
            picked.append(r)
    assert len(picked) == N
    return picked


def _matcher(grammar):
    import xgrammar as xgr
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False).compile_grammar(grammar)
    return lambda text: xgr.GrammarMatcher(compiled, terminate_without_stop_token=True).accept_string(text)


def _ordered(args: dict, tool: dict) -> dict:
    """`args` in the order of the tool's declared properties (the order xgrammar holds them to)."""
    props = list(tool["function"]["parameters"].get("properties") or {})
    return {k: args[k] for k in props if k in args} | {k: v for k, v in args.items() if k not in props}


def _layouts(value) -> list[str]:
    return [json.dumps(value, separators=(",", ":")), json.dumps(value), json.dumps(value, indent=2)]


def _check(fmt, text: str, tools, accepts) -> tuple[int, int]:
    """(prefixes checked, forced characters drafted); asserts every draft stays in the grammar."""
    checked = drafted = 0
    for cut in range(len(text) + 1):
        prefix = text[:cut]
        if not accepts(prefix):
            break  # the reply itself leaves the grammar here (a value of the wrong type): nothing to check
        chosen = reply_format(prefix, fmt) if type(fmt) is HermesFormat else fmt
        forced = forced_text(SimpleNamespace(answer=prefix, fmt=chosen or fmt, tools=tools)) if chosen else ""
        assert accepts(prefix + forced), (prefix, forced)
        checked += 1
        drafted += len(forced)
    return checked, drafted


def test_required_list_drafts_stay_in_vllms_grammar(records):
    import xgrammar as xgr
    checked = drafted = 0
    layout = Layout()
    layout.observe('[\n  {"name": "f", "parameters": {"a": 1}}\n]')
    for r in records:
        tools = normalize_tools(r["tools"])
        accepts = _matcher(xgr.Grammar.from_json_schema(json.dumps(required_schema(r["tools"]))))
        by_name = {t["function"]["name"]: t for t in r["tools"]}
        calls = [{"name": c["name"], "parameters": _ordered(c["arguments"], by_name[c["name"]])}
                 for c in r["expected"] if c["name"] in by_name]
        for text in _layouts(calls) + ["[\n  " + json.dumps(calls)[1:-1] + "\n]"]:
            for fmt in (VllmCallListFormat(), VllmCallListFormat(layout), HermesFormat()):
                c, d = _check(fmt, text, tools, accepts)
                checked, drafted = checked + c, drafted + d
    assert checked > 1000 and drafted > checked, (checked, drafted)


def test_named_tool_drafts_stay_in_vllms_grammar(records):
    import xgrammar as xgr
    checked = drafted = 0
    learnt = Layout()
    learnt.observe('{\n  "k": "v"\n}')
    for r in records:
        tools = normalize_tools(r["tools"])
        name = named_tool(r, "named")
        accepts = _matcher(xgr.Grammar.from_json_schema(json.dumps(required_schema(r["tools"], name))))
        tool = next(t for t in r["tools"] if t["function"]["name"] == name)
        args = _ordered(next(c["arguments"] for c in r["expected"] if c["name"] == name), tool)
        for text in _layouts(args):
            for fmt in (VllmArgumentsFormat(), VllmArgumentsFormat(name), VllmArgumentsFormat(layout=learnt),
                        VllmArgumentsFormat(name, learnt), HermesFormat()):
                c, d = _check(fmt, text, tools, accepts)
                checked, drafted = checked + c, drafted + d
    assert checked > 500 and drafted > 0, (checked, drafted)


@pytest.mark.parametrize("tool_choice", ["required", "named", "auto"])
def test_strict_hermes_drafts_stay_in_vllms_structural_tag(records, tool_choice):
    """VLLM_ENFORCE_STRICT_TOOL_CALLING with strict tools: vLLM's hermes structural tag; the reply is hermes."""
    import xgrammar as xgr
    checked = drafted = 0
    for r in records:
        tools = normalize_tools(strict_tools(r["tools"]))  # the prompt shows them strict: the proposer reads it
        accepts = _matcher(xgr.Grammar.from_structural_tag(structural_tag(r["tools"], tool_choice, r)))
        by_name = {t["function"]["name"]: t for t in r["tools"]}
        calls = [{"name": c["name"], "arguments": _ordered(c["arguments"], by_name[c["name"]])}
                 for c in r["expected"] if c["name"] in by_name]
        if tool_choice == "named":
            calls = [c for c in calls if c["name"] == named_tool(r, "named")][:1]
        text = "".join("<tool_call>\n" + json.dumps(c) + "\n</tool_call>" for c in calls)
        c, d = _check(HermesFormat(), text, tools, accepts)
        checked, drafted = checked + c, drafted + d
    assert checked > 300 and drafted > 0, (checked, drafted)
