"""A real uvicorn server on 127.0.0.1 for the serve tests: an ephemeral port, run on a thread of the
test process, so tests drive it over real sockets with clients we did not write."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import httpx
import uvicorn

API_KEY = "sk-oospec-test"


@contextmanager
def running(app, *, ready_path: str | None = "/health", timeout: float = 120):
    """Serve `app` until the block ends; yields the base URL (no trailing slash, no /v1)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the test server at {url} did not start")
        time.sleep(0.02)
    if ready_path:
        while httpx.get(url + ready_path).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test server at {url} never became ready")
            time.sleep(0.1)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
