"""ChatOoOSpec: a LangChain chat model whose replies and tool calls come from the oospec-agents engine.

This module owns LangChain's idioms: call keyword arguments, `bind_tools`, `with_structured_output`,
the engine's events as `AIMessageChunk`s whose sum is `invoke`'s message, ChatOpenAI's sampling fields
and `n` (several ChatGenerations in one ChatResult) and its `response_metadata["logprobs"]`, and a
reasoning target's reasoning as ChatOllama and ChatDeepSeek give it (`additional_kwargs["reasoning_content"]`,
which LangChain's `content_blocks` shows as a standard reasoning block). What every
front-end shares (the request, its sampling rules, the engine's loading, the async bridge, usage, the
`parallel_tool_calls` rule) is oospec_agents.frontend's.
"""
from __future__ import annotations

import json
import os
from contextlib import aclosing, closing
from operator import itemgetter
from typing import Any, AsyncIterator, Callable, Iterable, Iterator, Literal, Sequence

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, UsageMetadata
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.output_parsers import (JsonOutputKeyToolsParser, JsonOutputParser, PydanticOutputParser,
                                           PydanticToolsParser)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableLambda, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_function, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import Field, PrivateAttr, field_validator, model_validator

from oospec_agents import Generation, LogprobsDelta, ReasoningDelta, TextDelta, ToolCallDelta
from oospec_agents.engine import Event
from oospec_agents.errors import ToolSchemaError
from oospec_agents.events import CallPredicted, ToolCallReady
from oospec_agents.frontend import (OPENAI_SETTINGS, ChatRequest, EngineLike, LazyEngine, ParallelToolCalls, Usage,
                                    aiterate, call_problems, choice_count, read_sampling, settings)
from oospec_agents.tools import normalize_tools, resolve_tool_choice

from ._messages import to_openai_messages
from .custom_events import SpeculativeEvent, adispatch, dispatch
from .settings import ChatSettings

#: keyword arguments a single call may carry (through `bind`, `bind_tools` or `invoke`): ChatOpenAI's names, the
#: request's settings (`OPENAI_SETTINGS`; `stop` is `_generate`'s own argument) and the model's own. Its penalties
#: and `logit_bias` are not served: only the neutral value is taken (`frontend.check_penalties`).
_CALL_KWARGS = tuple(s for s in OPENAI_SETTINGS if s != "stop") + ("model", "parallel_tool_calls", "n",
                                                                   "frequency_penalty", "presence_penalty")


