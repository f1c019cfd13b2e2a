"""OpenAI's Predicted Outputs: the reply the caller expects (a file to edit, a call to repeat), drafted
wherever the reply agrees with it. The target verifies every drafted token like any other draft, so a
prediction changes the speed, never the reply.

The prediction is tokenized once. Each round the drafter finds where in it the reply has got to: the
reply so far is the prediction's beginning, or the reply's last tokens (at least `min_ngram`, the more
the better) occur in it -- after an edit the reply rejoins the prediction wherever their tokens agree
again -- and it proposes what follows there. Among equal matches it keeps to the order of the
prediction: the one at or after the last place it matched, nearest first.
"""
from __future__ import annotations

import difflib
from collections import defaultdict

from ..chat import join_text_parts
from ..errors import PredictionError
from .base import Draft, Drafter, Prediction, ReplyState


def prediction_text(prediction) -> str | None:
    """The predicted text of OpenAI's `prediction` field: `{"type": "content", "content": str | [text
    parts]}`, or a plain string; None for none. Anything else is a PredictionError that names it."""
    if prediction is None or isinstance(prediction, str):
        return prediction or None
    if not isinstance(prediction, dict):
        raise PredictionError(f"prediction must be an object {{\"type\": \"content\", \"content\": ...}} or a string, "
                              f"got {type(prediction).__name__}")
    if prediction.get("type") != "content":
        raise PredictionError(f"prediction.type is {prediction.get('type')!r}; the only type is 'content'")
    content = prediction.get("content")
    if isinstance(content, str):
        return content or None
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise PredictionError(f"prediction.content[{i}] is {part!r:.80}; each part must be "
                                      "{\"type\": \"text\", \"text\": str}")
            parts.append(part["text"])
        return join_text_parts(parts) or None
    raise PredictionError(f"prediction.content must be a string or a list of text parts, got {type(content).__name__}")


class PredictionDrafter(Drafter):
    source = "prediction"

    def __init__(self, max_tokens: int = 32, min_ngram: int = 3, max_ngram: int = 16):
        self.max_tokens, self.min_ngram, self.max_ngram = max_tokens, min_ngram, max_ngram

    def propose(self, ctx: ReplyState) -> list[Draft]:
        if ctx.prediction is None or not ctx.prediction.tokens:
            return []
        pred = ctx.prediction.tokens
        at = self._align(ctx.prediction, ctx.ids, ctx.n_prompt)
        cont = [] if at is None else pred[at:at + self.max_tokens]
        return [Draft(cont, self.source)] if cont else []

    def _align(self, prediction: Prediction, ids: list[int], n_prompt: int) -> int | None:
        """The index in the prediction just after the reply's last token (the reply is `ids[n_prompt:]`),
        or None where they do not agree."""
        pred, done = prediction.tokens, len(ids) - n_prompt
        if done < len(pred) and ids[n_prompt:] == pred[:done]:
            return done
        n = self.min_ngram
        if done < n:
            return None
        new = ids[len(ids) - min(done, self.max_ngram):]  # the reply's last tokens, as many as a match can use
        if prediction.index is None:
            prediction.index = defaultdict(list)
            for end in range(n, len(pred)):  # where each n-gram ends (an n-gram at the very end proposes nothing)
                prediction.index[tuple(pred[end - n:end])].append(end)
        index, cursor = prediction.index, prediction.at
        best = None
        for end in index.get(tuple(new[-n:]), ()):
            k = n
            while k < self.max_ngram and k < len(new) and end - k > 0 and pred[end - k - 1] == new[-k - 1]:
                k += 1
            rank = (k, end >= cursor, -abs(end - cursor))
            if best is None or rank > best[0]:
                best = (rank, end)
        if best is None:
            return None
        prediction.at = best[1]
        return best[1]


def matched_tokens(prediction: list[int], completion: list[int]) -> int:
    """How many of the prediction's tokens appear in the completion, in order (OpenAI's
    `accepted_prediction_tokens`; the rest are its `rejected_prediction_tokens`)."""
    if not prediction or not completion:
        return 0
    blocks = difflib.SequenceMatcher(None, prediction, completion, autojunk=False).get_matching_blocks()
    return sum(b.size for b in blocks)
