"""LangChain integration for oospec-agents: the `ChatOoOSpec` chat model."""
from langchain_oospec.chat_models import ChatOoOSpec

__all__ = ["ChatOoOSpec"]