class ChatOoOSpec(BaseChatModel, ChatSettings):
    """A local tool-calling chat model, decoded losslessly faster with out-of-order speculation.

    Output is the target model's own greedy decoding, or with a `temperature` a sample of its own
    distribution (`top_p`, `top_k`, `min_p`, `seed` as ChatOpenAI and vLLM take them); the speculation
    only saves target forwards. `n` gives several generations; `logprobs=True` (and `top_logprobs`)
    puts `{"content": [...]}` in `response_metadata["logprobs"]`, as ChatOpenAI does.

    Setup:
        `pip install langchain-oospec`. `model="embedded"` (the default) needs no download.

    Instantiate:
        ```python
        from langchain_oospec import ChatOoOSpec

        model = ChatOoOSpec()                                   # the embedded default
        model = ChatOoOSpec(model="Qwen/Qwen2.5-1.5B-Instruct", sidecar="Qwen/Qwen2.5-0.5B-Instruct",
                            max_tokens=512)
        ```

    Tool calling:
        ```python
        model.bind_tools([get_current_weather], tool_choice="auto").invoke("Weather in Paris?")
        model.bind_tools([get_current_weather], strict=True)    # calls decoded under the schema's grammar
        ```

    Speculative tools (docs/speculative-tools-langchain.md): the engine's predicted call and each verified
    call whose arguments have closed reach callback handlers as custom events (custom_events.py);
    `SpeculativeToolsMiddleware` starts read-only tools from them, and passes `speculative_tools=`
    (`{tool name: expected seconds or None}`) so the engine's pay-back rule weighs the tool time a hit hides.

    Reasoning (a `<think>` target such as Qwen3, docs/reasoning.md):
        ```python
        model = ChatOoOSpec(model="Qwen/Qwen3-8B", chat_template_kwargs={"enable_thinking": True})
        reply = model.invoke("Weather in Paris?")
        reply.additional_kwargs["reasoning_content"]            # the <think> block; streamed chunk by chunk
        reply.content_blocks[0]                                 # {"type": "reasoning", "reasoning": ...}
        ```
        An earlier AIMessage's reasoning (`additional_kwargs["reasoning_content"]`, or its reasoning
        content blocks) goes back to the chat template as `reasoning_content`.

    Engines are shared: every `ChatOoOSpec` naming the same models and devices uses one loaded engine,
    loaded on first use (constructing the chat model loads nothing). The fields below choose the engine;
    a reply's settings (method, length, sampling, template arguments) are `ChatSettings`' (settings.py).
    """

    model: str = "embedded"
    """The target: a Hugging Face id, a local path, a GGUF file or "embedded"."""
    sidecar: str | bool | None = None
    """The hint model, a reference like `model`. None: the embedded sidecar, for every target (it
    posts text in the target's own format); False: none, and `method="oospec"` decodes as ToolSpec."""
    target_device: str | None = None
    sidecar_device: str | None = None
    prefix_cache_tokens: int | None = None
    """KV of recent prompts the engine keeps for reuse, in tokens (0 turns it off; None: the engine's
    default). An agent resends its system prompt and tools every turn: only the new tail is prefilled."""
    sidecar_placement: Literal["auto", "thread", "process", "ray"] | None = None
    """Where the sidecar's waves run: "thread", "process" (a worker process of its own), or "auto"
    (a process for a CUDA sidecar, a thread on the CPU). None: the engine's default ("auto")."""
    deterministic: bool | None = None
    """The same request gives the same tokens whatever the method, draft tree and concurrency, in bf16
    too (`Engine(deterministic=True)`, docs/deterministic.md). None: the engine's default (off)."""
    call_log: str | None = None
    """A JSONL file where every reply whose calls all fit their schemas is appended as a training record
    for the sidecar (`Engine(call_log=...)`). It stores prompts (tool results left out); off by default."""
    chat_template: str | None = None
    """A Jinja chat template, or the path of a file holding one, replacing the target tokenizer's own
    (needed when it has none, e.g. Gemma 3 270M: oospec_agents/templates/gemma3.jinja)."""
    engine: EngineLike | None = Field(default=None, exclude=True)
    """An already loaded engine, used instead of loading `model`."""
    _engines: LazyEngine = PrivateAttr()
    """`engine`, or the shared engine of `model` (or of a per-call `model`), loaded on first use."""

    @field_validator("model", "sidecar", "chat_template", "call_log", mode="before")
    @classmethod
    def _path_as_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @model_validator(mode="after")
    def _select_engine(self) -> ChatOoOSpec:
        read_sampling(settings(self))  # bad settings fail here, naming the field
        choice_count(self.n)
        if self.engine is not None and "model" not in self.model_fields_set:
            self.model = self.engine.model_name
        options = {"target_device": self.target_device, "sidecar_device": self.sidecar_device,
                   "prefix_cache_tokens": self.prefix_cache_tokens, "chat_template": self.chat_template,
                   "sidecar_placement": self.sidecar_placement, "deterministic": self.deterministic,
                   "call_log": self.call_log}
        self._engines = LazyEngine(self.model, self.sidecar, options=options, engine=self.engine)
        return self

    @property
    def _llm_type(self) -> str:
        return "chat-oospec"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(ls_provider="oospec", ls_model_name=kwargs.get("model", self.model),
                                 ls_model_type="chat", ls_max_tokens=kwargs.get("max_tokens", self.max_tokens))
        temperature = kwargs.get("temperature", self.temperature)
        if temperature is not None:
            params["ls_temperature"] = temperature
        if ls_stop := stop or self.stop:
            params["ls_stop"] = ls_stop
        return params

    # ------------------------------------------------------------------ tools and structured output

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable | BaseTool],
        *,
        tool_choice: dict | str | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools, kept under `tools` as OpenAI function dicts (LangGraph reads them there).

        Args:
            tools: anything `convert_to_openai_tool` accepts; each schema is checked now.
            tool_choice: "auto", "none", "any" or "required" (some tool must be called), a tool's
                name, or `{"type": "function", "function": {"name": ...}}`.
            strict: as in `ChatOpenAI.bind_tools`. True: every tool is bound with `"strict": true`
                (and, as `convert_to_openai_tool(strict=True)` writes it, every object in its schema
                closed and its properties required), and the engine decodes the calls under a
                grammar of valid calls, so they always match the schema (docs/strict.md). Unlike
                `ChatOpenAI`, this reaches tools given as `{"type": "function", ...}` dicts too.
                False: `"strict": false` on every tool. None: each tool as it is given.
        """
        if strict is not None and not isinstance(strict, bool):
            raise TypeError(f"strict must be True, False or None, got {strict!r}")
        formatted = [_openai_tool(t, i, strict) for i, t in enumerate(tools)]
        # Each schema is checked now, so a bad one fails here, naming the tool. Duplicate names are
        # the engine's to reject when a request is made: binding them is not yet an error.
        checked = [tool for spec in formatted for tool in normalize_tools([spec])]
        if tool_choice is not None:
            mode, name = resolve_tool_choice(tool_choice, checked)
            kwargs["tool_choice"] = name if mode == "named" else mode
        return super().bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict | type | None = None,
        *,
        method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict | Any]:
        """Return output matching `schema` (pydantic class, TypedDict or JSON Schema).

        As in `ChatOpenAI`:
        - "function_calling" forces one call of a tool whose parameters are the schema; the output is
          parsed from a call the engine has validated. `strict=True` binds that tool strict
          (`bind_tools(strict=True)`): the call is decoded under the schema's grammar.
        - "json_schema" binds `response_format={"type": "json_schema", "json_schema": {"name", "schema",
          "strict"}}`: the reply's text is decoded under the schema's grammar (closed objects where
          `strict=True`) and parsed.
        - "json_mode" binds `response_format={"type": "json_object"}`: any JSON object, whose keys the
          prompt must ask for; the reply's text is parsed. `strict` is refused with it.
        Output decoded under a grammar always parses, unless `max_tokens` cuts it off.
        """
        if kwargs:
            raise ValueError(f"Received unsupported arguments {kwargs}")
        return _structured_output(self, schema, method, include_raw, strict)

    # ------------------------------------------------------------------ generation
    # One code path, as in langchain-ollama: `_stream` maps the engine's events to chunks, and
    # `_generate` is the sum of that stream. With `n` > 1, `_generate` sums each choice's chunks
    # (the choices decoded one after another) into a ChatGeneration of its own, as ChatOpenAI gives them.

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self._choices(kwargs) > 1:
            return _result(_dispatched(self._chunks(messages, stop, kwargs), run_manager))
        return _result(self._stream(messages, stop, run_manager, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self._choices(kwargs) > 1:
            chunks = _adispatched(aiterate(lambda: self._chunks(messages, stop, kwargs)), run_manager)
            return _result([chunk async for chunk in chunks])
        return _result([chunk async for chunk in self._astream(messages, stop, run_manager, **kwargs)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        self._one_choice(kwargs)
        # closing(): a consumer that stops early releases the engine now, not when garbage is collected
        with closing(self._chunks(messages, stop, kwargs)) as items:
            for chunk in _dispatched(items, run_manager):
                if run_manager:
                    run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        self._one_choice(kwargs)
        # The engine (its loading included) runs on aiterate's worker thread, off the event loop.
        async with aclosing(aiterate(lambda: self._chunks(messages, stop, kwargs))) as items:
            async for chunk in _adispatched(items, run_manager):
                if run_manager:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

    def _choices(self, kwargs: dict) -> int:
        return choice_count(kwargs.get("n", self.n))

    def _one_choice(self, kwargs: dict) -> None:
        if self._choices(kwargs) > 1:
            raise ValueError(f"n={self._choices(kwargs)}: ChatOoOSpec streams one generation; n must be 1 when "
                             "streaming (invoke, batch or generate give n generations)")

    def _chunks(self, messages: list[BaseMessage], stop: list[str] | None,
                kwargs: dict) -> Iterator[ChatGenerationChunk | SpeculativeEvent]:
        """This call's chunks, choice after choice (`_choice_chunks`); its request is made on first use."""
        engine, request = self._request(messages, stop, kwargs)
        yield from _choice_chunks(engine, request, self._choices(kwargs), kwargs.get("parallel_tool_calls"))

    def _request(self, messages: list[BaseMessage], stop: list[str] | None,
                 kwargs: dict) -> tuple[EngineLike, ChatRequest]:
        """The engine for this call and what to ask of it: the call's keyword arguments over the fields
        (a bad sampling setting is a ValueError naming the field: the engine's `SamplingError`).
        `speculative_tools` is SpeculativeToolsMiddleware's, for the engine's pay-back rule."""
        unknown = sorted(set(kwargs) - set(_CALL_KWARGS))
        if unknown:
            raise TypeError(f"ChatOoOSpec got unsupported call arguments {unknown}; supported: {list(_CALL_KWARGS)}")
        given = kwargs if stop is None else {**kwargs, "stop": stop}
        request = ChatRequest.of(to_openai_messages(messages), settings(given, self))
        return self._engines.get(kwargs.get("model")), request


