"""OoO-Spec inside vLLM: `OoOSpecProposer`, the class path for vLLM's `custom_class` proposer
(docs/vllm.md). Nothing here imports vLLM: vLLM imports us."""
from .proposer import OoOSpecProposer

__all__ = ["OoOSpecProposer"]
