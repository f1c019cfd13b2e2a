"""langchain-tests' standard integration suite, run against LangChain's own `ChatOpenAI` pointed at
`oospec serve` on the embedded default (SmolLM2-135M-Instruct).

Every xfail here is a wrong *answer* from the 135M target, never broken mechanics: the same tests
are marked for the in-process ChatOoOSpec (integrations/langchain/tests/integration_tests/
test_chat_oospec_standard_live.py). They are not strict, so they show up as XPASS once the
target answers right.
"""
from typing import Any

import httpx
import pytest
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests

pytestmark = pytest.mark.slow

_SERVER: dict[str, str] = {}
RAMBLES = ("135M target: the forced call's arguments ramble with invented keys until max_tokens, "
           "so the call never closes and the structured output parser gets nothing")
LONG_PUNCHLINE = ("135M target: under the schema's grammar the joke's punchline string runs on past max_tokens "
                  "(40), so the JSON never closes and the client raises LengthFinishReasonError")


@pytest.fixture(autouse=True, scope="module")
def _server_url(embedded_server):
    _SERVER["url"] = embedded_server


@pytest.fixture(autouse=True)
def _fresh_engine_state(embedded_server):
    """Each test starts from the same engine state, whatever ran before it on the shared engine: an
    empty prefix cache and call memory. The reply is the target's greedy one either way, but in
    float32 a near-tie can fall the other way between a cached and an uncached prefill (or a chain
    and a tree forward), and a 135M model's borderline answer then changes with the test order."""
    from oospec_agents import Engine
    engine = Engine.shared("embedded")
    engine.clear_prefix_cache()
    engine.clear_call_memory()


class TestChatOpenAIOnOoOSpecServe(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatOpenAI]:
        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict:
        # Enough for a whole call of the suite's tools; plain replies stop at EOS or here.
        # A fresh async HTTP client per model: langchain-openai's shared default one keeps connections
        # bound to the event loop of the first async test, and each async test runs in a new loop.
        return {"model": "embedded", "base_url": _SERVER["url"] + "/v1", "api_key": "unused", "max_tokens": 40,
                "max_retries": 0, "stream_usage": True, "http_async_client": httpx.AsyncClient(timeout=120)}

    @property
    def structured_output_kwargs(self) -> dict:
        # ChatOpenAI's default: the schema as response_format, decoded under its grammar.
        return {"method": "json_schema"}

    @property
    def supports_json_mode(self) -> bool:
        return True

    # A pydantic v1 schema: ChatOpenAI falls back to function calling for it.
    @pytest.mark.xfail(reason=RAMBLES, strict=False)
    def test_structured_output_pydantic_2_v1(self, model: Any) -> None:
        super().test_structured_output_pydantic_2_v1(model)

    @pytest.mark.xfail(reason=LONG_PUNCHLINE, strict=False)
    def test_structured_output_optional_param(self, model: Any) -> None:
        super().test_structured_output_optional_param(model)
