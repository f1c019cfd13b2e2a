"""The drafter stack driven from token ids alone, as a vLLM proposer drives it: no `Engine` in the loop.
Prompts are the embedded model's (its tokenizer and chat template, rendered by `Engine.prompt_ids`)."""
from __future__ import annotations

import pytest

from oospec_agents.drafters import Accepted, CallMemory, Drafter, DrafterStack, default_drafters
from oospec_agents.formats import detect_format
from oospec_agents.tools import normalize_tools

from oospec_testing import WEATHER

ASK = [{"role": "user", "content": "What is the weather in Reykjavik right now, in celsius?"}]


@pytest.fixture(scope="module")
def engine(smollm2_tokenizer):
    """Only to render prompts (`Engine.prompt_ids`) and to compare with the engine's own drafts."""
    from oospec_testing import make_tiny_engine
    return make_tiny_engine()


def test_a_calls_start_is_drafted_from_the_schema(engine, smollm2_tokenizer):
    tok = smollm2_tokenizer
    fmt = detect_format(tok.chat_template)
    stack = DrafterStack(tok, engine.prompt_ids(ASK, [WEATHER]), [WEATHER])
    draft = stack.propose([], k=64)
    # the wrapper, the only tool's name, the arguments opener, its one required key and the string's quote
    assert tok.decode(draft) == fmt.forced_prefix() + 'get_current_weather", "arguments": {"city": "'
    assert len(stack.propose([], k=3)) == 3


def test_a_forced_openers_reply_goes_on_from_the_prefix(engine, smollm2_tokenizer):
    tok = smollm2_tokenizer
    fmt = detect_format(tok.chat_template)
    ids = engine.prompt_ids(ASK, [WEATHER], tool_choice="required")
    stack = DrafterStack(tok, ids, [WEATHER], prefix=fmt.forced_prefix())
    assert tok.decode(stack.propose([], k=64)).startswith('get_current_weather", "arguments": {')


