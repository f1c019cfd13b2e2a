"""The embedded pair (SmolLM2-135M-Instruct, fp32) with its sidecar: lossless, fewer target forwards,
hints from another tokenizer, follow-up waves; and every target loaded by reference gets the shipped sidecar."""
from __future__ import annotations

import statistics

import pytest
import torch

from oospec_testing import InTime, check_events, greedy, on_target_of, trace_stream
from sidecar_testing import ASK, N, TIME, WEATHER, Aimed
from oospec_agents import Engine
from oospec_agents.drafters import HintDrafter, ReplyState
from oospec_agents.sidecar import HintRequest
from oospec_agents.sidecar.hosts.thread import WaveSidecar
from oospec_agents.sidecar.wave import Wave


@pytest.fixture(scope="module")
def oospec_traces(embedded_fp32, embedded_sidecar, dev_records20):
    """Per record: the oospec engine's streamed events with their rounds (the hint in time)."""
    oospec = on_target_of(embedded_fp32, InTime(embedded_sidecar))
    return oospec, [trace_stream(oospec, r["messages"], r["tools"], tool_choice="required", max_new_tokens=N,
                                 method="oospec") for r in dev_records20]


@pytest.fixture(scope="module")
def runs20(embedded_fp32, dev_records20, embedded_greedy48, oospec_traces):
    """Per record: plain greedy (the session's first N tokens of greedy's 48), toolspec, and oospec
    with the embedded sidecar's hint in time."""
    toolspec = on_target_of(embedded_fp32)
    runs = []
    for r, greedy48, (events, _) in zip(dev_records20, embedded_greedy48, oospec_traces[1]):
        ref = greedy48[:N]
        ts = toolspec.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N, method="toolspec")
        runs.append((r, ref, ts, events[-1][1]))
    return runs


@pytest.mark.slow
def test_oospec_streams_each_call_as_it_is_committed(dev_records20, oospec_traces):
    engine, traces = oospec_traces
    for r, (events, committed) in zip(dev_records20, traces):
        check_events(engine, engine.prepare(r["messages"], r["tools"], "required").prefix, events, committed)


@pytest.mark.slow
def test_oospec_is_lossless_on_20_dev_records(runs20):
    assert len({r["source"] for r, *_ in runs20}) >= 4
    for r, ref, ts, oo in runs20:
        assert oo.token_ids == ref, r["id"]
        assert ts.token_ids == ref, r["id"]


@pytest.mark.slow
def test_oospec_takes_fewer_target_forwards_than_toolspec(runs20):
    ts = sum(t.stats["target_forwards"] for *_, t, _ in runs20)
    oo = sum(o.stats["target_forwards"] for *_, o in runs20)
    hint = sum(o.stats["accepted_by_source"]["hint"] for *_, o in runs20)
    print(f"\ntarget forwards on 20 dev records: toolspec {ts}, oospec {oo}; hint tokens accepted {hint}; "
          f"median hint_bytes {statistics.median(o.stats['hint_bytes'] for *_, o in runs20)}")
    assert oo < ts and hint > 0
    assert all(o.stats["sidecar_error"] is None and o.stats["hint_bytes"] > 0 for *_, o in runs20)


@pytest.mark.slow
def test_an_oracle_hint_takes_a_call_in_a_few_forwards(embedded_fp32, runs20):
    engine = on_target_of(embedded_fp32)
    for r, ref, ts, _ in runs20[:3]:
        gen = engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N,
                                     method="oospec", hint=ts.text)
        assert gen.token_ids == ref
        assert gen.stats["target_forwards"] <= 4 < ts.stats["target_forwards"]
        assert gen.stats["accepted_by_source"]["hint"] >= N // 2


@pytest.mark.slow
def test_the_threaded_sidecar_races_the_target_without_changing_it(embedded_fp32, embedded_sidecar, runs20):
    engine = on_target_of(embedded_fp32, embedded_sidecar)
    for r, ref, ts, _ in runs20[:5]:
        gen = engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N)
        assert gen.token_ids == ref
        s = gen.stats
        assert s["sidecar_error"] is None or s["sidecar_error"].startswith("sidecar hint late"), s["sidecar_error"]
        print(f"\n{r['id']}: hint_ready_s={s['hint_ready_s']} call_s={s['prefill_s'] + s['decode_s']:.2f} "
              f"hint_bytes={s['hint_bytes']} forwards={s['target_forwards']} (toolspec {ts.stats['target_forwards']})")


