"""The OoO-Spec hint drafter: the sidecar's call, rendered in the target's format and re-tokenized
with the target's tokenizer, aligned to the committed text."""
from __future__ import annotations

import os

from .base import Draft, ReplyState, Drafter, encode_after, separator_variants

MIN_ANCHOR = 3      # chars of committed text that must match the hint to re-anchor after a divergence
MAX_CHARS = 160
ALT_CHARS = 24      # chars of the alternative separator's branch past the point where it differs


class HintDrafter(Drafter):
    source = "hint"

    def propose(self, ctx: ReplyState) -> list[Draft]:
        text = "" if ctx.answer is None else continuation(ctx.answer, ctx.hint, ctx.fmt)
        if not text:
            return []
        first, *alts = separator_variants(text[:MAX_CHARS], ctx.fmt.args_key)
        # The compact-separator branch only has to carry the reply past the comma: the next round
        # re-anchors on what was written, so a short branch keeps the tree within its node budget.
        alts = [a[:len(os.path.commonprefix([first, a])) + ALT_CHARS] for a in alts]
        return [Draft(encode_after(ctx.tokenizer, ctx.ids, t), self.source) for t in (first, *alts)]


def continuation(text: str, hint: str | None, fmt) -> str:
    """What the hint proposes after `text`.

    While the reply agrees with the hint, propose the rest of it. At the reply's start (or once a
    previous call closed), offer the whole hint as a new call. After a divergence, re-anchor on the
    longest suffix of the open call that the hint also contains -- e.g. `"city": ` -- so the slots
    the sidecar got right are still offered at their keys.
    """
    if not hint:
        return ""
    body = fmt.open_call_json(text)
    if body is None:
        stripped = text.rstrip()
        if not stripped:
            return hint
        # a message's calls that share one list end with it; calls wrapped one by one may go on
        if fmt.call_end and stripped.endswith(fmt.call_end.strip()) and not fmt.calls_in_one_list:
            return fmt.call_sep + hint if not text.endswith(fmt.call_sep) else hint
        return ""
    tag = fmt.call_start.strip()
    start = fmt.calls_start(text)
    committed = text[start:] if start >= 0 else body
    ref = hint[max(hint.find(tag), 0):] if tag else hint
    if ref.startswith(committed):
        return ref[len(committed):]
    if body == "" and fmt.calls_in_one_list and hint.startswith(fmt.call_start):
        return hint[len(fmt.call_start):]  # the list's next call begins: offer the hint's call there
    for k in range(min(len(committed), 48), MIN_ANCHOR - 1, -1):
        at = ref.rfind(committed[-k:])
        if at >= 0:
            return ref[at + k:]
    return ""
