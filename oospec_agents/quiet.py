"""Quiet model loads: what third-party libraries print while a model loads (their deprecation warnings,
transformers' "Loading weights" progress bars) is held back unless asked for, as transformers' own
pipelines keep to their verbosity.

Asked for by `OOSPEC_VERBOSE=1`, or by the `oospec_agents` logger (or the root logger above it) at
INFO or below, e.g. `logging.basicConfig(level=logging.INFO)`. This package's own warnings and log
records (a GGUF conversion, a sidecar without an adapter) are never held back."""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings

LOGGER = logging.getLogger("oospec_agents")
#: the libraries whose FutureWarnings and DeprecationWarnings a quiet load holds back
THIRD_PARTY = r"(transformers|peft|huggingface_hub|torch|accelerate|safetensors|gguf|tokenizers)(\.|$)"

_lock = threading.Lock()
_loads = 0               # quiet loads under way (a target and a sidecar may load at once)
_bars_were_on = False    # whether transformers showed progress bars before the first of them


def verbose() -> bool:
    """Whether loads show what the libraries print: OOSPEC_VERBOSE, else the `oospec_agents` logger's level."""
    env = os.environ.get("OOSPEC_VERBOSE", "").strip().lower()
    if env:
        return env not in ("0", "false", "no", "off")
    return LOGGER.getEffectiveLevel() <= logging.INFO


@contextlib.contextmanager
def quiet_loading():
    """Within it, transformers' progress bars are off and the libraries' deprecation warnings ignored
    (unless `verbose()`); both come back as they were when the last load under way ends."""
    if verbose():
        yield
        return
    _bars(off=True)
    try:
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning):
                warnings.filterwarnings("ignore", category=category, module=THIRD_PARTY)
            yield
    finally:
        _bars(off=False)


def _bars(*, off: bool) -> None:
    global _loads, _bars_were_on
    from transformers.utils import logging as hf_logging
    with _lock:
        _loads += 1 if off else -1
        if off and _loads == 1:
            _bars_were_on = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
        elif not off and _loads == 0 and _bars_were_on:
            hf_logging.enable_progress_bar()
