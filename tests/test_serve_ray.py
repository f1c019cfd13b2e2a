"""`oospec serve --ray`: the same app as Ray Serve replicas, on a local Ray cluster on this CPU.

Two replicas of the embedded engine behind one address: concurrent requests spread over both (each
reply names its replica in the "oospec" object), and with one replica killed mid-run every request
is still answered, the official client retrying the ones that died with it.
"""
from __future__ import annotations

import os
import socket
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def url():
    from oospec_agents.serve.ray_app import APP_NAME, application
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Replicas import this checkout, whatever the environment's editable install points at.
    # A cluster of its own (address="local"), even where `ray start` runs one.
    # Serve's controller gives a starting proxy 5 s to say it is ready, three times, then kills it: on
    # two cores busy with the rest of the suite, importing the proxy takes longer than that.
    patient = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60"}
    before = {k: os.environ.get(k) for k in patient}
    os.environ.update(patient)  # the raylet, and the controller it starts, inherit it
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **patient}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application({"target": "embedded"}, {"model": "embedded"}, replicas=2, cpus_per_replica=1),
                  name=APP_NAME, route_prefix="/")
        url = f"http://127.0.0.1:{port}"
        wait_until_routed_to_both(url)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def wait_until_routed_to_both(url: str, timeout_s: float = 120.0) -> None:
    """`serve.run` returns once both replicas run, but the HTTP proxy learns of them a little later
    (Ray's long poll): until then it routes everything to the one it knows. One request at a time
    until both replicas have answered, so the tests below start from a proxy that knows both."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=8, timeout=120)
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    while len(seen) < 2:
        assert time.monotonic() < deadline, f"after {timeout_s:.0f} s only replica {seen} had answered"
        r = client.chat.completions.create(model="embedded", max_tokens=1, messages=[{"role": "user", "content": "Hi"}])
        seen.add(r.model_extra["oospec"]["replica"])


def ask_all(url: str, n: int, during=None, failed: list | None = None) -> list[str]:
    """n concurrent requests; `during()` runs once the first is answered. Returns each reply's replica;
    `failed` collects the status of every attempt the client had to retry."""
    hook = {"response": [lambda r: failed.append(r.status_code) if r.status_code >= 500 else None]}
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=8, timeout=120,
                           http_client=httpx.Client(event_hooks=hook if failed is not None else {}))

    def ask(i: int) -> str:
        r = client.chat.completions.create(model="embedded", max_tokens=6,
                                           messages=[{"role": "user", "content": f"Count to {i}."}])
        assert r.usage.completion_tokens >= 1
        return r.model_extra["oospec"]["replica"]

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(ask, i) for i in range(n)]
        if during is not None:
            wait(futures, return_when=FIRST_COMPLETED)
            during()
        return [f.result() for f in futures]


def test_requests_spread_over_both_replicas(url):
    replicas = ask_all(url, 16)
    assert len(replicas) == 16
    assert len(set(replicas)) == 2, f"one replica answered everything: {replicas}"


def test_a_killed_replica_loses_no_request(url):
    def kill_one():
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                 if a["name"].startswith("SERVE_REPLICA::")]
        assert len(names) == 2, names
        ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)

    failed: list[int] = []
    replicas = ask_all(url, 16, during=kill_one, failed=failed)
    assert len(replicas) == 16  # every request answered
    assert failed, "the kill hit no request in flight: nothing was tested"  # those were retried


@pytest.mark.parametrize("cluster_gpus, asked", [(8, 2), (1, 1), (0, 0)])
def test_a_replica_asks_for_the_two_gpus_it_uses(monkeypatch, cluster_gpus, asked):
    """Target on one GPU, sidecar on another: Ray places each replica where two are free."""
    from oospec_agents.serve.ray_app import application
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16, "GPU": cluster_gpus})
    app = application({"target": "embedded"}, {"model": "embedded"}, autoscale=(1, 4))
    deployment = app._bound_deployment  # what serve.run would deploy
    assert deployment.ray_actor_options["num_gpus"] == asked
    assert deployment._deployment_config.autoscaling_config.max_replicas == 4