def _choice_chunks(engine: EngineLike, request: ChatRequest, choices: int,
                   parallel_tool_calls: bool | None) -> Iterator[ChatGenerationChunk | SpeculativeEvent]:
    """One chunk per engine event, as the engine commits it: reasoning (in
    `additional_kwargs["reasoning_content"]`, as ChatOllama's and ChatDeepSeek's chunks carry it, so the
    chunks' sum joins it), text, a call's name, its argument fragments; the last chunk carries usage and
    stats. `parallel_tool_calls=False` (as ChatOpenAI takes it): the reply's first call only, by the
    front-ends' one rule, as the server keeps it.
    With logprobs asked for, a chunk of empty content carries each round's in
    `generation_info["logprobs"]` (`{"content": [...]}`, as ChatOpenAI's chunks do), which LangChain
    puts in the chunk's `response_metadata`; the chunks' sum concatenates them. With `n` > 1, the
    choices' chunks one after another, each ending with its last chunk. Between them, as the engine
    yields them, its `CallPredicted` and `ToolCallReady` events as they are: `_dispatched` sends them to
    the run's callback handlers as custom events (custom_events.py); they change no chunk."""
    for index in range(choices):
        parallel = ParallelToolCalls.openai(parallel_tool_calls)
        with closing(request.for_choice(index).stream(engine)) as events:
            yield from _reply_chunks(events, engine.model_name, parallel)


