"""LlamaIndex integration for oospec-agents: the `OoOSpec` LLM."""
from llama_index.llms.oospec.base import OoOSpec

__all__ = ["OoOSpec"]
