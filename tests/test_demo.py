"""`oospec demo` (`oospec_agents/demo.py`): the human summary, `--json`, and the demo's quiet set-up.

The demo itself loads the embedded pair (about a minute on a CPU); these tests run its code on a tiny
random model, or on made-up figures, in well under a second each.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import warnings

import pytest

from oospec_agents import demo
from oospec_agents.engine import Generation
from oospec_agents.stats import DecodeStats

CALL = {"id": "call_0", "name": "get_current_weather", "arguments": {"city": "Paris", "unit": "celsius"}}


def _gen(method, forwards, ids, decode_s, **accepted) -> Generation:
    stats = DecodeStats(method, prompt_tokens=265, new_tokens=len(ids), target_forwards=forwards,
                        prefill_s=0.5, decode_s=decode_s)
    stats.accepted_by_source.update(accepted)
    if method == "oospec":
        stats.hint_ready_s, stats.hint_bytes = 0.48, 65
    return Generation("<tool_call>...</tool_call>", list(ids), [CALL], [], stats)


def _gens(oospec_ids=range(24)):
    return {"ar": _gen("ar", 24, range(24), 1.2),
            "toolspec": _gen("toolspec", 6, range(24), 0.4, schema=18),
            "oospec": _gen("oospec", 3, oospec_ids, 0.2, hint=15, schema=6)}


def test_the_summary_says_the_call_each_methods_figures_the_sources_and_that_it_is_lossless():
    text = demo.summary("What is the weather in Paris?", [demo.WEATHER_TOOL], "required", _gens())
    assert "What is the weather in Paris?" in text
    assert 'get_current_weather({"city": "Paris", "unit": "celsius"})' in text
    rows = {words[0]: words for words in map(str.split, text.splitlines()) if words[:1] in (["ar"], ["toolspec"],
                                                                                             ["oospec"])}
    assert rows["ar"][1:3] == ["24", "24"] and rows["ar"][-2:] == ["1.00x,", "1.00x"]
    assert rows["toolspec"][1] == "6" and rows["toolspec"][-2] == "3.00x,"   # decode 1.2 s / 0.4 s
    assert rows["oospec"][1] == "3" and rows["oospec"][-2] == "6.00x,"       # total 1.7 s / 0.7 s next
    assert rows["oospec"][-1] == f"{1.7 / 0.7:.2f}x"
    assert "15 from the sidecar's hint, 6 from the tool schema, 3 from the target's own forwards" in text
    assert "tokens = 18 from the tool schema, 6 from the target's own forwards\n" in text
    assert "18 from the tool schema, 6 from the target's own forwards" in text
    assert "ready 0.48s after the request (65 B)" in text
    assert "lossless: every method's 24 tokens are identical to ar's" in text
    assert "NOT identical" not in text


def test_end_to_end_counts_one_prefill_for_every_method_and_says_how_far_they_spread():
    gens = _gens()
    for method, prefill in (("ar", 4.16), ("toolspec", 3.80), ("oospec", 1.92)):
        gens[method].stats.prefill_s = prefill
    text = demo.summary("q", [demo.WEATHER_TOOL], "required", gens)
    rows = {w[0]: w for w in map(str.split, text.splitlines()) if w[:1] in (["ar"], ["toolspec"], ["oospec"])}
    assert rows["oospec"][-2:] == ["6.00x,", f"{(3.80 + 1.2) / (3.80 + 0.2):.2f}x"]  # not (4.16 + 1.2) / (1.92 + 0.2)
    assert rows["oospec"][5] == "2.12s"  # the measured total stands beside
    assert "the median 3.80s" in text and "the same 265-token prompt, in 1.92-4.16s" in text


def test_the_summary_names_the_first_token_where_a_method_differs():
    text = demo.summary("q", [demo.WEATHER_TOOL], "required", _gens(oospec_ids=[*range(10), 99, *range(11, 24)]))
    assert "NOT identical: oospec differs from ar at new token 10" in text
    assert "lossless:" not in text


def test_the_summary_says_why_the_wave_did_not_run():
    gens = _gens()
    gens["oospec"].stats.hint_ready_s = None
    gens["oospec"].stats.sidecar_skipped = "the wave would cost more than 20% of the decode it can shorten"
    text = demo.summary("q", [demo.WEATHER_TOOL], "required", gens, shares_cpu=True)
    assert "the sidecar's wave did not run: the wave would cost more than 20%" in text
    assert "shares the target's CPU cores" in text


def test_methods_always_start_with_ar_and_unknown_ones_are_named():
    assert demo.methods_of("oospec") == ["ar", "oospec"]
    assert demo.methods_of("oospec,toolspec,ar") == ["ar", "toolspec", "oospec"]
    with pytest.raises(ValueError, match="assisted"):
        demo.methods_of("oospec,assisted")


def _args(*argv):
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers(), "demo")
    return parser.parse_args(["demo", *argv])


@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    from oospec_agents import Engine
    from oospec_testing import tiny_model
    return Engine(tiny_model("llama", smollm2_tokenizer), smollm2_tokenizer, model_name="tiny-llama")


def test_run_prints_the_summary_of_a_real_engine(tiny, monkeypatch, capsys):
    from oospec_agents import Engine
    monkeypatch.setattr(demo, "quiet", lambda: None)  # the process-wide set-up is tested on its own below
    monkeypatch.setattr(Engine, "from_pretrained", classmethod(lambda cls, model: tiny))
    assert demo.run(_args()) == 0
    out = capsys.readouterr().out
    assert out.startswith("oospec demo\n")
    assert "  target       tiny-llama (cpu, float32)\n  sidecar      none\n" in out
    assert "\n  layout       no sidecar; pay-back on (a first request runs the wave: no estimate yet)\n" in out
    assert re.search(r"\n  measured     one request; cpu, float32, torch threads \d+; \d{4}-\d\d-\d\d, git \S+\n", out)
    for method in demo.METHODS:
        assert f"\n  {method} " in out
    assert "lossless: every method's" in out  # float32: the tree methods equal ar token for token


def test_json_prints_each_methods_calls_and_stats(tiny, monkeypatch, capsys):
    from oospec_agents import Engine
    monkeypatch.setattr(demo, "quiet", lambda: None)
    monkeypatch.setattr(Engine, "from_pretrained", classmethod(lambda cls, model: tiny))
    assert demo.run(_args("--json", "--methods", "toolspec")) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["ar", "toolspec"]
    assert out["ar"]["stats"]["method"] == "ar" and out["toolspec"]["stats"]["target_forwards"] >= 1
    assert {"text", "tool_calls", "tool_call_problems", "invalid_tool_calls", "stats"} == set(out["ar"])


def test_quiet_silences_the_libraries_warnings_and_logging(monkeypatch, capsys):
    from transformers.utils import logging as hf_logging
    for var in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "TOKENIZERS_PARALLELISM"):
        monkeypatch.setenv(var, "")  # restored after the test, whatever quiet() sets
    names = ("transformers", "torch", "gguf", "peft", "huggingface_hub", "accelerate", "oospec_agents")
    levels = {n: logging.getLogger(n).level for n in names}
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            demo.quiet()
            warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning)
            hf_logging.get_logger("transformers.modeling_utils").warning("a library warning")
            logging.getLogger("oospec_agents.engine").warning("logged once")
        assert not seen
        assert not hf_logging.is_progress_bar_enabled()
        assert capsys.readouterr().err == ""
    finally:
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
