"""OoOSpec: a LlamaIndex FunctionCallingLLM that runs local HF models through the oospec engine.

This module owns LlamaIndex's idioms: chat and completion methods and their callbacks, the sampling
fields as LlamaIndex's OpenAI LLM names them, `_prepare_chat_with_tools` and
`get_tool_calls_from_response`. The engine's events become ChatResponses in responses.py (the whole
message so far, its `logprobs` so far, a reasoning target's reasoning); the speculative tools' events are
dispatched through LlamaIndex's instrumentation while a reply decodes by events.py; message translation
is messages.py's. What every front-end shares (the request and its builder, its sampling rules, the
engine's loading, the async bridge, usage, the `allow_parallel_tool_calls` rule) is oospec_agents.frontend's.
"""
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
from oospec_agents.frontend import (OPENAI_SETTINGS, ChatRequest, EngineLike, LazyEngine, ParallelToolCalls, aiterate,
                                    read_sampling, settings)

from .events import dispatching
from .messages import to_engine_messages, tool_calls_of
from .responses import final_response, responses
from .settings import ChatSettings

# What `chat` accepts besides `messages`: the request's settings (`OPENAI_SETTINGS`, but LlamaIndex's
# `max_new_tokens` for `max_tokens`; the method and stop strings are the model's fields alone) and
# `allow_parallel_tool_calls`; `_prepare_chat_with_tools` fills in the tools. The sampling settings are
# fields too, and the call's win.
_CHAT_KWARGS = tuple(s for s in OPENAI_SETTINGS if s not in ("max_tokens", "method", "stop", "logit_bias")) + (
    "max_new_tokens", "allow_parallel_tool_calls")


