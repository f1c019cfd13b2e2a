"""`oospec_agents.testing.Scripted`: the real engine on a scripted model writes each scripted reply, by
every method, and everything after the model (stop cutting, finishing, events, stats) is the engine's."""
from __future__ import annotations

import pytest
import torch

from oospec_agents import CallPredicted, Generation, ReasoningDelta, TextDelta, ToolCallReady
from oospec_agents.formats import Reasoning
from oospec_agents.testing import BOOK_TABLE, CALL_REPLIES, Scripted

ASK = [{"role": "user", "content": "A table for four at Da Michele, 19:30."}]
CALL = CALL_REPLIES["two_calls"].split("\n<tool_call>")[0]  # one call of book_table
BOOKED = {"restaurant": "Da Michele", "people": 4, "time": "19:30"}


@pytest.mark.parametrize("method", ["ar", "toolspec", "oospec"])
def test_every_method_writes_the_script_then_its_end(method):
    engine = Scripted("Booking it." + CALL)
    gen = engine.generate(ASK, [BOOK_TABLE], method=method)
    tok = engine.tokenizer
    assert gen.text == "Booking it." + CALL
    assert gen.token_ids == tok.encode(gen.text, add_special_tokens=False) + [tok.eos_token_id]
    assert (gen.content, gen.finish_reason) == ("Booking it.", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in gen.tool_calls] == [("book_table", BOOKED)]
    stats = gen.stats  # the engine's own: a prefill plus a forward per round, the prompt as rendered
    assert stats.method == method and stats.new_tokens == len(gen.token_ids)
    assert stats.prompt_tokens == gen.prompt_tokens == len(engine.prompt_ids(ASK, [BOOK_TABLE]))
    assert stats.target_forwards == 1 + len(stats.rounds)
    assert (stats.target_forwards == len(gen.token_ids)) == (method == "ar")


def test_replies_go_to_requests_in_order_and_a_missing_one_is_a_clear_error():
    engine = Scripted("First.", "Second.")
    assert [engine.generate(ASK).text for _ in range(2)] == ["First.", "Second."]
    engine.script.add("Third.")
    assert engine.generate(ASK, temperature=1.5, seed=3).text == "Third."  # sampled: the script, too
    with pytest.raises(RuntimeError, match="no reply left for request 4"):
        engine.generate(ASK)


def test_a_stop_string_cuts_the_reply_as_the_engine_cuts():
    gen = Scripted("Fine. Stop here, not this.").generate(ASK, stop=[", not"])
    assert (gen.text, gen.finish_reason) == ("Fine. Stop here", "stop")
    gen = Scripted("Fine. Stop here, not this.").generate(ASK, max_new_tokens=2)
    assert (gen.text, gen.finish_reason) == ("Fine.", "length")


def test_a_forced_call_opener_in_the_prompt_is_not_written_again():
    gen = Scripted(CALL).generate(ASK, [BOOK_TABLE], tool_choice="required")
    assert gen.text == CALL and [c["arguments"] for c in gen.tool_calls] == [BOOKED]


def test_predictions_come_from_the_engines_loop_as_call_predicted_for_oospec_only():
    predicted = [{"name": "book_table", "arguments": BOOKED}]
    engine = Scripted(CALL, CALL, "No call.", predictions={0: predicted, 1: predicted})
    events = list(engine.stream(ASK, [BOOK_TABLE], method="oospec"))
    got = [e for e in events if isinstance(e, CallPredicted)]
    assert [e.calls for e in got] == [predicted] and got[0].confidence is None
    assert events.index(got[0]) < next(i for i, e in enumerate(events) if isinstance(e, ToolCallReady))
    assert events[-1].stats.accepted_by_source["hint"] > 0  # the hint was drafted, the target verified it
    assert not any(isinstance(e, CallPredicted) for e in engine.stream(ASK, [BOOK_TABLE], method="toolspec"))
    third = engine.generate(ASK, [BOOK_TABLE], method="oospec")  # no prediction for reply 2: it declines
    assert third.text == "No call." and third.stats.sidecar_declined


def test_a_reasoning_reply_streams_its_block_as_reasoning():
    engine = Scripted("<think>\nThe user wants a table.\n</think>\n\nBooked.", reasoning=Reasoning())
    assert engine.reasoning == Reasoning()
    events = list(engine.stream(ASK))
    gen = events[-1]
    assert isinstance(gen, Generation)
    assert (gen.reasoning, gen.content) == ("The user wants a table.", "Booked.")
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == gen.reasoning
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == gen.content


def test_requests_are_recorded_and_torch_gets_its_threads_back():
    threads = torch.get_num_threads()
    engine = Scripted("a")
    engine.generate(ASK, [BOOK_TABLE], temperature=0.5, stop=["x"], logprobs=1)
    assert engine.requests == [{"messages": ASK, "tools": [BOOK_TABLE], "tool_choice": "auto", "max_new_tokens": 256,
                                "method": "oospec", "stop": ["x"], "temperature": 0.5, "logprobs": 1}]
    assert torch.get_num_threads() == threads
