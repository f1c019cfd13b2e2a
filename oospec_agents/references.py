"""Model references checked before anything loads: a near miss of a shipped name, a local path that is not
there, a hub id that is neither in the local Hugging Face cache nor reachable.

`check_reference(ref)` runs where a model is about to load (`models.load_model`), with one short probe of
the hub for an id that is not cached; `check_reference(ref, probe_hub=False)` runs where a front-end is
built (`frontend.LazyEngine`), where only what costs nothing is checked. A reference that passes is
loaded as before (transformers resolves hub ids); one that fails raises `ModelLoadError` naming it."""
from __future__ import annotations

import difflib
import os
from pathlib import Path

from .errors import ModelLoadError

#: the names this package ships models under (models.py: the embedded pair, its thinking target, gemma3)
SHIPPED = ("embedded", "smollm2", "smollm2-instruct", "embedded-thinking", "gemma3")
#: seconds the hub probe waits for an answer
HUB_TIMEOUT_S = 5.0
WHAT_A_REFERENCE_IS = ("a shipped name (" + ", ".join(SHIPPED) + "), a Hugging Face id 'org/name', "
                       "a local model directory or a .gguf file")


def check_reference(ref, *, probe_hub: bool = True) -> None:
    """Raise `ModelLoadError` where model reference `ref` cannot load: a near miss of a shipped name
    ("did you mean"), a local path that is missing, a hub id that is not cached and cannot be fetched
    (offline mode set, or with `probe_hub` the hub unreachable or without it). Other references pass."""
    if not isinstance(ref, (str, os.PathLike)):
        return
    ref = os.fspath(ref)
    if ref in SHIPPED:
        return
    path = Path(ref).expanduser()
    if path.exists():
        return  # what it holds is models.resolve_reference's to check
    if ref.endswith(".gguf") or ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise ModelLoadError(f"model path {ref!r} does not exist")
    near = difflib.get_close_matches(ref.lower(), SHIPPED, n=1, cutoff=0.75)
    if near:
        raise ModelLoadError(f"unknown model {ref!r}: did you mean {near[0]!r}? A model reference is "
                             f"{WHAT_A_REFERENCE_IS}")
    check_hub_id(ref, probe=probe_hub)


def check_hub_id(ref: str, *, probe: bool = True, timeout: float = HUB_TIMEOUT_S) -> None:
    """A hub id passes when its config.json is in the local Hugging Face cache. Otherwise it fails at once in
    offline mode (HF_HUB_OFFLINE), and with `probe` after one metadata request of at most `timeout`
    seconds: no such repository, or no answer from the hub. A gated repository or a server error passes
    (transformers' own message says more)."""
    try:
        from huggingface_hub import HfApi, constants, try_to_load_from_cache
        from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
    except ImportError:  # transformers brings huggingface_hub; without it there is nothing to check
        return
    try:
        cached = try_to_load_from_cache(ref, "config.json")
    except ValueError as e:  # not a valid repo id ("a b", "org/na me")
        raise ModelLoadError(f"model {ref!r} is not a local path, and not a valid Hugging Face id ({e}); "
                             f"a model reference is {WHAT_A_REFERENCE_IS}") from None
    if isinstance(cached, str):
        return
    where = f"not a local path, and not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(f"cannot load model {ref!r}: it is {where}, and HF_HUB_OFFLINE is set, so "
                             "nothing is downloaded. Download it once with the network on "
                             f"(`hf download {ref}`), or pass a local directory or .gguf file")
    if not probe:
        return
    try:
        HfApi(endpoint=constants.ENDPOINT).model_info(ref, timeout=timeout)
    except GatedRepoError:
        return
    except RepositoryNotFoundError:
        raise ModelLoadError(f"cannot load model {ref!r}: it is {where}, and the hub ({constants.ENDPOINT}) has "
                             "no such model (a private one needs `hf auth login`); a model reference is "
                             f"{WHAT_A_REFERENCE_IS}") from None
    except HfHubHTTPError:
        return
    except Exception as e:  # no network: a connection, DNS or timeout error of the HTTP client
        raise ModelLoadError(f"cannot load model {ref!r}: it is {where}, and the hub ({constants.ENDPOINT}) "
                             f"cannot be reached ({type(e).__name__}: {e}); offline, pass a local directory "
                             "or .gguf file, or download it once with the network on") from None
