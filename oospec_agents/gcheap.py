"""Keep Python's garbage collector out of the decode loop: freeze the heap once the models are loaded.

A process that has imported torch and transformers and loaded an engine tracks about 400,000 Python
objects (the modules, the tokenizer's vocabulary tables, the grammar's token tables). CPython's
oldest-generation collection walks all of them, a pause of a few hundred ms. It runs whenever enough
objects have survived since the last one, which in a serving process means in the middle of some
request, and most allocations happen inside a target forward, so the pause lands in a forward
(measured: docs/engine.md, "The garbage collector and the decode loop").

`gc.freeze()` moves every object alive now into a permanent generation that collections skip, so
later passes only walk what was allocated since. This is what vLLM does once its engine has started
(`vllm.utils.gc_utils.freeze_gc_heap`). Collect first: freezing garbage would keep it forever.
Objects frozen here are still freed by reference counting when their last reference goes (an
`Engine` and its model are: they hold no reference cycle); only a frozen object that later becomes
part of unreachable cycle stays until `gc.unfreeze()`.
"""
from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def freeze_gc_heap() -> int:
    """Collect, then freeze everything alive into the permanent generation; return how many objects
    are frozen now (`gc.get_freeze_count()`)."""
    t0 = time.perf_counter()
    gc.collect()
    gc.freeze()
    count = gc.get_freeze_count()
    log.debug("froze %d objects for the garbage collector in %.0f ms", count, 1000 * (time.perf_counter() - t0))
    return count
