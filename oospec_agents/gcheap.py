"""Keep Python's garbage collector out of the decode loop: freeze the heap once the models are loaded.

A process that has imported torch and transformers and loaded an engine tracks about 400,000 Python
objects (the modules, the tokenizer's vocabulary tables, the grammar's token tables). CPython's
oldest-generation collection walks all of them: 215-235 ms on the 2-core Xeon of docs/gpu.md. It
runs whenever enough objects have survived since the last one, which in a serving process means in
the middle of some request, and most allocations happen inside a target forward, so the pause lands
in a forward. On the 6 first dev records (`oospec bench --sidecar none --methods ar,toolspec`) the
bench's forwards averaged 47.9 ms (ar) and 91.2 ms (toolspec) per round with the collector as it is,
and 42.6 ms and 81.0 ms with it off: 1.27 s of collection pauses, eight of them full passes of
126 ms each, inside 13 s of forwards.

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
