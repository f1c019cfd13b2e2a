"""Readiness: `GET /health` is not 200 until the model can answer, and is 200 as soon as it can.

`oospec serve` answers at once and loads its engine on a thread (`create_app(loader=...)`): a
readiness probe on `/health` must keep traffic away until then, and a request that follows the
first 200 must be answered. Ray Serve's replica health check (`ray_app.check_ready`) asks the app
the same question. The loader here is a test double that blocks on an Event.
"""
from __future__ import annotations

import threading
import time

import httpx
import pytest
from serve_testing import running

from oospec_agents.serve import create_app
from oospec_agents.serve.errors import ServeError
from oospec_agents.testing import Scripted

MODEL = "m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
RESPONSE = {"model": MODEL, "input": "Hi"}


def check_ready(app):
    ray_app = pytest.importorskip("oospec_agents.serve.ray_app", reason="Ray Serve is not installed")
    ray_app.check_ready(app)


def blocking_loader(release: threading.Event, result):
    def load():
        if not release.wait(30):
            raise TimeoutError("the test never released the loader")
        if isinstance(result, Exception):
            raise result
        return result
    return load


def test_health_is_503_while_loading_and_200_once_a_request_is_answered():
    release = threading.Event()
    app = create_app(loader=blocking_loader(release, Scripted("Hello.", "Hello.")), model=MODEL)
    with running(app, ready_path=None) as url:
        for _ in range(3):  # however often it is asked
            health = httpx.get(url + "/health")
            assert health.status_code == 503 and health.json()["status"] == "loading"
            time.sleep(0.05)
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSE)):
            r = httpx.post(url + path, json=body)
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading", r.text
        with pytest.raises(ServeError, match="still loading"):
            check_ready(app)
        assert httpx.get(url + "/v1/models").status_code == 200  # metadata needs no model

        release.set()
        deadline = time.monotonic() + 10
        while (health := httpx.get(url + "/health")).status_code != 200:
            assert health.status_code == 503 and time.monotonic() < deadline
            time.sleep(0.01)
        assert health.json()["status"] == "ok"
        # the first request after the first 200 is answered: there is no window in between
        r = httpx.post(url + "/v1/responses", json=RESPONSE, timeout=30)
        assert r.status_code == 200 and r.json()["output"][0]["content"][0]["text"] == "Hello."
        assert httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=30).status_code == 200
        check_ready(app)


def test_a_failed_load_is_a_500_on_health_and_on_every_route_for_good():
    release = threading.Event()
    app = create_app(loader=blocking_loader(release, OSError("no such model: /models/missing")), model=MODEL)
    with running(app, ready_path=None) as url:
        release.set()
        deadline = time.monotonic() + 10
        while (health := httpx.get(url + "/health")).status_code == 503:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert health.status_code == 500 and health.json()["status"] == "failed"
        assert "OSError: no such model" in health.json()["error"]
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSE)):
            r = httpx.post(url + path, json=body)
            assert r.status_code == 500 and r.json()["error"]["code"] == "model_load_failed"
        with pytest.raises(ServeError, match="failed to load"):
            check_ready(app)
        assert httpx.get(url + "/health").status_code == 500  # it stays failed


def test_an_app_given_its_engine_is_ready_at_once():
    app = create_app(Scripted(), model=MODEL)
    with running(app, ready_path=None) as url:
        assert httpx.get(url + "/health").status_code == 200
        check_ready(app)