class OoOSpec(FunctionCallingLLM, ChatSettings):
    """A local HF model as a function-calling LLM, decoded losslessly with speculative tool calls.

    The output is exactly the target's own greedy reply, or with a `temperature` a sample of its own
    distribution (`top_p`, `top_k`, `min_p`, `seed`), produced in fewer target forwards. `logprobs=True`
    fills `ChatResponse.logprobs`. Each setting of a reply (`ChatSettings`' fields, settings.py) may be
    given per call too; the fields below choose the engine. Engines are shared: every OoOSpec naming the
    same models uses one engine, loaded on first use (constructing an OoOSpec loads nothing).

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
    sidecar: Optional[Union[str, bool]] = Field(
        default=None, description="Sidecar model that posts call hints. None: the embedded sidecar, for every "
        "target; False: none (method 'oospec' then decodes as ToolSpec).")
    target_device: Optional[str] = Field(default=None, description='e.g. "cuda:0" or "cpu"; None picks one.')
    sidecar_device: Optional[str] = Field(default=None, description='e.g. "cuda:1"; None picks one.')
    prefix_cache_tokens: Optional[int] = Field(
        default=None, ge=0, description="KV of recent prompts kept for reuse, in tokens (0 turns it off; "
        "None: the engine's default), so each agent turn prefills only what is new.")
    sidecar_placement: Optional[Literal["auto", "thread", "process", "ray"]] = Field(
        default=None, description='Where the sidecar\'s waves run: "thread", "process" (a worker process of its '
        'own), or "auto" (a process for a CUDA sidecar, a thread on the CPU). None: the engine\'s default ("auto").')
    chat_template: Optional[str] = Field(
        default=None, description="A Jinja chat template, or the path of a file holding one, replacing the "
        "target tokenizer's own (needed when it has none, e.g. Gemma 3 270M: oospec_agents/templates/gemma3.jinja).")
    deterministic: Optional[bool] = Field(
        default=None, description="The same request gives the same tokens whatever the method, draft tree and "
        "concurrency, in bf16 too (Engine(deterministic=True), docs/deterministic.md). None: the engine's default (off).")
    call_log: Optional[str] = Field(
        default=None, description="A JSONL file where every reply whose calls all fit their schemas is appended as a "
        "training record for the sidecar (Engine(call_log=...)). It stores prompts (tool results left out); off by default.")

    _engine: LazyEngine = PrivateAttr()

    def __init__(
        self,
        model: Union[str, os.PathLike, None] = None,
        *,
        sidecar: Optional[Union[str, bool]] = None,
        target_device: Optional[str] = None,
        sidecar_device: Optional[str] = None,
        method: Literal["ar", "toolspec", "oospec"] = "oospec",
        max_new_tokens: int = 256,
        prefix_cache_tokens: Optional[int] = None,
        chat_template: Union[str, os.PathLike, None] = None,
        sidecar_placement: Optional[Literal["auto", "thread", "process", "ray"]] = None,
        strict: bool = False,
        deterministic: Optional[bool] = None,
        call_log: Union[str, os.PathLike, None] = None,
        engine: Optional[EngineLike] = None,
        **kwargs: Any,
    ) -> None:
        placement = {"sidecar": sidecar, "target_device": target_device, "sidecar_device": sidecar_device}
        model = _target_name(engine, model, placement)
        chat_template = None if chat_template is None else os.fspath(chat_template)
        call_log = None if call_log is None else os.fspath(call_log)
        super().__init__(model="embedded" if model is None else os.fspath(model), method=method,
                         max_new_tokens=max_new_tokens, prefix_cache_tokens=prefix_cache_tokens,
                         chat_template=chat_template, sidecar_placement=sidecar_placement, strict=strict,
                         deterministic=deterministic, call_log=call_log, **placement, **kwargs)
        read_sampling(settings(self))  # bad settings fail here, naming the field
        # Nothing loads here: the engine is loaded (or found among the shared ones) on first use.
        self._engine = LazyEngine(self.model, sidecar, {"target_device": target_device, "sidecar_device": sidecar_device,
                                                        "prefix_cache_tokens": prefix_cache_tokens,
                                                        "chat_template": chat_template,
                                                        "sidecar_placement": sidecar_placement,
                                                        "deterministic": deterministic, "call_log": call_log}, engine)

    @classmethod
    def class_name(cls) -> str:
        return "OoOSpec"

    @property
    def engine(self) -> EngineLike:
        """The engine, loaded now if this is its first use."""
        return self._engine.get()

    @property
    def metadata(self) -> LLMMetadata:
        """Loads the engine: the context window and the model's name are the target's own, and
        agents size their memory from them."""
        engine = self.engine
        return LLMMetadata(
            context_window=engine.context_window,
            num_output=self.max_new_tokens,
            model_name=engine.model_name,
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
        request, parallel = self._request(messages, kwargs)
        generation = None
        for generation in dispatching(request.stream(self.engine), parallel, id(self)):
            pass
        return final_response(generation, parallel)

    async def _achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request, parallel = self._request(messages, kwargs)
        # Through the event bridge rather than one blocking call, so that a cancelled `achat`
        # stops the decode after its current round and frees the engine.
        generation = None
        async for generation in aiterate(lambda: dispatching(request.stream(self.engine), parallel, id(self))):
            pass
        return final_response(generation, parallel)

    def _stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        request, parallel = self._request(messages, kwargs)
        events = request.stream(self.engine)  # bad input fails here, not on the first chunk
        return responses(dispatching(events, parallel, id(self)), parallel)

    async def _astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        request, parallel = self._request(messages, kwargs)
        # A first use loads the models: seconds that must not block the event loop.
        engine = await asyncio.to_thread(self._engine.get)
        events = request.stream(engine)  # bad input fails here, not on the first chunk
        return aiterate(lambda: responses(dispatching(events, parallel, id(self)), parallel))

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict) -> tuple[ChatRequest, ParallelToolCalls]:
        """The engine request for one reply, and which of its tool calls to keep: every one, or (unless
        `allow_parallel_tool_calls` is truthy) the first, by the front-ends' one rule."""
        unknown = sorted(set(kwargs) - set(_CHAT_KWARGS))
        if unknown:
            raise TypeError(f"OoOSpec chat got unexpected keyword arguments {unknown}; it accepts "
                            f"{list(_CHAT_KWARGS)}")
        tools = kwargs.get("tools") or None
        if tools and self.strict:
            tools = [_strict_tool(t) for t in tools]
        given = {**kwargs, "tools": tools, "max_tokens": kwargs.get("max_new_tokens", self.max_new_tokens)}
        request = ChatRequest.of(to_engine_messages(messages), settings(given, self))
        return request, ParallelToolCalls(bool(kwargs.get("allow_parallel_tool_calls", True)))

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
        strict: Optional[bool] = None,
        **kwargs: Any,
    ) -> Dict[str, Any]:
        """The `chat` arguments for a reply that may call `tools`.

        `tool_choice` ("auto", "none", "required", a tool's name, or an OpenAI dict) wins over
        `tool_required`, which asks for any call. `strict` (None: the LLM's own `strict`) sends
        every tool with `"strict": true`: its calls are decoded under the schemas' grammar. Speculative
        tools among `tools` (speculative.py) are named to the engine with their expected seconds
        (`speculative_tools`), which its pay-back rule weighs.
        """
        if strict is None:
            strict = self.strict
        elif not isinstance(strict, bool):
            raise TypeError(f"strict must be True, False or None, got {strict!r}")
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
        specs = [tool.metadata.to_openai_tool(skip_length_check=True) for tool in tools]
        if strict or self.strict:  # written out either way, so a call's strict=False wins in `chat`
            for spec in specs:
                spec["function"]["strict"] = strict
        # A speculative tool (speculative.py) says so itself: this module does not import that one (no circle).
        speculative = {t.metadata.get_name(): t.expected_latency for t in tools if getattr(t, "is_speculative", False)}
        return {
            "messages": messages,
            "tools": specs,
            "tool_choice": tool_choice,
            "allow_parallel_tool_calls": allow_parallel_tool_calls,
            **({"speculative_tools": speculative} if speculative else {}),
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
            why = (f"; the model wrote {len(invalid)} call(s) whose arguments could not be read: "
                   f"{invalid[0]['error']}" if invalid else "")
            raise ValueError(f"expected at least one tool call in the response, got none{why}. "
                             f"Reply text: {response.message.content or '':.200}")
        return calls


def _target_name(engine: Optional[EngineLike], model: Union[str, os.PathLike, None], placement: dict) -> Any:
    """`model`, or where an `engine` is given, its target's name: the engine holds its models and their
    devices, so naming them too is an error."""
    if engine is None:
        return model
    given = [k for k, v in {"model": model, **placement}.items() if v is not None]
    if given:
        raise ValueError(f"pass either engine= or {'=, '.join(given)}=, not both: the engine "
                         "already holds its models and their devices")
    if not isinstance(engine, EngineLike):
        raise TypeError(f"engine must be an oospec_agents.Engine, got {type(engine).__name__}")
    return engine.model_name


def _strict_tool(tool: Any) -> Any:
    """An OpenAI tool dict flagged `"strict": true`, unless it says otherwise (a copy: the caller's
    dict is not changed). Anything else is left for the engine to check."""
    if not isinstance(tool, dict):
        return tool
    if isinstance(tool.get("function"), dict):
        return tool if "strict" in tool["function"] else {**tool, "function": {**tool["function"], "strict": True}}
    if "name" in tool and "strict" not in tool:  # a bare function dict
        return {**tool, "strict": True}
    return tool