def _reply_chunks(events: Iterable[Event], model_name: str,
                  parallel: ParallelToolCalls) -> Iterator[ChatGenerationChunk | SpeculativeEvent]:
    """One reply's chunks, one per engine event (`ChatOoOSpec._chunks`), its speculative events as they are."""
    for event in events:
        if isinstance(event, TextDelta):
            yield ChatGenerationChunk(message=AIMessageChunk(content=event.text))
        elif isinstance(event, ReasoningDelta):
            yield ChatGenerationChunk(message=AIMessageChunk(
                content="", additional_kwargs={"reasoning_content": event.text}))
        elif isinstance(event, ToolCallDelta):
            if not parallel.keeps(event):
                continue
            call = tool_call_chunk(name=event.name, args=event.arguments, id=event.id, index=event.index)
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[call]))
        elif isinstance(event, LogprobsDelta):
            yield ChatGenerationChunk(message=AIMessageChunk(content=""),
                                      generation_info={"logprobs": {"content": event.content}})
        elif isinstance(event, (CallPredicted, ToolCallReady)):  # for the callback handlers only
            yield event
        elif isinstance(event, Generation):  # always the last event
            yield _LastChunk(event, model_name, parallel)


class _LastChunk(ChatGenerationChunk):
    """A reply's last chunk. It keeps the engine's `Generation` for `_result`: the aggregate of the
    chunks reads a call cut off by `max_tokens` leniently (LangChain's partial JSON), the engine's
    verdict makes it invalid."""

    _generation: Generation = PrivateAttr()
    _parallel: ParallelToolCalls = PrivateAttr(default_factory=ParallelToolCalls)  # which calls are kept

    def __init__(self, gen: Generation, model_name: str, parallel: ParallelToolCalls):
        super().__init__(message=AIMessageChunk(content="", usage_metadata=_usage_metadata(Usage.of(gen)),
                                                response_metadata=_response_metadata(gen, model_name, parallel),
                                                chunk_position="last"))
        self._generation, self._parallel = gen, parallel

    def generation(self, full: ChatGenerationChunk) -> ChatGeneration:
        """The message of its choice, `full` the sum of its stream: its calls as ChatOpenAI and ChatOllama
        class them, those whose arguments parse in `tool_calls` (a schema misfit too: its problem is in
        `response_metadata["tool_call_problems"]`), the others in `invalid_tool_calls`. An invalid call's
        `error` is None, as the summed stream's is (LangChain's sum of chunks sets none): its reason is in
        `tool_call_problems` too. Its reasoning is the stream's, joined (`additional_kwargs["reasoning_content"]`)."""
        gen, parallel = self._generation, self._parallel
        message = AIMessage(
            content=full.message.content,
            tool_calls=[tool_call(name=c["name"], args=c["arguments"], id=c["id"])
                        for c in parallel.shown(gen.tool_calls)],
            invalid_tool_calls=[invalid_tool_call(name=c["name"], args=c["arguments"], id=c["id"], error=None)
                                for c in parallel.shown(gen.invalid_tool_calls)],
            additional_kwargs=full.message.additional_kwargs,
            usage_metadata=full.message.usage_metadata,
            response_metadata=full.message.response_metadata,
        )
        # as ChatOpenAI's: LangChain puts generation_info in the message's response_metadata
        info = None if gen.logprobs is None else {"logprobs": {"content": gen.logprobs}}
        return ChatGeneration(message=message, generation_info=info)


