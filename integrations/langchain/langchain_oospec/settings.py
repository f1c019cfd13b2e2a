"""The settings of one reply, as ChatOpenAI names them: `ChatOoOSpec`'s fields, each of which a call may
override (through `bind`, `bind_tools` or `invoke`; `chat_models._CALL_KWARGS`). Which engine answers
(the models, their devices, the engine's options) is `ChatOoOSpec`'s own."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class ChatSettings(BaseModel):
    """The decoding method, the length, the sampling and the chat template's arguments of a reply."""

    method: Literal["ar", "toolspec", "oospec"] = "oospec"
    """Decoding: plain autoregressive, schema drafting only, or schema drafting plus sidecar hints."""
    max_tokens: int = 256
    temperature: float | None = None
    """None or 0: greedy decoding. Otherwise each token is drawn from the target's distribution at that
    temperature, verified so that the speculation keeps that distribution exactly."""
    top_p: float | None = None
    """Nucleus sampling, in (0, 1]."""
    top_k: int | None = None
    """Draw from the k likeliest tokens only (0 or None: all)."""
    min_p: float | None = None
    """Drop tokens less likely than min_p times the likeliest, in [0, 1]."""
    seed: int | None = None
    """The same seed gives the same reply (on the same machine and method); none: a fresh seed each reply."""
    n: int | None = None
    """Generations per prompt, 1 to 8 (decoded one after another; generation i draws with seed + i). Not
    with streaming."""
    logprobs: bool | None = None
    """Whether to return each token's log-probability, in `response_metadata["logprobs"]["content"]`."""
    top_logprobs: int | None = None
    """The most likely alternatives per token to return too, 0 to 20; needs `logprobs=True`."""
    frequency_penalty: float | None = None
    """Not served: only 0 (or unset) is accepted."""
    presence_penalty: float | None = None
    """Not served: only 0 (or unset) is accepted."""
    logit_bias: dict[int, int] | None = None
    """Not served: only an empty one (or unset) is accepted."""
    stop: list[str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """Arguments of the target's chat template, as vLLM takes them: e.g. `{"enable_thinking": False}` for
    Qwen3. An argument the template does not read is an error naming it."""
    reasoning_effort: str | None = None
    """"low", "medium" or "high", for chat templates that read `reasoning_effort`; with any other template it
    is an error that says so."""
