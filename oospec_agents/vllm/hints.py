"""The sidecar's hints for the proposer's requests.

A request's wave is submitted when the proposer first sees it (its first decode step) and polled at
every later step, never waited for (sidecar/session.py's `HintSession`, as the engine does): the hint
joins the drafts when it is ready, and a sidecar that fails or dies only takes its hints away.

The sidecar is told what the proposer knows: the offered tools and the conversation's last turn (the
text of the prompt's last user turn, cut out with the chat template's own markers: prompt.py reads
ids, not messages). Set where the proposer runs (vLLM's worker inherits the environment):

    OOSPEC_VLLM_SIDECAR=embedded           a model reference, as `Engine.from_pretrained(sidecar=...)`
    OOSPEC_VLLM_SIDECAR_DEVICE=cpu         a torch device or a core set ("cpu:1", "cuda:1")
    OOSPEC_VLLM_SIDECAR_PLACEMENT=process  "process" (default) or "thread"; "ray" where Ray runs
    OOSPEC_VLLM_HINT_FIRST=1               a measuring aid (`oospec bench --backend vllm --hint-first`): the
                                           proposer waits for a request's wave before its first draft, so
                                           vLLM's steps are those of a sidecar always in time; not for serving

vLLM's worker is a daemonic process, which Python's multiprocessing forbids children: for the process
placement the worker is marked non-daemonic first (its parent still stops it), so the sidecar gets a
process of its own.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os

import torch

from ..sidecar import cores
from ..sidecar.protocol import HintRequest
from ..sidecar.session import HintSession
from .prompt import PromptReader

log = logging.getLogger(__name__)
_MARK = "\x00OOSPEC-TURN\x00"


class SidecarHints:
    """One hint session per request (keyed as the proposer keys them)."""

    def __init__(self, sidecar, reader: PromptReader):
        self.sidecar, self.reader = sidecar, reader
        self.turn = turn_markers(reader.tokenizer)
        self.sessions: dict[int, HintSession] = {}
        self.faults: set[str] = set()
        self.place = cores.Place(torch.device("cpu"))

    def open(self, key: int, prompt_ids: list[int], tools: list) -> None:
        """Start the request's wave (returns at once)."""
        text = self.reader.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        request = HintRequest([{"role": "user", "content": last_turn(text, self.turn)}], tools, self.reader.fmt,
                              ("auto", None))
        self.sessions[key] = HintSession.open(self.sidecar, request, target=self.place, faults=self.faults,
                                              lend_cores=False)

    def poll(self, key: int) -> str | None:
        """The request's hint if its wave has posted one (never blocks)."""
        session = self.sessions.get(key)
        return None if session is None else session.poll()

    def close(self, key: int) -> None:
        session = self.sessions.pop(key, None)
        if session is not None:
            session.close(abandoned=True)


def turn_markers(tokenizer) -> tuple[str, str] | None:
    """The text the chat template writes before and after a user turn's content, or None."""
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False)
    except Exception:  # a template that cannot render a user turn: the whole prompt is the turn
        return None
    before, _, after = text.partition(_MARK)
    head = before.rsplit("\n", 2)[-2:] if "\n" in before else [before]
    return ("\n".join(head) if before else "", after)


def last_turn(text: str, turn: tuple[str, str] | None) -> str:
    """The content of the prompt text's last user turn (all of it where the markers are not found)."""
    if not turn or not turn[0]:
        return text
    start = text.rfind(turn[0])
    if start < 0:
        return text
    body = text[start + len(turn[0]):]
    end = body.find(turn[1]) if turn[1] else -1
    return body if end < 0 else body[:end]


def hints_from_env(reader: PromptReader) -> SidecarHints | None:
    """The sidecar OOSPEC_VLLM_SIDECAR names, loaded where the proposer runs; None when it names none."""
    ref = os.environ.get("OOSPEC_VLLM_SIDECAR")
    if not ref:
        return None
    from .. import models
    from ..sidecar.load import load_sidecar
    device = os.environ.get("OOSPEC_VLLM_SIDECAR_DEVICE", "cpu")
    placement = os.environ.get("OOSPEC_VLLM_SIDECAR_PLACEMENT", "process")
    if placement == "process" and mp.current_process().daemon:
        mp.current_process().daemon = False  # vLLM's worker: let it start the sidecar's process
    where = cores.place(device)
    sidecar = load_sidecar(ref, device=device, dtype=models.resolve_dtype(None, where.device),
                           sidecar_placement=placement)
    if os.environ.get("OOSPEC_VLLM_HINT_FIRST", "").strip() not in ("", "0"):
        from ..sidecar.protocol import HintFirst
        sidecar = HintFirst(sidecar)
    log.info("oospec: sidecar %s on %s (%s)", ref, device, placement)
    return SidecarHints(sidecar, reader)