def _dispatched(items: Iterable[ChatGenerationChunk | SpeculativeEvent],
                run_manager: CallbackManagerForLLMRun | None) -> Iterator[ChatGenerationChunk]:
    """The chunks of `items`; each engine event among them is dispatched, as it comes, as a custom event
    of the model's run (`custom_events.dispatch`), so a handler sees a prediction before the reply ends."""
    for item in items:
        if isinstance(item, ChatGenerationChunk):
            yield item
        else:
            dispatch(run_manager, item)


async def _adispatched(items: AsyncIterator[ChatGenerationChunk | SpeculativeEvent],
                       run_manager: AsyncCallbackManagerForLLMRun | None) -> AsyncIterator[ChatGenerationChunk]:
    """`_dispatched` for the async paths: the events are dispatched on the event loop, in order."""
    async for item in items:
        if isinstance(item, ChatGenerationChunk):
            yield item
        else:
            await adispatch(run_manager, item)


def _result(chunks: Iterable[ChatGenerationChunk]) -> ChatResult:
    """The reply as `invoke` returns it: the sum of its stream, with the calls the engine validated; with
    `n` > 1, a generation per choice (each choice's chunks end with its last chunk)."""
    generations, full, last = [], None, None
    for last in chunks:
        full = last if full is None else full + last
        if isinstance(last, _LastChunk):
            generations.append(last.generation(full))
            full = None
    if full is not None or not generations:
        raise RuntimeError(f"ChatOoOSpec's stream ended without its last chunk; it ended with {last!r}")
    return ChatResult(generations=generations)


def _structured_output(model: ChatOoOSpec, schema: dict | type | None, method: str, include_raw: bool,
                       strict: bool | None) -> Runnable[LanguageModelInput, dict | Any]:
    """`ChatOoOSpec.with_structured_output`: `model` bound to answer in `schema`, and the parser of its answer."""
    if strict is not None and method == "json_mode":
        raise ValueError("Argument `strict` is not supported with `method`='json_mode'")
    is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    ls_format = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
    if method in ("function_calling", "json_schema") and schema is None:
        raise ValueError(f"schema must be given for method={method!r}")
    if method == "function_calling":
        name = convert_to_openai_tool(schema)["function"]["name"]
        llm = model.bind_tools([schema], tool_choice=name, strict=strict, ls_structured_output_format=ls_format)
        tools_parser = (PydanticToolsParser(tools=[schema], first_tool_only=True) if is_pydantic
                        else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True))
        parser: Runnable = RunnableLambda(_reject_invalid_call) | tools_parser
    elif method in ("json_schema", "json_mode"):
        response_format = (_json_schema_response_format(schema, strict) if method == "json_schema"
                           else {"type": "json_object"})
        llm = model.bind(response_format=response_format, ls_structured_output_format=ls_format)
        parser = PydanticOutputParser(pydantic_object=schema) if is_pydantic else JsonOutputParser()
    else:
        raise ValueError(f"method must be 'function_calling', 'json_schema' or 'json_mode', got {method!r}")
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([unparsed], exception_key="parsing_error")


