"""The sidecar: a small model that predicts a whole call in one wave, on a device (or core set) of its
own, while the target decodes. Words: docs/glossary.md.

    protocol.py   HintRequest, Hint, Ticket, the Sidecar protocol and SidecarBase   (the contract)
    runtime.py    load_wave, wave_rows, run_waves, WaveHost                          (where a wave runs)
    cores.py      core sets as devices; every torch thread-count change
    hosts/        thread.py, process.py, ray.py: transport only, each around a WaveHost
    load.py       load_sidecar(): the one module that imports hosts/
    session.py    one reply's view of its sidecar; returns an Outcome
    rows.py wave.py fanout.py join.py rank.py payback.py
                  the model side: rows, the batched wave (and its prefill), the join, the lexical
                  prior, the pay-back rule
"""
from .protocol import FixedHint, Hint, HintRequest, HintTicket, Sidecar, SidecarBase, Ticket, check_sidecar

__all__ = ["FixedHint", "Hint", "HintRequest", "HintTicket", "Sidecar", "SidecarBase", "Ticket", "check_sidecar"]