@pytest.mark.slow
def test_a_real_target_is_lossless_with_hints_from_a_sidecar_with_another_tokenizer(
        embedded_fp32, bpe_tokenizer, bpe_sidecar_model, runs20):
    side = WaveSidecar(Wave(bpe_sidecar_model, bpe_tokenizer, max_row_tokens=8))
    engine = on_target_of(embedded_fp32, InTime(side))
    for r, ref, *_ in runs20[:4]:
        gen = engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N)
        assert gen.token_ids == ref and gen.stats["hint_bytes"] and gen.stats["sidecar_error"] is None
    # What the target is offered is the hint's text in the target's own tokens.
    r = runs20[1][0]
    req = engine.prepare(r["messages"], r["tools"], "required")
    ticket = InTime(side).submit(HintRequest(req.messages, req.tools, engine.fmt, req.choice))
    hint = ticket.poll().text
    ctx = ReplyState(ids=list(req.prompt_ids), n_prompt=len(req.prompt_ids), text=req.prefix, tools=req.tools,
                       fmt=engine.fmt, tokenizer=engine.tokenizer, hint=hint)
    draft, *alternatives = HintDrafter().propose(ctx)
    assert req.prefix + engine.tokenizer.decode(draft.tokens) == hint[:len(req.prefix) + 160]
    assert len(alternatives) <= 1  # at most the compact-separator branch


# ---------------------------------------------------------------- every target gets the shipped sidecar

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.slow
def test_a_target_with_another_tokenizer_gets_the_embedded_sidecar(tmp_path, bpe_tokenizer):
    """Any target loaded by reference gets the embedded sidecar: its hint, rendered as text in the
    target's format, is tokenized by the target's own (BPE) tokenizer, polled and verified, and the
    reply is still the target's greedy output. `sidecar=False` loads none."""
    import copy

    from transformers import AutoModelForCausalLM, Qwen2Config
    tok = copy.deepcopy(bpe_tokenizer)
    tok.chat_template = CHATML
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)

    assert Engine.from_pretrained(str(tmp_path), sidecar=False, dtype="float32").sidecar is None
    engine = Engine.from_pretrained(str(tmp_path), dtype="float32", wave_payback=None)
    assert engine.sidecar.name == "embedded:SmolLM2-135M-Instruct+smollm2-sidecar"
    engine = engine.with_parts(sidecar=InTime(engine.sidecar))  # the hint is there at the first round
    ids = engine.prompt_ids(ASK, [WEATHER, TIME], tool_choice="required")
    gen = engine.generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=24, method="oospec")
    assert gen.stats.sidecar == "embedded:SmolLM2-135M-Instruct+smollm2-sidecar"
    assert gen.stats.sidecar_error is None and gen.stats.hint_bytes > 0  # posted, and polled by the target
    assert gen.token_ids == greedy(engine, ids, 24)
    toolspec = engine.generate(ASK, [WEATHER, TIME], tool_choice="required", max_new_tokens=24, method="toolspec")
    assert toolspec.stats.sidecar is None


@pytest.mark.slow
def test_a_follow_up_wave_corrects_a_misaimed_hint_without_changing_the_tokens(embedded_fp32, runs20):
    """The first hint calls another offered tool; the follow-up, asked once the target has written its
    function's name, brings that function's call. Lossless either way, and fewer forwards with it."""
    fmt = embedded_fp32.fmt
    picked = [(r, ref) for r, ref, *_ in runs20 if len(r["tools"]) > 1][:3]
    assert len(picked) == 3
    forwards = {False: 0, True: 0}
    for r, ref in picked:
        whole = on_target_of(embedded_fp32).generate(r["messages"], r["tools"], tool_choice="required",
                                                     max_new_tokens=128, method="toolspec")
        call = whole.tool_calls[0]  # the target's whole first call: the follow-up's hint
        other = next(t["function"]["name"] for t in r["tools"] if t["function"]["name"] != call["name"])
        calls = {call["name"]: fmt.render_call(call["name"], call["arguments"]), other: fmt.render_call(other, {})}
        runs = {}
        for follow_up in (False, True):
            side = Aimed(calls, first=other)
            engine = on_target_of(embedded_fp32, side, hint_follow_up=follow_up)
            gen = engine.generate(r["messages"], r["tools"], tool_choice="required", max_new_tokens=N, method="oospec")
            assert gen.token_ids == ref, (r["id"], follow_up)
            assert gen.stats["sidecar_error"] is None
            assert gen.stats["hint_follow_ups"] == int(follow_up)
            assert [q.tool_choice for q in side.requests][1:] == ([("named", call["name"])] if follow_up else [])
            runs[follow_up] = gen.stats
        assert runs[True]["target_forwards"] <= runs[False]["target_forwards"], r["id"]
        assert runs[True]["accepted_by_source"]["hint"] > runs[False]["accepted_by_source"]["hint"], r["id"]
        for follow_up in runs:
            forwards[follow_up] += runs[follow_up]["target_forwards"]
    assert forwards[True] < forwards[False], forwards