def _openai_tool(tool: Any, position: int, strict: bool | None = None) -> dict:
    if strict is not None and isinstance(tool, dict):
        # `convert_to_openai_tool` returns a `{"type": "function", ...}` dict as it is, ignoring
        # `strict`; its function part goes through the conversion like any function dict, so that
        # strict=True reaches every tool. A function with no parameters takes none (strict needs them).
        fn = tool.get("function") if tool.get("type") == "function" else tool
        if isinstance(fn, dict) and "name" in fn:
            tool = {"parameters": {"type": "object", "properties": {}}, **fn}
    try:
        return convert_to_openai_tool(tool, strict=strict)
    except (ValueError, TypeError) as e:
        reason = " ".join(str(e).split())
        raise ToolSchemaError(f"tools[{position}] ({tool!r:.80}) cannot be converted to an OpenAI tool: {reason}") from e


def _json_schema_response_format(schema: dict | type, strict: bool | None) -> dict:
    """OpenAI's `response_format` for `schema`, built as ChatOpenAI builds it for method="json_schema": a
    dict already in that form (whole, or its inner {"name", "schema"}) is kept; anything else (pydantic,
    TypedDict, JSON Schema) becomes {"name", "description", "schema"[, "strict"]}."""
    if isinstance(schema, dict) and schema.get("type") == "json_schema" and "json_schema" in schema:
        return schema
    if isinstance(schema, dict) and "name" in schema and "schema" in schema:
        return {"type": "json_schema", "json_schema": schema}
    function = convert_to_openai_function(schema, strict=strict)
    function["schema"] = function.pop("parameters")
    return {"type": "json_schema", "json_schema": function}


def _reject_invalid_call(message: AIMessage) -> AIMessage:
    """Structured output from a call that misfits the schema, or cannot be read, is an error, not a
    silent None or a dict of the wrong shape."""
    calls = message.tool_calls or message.invalid_tool_calls
    problems = {p["id"]: p["error"] for p in message.response_metadata.get("tool_call_problems") or []}
    if calls and calls[0]["id"] in problems:
        bad = calls[0]
        args = bad["args"] if isinstance(bad["args"], str) else json.dumps(bad["args"], ensure_ascii=False)
        raise OutputParserException(f"the model's {bad['name']!r} call does not match the schema: "
                                    f"{problems[bad['id']]}", llm_output=args)
    return message


def _usage_metadata(usage: Usage) -> UsageMetadata:
    out = UsageMetadata(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                        total_tokens=usage.total_tokens)
    if usage.cached_prompt_tokens:
        out["input_token_details"] = {"cache_read": usage.cached_prompt_tokens}
    return out


def _response_metadata(gen: Generation, model_name: str, parallel: ParallelToolCalls) -> dict:
    """ChatOpenAI's `model_name`, `finish_reason` and `token_usage`, the speculation stats, and
    `tool_call_problems`: {"id", "name", "error"} per call of the message that misfits its schema or
    cannot be read (`frontend.call_problems`), in the reply's order."""
    stats = gen.stats
    return {"model_name": model_name, "finish_reason": gen.finish_reason,
            "tool_call_problems": parallel.shown(call_problems(gen)), "method": stats.method,
            "target_forwards": stats.target_forwards, "accepted_by_source": stats.accepted_by_source,
            "hint_bytes": stats.hint_bytes, "prefill_s": stats.prefill_s, "decode_s": stats.decode_s,
            "sidecar": stats.sidecar, "token_usage": Usage.of(gen).openai()}
