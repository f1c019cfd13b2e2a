"""Waves of concurrent requests share the sidecar's forwards (#58 item 3): `Wave.many` stacks the requests'
prefilled prefixes (left-padded, masked) and decodes every row of every request in one lockstep batch.
Each request's texts are the ones its wave alone writes (float32), while the model runs fewer forwards;
the hosts gather the requests that wait while a wave runs into the next one."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from oospec_testing import load_records, spread
from oospec_agents import models
from oospec_agents.chat import normalize_messages
from oospec_agents.formats import HermesFormat
from oospec_agents.sidecar import HintRequest
from oospec_agents.sidecar import wave as wave_module
from oospec_agents.sidecar.hosts.thread import WaveSidecar
from oospec_agents.sidecar.rows import RowOptions
from oospec_agents.sidecar.runtime import WaveHost, wave_rows
from oospec_agents.sidecar.wave import Wave, WaveResult
from oospec_agents.tools import normalize_tools


def _request(rec, tool_choice=("auto", None)):
    return HintRequest(normalize_messages(rec["messages"]), normalize_tools(rec["tools"]), HermesFormat(), tool_choice)


@pytest.fixture(scope="module")
def sidecar_fp32():
    """The embedded sidecar (its shipped adapter) in float32: a wave's texts are exact there."""
    cpu = torch.device("cpu")
    return models.load_model("embedded", device=cpu, dtype=torch.float32, adapter=models.EMBEDDED_SIDECAR_ADAPTER)


@pytest.fixture(scope="module")
def records():
    return spread(load_records("dev"), 6)


