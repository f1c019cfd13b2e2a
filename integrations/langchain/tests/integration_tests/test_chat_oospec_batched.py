"""#58: a ChatOoOSpec's async calls from one process share the engine's batched rounds (`abatch`,
`asyncio.gather` of agents), and each reply is the one it gets alone."""
from __future__ import annotations

import asyncio

from oospec_testing import batch_sizes

from langchain_oospec import ChatOoOSpec

PROMPTS = [f"Question {i}: what is {i} plus {i}?" for i in range(4)]


async def test_gathered_ainvokes_and_abatch_share_the_engines_forwards(tiny_engine):
    model = ChatOoOSpec(engine=tiny_engine, method="ar", max_tokens=24)
    alone = [(await model.ainvoke(p)).content for p in PROMPTS]
    with batch_sizes(tiny_engine) as sizes:
        gathered = await asyncio.gather(*(model.ainvoke(p) for p in PROMPTS))
        batched = await model.abatch(PROMPTS)
    assert [m.content for m in gathered] == alone
    assert [m.content for m in batched] == alone
    assert sizes and max(sizes) > 1, "no forward was shared"
