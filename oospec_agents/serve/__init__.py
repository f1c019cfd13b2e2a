"""`oospec serve`: OpenAI Chat Completions (tools, streaming, usage) over the engine, with Prometheus
metrics, a bounded FIFO queue, and Ray Serve replicas beyond one process."""
from .app import create_app

__all__ = ["create_app"]
