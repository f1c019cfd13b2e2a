"""Predicted Outputs in process, as `ChatOpenAI` sends them (`invoke(..., prediction=...)`), on a real
engine over a tiny random model: the reply is the same, the prediction drafts it, and the usage object
under `response_metadata["token_usage"]` counts what was accepted as OpenAI's does."""
from __future__ import annotations

import pytest

from langchain_oospec import ChatOoOSpec


@pytest.mark.parametrize("how", ["invoke", "stream", "ainvoke"])
async def test_a_prediction_drafts_the_same_reply_and_is_counted(tiny_engine, how):
    model = ChatOoOSpec(engine=tiny_engine, max_tokens=32, method="toolspec")
    tiny_engine.clear_call_memory()
    plain = model.invoke("Rewrite my paragraph.")
    tiny_engine.clear_call_memory()  # retrieval would draft the first reply: the prediction alone drafts it here
    prediction = {"type": "content", "content": plain.content}
    if how == "invoke":
        reply = model.invoke("Rewrite my paragraph.", prediction=prediction)
    elif how == "ainvoke":
        reply = await model.ainvoke("Rewrite my paragraph.", prediction=prediction)
    else:
        reply = None
        for chunk in model.stream("Rewrite my paragraph.", prediction=prediction):
            reply = chunk if reply is None else reply + chunk
    assert reply.content == plain.content
    meta = reply.response_metadata
    assert meta["accepted_by_source"]["prediction"] > 0
    assert meta["target_forwards"] < plain.response_metadata["target_forwards"]
    details = meta["token_usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0
    assert details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"] == len(
        tiny_engine.tokenizer.encode(plain.content, add_special_tokens=False))
