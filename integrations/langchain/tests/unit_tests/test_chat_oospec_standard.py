"""langchain-tests' standard unit suite. Constructing ChatOoOSpec loads nothing, so no engine is needed."""
from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_oospec import ChatOoOSpec


class TestChatOoOSpecStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatOoOSpec]:
        return ChatOoOSpec

    @property
    def chat_model_params(self) -> dict:
        return {"model": "embedded"}
