from .base import Draft, ReplyState, Drafter, encode_after
from .hint import HintDrafter
from .prediction import PredictionDrafter
from .retrieval import RetrievalDrafter
from .schema import SchemaDrafter

__all__ = ["Draft", "ReplyState", "Drafter", "encode_after", "HintDrafter", "PredictionDrafter", "RetrievalDrafter", "SchemaDrafter"]
