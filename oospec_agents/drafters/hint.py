"""The OoO-Spec hint drafter: the sidecar's call, rendered in the target's format and re-tokenized
with the target's tokenizer, aligned to the committed text.

Where the hint goes in the round's tree: first, while the reply agrees with it and the sidecar is not
unsure of it (its confidence at least TRUSTED, or unknown, as for a caller's own hint); otherwise
`late`, after the schema's and retrieval's drafts, so a wrong guess never takes the nodes of drafts
the target would accept. The runner-up calls of an unsure wave (`HintText.alternatives`) are late
branches: ALT_CHARS past where they leave the hint while the reply agrees with it, the whole call
where the reply took the runner-up's way. A hint with several calls (a parallel reply's, calls wrapped
one by one) offers its k-th call once the reply has closed k calls.
"""
from __future__ import annotations

import os

from .base import Draft, ReplyState, Drafter, encode_after, separator_variants

MIN_ANCHOR = 3      # chars of committed text that must match the hint to re-anchor after a divergence
MAX_CHARS = 160
ALT_CHARS = 24      # chars of an alternative branch past the point where it leaves the first draft
#: a hint whose whole-call confidence is below this drafts late (after the schema's and retrieval's)
TRUSTED = 0.5


class HintDrafter(Drafter):
    source = "hint"

    def propose(self, ctx: ReplyState) -> list[Draft]:
        if ctx.answer is None or not ctx.hint:
            return []
        text, agrees = aligned(ctx.answer, ctx.hint, ctx.fmt)
        confidence = getattr(ctx.hint, "confidence", None)
        late = not agrees or (confidence is not None and confidence < TRUSTED)
        out: list[tuple[str, bool]] = []
        if text:
            first, *variants = separator_variants(text[:MAX_CHARS], ctx.fmt.args_key)
            out = [(first, late)] + [(_branch(a, first), late) for a in variants]
        for alt in getattr(ctx.hint, "alternatives", ()):
            more, on_it = aligned(ctx.answer, alt, ctx.fmt)
            if more and on_it:  # a runner-up the reply has not left
                out.append((_branch(more, text) if agrees and text else more[:MAX_CHARS], True))
        return [Draft(encode_after(ctx.tokenizer, ctx.ids, t), self.source, lt) for t, lt in out]


def _branch(alt: str, first: str) -> str:
    """An alternative branch only has to carry the reply past where it leaves `first`: the next round
    re-anchors on what was written, so a short branch keeps the tree within its node budget."""
    return alt[:len(os.path.commonprefix([first, alt])) + ALT_CHARS]


def continuation(text: str, hint: str | None, fmt) -> str:
    """What the hint proposes after `text` (`aligned`'s text)."""
    return aligned(text, hint, fmt)[0]


def aligned(text: str, hint: str | None, fmt) -> tuple[str, bool]:
    """What the hint proposes after `text`, and whether the reply so far agrees with it.

    While the reply agrees with the hint, propose the rest of it. At the reply's start (or once a
    previous call closed), offer the hint's next call (a hint of one call is offered again: it does
    not agree then). After a divergence, re-anchor on the longest suffix of the open call that the
    hint also contains -- e.g. `"city": ` -- so the slots the sidecar got right are still offered at
    their keys (the reply does not agree with it then).
    """
    if not hint:
        return "", False
    calls = hint_calls(hint, fmt)
    skip = getattr(hint, "after_calls", 0)  # the reply's calls before the hint's first
    tag = fmt.call_start.strip()
    body = fmt.open_call_json(text)
    if body is None:
        stripped = text.rstrip()
        if not stripped:
            return hint, True
        # a message's calls that share one list end with it; calls wrapped one by one may go on
        if fmt.call_end and stripped.endswith(fmt.call_end.strip()) and not fmt.calls_in_one_list:
            done = text.count(tag) - skip if tag else len(calls)
            nxt = fmt.call_sep.join(calls[done:]) if 0 <= done < len(calls) else calls[-1]
            return (nxt if text.endswith(fmt.call_sep) else fmt.call_sep + nxt), 0 <= done < len(calls)
        return "", False
    start = fmt.calls_start(text)
    committed = text[start:] if start >= 0 else body
    done = text[:start].count(tag) - skip if tag and start >= 0 else 0   # the hint's calls before the open one
    own = calls[max(0, min(done, len(calls) - 1))]
    after = fmt.call_sep.join([""] + calls[done + 1:]) if 0 <= done and done + 1 < len(calls) else ""
    ref = own[max(own.find(tag), 0):] if tag else own
    if ref.startswith(committed):
        return ref[len(committed):] + after, True
    if body == "" and fmt.calls_in_one_list and hint.startswith(fmt.call_start):
        return hint[len(fmt.call_start):], True  # the list's next call begins: offer the hint's call there
    for k in range(min(len(committed), 48), MIN_ANCHOR - 1, -1):
        at = ref.rfind(committed[-k:])
        if at >= 0:
            return ref[at + k:] + after, False
    return "", False


def hint_calls(hint: str, fmt) -> list[str]:
    """A hint's calls one by one, each as `render_call` writes it (the first with whatever text leads
    it), where the format wraps each call on its own (hermes); the whole hint as its one piece
    otherwise."""
    tag, sep = fmt.call_start.strip(), fmt.call_sep
    if not tag or fmt.calls_in_one_list or hint.count(tag) < 2:
        return [hint]
    lead = hint[:hint.find(tag)]
    pieces = [tag + p for p in hint[len(lead):].split(tag)[1:]]
    pieces = [p[:len(p) - len(sep)] if sep and n < len(pieces) - 1 and p.endswith(sep) else p
              for n, p in enumerate(pieces)]
    return [lead + pieces[0]] + pieces[1:]
