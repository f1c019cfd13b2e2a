"""The drafter stack driven from token ids alone, as a vLLM proposer drives it: no `Engine` in the loop.
Prompts are the embedded model's (its tokenizer and chat template, rendered by `Engine.prompt_ids`)."""
from __future__ import annotations

import pytest

from oospec_agents.drafters import Accepted, CallMemory, Drafter, DrafterStack, default_drafters
from oospec_agents.formats import detect_format

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


@pytest.mark.parametrize("method,hint,choice", [("toolspec", None, "auto"), ("oospec", "hint", "required"),
                                                ("toolspec", None, "required")])
def test_the_stack_drafts_what_the_engines_drafters_draft(engine, smollm2_tokenizer, monkeypatch, method, hint,
                                                          choice):
    tok = smollm2_tokenizer
    fmt = detect_format(tok.chat_template)
    hint_text = fmt.render_calls([{"name": "get_current_weather", "arguments": {"city": "Reykjavik"}}]) if hint else None
    log: list = []
    for slot, real in list(engine.drafters.items()):
        monkeypatch.setitem(engine.drafters, slot, Recorder(slot, real, log))
    engine.clear_call_memory()
    prompt = engine.prompt_ids(ASK, [WEATHER], tool_choice=choice)
    first = engine.generate(ASK, [WEATHER], tool_choice=choice, method=method, hint=hint_text, max_new_tokens=40)
    log.clear()
    gen = engine.generate(ASK, [WEATHER], tool_choice=choice, method=method, hint=hint_text, max_new_tokens=40)
    engine.clear_call_memory()
    rounds: dict[int, list] = {}
    for done, seen_hint, slot, drafts in log:  # the second reply's rounds: it drafts from the first, remembered
        rounds.setdefault(done, [seen_hint, []])[1] += drafts
    assert len(rounds) > 1 and any(drafts for _, drafts in rounds.values())
    memory = CallMemory()
    stack = DrafterStack(smollm2_tokenizer, prompt, [WEATHER], memory=memory)  # the same tool set's key
    memory.remember(stack.state.tools, first.token_ids)
    prefix = fmt.forced_prefix() if choice == "required" else ""
    stack = DrafterStack(tok, prompt, [WEATHER], prefix=prefix, memory=memory)
    for done, (seen_hint, drafts) in sorted(rounds.items()):
        if seen_hint and not stack.state.hint:
            stack.hint(seen_hint)
        assert [(d.tokens, d.source) for d in stack.drafts(gen.token_ids[:done])] == drafts, done
