"""`sidecar_placement="ray"`: the embedded sidecar as a Ray actor (what a Serve replica's sidecar on
a GPU of its own is), on a local Ray cluster on this CPU. The target verifies its hints and stays
greedy; a killed actor is a fault in `stats`, never a change in the tokens, and the next request
starts another."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from oospec_testing import InTime, on_target_of

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
N = 48  # the session's greedy references are 48 tokens


@pytest.fixture(scope="module")
def ray_sidecar():
    from oospec_agents.sidecar.load import load_sidecar
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        sidecar = load_sidecar("embedded", device=torch.device("cpu"), dtype=torch.float32,
                               sidecar_placement="ray", sidecar_timeout_s=120)
        yield sidecar
        sidecar.close()
    finally:
        ray.shutdown()


def test_the_actors_hints_are_verified_and_the_reply_stays_greedy(ray_sidecar, embedded_fp32, dev_records20,
                                                                   embedded_greedy48):
    from oospec_agents.sidecar.hosts.ray import RaySidecar
    assert isinstance(ray_sidecar, RaySidecar) and ray_sidecar.name.startswith("embedded:")
    engine = on_target_of(embedded_fp32, InTime(ray_sidecar))
    hint_tokens = 0
    for rec, reference in list(zip(dev_records20, embedded_greedy48))[:4]:
        gen = engine.generate(rec["messages"], rec["tools"], tool_choice="required", max_new_tokens=N)
        assert gen.token_ids == reference, rec["id"]
        assert gen.stats.sidecar_error is None, gen.stats.sidecar_error
        hint_tokens += gen.stats.accepted_by_source["hint"]
    assert hint_tokens > 0


def test_a_killed_actor_is_a_fault_and_the_next_request_starts_another(ray_sidecar, embedded_fp32, dev_records20,
                                                                        embedded_greedy48):
    engine = on_target_of(embedded_fp32, InTime(ray_sidecar))
    rec, reference = dev_records20[0], embedded_greedy48[0]
    old = ray_sidecar._actor
    ray.kill(old)
    gen = engine.generate(rec["messages"], rec["tools"], tool_choice="required", max_new_tokens=N)
    assert gen.token_ids == reference
    assert "sidecar actor died" in gen.stats.sidecar_error
    gen = engine.generate(rec["messages"], rec["tools"], tool_choice="required", max_new_tokens=N)
    assert gen.token_ids == reference
    assert ray_sidecar._actor is not old and gen.stats.sidecar_error is None
    assert gen.stats.accepted_by_source["hint"] > 0
