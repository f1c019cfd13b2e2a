"""#58: OoOSpec's async calls from one process share the engine's batched rounds (`asyncio.gather` of
`achat`), and each reply is the one it gets alone."""
import asyncio

from oospec_testing import batch_sizes

from llama_index.core.base.llms.types import ChatMessage

from llama_index.llms.oospec import OoOSpec

ASKS = [[ChatMessage(role="user", content=f"Question {i}: what is {i} plus {i}?")] for i in range(4)]


async def test_gathered_achats_share_the_engines_forwards(tiny_engine):
    llm = OoOSpec(engine=tiny_engine, method="ar", max_new_tokens=24)
    alone = [(await llm.achat(m)).message.content for m in ASKS]
    with batch_sizes(tiny_engine) as sizes:
        gathered = await asyncio.gather(*(llm.achat(m) for m in ASKS))
    assert [r.message.content for r in gathered] == alone
    assert sizes and max(sizes) > 1, "no forward was shared"