def test_retrieval_drafts_the_prompts_continuation(engine, smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = engine.prompt_ids(ASK, [WEATHER])
    words = tok.encode("What is the weather", add_special_tokens=False)
    at = next(i for i in range(len(ids)) if ids[i:i + len(words)] == words)  # where the user's question starts
    stack = DrafterStack(tok, ids, [WEATHER])
    said = tok.encode("Here is the weather in", add_special_tokens=False)  # plain text: nothing is forced
    said += ids[at:at + 3]
    assert stack.propose(said, k=5) == ids[at + 3:at + 8]


def test_a_hint_is_drafted_from_its_text_or_its_payload(engine, smollm2_tokenizer):
    tok = smollm2_tokenizer
    fmt = detect_format(tok.chat_template)
    ids = engine.prompt_ids(ASK, [WEATHER])
    call = {"name": "get_current_weather", "arguments": {"city": "Reykjavik", "unit": "celsius"}}
    text = fmt.render_calls([call])
    by_text, by_payload = DrafterStack(tok, ids, [WEATHER]), DrafterStack(tok, ids, [WEATHER])
    by_text.hint(text)
    by_payload.hint_calls([call])
    draft = by_text.propose([], k=200)
    assert tok.decode(draft) == text and by_payload.propose([], k=200) == draft
    # half the call written: the hint goes on from there
    half = draft[:len(draft) // 2]
    assert half + by_text.propose(half, k=200) == draft
    with pytest.raises(ValueError, match="hint"):
        by_text.hint("")
    with pytest.raises(ValueError, match="hint_calls"):
        by_text.hint_calls([])


def test_the_drafters_are_told_what_was_accepted_and_the_memory_keeps_the_reply(engine, smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = engine.prompt_ids(ASK, [WEATHER])
    told: list[Accepted] = []

    class Listening(Drafter):  # TEST DOUBLE: records the feedback hook, drafts what the real schema drafter drafts
        source = "schema"

        def __init__(self):
            self.real = default_drafters()["schema"]

        def propose(self, ctx):
            return self.real.propose(ctx)

        def accepted(self, ctx, accepted):
            told.append(accepted)

    memory = CallMemory()
    stack = DrafterStack(tok, ids, [WEATHER], memory=memory, drafters=default_drafters() | {"schema": Listening()})
    draft = stack.propose([], k=6)
    reply = draft[:4] + [draft[4] + 1]  # the target kept four drafted tokens, then wrote its own
    stack.propose(reply, k=6)
    assert told[-1] == Accepted(tuple(reply), {"schema": 4})
    stack.finish(reply + [7])
    assert told[-1] == Accepted((7,), {}, done=True)
    assert memory.recall(stack.state.tools) == [reply + [7]]
    with pytest.raises(ValueError, match="finished"):
        stack.propose(reply + [7], k=4)
    # a later request on the same tools drafts the remembered reply (retrieval over the call memory)
    again = DrafterStack(tok, ids, [WEATHER], memory=memory)
    assert again.state.pool == [reply + [7]]


def test_bad_arguments_are_named(smollm2_tokenizer):
    with pytest.raises(ValueError, match="prompt_ids"):
        DrafterStack(smollm2_tokenizer, [], None)
    with pytest.raises(ValueError, match="slots"):
        DrafterStack(smollm2_tokenizer, [1, 2], None, drafters={"schema": default_drafters()["schema"]})


class Recorder(Drafter):
    """TEST DOUBLE around one of the engine's real drafters: what it proposed, at which reply length."""

    def __init__(self, slot, real, log):
        self.slot, self.real, self.log, self.source = slot, real, log, real.source

    def propose(self, ctx):
        drafts = self.real.propose(ctx)
        self.log.append((len(ctx.ids) - ctx.n_prompt, ctx.hint, self.slot, [(d.tokens, d.source) for d in drafts]))
        return drafts


@pytest.mark.parametrize("method,choice", [("toolspec", "auto"), ("oospec", "required"), ("toolspec", "required")])
def test_the_stack_drafts_what_the_engines_drafters_draft(engine, smollm2_tokenizer, monkeypatch, method, choice):
    """Every round of the engine's reply, replayed on a stack: the same drafts, in the same order. toolspec
    drafts from the call memory (it holds the reply's first run); oospec from a hint (the first run's text)."""
    tok = smollm2_tokenizer
    fmt = detect_format(tok.chat_template)
    log: list = []
    engine.clear_call_memory()
    prompt = engine.prompt_ids(ASK, [WEATHER], tool_choice=choice)
    first = engine.generate(ASK, [WEATHER], tool_choice=choice, method="toolspec", max_new_tokens=40)
    hint = first.text if method == "oospec" else None
    memory = CallMemory()  # what the engine's memory holds for the second run
    if hint is None:
        memory.remember(normalize_tools([WEATHER]), first.token_ids)
    else:
        engine.clear_call_memory()
    recording = engine.with_parts(drafters={slot: Recorder(slot, make(), log) for slot, make in engine.drafters.items()})
    gen = recording.generate(ASK, [WEATHER], tool_choice=choice, method=method, hint=hint, max_new_tokens=40)
    engine.clear_call_memory()
    assert gen.token_ids == first.token_ids
    rounds: dict[int, list] = {}
    for done, seen_hint, slot, drafts in log:
        rounds.setdefault(done, [seen_hint, []])[1] += drafts
    sources = {source for _, drafts in rounds.values() for _, source in drafts}
    assert len(rounds) > 1 and ("hint" in sources) == bool(hint) and ("retrieval" in sources), sources
    prefix = fmt.forced_prefix() if choice == "required" else ""
    stack = DrafterStack(tok, prompt, [WEATHER], prefix=prefix, memory=memory)
    for done, (seen_hint, drafts) in sorted(rounds.items()):
        if seen_hint and not stack.state.hint:
            stack.hint(seen_hint)
        assert [(d.tokens, d.source) for d in stack.drafts(gen.token_ids[:done])] == drafts, done


def test_the_engine_tells_its_drafters_what_each_round_accepted(engine, monkeypatch):
    told: list[Accepted] = []

    class Listening(Drafter):  # TEST DOUBLE around the engine's own retrieval drafter: records the feedback
        source = "retrieval"

        def __init__(self, real):
            self.real = real

        def propose(self, ctx):
            return self.real.propose(ctx)

        def accepted(self, ctx, accepted):
            assert ctx.ids[len(ctx.ids) - len(accepted.tokens):] == list(accepted.tokens)  # committed already
            told.append(accepted)

    listening = engine.with_parts(drafters={"retrieval": Listening(engine.drafters["retrieval"]())})
    engine.clear_call_memory()
    gen = listening.generate(ASK, [WEATHER], method="toolspec", max_new_tokens=40)
    *rounds, last = told
    assert last.done and not any(r.done for r in rounds)
    assert len(rounds) == gen.stats.target_forwards - 1  # one telling per verify forward
    # the prefill chose the first token; each verify forward committed the rest
    assert gen.token_ids[:1] + [t for r in rounds for t in r.tokens] == gen.token_ids
    for source, n in gen.stats.accepted_by_source.items():
        assert sum(r.by_source.get(source, 0) for r in rounds) == n, source
    assert gen.stats.accepted_by_source["retrieval"] > 0
    assert engine.memory.recall(normalize_tools([WEATHER])) == [gen.token_ids]  # the memory took the same hook
    engine.clear_call_memory()


def test_the_pay_back_rule_learns_a_finished_replys_seconds_on_the_same_hook(engine, monkeypatch):
    from oospec_agents.sidecar.payback import PayBack
    engine = engine.with_parts(payback=PayBack())
    seen = []
    monkeypatch.setattr(engine.payback, "observe", lambda *a: seen.append(a))
    engine.generate(ASK, [WEATHER], method="ar", max_new_tokens=8)
    assert seen == []  # `ar` is not the call a speculative method takes
    gen = engine.generate(ASK, [WEATHER], method="toolspec", max_new_tokens=8)
    s = gen.stats
    assert seen == [(s.prompt_tokens, s.cached_prompt_tokens, s.prefill_s, s.decode_s)]
    events = engine.stream(ASK, [WEATHER], method="toolspec", max_new_tokens=8)
    next(events)
    events.close()  # abandoned: never told `done`, nothing learnt
    assert len(seen) == 1
