from llama_index.llms.oospec.base import OoOSpec

__all__ = ["OoOSpec"]
