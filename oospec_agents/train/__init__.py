"""Training: teacher traces, row expansion for the sidecar, LoRA training with peft.

Python entry points: `train_target(...)`, `train_sidecar(...)`, `evaluate_target(...)`,
`evaluate_sidecar(...)`; the CLI is `oospec train-target` / `oospec train-sidecar`.
"""
from .data import TrainDataError, load_records
from .lora import LoraConfigArgs


def train_target(**kw):
    """See `train.run.train_target`."""
    from .run import train_target as _t
    return _t(**kw)


def train_sidecar(**kw):
    """See `train.sidecar_train.train_sidecar`."""
    from .sidecar_train import train_sidecar as _t
    return _t(**kw)


__all__ = ["LoraConfigArgs", "TrainDataError", "load_records", "train_sidecar", "train_target"]
