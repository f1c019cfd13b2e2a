"""OoOSpec: a LlamaIndex FunctionCallingLLM that runs local HF models through the oospec engine."""
from __future__ import annotations

import asyncio
import os
from typing import Any, Dict, List, Literal, Optional, Sequence, Union

from llama_index.core.base.llms.generic_utils import (
    achat_to_completion_decorator,
    astream_chat_to_completion_decorator,
    chat_to_completion_decorator,
    stream_chat_to_completion_decorator,
)
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.tools.types import BaseTool
from oospec_agents import Engine, Generation, TextDelta

from .messages import assistant_message, to_engine_messages, tool_calls_of
from .streaming import iterate_in_thread

# What `chat` accepts besides `messages`; `_prepare_chat_with_tools` fills in the first three.
_CHAT_KWARGS = ("tools", "tool_choice", "allow_parallel_tool_calls", "max_new_tokens")


class OoOSpec(FunctionCallingLLM):
    """A local HF model as a function-calling LLM, decoded losslessly with speculative tool calls.

    Greedy decoding only: the output is exactly the target's own greedy reply, produced in fewer
    target forwards. Engines are shared: every OoOSpec naming the same models uses one engine.

    Examples:
        ```python
        from llama_index.core.agent.workflow import FunctionAgent
        from llama_index.llms.oospec import OoOSpec

        llm = OoOSpec()  # the embedded SmolLM2-135M pair, on CPU or GPU
        agent = FunctionAgent(tools=[multiply], llm=llm)
        print(await agent.run("What is 6 times 7?"))
        ```
    """

    model: str = Field(default="embedded", description="Target model: a HF id, a local path, a GGUF "
                       'file, or "embedded".')
    sidecar: Optional[str] = Field(default=None, description="Sidecar model that posts call hints; None "
                                   "takes the engine's default (the embedded sidecar for the embedded target).")
    target_device: Optional[str] = Field(default=None, description='e.g. "cuda:0" or "cpu"; None picks one.')
    sidecar_device: Optional[str] = Field(default=None, description='e.g. "cuda:1"; None picks one.')
    method: Literal["ar", "toolspec", "oospec"] = Field(
        default="oospec", description="Decoding method: plain autoregressive, schema drafting only, or "
        "schema drafting plus the sidecar's hints.")
    max_new_tokens: int = Field(default=256, gt=0, description="Most tokens generated per reply.")

    _engine: Engine = PrivateAttr()

    def __init__(
        self,
        model: Union[str, os.PathLike, None] = None,
        *,
        sidecar: Optional[str] = None,
        target_device: Optional[str] = None,
        sidecar_device: Optional[str] = None,
        method: Literal["ar", "toolspec", "oospec"] = "oospec",
        max_new_tokens: int = 256,
        engine: Optional[Engine] = None,
        **kwargs: Any,
    ) -> None:
        placement = {"sidecar": sidecar, "target_device": target_device, "sidecar_device": sidecar_device}
        if engine is not None:
            given = [k for k, v in {"model": model, **placement}.items() if v is not None]
            if given:
                raise ValueError(f"pass either engine= or {'=, '.join(given)}=, not both: the engine "
                                 "already holds its models and their devices")
            if not isinstance(engine, Engine):
                raise TypeError(f"engine must be an oospec_agents.Engine, got {type(engine).__name__}")
            model = engine.model_name
        super().__init__(model="embedded" if model is None else os.fspath(model), method=method, max_new_tokens=max_new_tokens,
                         **placement, **kwargs)
        if engine is None:
            # Unset arguments are left out so that equal requests hit the same shared engine.
            engine = Engine.shared(self.model, **{k: v for k, v in placement.items() if v is not None})
        self._engine = engine

    @classmethod
    def class_name(cls) -> str:
        return "OoOSpec"

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._engine.context_window,
            num_output=self.max_new_tokens,
            model_name=self._engine.model_name,
            is_chat_model=True,
            is_function_calling_model=True,
        )

    # ------------------------------------------------------------------ chat

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat(messages, **kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await self._achat(messages, **kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._stream_chat(messages, **kwargs)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return await self._astream_chat(messages, **kwargs)

    # The completion methods wrap the undecorated chat methods, so each call fires one callback event.

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return chat_to_completion_decorator(self._chat)(prompt, **kwargs)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await achat_to_completion_decorator(self._achat)(prompt, **kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return stream_chat_to_completion_decorator(self._stream_chat)(prompt, **kwargs)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        return await astream_chat_to_completion_decorator(self._astream_chat)(prompt, **kwargs)

    def _chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request, keep_all = self._request(messages, kwargs)
        return self._response(self._engine.generate(**request), keep_all)

    async def _achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request, keep_all = self._request(messages, kwargs)
        generation = await asyncio.to_thread(self._engine.generate, **request)
        return self._response(generation, keep_all)

    def _stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        request, keep_all = self._request(messages, kwargs)  # bad input fails here, not mid-stream
        return self._stream(request, keep_all)

    async def _astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        request, keep_all = self._request(messages, kwargs)
        return iterate_in_thread(self._stream(request, keep_all))

    def _stream(self, request: dict, keep_all: bool) -> ChatResponseGen:
        content = ""
        for item in self._engine.stream(**request):
            if isinstance(item, Generation):
                final = self._response(item, keep_all)
                yield ChatResponse(message=final.message, delta="", raw=final.raw)
            elif isinstance(item, TextDelta):
                content += item.text
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=content), delta=item.text)

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict) -> tuple[dict, bool]:
        """The engine's arguments for one reply, and whether to keep every tool call it makes."""
        unknown = sorted(set(kwargs) - set(_CHAT_KWARGS))
        if unknown:
            raise TypeError(f"OoOSpec chat got unexpected keyword arguments {unknown}; it accepts "
                            f"{list(_CHAT_KWARGS)} (decoding is greedy, so there is no temperature)")
        request = {
            "messages": to_engine_messages(messages),
            "tools": kwargs.get("tools") or None,
            "tool_choice": kwargs.get("tool_choice") or "auto",
            "max_new_tokens": kwargs.get("max_new_tokens", self.max_new_tokens),
            "method": self.method,
        }
        return request, kwargs.get("allow_parallel_tool_calls", True)

    def _response(self, generation: Generation, keep_all: bool) -> ChatResponse:
        calls = generation.tool_calls if keep_all else generation.tool_calls[:1]
        completion_tokens = len(generation.token_ids)
        raw = {
            "usage": {"prompt_tokens": generation.prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": generation.prompt_tokens + completion_tokens},
            "finish_reason": generation.finish_reason,
            "text": generation.text,
            "invalid_tool_calls": generation.invalid_tool_calls,
            "stats": generation.stats,
        }
        return ChatResponse(message=assistant_message(generation.content, calls), raw=raw)

    # ------------------------------------------------------------------ tools

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: Optional[Union[str, ChatMessage]] = None,
        chat_history: Optional[List[ChatMessage]] = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: Union[str, dict, None] = None,
        **kwargs: Any,
    ) -> Dict[str, Any]:
        """The `chat` arguments for a reply that may call `tools`.

        `tool_choice` ("auto", "none", "required", a tool's name, or an OpenAI dict) wins over
        `tool_required`, which asks for any call.
        """
        for i, tool in enumerate(tools):
            if not isinstance(tool, BaseTool):
                raise TypeError(f"tools[{i}] must be a LlamaIndex BaseTool (e.g. FunctionTool.from_defaults"
                                f"(fn)), got {type(tool).__name__}")
        messages = list(chat_history or [])  # the caller's history is not ours to append to
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        if tool_choice is None:
            tool_choice = "required" if tool_required else "auto"
        return {
            "messages": messages,
            "tools": [tool.metadata.to_openai_tool(skip_length_check=True) for tool in tools],
            "tool_choice": tool_choice,
            "allow_parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> List[ToolSelection]:
        """The response's tool calls as ToolSelections with dict kwargs."""
        calls = tool_calls_of(response.message)
        if not calls and error_on_no_tool_call:
            invalid = response.raw.get("invalid_tool_calls") if isinstance(response.raw, dict) else None
            why = (f"; the model wrote {len(invalid)} call(s) that failed validation: "
                   f"{invalid[0]['error']}" if invalid else "")
            raise ValueError(f"expected at least one tool call in the response, got none{why}. "
                             f"Reply text: {response.message.content or '':.200}")
        return calls
