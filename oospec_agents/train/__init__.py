"""Training: teacher traces, row expansion for the sidecar, LoRA training with peft.

Python entry points: `train_target(...)`, `train_sidecar(...)`, `evaluate_target(...)`,
`evaluate_sidecar(...)`; the CLI is `oospec train-target` / `oospec train-sidecar`.
"""
from .data import load_records, TrainDataError

__all__ = ["load_records", "TrainDataError"]
