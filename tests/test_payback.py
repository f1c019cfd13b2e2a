"""The pay-back rule: a sidecar on the target's own CPU runs its wave only when the wave's seconds,
which land on the target's call, are a small enough share of the decode a hint can shorten. Decided
from fitted costs, never from a clock in the test: the costs here are fed in by hand."""
from __future__ import annotations

import pytest

from oospec_testing import tiny_model
from oospec_agents import Engine
from oospec_agents.sidecar import FixedHint
from oospec_agents.sidecar.payback import Line, PayBack

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_line_fits_cost_against_work():
    line = Line()
    assert line(5) is None                      # nothing to fit: no estimate
    line.add(10, 1.0)
    assert line(500) == pytest.approx(1.0)      # one point: its value
    line.add(110, 2.0)
    assert line(60) == pytest.approx(1.5) and line(210) == pytest.approx(3.0)
    falling = Line()
    falling.add(0, 2.0)
    falling.add(100, 1.0)
    # more work never costs less: a falling fit is flat, at the mean (the older point weighs 0.8)
    assert falling(1000) == pytest.approx((0.8 * 2.0 + 1.0) / 1.8)


def test_the_line_follows_the_machine():
    line = Line(decay=0.5)
    for _ in range(20):
        line.add(0, 1.0)
    for _ in range(20):
        line.add(0, 3.0)
    assert line(0) == pytest.approx(3.0, abs=1e-4)


def test_the_verdict_weighs_the_wave_against_the_decode_not_the_whole_call():
    rule = PayBack(ratio=0.5)
    assert rule.call_s(50) is None and rule.decode_s() is None
    assert rule.verdict(100.0, None) is None    # no reply seen yet: the wave runs
    rule.observe(prompt_tokens=3000, cached_prompt_tokens=0, prefill_s=6.0, decode_s=2.0)
    assert rule.call_s(3000) == pytest.approx(8.0) and rule.decode_s() == pytest.approx(2.0)
    assert rule.verdict(1.0, rule.decode_s()) is None   # half the decode: it can still pay back
    assert rule.verdict(None, 2.0) is None      # the sidecar has no estimate yet: the wave runs
    # a 3 s wave is well inside a long prompt's 8 s call, but 3 s is more than a 2 s decode can give back
    reason = rule.verdict(3.0, rule.decode_s())
    assert "3.00 s" in reason and "2.00 s" in reason and "50%" in reason
    with pytest.raises(ValueError, match="wave_payback"):
        PayBack(0)


class CpuHint(FixedHint):
    """A sidecar on the target's CPU that states its wave's cost and counts its waves."""

    device = "cpu"
    threads = None  # lends no cores: the test is about the decision only

    def __init__(self, text: str, estimate_s, device: str = "cpu"):
        super().__init__(text)
        self.estimate_s, self.device, self.waves = estimate_s, device, 0

    def estimate(self, request):
        if isinstance(self.estimate_s, Exception):
            raise self.estimate_s
        return self.estimate_s

    def submit(self, request):
        self.waves += 1
        return super().submit(request)


@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    model = tiny_model("llama", smollm2_tokenizer)
    plain = Engine(model, smollm2_tokenizer, model_name="tiny")
    ref = plain.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=24, method="toolspec")
    return model, smollm2_tokenizer, ref


def _engine(tiny, sidecar, **kw) -> Engine:
    model, tok, _ = tiny
    engine = Engine(model, tok, sidecar, model_name="tiny", **kw)
    engine.payback.observe(prompt_tokens=100, cached_prompt_tokens=0, prefill_s=0.5, decode_s=1.5) \
        if engine.payback else None  # replies decode in about 1.5 s (2 s with the prefill)
    return engine


@pytest.mark.parametrize("estimate_s, runs", [(0.5, True), (0.6, True), (0.65, False), (30.0, False),
                                              (None, True), (RuntimeError("no costs"), True)])
def test_a_wave_on_the_targets_cores_runs_only_when_it_can_pay_back(tiny, estimate_s, runs):
    _, _, ref = tiny
    sidecar = CpuHint(ref.text, estimate_s)
    gen = _engine(tiny, sidecar, wave_payback=0.4).generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=24)
    assert sidecar.waves == int(runs)
    assert (gen.stats.sidecar_skipped is None) == runs
    assert gen.stats.call_estimate_s == pytest.approx(2.0) and gen.stats.decode_estimate_s == pytest.approx(1.5)
    assert gen.stats.wave_estimate_s == (estimate_s if isinstance(estimate_s, float) else None)
    if not runs:
        assert "on the cores it shares with the target" in gen.stats.sidecar_skipped
        assert gen.stats.hint_ready_s is None and gen.stats.accepted_by_source["hint"] == 0
    assert gen.token_ids == ref.token_ids  # skipped or not, the target's answer


def test_a_wave_on_its_own_device_always_runs(tiny):
    _, _, ref = tiny
    sidecar = CpuHint(ref.text, 30.0, device="cuda:1")  # only the device type is read: nothing runs on it
    gen = _engine(tiny, sidecar).generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=24)
    assert sidecar.waves == 1 and gen.stats.sidecar_skipped is None and gen.token_ids == ref.token_ids


def test_the_rule_can_be_turned_off(tiny):
    _, _, ref = tiny
    sidecar = CpuHint(ref.text, 30.0)
    gen = _engine(tiny, sidecar, wave_payback=None).generate(ASK, [WEATHER], tool_choice="required",
                                                             max_new_tokens=24)
    assert sidecar.waves == 1 and gen.stats.sidecar_skipped is None


