"""What the figures were measured on: devices, dtype, library versions, thread counts."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch
import transformers


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or "cpu"
    return str(device)


def git_commit() -> str | None:
    """This checkout's short commit, or None outside a git checkout (an installed wheel)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(engine, assistant=None) -> dict:
    target_dev = next(engine.target.parameters()).device
    sidecar = engine.sidecar
    sidecar_dev = None if sidecar is None else sidecar.device
    return {
        "target": engine.model_name,
        "target_device": str(target_dev),
        "target_device_name": device_name(target_dev),
        "dtype": str(engine.target.dtype).removeprefix("torch."),
        "sidecar": None if sidecar is None else sidecar.name or type(sidecar).__name__,
        "sidecar_device": None if sidecar_dev is None else str(sidecar_dev),
        "sidecar_device_name": None if sidecar_dev is None else device_name(sidecar_dev),
        # where its wave runs: WaveSidecar (a thread of this process), ProcessSidecar, RaySidecar
        "sidecar_runtime": None if sidecar is None else type(sidecar).__name__,
        "sidecar_cores": None if sidecar is None or sidecar.cores is None else sorted(sidecar.cores),
        "target_cores": None if getattr(engine, "place", None) is None or engine.place.cores is None
        else sorted(engine.place.cores),
        "assistant": None if assistant is None else getattr(assistant.config, "_name_or_path", type(assistant).__name__),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available() else [],
        "git_commit": git_commit(),
    }
