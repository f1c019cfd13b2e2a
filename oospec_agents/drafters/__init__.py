from .base import Accepted, Draft, ReplyState, Drafter, ReplyText, encode_after
from .hint import HintDrafter
from .prediction import PredictionDrafter
from .retrieval import CallMemory, RetrievalDrafter
from .schema import SchemaDrafter
from .stack import DrafterStack, default_drafters, stack_drafts

__all__ = ["Accepted", "Draft", "ReplyState", "Drafter", "ReplyText", "encode_after", "HintDrafter",
           "PredictionDrafter", "RetrievalDrafter", "SchemaDrafter", "CallMemory", "DrafterStack",
           "default_drafters", "stack_drafts"]