def test_the_engine_learns_its_call_time_from_speculative_replies(tiny):
    model, tok, _ = tiny
    engine = Engine(model, tok, model_name="tiny")
    assert engine.payback.call_s(10) is None
    engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=8, method="ar")
    assert engine.payback.call_s(10) is None  # AR's call is not the one a wave would shorten
    gen = engine.generate(ASK, [WEATHER], tool_choice="required", max_new_tokens=8, method="toolspec")
    assert engine.payback.call_s(gen.stats.prompt_tokens) == pytest.approx(gen.stats.prefill_s + gen.stats.decode_s)


def test_a_wave_estimates_itself_from_the_waves_it_ran(tiny):
    from oospec_agents.chat import normalize_messages
    from oospec_agents.formats import HermesFormat
    from oospec_agents.sidecar import HintRequest
    from oospec_agents.sidecar.wave import ROW_WORK, Wave
    from oospec_agents.sidecar.hosts.thread import WaveSidecar
    from oospec_agents.sidecar.runtime import wave_rows
    from oospec_agents.tools import normalize_tools
    model, tok, _ = tiny
    request = HintRequest(normalize_messages(ASK), normalize_tools([WEATHER]), HermesFormat(), ("required", None))
    wave = Wave(model, tok, max_row_tokens=4)
    sidecar = WaveSidecar(wave)
    assert sidecar.estimate(request) is None  # no wave has run
    rows, prefix, choices = wave_rows(request)
    profile = wave(prefix, rows, None, choices).profile
    n = len(tok.encode(prefix, add_special_tokens=False))
    assert profile["cached_prefix_tokens"] == 0
    assert sidecar.estimate(request) == pytest.approx(profile["prefill_s"] + profile["decode_s"], rel=0.2)
    # the prefix is cached now: the same request is less work, and a wave of it adds a cheaper point
    assert wave.prefix_cache.peek(tok.encode(prefix, add_special_tokens=False)) > n // 2
    assert wave(prefix, rows, None, choices).profile["cached_prefix_tokens"] > n // 2
    assert wave.cost(n + ROW_WORK * len(rows)) >= wave.cost(ROW_WORK * len(rows))


# ---------------------------------------------------------------- speculative tools on offer (#55)

def test_the_tool_time_a_wave_can_hide_pays_for_it():
    rule = PayBack(ratio=0.2)
    rule.observe(prompt_tokens=400, cached_prompt_tokens=0, prefill_s=0.3, decode_s=1.2)  # a 1.5 s call
    assert rule.exact() == pytest.approx(0.5)  # the prior: half the predicted calls are exact
    assert rule.hidden_s(None, 1.5) == 0.0 and rule.hidden_s(1.0, None) == 0.0
    assert rule.hidden_s(1.0, 1.5) == pytest.approx(0.5)
    assert rule.hidden_s(4.0, 1.5) == pytest.approx(0.75)  # no more than the call it hides behind
    wave = 0.6  # a wave on 2 shared cores
    assert rule.verdict(wave, rule.decode_s()) is not None                  # no tools: 0.24 s of decode to win
    assert rule.verdict(wave, rule.decode_s(), rule.hidden_s(1.0, 1.5)) is None  # 1 s tools: 0.74 s to win
    why = rule.verdict(wave, rule.decode_s(), rule.hidden_s(0.25, 1.5))     # 0.25 s tools: 0.365 s
    assert why is not None and "tool time it is expected to hide (about 0.12 s)" in why
    for _ in range(30):
        rule.observe_prediction(False)
    assert rule.exact() < 0.01 and rule.hidden_s(1.0, 1.5) < 0.01  # a sidecar that is never exact hides nothing
    for _ in range(30):
        rule.observe_prediction(True)
    assert rule.exact() > 0.99


@pytest.mark.parametrize("tools, runs", [(None, False), ({"get_weather": 1.0}, True),
                                         ({"get_weather": 0.25}, False), ({"get_weather": None}, False),
                                         ({"other_tool": 5.0}, False), ({"get_weather": 1.0, "x": None}, True)])
def test_the_engine_weighs_the_speculative_tools_on_offer(tiny, tools, runs):
    _, _, ref = tiny
    sidecar = CpuHint(ref.text, 0.8)  # over 0.4 * 1.5 s of decode; under it plus half of a 1 s tool
    gen = _engine(tiny, sidecar, wave_payback=0.4).generate(ASK, [WEATHER], tool_choice="required",
                                                            max_new_tokens=24, speculative_tools=tools)
    assert sidecar.waves == int(runs) and (gen.stats.sidecar_skipped is None) == runs
    known = tools is not None and tools.get("get_weather") is not None
    assert gen.stats.hidden_estimate_s == (pytest.approx(0.5 * min(tools["get_weather"], 2.0)) if known else None)
    assert gen.token_ids == ref.token_ids  # the wave or not, the target's answer


@pytest.mark.parametrize("bad, message", [(["get_weather"], "must be a dict"),
                                          ({"get_weather": -1}, r"speculative_tools\['get_weather'\] must be"),
                                          ({"get_weather": "1s"}, "expected seconds >= 0 or None")])
def test_bad_speculative_tools_are_named(tiny, bad, message):
    from oospec_agents import OoOSpecError
    with pytest.raises(OoOSpecError, match=message):
        _engine(tiny, None).stream(ASK, [WEATHER], speculative_tools=bad)
