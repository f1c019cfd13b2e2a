"""LangChain integration for oospec-agents: the `ChatOoOSpec` chat model, and `SpeculativeToolsMiddleware`
(which needs `pip install "langchain-oospec[agents]"`) for agents that start read-only tools early."""
from langchain_oospec.chat_models import ChatOoOSpec
from langchain_oospec.speculative_tools import SpeculativeToolCalls

__all__ = ["ChatOoOSpec", "SpeculativeToolCalls", "SpeculativeToolsMiddleware"]


def __getattr__(name: str):
    # imported on first use: it needs the `langchain` package, and says so (the `agents` extra) without it
    if name == "SpeculativeToolsMiddleware":
        from langchain_oospec.middleware import SpeculativeToolsMiddleware
        return SpeculativeToolsMiddleware
    raise AttributeError(f"module 'langchain_oospec' has no attribute {name!r}")
