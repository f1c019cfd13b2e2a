"""langchain-tests' standard integration suite against the embedded default (SmolLM2-135M-Instruct).

Every xfail here is a wrong *answer* from the 135M target, never broken mechanics: the call is
forced and parsed as it should be, and the model fills it with values that fail the schema or
never closes it. They are not strict, so they show up as XPASS once the target answers right
(the tool-calling adapter in oospec_agents/adapters/smollm2-target is meant to get there).
"""
from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

from langchain_oospec import ChatOoOSpec

pytestmark = pytest.mark.slow

WRONG_ARGS = ("135M target: the forced call carries arguments that fail the tool's schema "
              "(e.g. a JSON Schema fragment instead of an integer)")
NO_CALL = ("135M target: with tool_choice='auto' it answers in prose instead of calling the tool; "
           "calling on its own needs the tool-calling adapter")
RAMBLES = ("135M target: the forced call's arguments ramble with invented keys until max_tokens, "
           "so the call never closes and fails the schema")


class TestChatOoOSpecStandardLive(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatOoOSpec]:
        return ChatOoOSpec

    @property
    def chat_model_params(self) -> dict:
        # Enough for a whole call of the suite's tools; plain replies stop at EOS or here.
        return {"model": "embedded", "max_tokens": 40}

    @property
    def supports_json_mode(self) -> bool:
        return True  # method="json_mode" decodes under JSON mode's grammar (response_format json_object)

    @pytest.mark.xfail(reason="135M target: JSON mode's grammar makes the reply a JSON object, not its keys; "
                              "in a whole-suite run it wrote {\"\": \"setup\", \"punchline\": ...}, no 'setup' key",
                       strict=False)
    def test_json_mode(self, model: Any) -> None:
        super().test_json_mode(model)

    @pytest.mark.xfail(reason=WRONG_ARGS, strict=False)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_tool_calling(self, model: Any) -> None:
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=WRONG_ARGS, strict=False)
    async def test_tool_calling_async(self, model: Any) -> None:
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(reason=WRONG_ARGS + "; here 'answer_style' comes back as an object", strict=False)
    def test_bind_runnables_as_tools(self, model: Any) -> None:
        super().test_bind_runnables_as_tools(model)

    @pytest.mark.xfail(reason="135M target: under tool_choice='any' with two tools it writes a name that is "
                              "no offered tool, or arguments that fail the schema", strict=False)
    def test_tool_choice(self, model: Any) -> None:
        super().test_tool_choice(model)

    @pytest.mark.xfail(reason="135M target: it invents arguments for a tool that takes none", strict=False)
    def test_tool_calling_with_no_arguments(self, model: Any) -> None:
        super().test_tool_calling_with_no_arguments(model)

    @pytest.mark.xfail(reason=RAMBLES, strict=False)
    @pytest.mark.parametrize("schema_type", ["pydantic", "typeddict", "json_schema"])
    def test_structured_output(self, model: Any, schema_type: Any) -> None:
        super().test_structured_output(model, schema_type)

    @pytest.mark.xfail(reason=RAMBLES, strict=False)
    @pytest.mark.parametrize("schema_type", ["pydantic", "typeddict", "json_schema"])
    async def test_structured_output_async(self, model: Any, schema_type: Any) -> None:
        await super().test_structured_output_async(model, schema_type)

    @pytest.mark.xfail(reason=RAMBLES, strict=False)
    def test_structured_output_pydantic_2_v1(self, model: Any) -> None:
        super().test_structured_output_pydantic_2_v1(model)

    @pytest.mark.xfail(reason=RAMBLES, strict=False)
    def test_structured_output_optional_param(self, model: Any) -> None:
        super().test_structured_output_optional_param(model)

    @pytest.mark.xfail(reason=NO_CALL, strict=False)
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: Any) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason=WRONG_ARGS + "; the Chinese/Japanese location comes back as malformed JSON",
                       strict=False)
    def test_unicode_tool_call_integration(self, model: Any, *, tool_choice: Any = None,
                                           force_tool_call: bool = True) -> None:
        super().test_unicode_tool_call_integration(model, tool_choice=tool_choice, force_tool_call=force_tool_call)