def _counting(model):
    """Count the model's forwards."""
    calls = []
    original = model.forward

    def forward(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    model.forward = forward
    return calls, lambda: setattr(model, "forward", original)


def _wave(sidecar_fp32, **kw) -> Wave:
    """A wave of the float32 sidecar that writes its adapter's rows, as the runtime loads it."""
    model, tok = sidecar_fp32
    return Wave(model, tok, row_options=RowOptions.for_adapter(models.EMBEDDED_SIDECAR_ADAPTER), **kw)


def _waves(records, wave):
    out = []
    for rec in records:
        rows, prefix, choices = wave_rows(_request(rec), options=wave.row_options)
        out.append((prefix, rows, None, choices))
    return out


def test_each_request_of_a_batched_wave_writes_what_its_wave_alone_writes_in_fewer_forwards(sidecar_fp32, records):
    wave = _wave(sidecar_fp32, prefix_cache_tokens=0)
    waves = _waves(records, wave)
    calls, restore = _counting(wave.model)
    try:
        alone = [wave(prefix, rows, cancel, choices) for prefix, rows, cancel, choices in waves]
        forwards_alone = len(calls)
        calls.clear()
        together = wave.many(waves)
        forwards_together = len(calls)
    finally:
        restore()
    assert [r.texts for r in together] == [r.texts for r in alone]
    for res, res_alone in zip(together, alone):
        assert res.row_logprobs == pytest.approx(res_alone.row_logprobs, abs=1e-3)
        assert res.profile["batched"] == len(records)
    assert sum(len(rows) for _, rows, _, _ in waves) > len(records)  # several rows a request
    assert forwards_together < forwards_alone / 2, (forwards_together, forwards_alone)


def test_a_cancelled_request_leaves_the_batch_and_the_others_write_as_alone(sidecar_fp32, records):
    wave = _wave(sidecar_fp32, prefix_cache_tokens=0)
    waves = _waves(records[:3], wave)
    alone = [wave(p, r, c, ch).texts for p, r, c, ch in waves]
    stop = threading.Event()
    stop.set()
    waves[1] = waves[1][:2] + (stop,) + waves[1][3:]
    together = wave.many(waves)
    assert [together[0].texts, together[2].texts] == [alone[0], alone[2]]
    assert together[1].profile["steps"] <= 1  # it left at the first step


def test_requests_past_the_kv_budget_wait_for_their_own_batch(sidecar_fp32, records, monkeypatch):
    wave = _wave(sidecar_fp32, prefix_cache_tokens=0)
    waves = _waves(records[:4], wave)
    alone = [wave(p, r, c, ch).texts for p, r, c, ch in waves]
    monkeypatch.setattr(wave_module, "MAX_BATCH_TOKENS", 1)  # no two requests fit
    together = wave.many(waves)
    assert [r.texts for r in together] == alone
    assert all("batched" not in r.profile for r in together)


def test_a_large_tool_set_runs_its_two_phases_on_its_own_beside_a_batch(sidecar_fp32, records):
    wave = _wave(sidecar_fp32, prefix_cache_tokens=0, max_rows=3)  # every multi-tool request: two phases
    waves = _waves(records, wave)
    alone = [wave(p, r, c, ch).texts for p, r, c, ch in waves]
    together = wave.many(waves)
    assert [r.texts for r in together] == alone
    phased = [r.profile for r in together if "phases" in r.profile]
    assert phased and all("batched" not in p for p in phased)
    assert any("batched" in r.profile for r in together)  # the small tool sets still shared a wave


def test_the_prefix_cache_serves_a_batched_wave_and_keeps_its_prefixes(sidecar_fp32, records):
    wave = _wave(sidecar_fp32)
    waves = _waves(records[:3], wave)
    cold_results = wave.many(waves)
    warm_results = wave.many(waves)
    assert [r.texts for r in warm_results] == [r.texts for r in cold_results]
    cold, warm = [r.profile for r in cold_results], [r.profile for r in warm_results]
    assert cold[0]["cached_prefix_tokens"] == 0  # (the later cold ones may share the first's system prompt)
    assert all(w["cached_prefix_tokens"] > c["cached_prefix_tokens"] for w, c in zip(warm, cold))
    assert all(w["cached_prefix_tokens"] >= w["prefix_tokens"] - 1 for w in warm), warm  # all but the last


# ---------------------------------------------------------------- the hosts gather waiting requests

class _Recorder:
    """TEST DOUBLE: a wave function with `many`, recording how many requests each call took."""

    def __init__(self):
        self.calls = []
        self.gate = threading.Event()

    def __call__(self, prefix, rows, cancel, choices):
        self.calls.append(1)
        self.gate.wait(10)
        return [' "get_weather"', ' "Paris"'] + [" null"] * (len(rows) - 2)

    def many(self, waves):
        self.calls.append(len(waves))
        return [WaveResult(self(p, r, c, ch), None, {"batched": len(waves)}) for p, r, c, ch in waves]


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def test_requests_that_wait_while_a_wave_runs_go_together_into_the_next_one():
    wave = _Recorder()
    sidecar = WaveSidecar(wave, threads=None)
    rec = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
    first = sidecar.submit(_request(rec, ("required", None)))
    while not wave.calls:
        time.sleep(0.001)
    tickets = [sidecar.submit(_request(rec, ("required", None))) for _ in range(4)]
    deadline = time.monotonic() + 5
    while len(sidecar.host._pending) < 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    wave.gate.set()
    for t in [first, *tickets]:
        while t.poll() is None and t.error is None:
            time.sleep(0.001)
        assert t.poll() is not None, t.error
    assert wave.calls[0] == 1 and 4 in wave.calls, wave.calls  # one alone, then the four at once
    assert sidecar.wait_idle(5)


def test_a_waiting_request_past_its_wait_gets_a_timeout_and_the_others_run():
    wave = _Recorder()
    host = WaveHost(wave)
    rec = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
    out = {}
    runner = threading.Thread(target=lambda: out.setdefault("first", host.run(1, _request(rec, ("required", None)))))
    runner.start()
    while not wave.calls:
        time.sleep(0.001)
    late = host.run(2, _request(rec, ("required", None)), wait_s=0.05)
    assert "sidecar timeout" in late["error"]
    wave.gate.set()
    runner.join(5)
    assert "payload" in out["first"]
    assert not host._pending


class _GatedWave:
    """TEST DOUBLE around a real `Wave`: its first wave waits until `n` more requests queue behind it,
    so that the engine's concurrent replies deterministically meet at the sidecar."""

    def __init__(self, wave, n):
        self.wave, self.n, self.host, self.batches = wave, n, None, []

    def __getattr__(self, name):
        return getattr(self.wave, name)

    def __call__(self, *args):
        deadline = time.monotonic() + 10
        while self.host is not None and len(self.host._pending) < self.n and time.monotonic() < deadline:
            time.sleep(0.002)
        self.batches.append(1)
        return self.wave(*args)

    def many(self, waves):
        self.batches.append(len(waves))
        return self.wave.many(waves)


def test_an_engines_concurrent_replies_share_sidecar_waves_and_each_reply_is_its_reply_alone(smollm2_tokenizer):
    from oospec_testing import greedy, tiny_model
    from oospec_agents import Engine
    tok = smollm2_tokenizer
    target = tiny_model("llama", tok, seed=7)
    side_model = tiny_model("llama", tok, seed=3)
    wave = _GatedWave(Wave(side_model, tok, max_row_tokens=8), n=4)
    sidecar = WaveSidecar(wave, threads=None)
    wave.host = sidecar.host
    engine = Engine(target, tok, sidecar=sidecar, wave_payback=None, memory_size=0)
    questions = ["Weather in Paris?", "Weather in Rome?", "Is it hot in Oslo?", "Weather in Lima?", "Cairo?"]
    kw = dict(tool_choice="required", max_new_tokens=48, method="oospec")
    alone = Engine(target, tok, memory_size=0)
    refs = [greedy(alone, alone.prompt_ids([{"role": "user", "content": q}], [WEATHER], tool_choice="required"), 48)
            for q in questions]
    from test_batching import together
    gens = together([lambda q=q: engine.generate([{"role": "user", "content": q}], [WEATHER], **kw)
                     for q in questions])
    for g, ref in zip(gens, refs):
        assert not isinstance(g, BaseException), g
        assert g.token_ids == ref[:len(g.token_ids)]
    # one wave alone, then the others together (less any whose reply ended first: its wave is cancelled)
    assert wave.batches[0] == 1 and max(wave.batches) >= 2, wave.batches
    assert sum((g.stats.sidecar_profile or {}).get("batched", 1) >= 2 for g in gens) == max(wave.batches)
    engine.close()


def test_a_subclass_biases_each_rows_logits_before_its_constraints(smollm2_tokenizer):
    """An experiment's wave (examples/copy_prior.py) adds to a row's logits by overriding `_constrain_row`
    and calling it after: it sees each live row with its tokens so far and may add to its logits; the
    function row's choices still hold."""
    from oospec_testing import tiny_model
    tok = smollm2_tokenizer
    quote = tok.encode(' "', add_special_tokens=False)[0]
    seen = []

    class QuoteWave(Wave):
        def _constrain_row(self, job, row, logits):
            so_far = job.out[row]
            seen.append((job.rows[row].kind, list(so_far)))
            if job.rows[row].kind == "slot" and not so_far:
                logits[quote] += 1e4
            super()._constrain_row(job, row, logits)
    wave = QuoteWave(tiny_model("llama", tok, seed=3), tok, max_row_tokens=4)
    rec = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}
    rows, prefix, choices = wave_rows(_request(rec, ("required", None)))
    texts = wave(prefix, rows, None, choices).texts
    assert texts[0].strip() == '"get_weather"'  # constrained to the offered name regardless
    assert texts[1].startswith(' "')             # the slot row's first token is the biased one
    assert {k for k, _ in seen} == {"function", "slot"}
