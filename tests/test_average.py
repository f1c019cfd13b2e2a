"""`oospec average-adapters`: the mean of LoRA updates, checked on real peft adapters of a tiny Llama."""
from __future__ import annotations

import json

import pytest
import torch

from oospec_agents.cli import main as cli
from oospec_agents.train.average import average_adapters
from oospec_agents.train.data import TrainDataError

MODULES = ["q_proj", "v_proj", "down_proj"]


def _base():
    from transformers import AutoModelForCausalLM, LlamaConfig
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def _adapter(path, seed, r=4, alpha=8, modules=MODULES):
    """A saved peft LoRA adapter with random (non-zero) A and B."""
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(_base(), LoraConfig(r=r, lora_alpha=alpha, target_modules=list(modules)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model.save_pretrained(path)
    return path


def _merged(path):
    """Full weights of the base with the saved adapter merged in, loaded the way users load it."""
    from peft import PeftModel
    return {k: v.detach().clone() for k, v in
            PeftModel.from_pretrained(_base(), str(path)).merge_and_unload().state_dict().items()}


def test_two_copies_of_one_adapter_average_to_that_adapter(tmp_path):
    a = _adapter(tmp_path / "a", 1)
    import shutil
    shutil.copytree(a, tmp_path / "a2")
    m = average_adapters([a, tmp_path / "a2"], tmp_path / "out")
    want, got = _merged(a), _merged(tmp_path / "out")
    assert max((want[k] - got[k]).abs().max().item() for k in want) < 1e-5
    assert m["svd_tail"]["max"] < 1e-6


def test_the_update_is_the_exact_mean_of_the_updates_when_the_rank_holds_it(tmp_path):
    a, b, c = (_adapter(tmp_path / n, s, r=2) for n, s in (("a", 1), ("b", 2), ("c", 3)))
    base = _base().state_dict()
    ma, mb, mc = _merged(a), _merged(b), _merged(c)
    m = average_adapters([a, b, c], tmp_path / "out", r=6)   # three rank-2 updates: rank <= 6, exact
    got = _merged(tmp_path / "out")
    for k in base:
        mean = base[k] + ((ma[k] - base[k]) + (mb[k] - base[k]) + (mc[k] - base[k])) / 3
        torch.testing.assert_close(got[k], mean, atol=1e-5, rtol=1e-5)
    assert json.loads((tmp_path / "out" / "adapter_config.json").read_text())["r"] == 6
    assert m["config"]["r"] == 6 and m["svd_tail"]["max"] < 1e-6
    assert [x["path"] for x in m["averaged"]] == [str(a), str(b), str(c)]
    assert len({x["sha256"] for x in m["averaged"]}) == 3
    # cut to rank 2, the result is the best rank-2 fit and says how much it dropped
    m2 = average_adapters([a, b, c], tmp_path / "out2")
    assert 0.01 < m2["svd_tail"]["max"] < 1
    assert json.loads((tmp_path / "out2" / "adapter_config.json").read_text())["r"] == 2


def test_adapters_with_other_alpha_or_rank_average_by_their_own_scale(tmp_path):
    a = _adapter(tmp_path / "a", 1, r=4, alpha=8)
    b = _adapter(tmp_path / "b", 2, r=2, alpha=16)
    base, ma, mb = _base().state_dict(), _merged(a), _merged(b)
    # r=40 is wider than the 32-wide layers: the factors are padded with zeros, still exact
    for r in (6, 40):
        average_adapters([a, b], tmp_path / f"out{r}", r=r)
        got = _merged(tmp_path / f"out{r}")
        for k in base:
            torch.testing.assert_close(got[k], (ma[k] + mb[k]) / 2, atol=1e-5, rtol=1e-5)


def test_bad_input_names_the_problem(tmp_path):
    a = _adapter(tmp_path / "a", 1)
    with pytest.raises(TrainDataError, match="at least two"):
        average_adapters([a], tmp_path / "out")
    with pytest.raises(TrainDataError, match="rank must be at least 1, got 0"):
        average_adapters([a, a], tmp_path / "out", r=0)
    with pytest.raises(TrainDataError, match="nope: no such directory"):
        average_adapters([a, tmp_path / "nope"], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainDataError, match="missing adapter_config.json"):
        average_adapters([a, tmp_path / "empty"], tmp_path / "out")
    other = _adapter(tmp_path / "other", 2, modules=["q_proj"])
    with pytest.raises(TrainDataError, match="adapts other layers"):
        average_adapters([a, other], tmp_path / "out")
    c = tmp_path / "c"
    _adapter(c, 3)
    cfg = json.loads((c / "adapter_config.json").read_text())
    (c / "adapter_config.json").write_text(json.dumps(cfg | {"base_model_name_or_path": "elsewhere"}))
    with pytest.raises(TrainDataError, match="base model 'elsewhere' differs"):
        average_adapters([a, c], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli(tmp_path, capsys):
    a, b = _adapter(tmp_path / "a", 1), _adapter(tmp_path / "b", 2)
    assert cli(["average-adapters", "--out", str(tmp_path / "out"), str(a), str(b)]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "average"
    assert cli(["average-adapters", "--out", str(tmp_path / "x"), str(a), str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
