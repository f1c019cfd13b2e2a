"""Our attention implementations, registered with transformers in one place.

A target runs one attention implementation at a time (its config names it; `set_attn_implementation`
switches it). Two features of ours need their own: batched rounds (batch_attention.py: a forward over
several replies' trees, each row over its own keys) and the exact prefill and deterministic decode
forwards (deterministic.py). Neither knows the other's: each registers here an implementation that is
transformers' `sdpa` with cases of its own, and `register` makes every one of them hand a batched
round's keys (`RoundKeys`) to the round's own attention. So a target switched to either runs both
features, in whichever order they were installed.

What this module reads of transformers that transformers does not publish is marked below, so a
transformers upgrade that moves it breaks here and nowhere else.
"""
from __future__ import annotations

from typing import Callable

#: transformers' own scaled-dot-product attention, which each of ours computes outside its own cases
SDPA = "sdpa"

_OURS: set[str] = set()  # names registered through `register`


class RoundKeys:
    """Keys (or values) of a batched round, as a round's cache hands them to the attention: not one
    tensor but each row's own (batch_attention.py). `attend` computes the round's attention."""

    def attend(self, module, query, value: "RoundKeys", **kwargs):
        raise NotImplementedError


def register(name: str, forward: Callable) -> None:
    """Register `forward` (transformers' attention signature: module, query, key, value, mask, ...) as the
    attention implementation `name`, with sdpa's mask, once; a batched round's keys go to the round."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    if name in _OURS:
        return

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        if isinstance(key, RoundKeys):
            return key.attend(module, query, value, **kwargs)
        return forward(module, query, key, value, attention_mask, *args, **kwargs)
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[SDPA])
    _OURS.add(name)


def computes_sdpa(name: str | None) -> bool:
    """Whether the implementation `name` computes transformers' sdpa outside its own cases: sdpa, or ours."""
    return name == SDPA or name in _OURS


def passes_rounds_on(name: str | None) -> bool:
    """Whether the implementation `name` hands a batched round's keys to the round: every one of ours."""
    return name in _OURS


def implementation(model) -> str | None:
    """The attention implementation the model's text layers run (None where the config names none)."""
    text = model.config.get_text_config(decoder=True)
    # transformers keeps the implementation in a private config attribute; `set_attn_implementation` writes
    # it and nothing public reads it back (transformers 5.x)
    return getattr(text, "_attn_implementation", None)


def switch(model, name: str) -> bool:
    """Make the model run the attention `name` (registered here); whether it took. A model that cannot
    switch raises from transformers (`set_attn_implementation`)."""
    if implementation(model) != name:
        model.set_attn_implementation(name)
    return implementation(model) == name
