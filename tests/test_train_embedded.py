"""The embedded pair with its trained adapters: small, with metrics; the target calls, answers after a
result, reasons then calls (the thinking target); oospec lossless with the trained sidecar."""
from __future__ import annotations

import json

import pytest
import torch

from oospec_testing import DATA, WEATHER, tiny_model
from train_testing import TIME

pytestmark = pytest.mark.usefixtures("one_thread")  # training on a busy machine


# --------------------------------------------------------------------------- the embedded pair (trained adapters)

@pytest.fixture(scope="module")
def embedded_pair():
    """Engine.from_pretrained("embedded") in float32: target + tool-calling adapter, sidecar + its adapter.
    The pay-back rule is off: these tests are about the trained sidecar's hint, which must be asked for
    whatever this CPU's costs say (tests/test_payback.py tests the rule)."""
    from oospec_agents import Engine, models
    assert models.EMBEDDED_TARGET_ADAPTER.exists(), "the target adapter is not committed"
    assert models.EMBEDDED_SIDECAR_ADAPTER.exists(), "the sidecar adapter is not committed"
    return Engine.from_pretrained("embedded", dtype=torch.float32, wave_payback=None)


WEATHER_Q = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def test_thinking_examples_reason_in_a_block_then_answer(smollm2_tokenizer):
    """`train-target --thinking`: SmolLM2's own prompt (the template adds only Qwen3's `enable_thinking`
    switch), the answer preceded by a sentence of reasoning naming the call's function and short values;
    a seeded share rendered with thinking off (the empty block in the prompt, the answer at once)."""
    import copy

    from oospec_agents import Engine, models
    from oospec_agents.train.target import build_target_examples, call_thought
    recs = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()[:30]]
    tok = copy.deepcopy(smollm2_tokenizer)
    tok.chat_template = models.THINKING_CHAT_TEMPLATE.read_text()
    engine = Engine(tiny_model("llama", tok), tok)
    assert engine.reasoning is not None
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        smollm2_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    examples, counts = build_target_examples(engine, recs, thinking=True, answer_frac=0.0, no_tool_frac=0.0)
    assert counts["call"] == len(examples) == 30
    texts = [(tok.decode(ids[:-n]), tok.decode(ids[-n:])) for ids, n in examples]
    on = [(p, a) for p, a in texts if a.startswith("<think>\n")]
    off = [(p, a) for p, a in texts if p.endswith("<think>\n\n</think>\n\n")]
    assert len(on) + len(off) == 30 and 2 <= len(off) <= 12  # no_think_frac 0.2, seeded
    for prompt, answer in on:
        thought, after = answer[len("<think>\n"):].split("\n</think>\n\n", 1)
        assert after.startswith("<tool_call>\n") and prompt.endswith("<|im_start|>assistant\n")
        name = json.loads(after.split("\n")[1])["name"]
        assert name in thought
    for _, answer in off:
        assert answer.startswith("<tool_call>")
    rng = __import__("random").Random(0)
    assert "city \"Paris\"" in call_thought([{"name": "get_weather", "arguments": {"city": "Paris"}}], rng)
    two = call_thought([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}], rng)
    assert "a and b" in two


@pytest.mark.slow
def test_embedded_adapters_are_small_and_have_metrics():
    from oospec_agents import models
    for d in (models.EMBEDDED_TARGET_ADAPTER, models.EMBEDDED_SIDECAR_ADAPTER, models.EMBEDDED_THINKING_ADAPTER):
        files = list(d.iterdir())
        assert all(f.stat().st_size < 20 * 2**20 for f in files)
        assert {"adapter_config.json", "adapter_model.safetensors", "metrics.json"} <= {f.name for f in files}
        assert "config" in json.loads((d / "metrics.json").read_text())


