"""The settings of one reply, as LlamaIndex's OpenAI LLM names them: `OoOSpec`'s fields, each of which a call
may override (`base._CHAT_KWARGS`). Which engine answers (the models, their devices, the engine's options)
is `OoOSpec`'s own."""
from __future__ import annotations

from typing import Any, Dict, Literal, Optional

from llama_index.core.bridge.pydantic import BaseModel, Field


class ChatSettings(BaseModel):
    """The decoding method, the length, strict tool calls, the sampling and the chat template's arguments
    of a reply."""

    method: Literal["ar", "toolspec", "oospec"] = Field(
        default="oospec", description="Decoding method: plain autoregressive, schema drafting only, or "
        "schema drafting plus the sidecar's hints.")
    max_new_tokens: int = Field(default=256, gt=0, description="Most tokens generated per reply.")
    strict: bool = Field(
        default=False, description="Whether tool calls are strict, as in LlamaIndex's OpenAI LLM: every tool is "
        'sent with "strict": true, and the engine decodes the calls under a grammar of valid calls, so they always '
        "match the tools' schemas (docs/strict.md). A call's own `strict=` wins over it.")
    temperature: Optional[float] = Field(
        default=None, description="None or 0: greedy decoding. Otherwise each token is drawn from the "
        "target's distribution at this temperature, verified so that the speculation keeps it exactly.")
    top_p: Optional[float] = Field(default=None, description="Nucleus sampling, in (0, 1].")
    top_k: Optional[int] = Field(default=None, description="Draw from the k likeliest tokens only (0 or None: all).")
    min_p: Optional[float] = Field(
        default=None, description="Drop tokens less likely than min_p times the likeliest, in [0, 1].")
    seed: Optional[int] = Field(
        default=None, description="The same seed gives the same reply (on the same machine and method); none: a "
        "fresh seed each reply.")
    logprobs: Optional[bool] = Field(
        default=None, description="Whether to return logprobs per token, in ChatResponse.logprobs: per token, its "
        "top_logprobs alternatives as LogProbs (as LlamaIndex's OpenAI LLM gives them), or the chosen token "
        "alone when top_logprobs is 0.")
    top_logprobs: int = Field(default=0, description="The number of top token log probs to return, 0 to 20.")
    chat_template_kwargs: Optional[Dict[str, Any]] = Field(
        default=None, description='Arguments of the target\'s chat template, as vLLM takes them: e.g. {"enable_thinking": '
        "False} for Qwen3. An argument the template does not read is an error naming it.")
    reasoning_effort: Optional[str] = Field(
        default=None, description='"low", "medium" or "high", for chat templates that read reasoning_effort; with any '
        "other template it is an error that says so.")
