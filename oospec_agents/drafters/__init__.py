from .base import Draft, DraftContext, Drafter, encode_after
from .hint import HintDrafter
from .prediction import PredictionDrafter
from .retrieval import RetrievalDrafter
from .schema import SchemaDrafter

__all__ = ["Draft", "DraftContext", "Drafter", "encode_after", "HintDrafter", "PredictionDrafter", "RetrievalDrafter", "SchemaDrafter"]
