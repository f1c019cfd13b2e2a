from .base import FixedHint, Hint, HintRequest, HintTicket, Sidecar

__all__ = ["FixedHint", "Hint", "HintRequest", "HintTicket", "Sidecar"]