@pytest.mark.slow
def test_the_embedded_thinking_target_reasons_then_calls_lossless(tmp_path):
    """`Engine.from_pretrained("embedded-thinking")` (float32, pinned) writes a `<think>` block first; every
    method gives greedy `generate`'s tokens under `auto`, and under `required` (the call forced after the
    block) the masked reference's; `enable_thinking=False` answers without a block."""
    from oospec_agents import Engine
    from oospec_agents.formats import Reasoning
    from oospec_testing import greedy
    engine = Engine.from_pretrained("embedded-thinking", sidecar=False, dtype=torch.float32)
    assert engine.reasoning == Reasoning() and engine.model_name.startswith("embedded-thinking")
    hint = engine.fmt.render_calls([{"name": "get_current_weather", "arguments": {"city": "Paris"}}])
    for choice in ("auto", "required"):
        ids = engine.prompt_ids(WEATHER_Q, [WEATHER], tool_choice=choice)
        if choice == "auto":
            reference = greedy(engine, ids, 96)
        else:
            masked = engine.logits_processor(WEATHER_Q, [WEATHER], tool_choice=choice, strict=False)
            out = engine.target.generate(torch.tensor([ids]), logits_processor=[masked], do_sample=False,
                                         max_new_tokens=96, pad_token_id=engine.tokenizer.eos_token_id)
            reference = out[0, len(ids):].tolist()
        for method in ("ar", "toolspec", "oospec"):
            gen = engine.generate(WEATHER_Q, [WEATHER], tool_choice=choice, max_new_tokens=96, method=method,
                                  hint=hint if method == "oospec" else None)
            assert gen.token_ids == reference, (choice, method)
            assert gen.reasoning and gen.text.startswith("<think>\n"), gen.text
            assert gen.stats.reasoning_forwards < gen.stats.target_forwards
            if choice == "required":
                assert [c["name"] for c in gen.tool_calls + gen.invalid_tool_calls] == ["get_current_weather"]
    off = engine.generate(WEATHER_Q, [WEATHER], max_new_tokens=48, method="toolspec",
                          chat_template_kwargs={"enable_thinking": False})
    assert off.reasoning is None and "<think>" not in off.text, off.text


@pytest.mark.slow
def test_embedded_target_calls_the_weather_tool_on_auto(embedded_pair):
    gen = embedded_pair.generate(WEATHER_Q, [WEATHER, TIME], tool_choice="auto", max_new_tokens=64, method="toolspec")
    assert [c["name"] for c in gen.tool_calls] == ["get_current_weather"], gen.text
    assert gen.tool_calls[0]["arguments"].get("city") == "Paris"
    assert gen.finish_reason == "tool_calls"


@pytest.mark.slow
def test_embedded_target_answers_in_text_after_a_tool_result(embedded_pair):
    msgs = WEATHER_Q + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_current_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "unit": "celsius", "condition": "sunny"}'}]
    gen = embedded_pair.generate(msgs, [WEATHER, TIME], tool_choice="auto", max_new_tokens=48, method="toolspec")
    assert not gen.tool_calls and not gen.invalid_tool_calls, gen.text
    assert gen.content and gen.finish_reason == "stop"
    assert "18" in gen.content or "sunny" in gen.content  # it reads the result


@pytest.mark.slow
def test_oospec_stays_lossless_with_the_trained_sidecar(embedded_pair):
    from oospec_testing import InTime, greedy
    if embedded_pair.sidecar is None:
        pytest.fail("the embedded sidecar did not load")
    msgs = [{"role": "user", "content": "What's the weather in Tokyo in fahrenheit?"}]
    ar = embedded_pair.generate(msgs, [WEATHER, TIME], tool_choice="auto", max_new_tokens=48, method="ar")
    # The target's prompt is cached now, so its prefill is one token and its reply may be over before
    # the sidecar's (cold) wave posts: lossless all the same, with or without the hint.
    warm = embedded_pair.generate(msgs, [WEATHER, TIME], tool_choice="auto", max_new_tokens=48, method="oospec")
    assert warm.stats.cached_prompt_tokens > 0 and warm.token_ids == ar.token_ids
    embedded_pair.clear_prefix_cache()  # cold, and the hint posted before the first round (InTime): whether
    in_time = embedded_pair.with_parts(sidecar=InTime(embedded_pair.sidecar))  # it lands in time must not depend
    oo = in_time.generate(msgs, [WEATHER, TIME], tool_choice="auto", max_new_tokens=48,  # on how busy CI's two
                          method="oospec")                                              # cores are
    assert oo.stats.cached_prompt_tokens == 0
    assert oo.token_ids == ar.token_ids
    assert oo.token_ids == greedy(embedded_pair, embedded_pair.prompt_ids(msgs, [WEATHER, TIME]), 48)
    assert oo.stats["sidecar_error"] is None and oo.stats["hint_ready_s"] is not None
