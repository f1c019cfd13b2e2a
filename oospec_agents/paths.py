"""Where oospec keeps what it unpacks once: a leaf module, so that any layer may ask."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`OOSPEC_CACHE`, else `$XDG_CACHE_HOME/oospec`, else `~/.cache/oospec`: the assembled GGUF files, the
    converted checkpoints, openai-harmony's vocabulary."""
    root = os.environ.get("OOSPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "oospec")
    return Path(root)
