"""LangChain integration for oospec-agents."""
from langchain_oospec.chat_models import ChatOoOSpec

__all__ = ["ChatOoOSpec"]
