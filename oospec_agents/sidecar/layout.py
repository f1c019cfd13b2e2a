"""What `sidecar_placement="auto"` does on a CPU: share every core, or split them, whichever the cost
model projects faster (words: docs/glossary.md; the measurements: docs/sidecar.md, "Auto layout").

Two layouts serve a CPU with n usable cores:

    shared   the target on all n cores, the sidecar beside it; on shared cores the pay-back rule
             skips nearly every wave, so a call costs toolspec's time:     P + D
    split    the target on n - 1 cores, the sidecar's worker pinned to the last one; the wave is
             free and its hint cuts the target's forwards to H of toolspec's:
                                                                           P * a(f_pre) + D * H * a(f_dec)

P and D are a toolspec call's prefill and decode shares on all n cores (P + D = 1), H the forwards
with a hint in time over toolspec's, and a(f) the slowdown of a forward on n - 1 cores instead of n,
from Amdahl's law with a measured parallel fraction f: a(f) = ((1 - f) + f / (n - 1)) / ((1 - f) + f / n).
Split wins when its projected time is below `MARGIN` of shared's: a near tie keeps the simpler
layout, with no second process. The constants are measured on the embedded pair (the SmolLM2-135M
target in bf16 on a 2-core AMD EPYC, 2026-12-04): other models and CPUs differ, and explicit
`target_device="cpu:0-5"`, `sidecar_device="cpu:6-7"` (or "cpu" for shared) always wins over `auto`.

`OOSPEC_CPU_LAYOUT=shared|split` in the environment overrides the projection (the test suite pins
"shared", so that what it asserts does not depend on the machine's core count).
"""
from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from . import cores
from .cores import Place

#: split must project below this share of shared's time to be chosen
MARGIN = 0.95
ENV = "OOSPEC_CPU_LAYOUT"
_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.M)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Costs:
    """The cost model's inputs; the defaults and where each was measured are in docs/sidecar.md."""
    prefill_share: float = 0.5      # P: toolspec's prefill over its whole call on every core
    hint_forwards: float = 0.75     # H: oospec's target forwards over toolspec's, the hint in time
    prefill_parallel: float = 0.9   # f_pre: parallel fraction of a prefill forward
    decode_parallel: float = 0.6    # f_dec: parallel fraction of a verify forward


def slowdown(parallel: float, n: int) -> float:
    """A forward's time on n - 1 cores over its time on n (Amdahl's law)."""
    return ((1 - parallel) + parallel / (n - 1)) / ((1 - parallel) + parallel / n)


def split_over_shared(n: int, costs: Costs = Costs()) -> float:
    """The projected time of a call split (n - 1 cores for the target, one for the sidecar) over shared."""
    if n < 2:
        return float("inf")
    p = costs.prefill_share
    return p * slowdown(costs.prefill_parallel, n) + (1 - p) * costs.hint_forwards * slowdown(costs.decode_parallel, n)


def choose(n: int, costs: Costs = Costs()) -> str:
    """"split" or "shared" for a CPU of n usable cores: the environment's word, else the projection."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("shared", "split"):
        return forced if n >= 2 or forced == "shared" else "shared"
    if forced and forced != "auto":
        raise ValueError(f"{ENV} must be 'shared', 'split' or 'auto', got {os.environ[ENV]!r}")
    return "split" if split_over_shared(n, costs) < MARGIN else "shared"


def spawn_safe() -> bool:
    """Whether a worker process can start here: its `spawn` start imports the main script again, which
    then must keep its work under `if __name__ == "__main__":` (an interactive session, a notebook and
    `python -c` have no script to import)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:  # interactive, or `python -m`: a guarded module
        return True
    try:
        return _GUARD.search(Path(path).read_text(errors="replace")) is not None
    except OSError:
        return False


def auto_places(costs: Costs = Costs()) -> tuple[Place, Place] | None:
    """The (target, sidecar) core sets of a split when the projection picks it, else None (shared).
    A script without a `__main__` guard stays shared: a worker process would run it again."""
    if choose(len(cores.usable_cores()), costs) != "split":
        return None
    if not spawn_safe():
        log.warning("sidecar_placement='auto' keeps every core shared: a split needs a worker process, and this "
                    "script has no `if __name__ == \"__main__\":` guard for its start (or name the core sets: "
                    "target_device='cpu:0-5', sidecar_device='cpu:6-7')")
        return None
    return cores.split_cores()
