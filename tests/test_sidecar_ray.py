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


def test_the_actors_adapter_swaps_and_a_bad_one_is_refused(ray_sidecar, embedded_fp32, dev_records20,
                                                          embedded_greedy48, smollm2_dir, smollm2_tokenizer, tmp_path):
    """The hot swap (#49) in an actor: a fresh LoRA for the same base loads beside the waves and the
    reply stays greedy; one for a narrower model is refused in the actor, and the old adapter stays."""
    from oospec_agents.errors import AdapterError
    from oospec_testing import save_lora, tiny_model
    fresh = save_lora(smollm2_dir, tmp_path / "fresh")
    tiny_model("llama", smollm2_tokenizer).save_pretrained(tmp_path / "tiny")
    narrower = save_lora(tmp_path / "tiny", tmp_path / "narrower")
    engine = on_target_of(embedded_fp32, InTime(ray_sidecar))
    rec, reference = dev_records20[0], embedded_greedy48[0]
    shipped = ray_sidecar.spec.adapter
    try:
        assert ray_sidecar.load_adapter(fresh) == "embedded:SmolLM2-135M-Instruct+fresh" == ray_sidecar.name
        with pytest.raises(AdapterError, match="made for another base model: its LoRA A for"):
            ray_sidecar.load_adapter(narrower)
        assert ray_sidecar.describe()["adapter"] == str(fresh)
        gen = engine.generate(rec["messages"], rec["tools"], tool_choice="required", max_new_tokens=N)
        assert gen.token_ids == reference and gen.stats.sidecar_error is None, gen.stats.sidecar_error
    finally:
        ray_sidecar.load_adapter(shipped)
